"""Translation of raw text with a trained model: tokenize, batch, search, detokenize.

`Translator` is the Python API behind `nmt translate` and validation BLEU:

    from nmt import Translator
    Translator.from_checkpoint("runs/toy_transformer/best.pt").translate(["The man sees the dog."], beam=5)

Input is sorted by length into token-budget batches and put back in input
order; every input line gives exactly one output (an empty line gives an empty
line), and streams are translated in bounded chunks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import torch

from nmt.config import DecodeConfig, ExperimentConfig
from nmt.data.batching import inference_batches
from nmt.data.tokenizer import EOS_ID, PAD_ID, Tokenizer
from nmt.decode import search
from nmt.runtime import inference, pick_device
from nmt.train.checkpoint import load_checkpoint, model_from_checkpoint

log = logging.getLogger(__name__)


@dataclass
class Translation:
    """One hypothesis for one input line."""

    text: str
    score: float  # length-penalised log-probability used for ranking
    log_prob: float  # sum of token log-probabilities
    tokens: list[str]  # target subwords
    attention: torch.Tensor | None = None  # (T_out, S) over source subwords incl. EOS


class Translator:
    """A model with its tokenizer and decoding settings."""

    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer, cfg: ExperimentConfig, device: torch.device) -> None:
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.device = device
        self.max_src_len = _max_source_length(cfg)

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "auto") -> Translator:
        """Load everything needed from the checkpoint alone."""
        dev = pick_device(device)
        model, tokenizer, cfg = model_from_checkpoint(load_checkpoint(path, map_location="cpu"), dev)
        return cls(model, tokenizer, cfg, dev)

    def translate(self, lines: Sequence[str], *, beam: int | None = None, **options) -> list[str]:
        """Best translation of each line, in input order."""
        return [nbest[0].text for nbest in self.translate_nbest(lines, beam=beam, **options)]

    def translate_nbest(
        self,
        lines: Sequence[str],
        *,
        beam: int | None = None,
        nbest: int = 1,
        length_penalty: float | None = None,
        max_tokens: int | None = None,
        need_attn: bool = False,
    ) -> list[list[Translation]]:
        """The `nbest` best translations of each line (best first), in input order.

        Settings left as None come from the checkpoint's `decode` section.
        """
        d: DecodeConfig = self.cfg.decode
        beam = beam or d.beam
        if nbest > beam:
            raise ValueError(f"nbest ({nbest}) cannot exceed beam ({beam})")
        ids = self._encode(lines)
        results: list[list[Translation]] = [[_empty()] * nbest for _ in lines]
        todo = [i for i, seq in enumerate(ids) if len(seq) > 1]  # only EOS: an empty line
        budget = max(1, (max_tokens or d.max_tokens) // beam)
        with inference(self.model):
            for chunk in inference_batches([len(ids[i]) for i in todo], budget):
                rows = [todo[j] for j in chunk]
                src, mask = _pad([ids[i] for i in rows], self.device)
                hyps = search(
                    self.model,
                    src,
                    mask,
                    beam=beam,
                    nbest=nbest,
                    length_penalty=d.length_penalty if length_penalty is None else length_penalty,
                    max_len_a=d.max_len_a,
                    max_len_b=d.max_len_b,
                    need_attn=need_attn,
                )
                for row, sentence_hyps in zip(rows, hyps):
                    results[row] = [self._finish(h) for h in sentence_hyps]
        return results

    def translate_stream(self, lines: Iterable[str], *, chunk_size: int = 2000, **options) -> Iterator[str]:
        """Translate a (possibly endless) stream in chunks, yielding outputs in order."""
        it = iter(lines)
        while chunk := list(islice(it, chunk_size)):
            yield from self.translate([line.rstrip("\r\n") for line in chunk], **options)

    def _encode(self, lines: Sequence[str]) -> list[list[int]]:
        cleaned = [" ".join(line.split()) for line in lines]  # control characters and odd spacing
        encoded = self.tokenizer.encode_src(cleaned)
        out = []
        for n, seq in enumerate(encoded):
            if len(seq) + 1 > self.max_src_len:
                log.warning("line %d has %d subwords; truncated to %d", n + 1, len(seq), self.max_src_len - 1)
                seq = seq[: self.max_src_len - 1]
            out.append(seq + [EOS_ID])
        return out

    def _finish(self, hyp) -> Translation:
        return Translation(
            text=self.tokenizer.decode_tgt([hyp.tokens])[0],
            score=hyp.score,
            log_prob=hyp.log_prob,
            tokens=self.tokenizer.tgt_pieces(hyp.tokens),
            attention=hyp.attention,
        )


def _empty() -> Translation:
    return Translation(text="", score=0.0, log_prob=0.0, tokens=[])


def _pad(seqs: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (B, S) and their pad mask (B, S), True at padding."""
    width = max(len(s) for s in seqs)
    src = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        src[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    src = src.to(device)
    return src, src.eq(PAD_ID)


def _max_source_length(cfg: ExperimentConfig) -> int:
    """Longest source (subwords incl. EOS) the model accepts.

    A Transformer's position table must cover the source and the longest output
    the search may produce (`max_len_a * S + max_len_b`); recurrent models take any.
    """
    if cfg.model.type != "transformer":
        return 1 << 30
    positions, d = cfg.model.transformer.max_positions, cfg.decode
    by_output = int((positions - 1 - d.max_len_b) / d.max_len_a) if d.max_len_a > 0 else positions
    return max(2, min(positions, by_output))
