"""Translation of raw text with a trained model (or an ensemble): tokenize, batch, search, detokenize.

`Translator` is the Python API behind `nmt translate`, `nmt eval` and validation BLEU:

    from nmt import Translator

    translator = Translator.from_checkpoint("runs/multi30k_transformer/best.pt")
    translator.translate(["Ein Mann fährt Fahrrad."], beam=5)  # ["A man is riding a bike."]
    translator.translate("Ein Mann fährt Fahrrad.")  # one string in, one string out
    best = translator.translate_nbest(["Ein Mann fährt Fahrrad."], beam=5, nbest=3, attention=True)
    best[0][0].log_prob, best[0][0].tokens, best[0][0].attention  # (T_out, S) over best[0][0].src_tokens
    translator.translate(lines, sampling=Sampling(top_p=0.9, seed=1))  # back-translation; line i's sample: seed, i, text

Several checkpoints make an ensemble (`nmt.models.ensemble`):
`Translator.from_checkpoint(["a.pt", "b.pt"])`.

Input is sorted by length into token-budget batches and put back in input
order; every input line gives exactly one output (an empty or whitespace-only
line gives an empty line; a line too long for the model is truncated with a
warning, never dropped). `translate_stream` reads a chunk of lines at a time
(`Translator.chunk_lines`), so memory stays bounded on files of any size. Decoding runs under
`torch.inference_mode()`, in fp32 (TF32 matrix products on a GPU) unless bf16 or fp16 weights are asked for.

The file, pipe and terminal drivers of `nmt translate` are in `nmt.translate_io`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, overload

import torch
from torch.profiler import record_function

from nmt.checkpoint import load_checkpoint, model_from_checkpoint
from nmt.config import ExperimentConfig
from nmt.config.schema import longest_source
from nmt.data.batching import inference_batches
from nmt.data.text import normalize_spaces, one_line
from nmt.data.tokenizer import EOS_ID, PAD_ID, Tokenizer
from nmt.decode import CHUNK_LINES, MAX_CHUNK_LINES, Hypothesis, SearchOptions, search
from nmt.errors import CheckpointError, UserError, headline
from nmt.kernels import warn_if_slow_precision
from nmt.models.ensemble import Ensemble
from nmt.runtime import HALF_DTYPES, inference, pick_device

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
"""`auto`: fp32 everywhere. `bf16` and `fp16` cast the model's weights to that type, as inference
engines do, rather than autocasting: on an H100, beam search under bf16 autocast ran 4x slower than
fp32 (186 vs 724 sentences/s, test_2016_flickr, beam 5), since decoding is bound by per-step kernel
launches and autocast adds a cast before every matrix product. Log-probabilities, search scores and
returned attention stay fp32 whatever the weights are."""

AUTO_MAX_TOKENS = {"cuda": 128_000}
"""Batch budget (padded source tokens times beam) for `decode.max_tokens: 0`, by device type;
`DEFAULT_MAX_TOKENS` on any other. The reasoning is in `DecodeConfig.max_tokens`."""
DEFAULT_MAX_TOKENS = 8000


@dataclass
class Translation:
    """One hypothesis for one input line.

    Attributes:
        text: the detokenized translation, on one line (`nmt.data.text.one_line`).
        score: what hypotheses are ranked by (log_prob over the GNMT length penalty).
        log_prob: log P(translation | source): the sum of token log-probabilities, EOS included.
        tokens: target subwords, without the final EOS.
        src_tokens: source subwords the model read, with the final "</s>".
        attention: weights of each output step (EOS included) over `src_tokens`,
            (len(tokens) + 1, len(src_tokens)); None unless requested.
        truncated: the line had more subwords than the model takes (`Translator.max_src_len`): what
            was translated is its beginning, `src_tokens`.
    """

    text: str
    score: float
    log_prob: float
    tokens: list[str]
    src_tokens: list[str]
    attention: torch.Tensor | None = None
    truncated: bool = False


def _placed(model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None) -> torch.nn.Module:
    """`model` on `device` (and in `dtype`, None: as it is), moved only where it is not there already.

    `Module.to` is no no-op even then: an `nn.GRU` or `nn.LSTM` flattens its weights into a new cuDNN buffer
    at every call, which moves them in memory; validation builds a `Translator` on the training model,
    whose recorded updates (`train.cuda_graphs`) would then go on reading and writing the old addresses.
    """
    index = device.index
    if device.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    tensors = [*model.parameters(), *model.buffers()]
    if all(t.device.type == device.type and (index is None or t.device.index == index) for t in tensors) and (
            dtype is None or all(t.dtype == dtype for t in tensors if t.is_floating_point())):
        return model
    return model.to(device=device, dtype=dtype)


class Translator:
    """A model (or `Ensemble`) with its tokenizer, decoding defaults, device and precision.

    Args:
        model: any `nmt.models.contract.Seq2Seq`.
        tokenizer: the sentencepiece models the model was trained with.
        cfg: the experiment config; its `decode` section gives the defaults.
        device: where the model runs.
        precision: one of `PRECISIONS`; `bf16` and `fp16` cast the model's weights (in place,
            as `Module.to` does).

    Attributes:
        max_src_len: longest source (subwords incl. EOS) with the checkpoint's decoding
            settings; longer lines are truncated.
        checkpoints: the files `from_checkpoint` loaded (none for a model given directly).
    """

    def __init__(
        self, model: torch.nn.Module, tokenizer: Tokenizer, cfg: ExperimentConfig, device: torch.device,
        *, precision: str = "fp32",
    ) -> None:
        if precision not in PRECISIONS:
            raise UserError(f"precision ({precision!r}) must be one of {PRECISIONS}")
        self.precision = _resolve_precision(precision, device)
        warn_if_slow_precision(device, self.precision, "precision:")
        self.model = _placed(model, device, HALF_DTYPES.get(self.precision)).eval()
        self.tokenizer = tokenizer
        if cfg.decode.coverage_penalty > 0 and not self.model.has_attention:  # trained before `nmt train` refused it
            log.warning("%s has no attention: its decode.coverage_penalty (%g) is left out", self.model.name,
                        cfg.decode.coverage_penalty)
            cfg = dataclasses.replace(cfg, decode=dataclasses.replace(cfg.decode, coverage_penalty=0.0))
        self.cfg = cfg
        self.device = device
        self.checkpoints: list[Path] = []
        self._max_tokens_cap: int | None = None  # lowered by a batch that ran out of CUDA memory (`_search`)

    @classmethod
    def from_checkpoint(
        cls, path: str | Path | Sequence[str | Path], device: str = "auto", precision: str = "auto"
    ) -> Translator:
        """Load everything needed from the checkpoint(s) alone.

        Args:
            path: one checkpoint, or several to ensemble (they must share the
                tokenizer; decoding defaults come from the first).
            device: "auto", "cpu", "cuda" or "mps".
            precision: one of `PRECISIONS`.

        Raises:
            CheckpointError: a checkpoint is missing or unreadable, or ensemble
                members have different tokenizers or language pairs.
        """
        paths = [path] if isinstance(path, (str, Path)) else list(path)
        if not paths:
            raise UserError("no checkpoint given")
        dev = pick_device(device)
        loaded = [model_from_checkpoint(load_checkpoint(p, map_location="cpu"), dev, source=p) for p in paths]
        model, tokenizer, cfg = loaded[0]
        if len(loaded) > 1:
            pair = (cfg.data.src_lang, cfg.data.tgt_lang)
            for p, (_, other, other_cfg) in zip(paths[1:], loaded[1:]):
                if other.to_state() != tokenizer.to_state():
                    raise CheckpointError(f"{p}: its sentencepiece models differ from those of {paths[0]}; "
                                          "ensemble members must share one vocabulary")
                # a joint vocabulary is the same for both directions: only the configs tell them apart
                if (other_cfg.data.src_lang, other_cfg.data.tgt_lang) != pair:
                    raise CheckpointError(
                        f"{p}: translates {other_cfg.data.src_lang}->{other_cfg.data.tgt_lang}, and {paths[0]} "
                        f"{pair[0]}->{pair[1]} (their data.src_lang and data.tgt_lang); ensemble members must "
                        "translate one language pair in one direction")
            model = Ensemble(members=[m for m, _, _ in loaded])
        translator = cls(model, tokenizer, cfg, dev, precision=precision)
        translator.checkpoints = [Path(p) for p in paths]
        return translator

    def set_attention(self, *, layer: int = -1, head: int | None = None) -> None:
        """Choose whose cross-attention a Transformer returns: a decoder layer and a head (None: their mean).

        RNN attention has a single distribution and ignores this.

        Raises:
            UserError: a layer or head outside the model.
        """
        try:
            self.model.select_attention(layer=layer, head=head)
        except ValueError as err:
            raise UserError(str(err)) from None

    def options(self, options: SearchOptions | None = None, **overrides: Any) -> SearchOptions:
        """`options`, or the checkpoint's `decode` settings, with `overrides` (None values are not given).

        Unless given, `beam` is the checkpoint's `decode.beam`, or `nbest` if larger (1 for sampling and greedy).

        Raises:
            UserError: inconsistent settings (nbest > beam, sampling with beam > 1, ...).
        """
        given = {k: v for k, v in overrides.items() if v is not None}
        try:
            if options is not None:
                return dataclasses.replace(options, **given)
            d = self.cfg.decode
            nbest = given.get("nbest", 1)
            one_row = given.get("sampling") is not None or given.get("strategy") in ("sample", "greedy")
            defaults = dict(beam=1 if one_row else max(d.beam, nbest if isinstance(nbest, int) else 1),
                            length_penalty=d.length_penalty, coverage_penalty=d.coverage_penalty,
                            min_len=d.min_len, max_len_a=d.max_len_a, max_len_b=d.max_len_b,
                            max_tokens=d.max_tokens)
            return SearchOptions(**{**defaults, **given})
        except ValueError as err:
            raise UserError(str(err)) from None

    @overload
    def translate(self, lines: str, **options) -> str: ...
    @overload
    def translate(self, lines: Iterable[str], **options) -> list[str]: ...

    def translate(self, lines, options: SearchOptions | None = None, **overrides):
        """Best translation of each line, in input order; a single string gives a single string.

        `options` and `overrides` as for `Translator.options`. The lines are translated a chunk at a time
        (`translate_stream`): beside the outputs, memory holds one chunk's subwords and hypotheses, not
        every line's (about 4 KB a line).
        """
        if isinstance(lines, str):
            return self.translate([lines], options, **overrides)[0]
        return list(self.translate_stream(lines, options, **overrides))

    def translate_nbest(self, lines: Iterable[str], options: SearchOptions | None = None,
                        **overrides: Any) -> list[list[Translation]]:
        """The `nbest` best translations of each line (best first), in input order.

        Args:
            lines: source sentences; a seeded sampler's draws for `lines[i]` are keyed by i
                (`nmt.decode.sampling.sample_step`), whatever batch it falls in.
            options, overrides: search settings (`Translator.options`), e.g. `beam=5, nbest=3,
                attention=True, sampling=Sampling(top_p=0.9)`.

        Raises:
            UserError: inconsistent settings.
        """
        opts = self._resolve(self.options(options, **overrides))
        return self._translate(list(lines), opts)

    def translate_stream(self, lines: Iterable[str], options: SearchOptions | None = None, *,
                         chunk_size: int | None = None, **overrides: Any) -> Iterator[str]:
        """Translate a (possibly endless) stream a chunk of lines at a time, yielding outputs in order."""
        for nbest in self.translate_stream_nbest(lines, options, chunk_size=chunk_size, **overrides):
            yield nbest[0].text

    def translate_stream_nbest(self, lines: Iterable[str], options: SearchOptions | None = None, *,
                               chunk_size: int | None = None, **overrides: Any) -> Iterator[list[Translation]]:
        """`translate_nbest` over a stream: at most `chunk_size` lines (default: `chunk_lines`) are held at a time.

        Line endings ("\\n", "\\r\\n") are stripped; lines are numbered across chunks, so a seeded sample
        does not depend on `chunk_size`.
        """
        opts = self.options(options, **overrides)
        size = self.chunk_lines(opts) if chunk_size is None else chunk_size
        if size < 1:
            raise UserError(f"chunk_size ({size}) must be at least 1")
        it = iter(lines)
        return self.translate_chunks(iter(lambda: list(islice(it, size)), []), opts)

    def chunk_lines(self, opts: SearchOptions) -> int:
        """Lines a stream is read and translated at a time with `opts`: as many as one batch holds
        source tokens (`max_tokens_for` over the beam), from `CHUNK_LINES` up to `MAX_CHUNK_LINES`.

        A chunk is sorted by length and cut into batches; sentences of L subwords on average fill
        about 1/L of such a chunk per batch, so it makes about L batches, one of them part-filled.
        That one holds the chunk's longest sentences and takes as many search steps as a full one:
        with a fixed 2,000 lines, a GPU's 128,000-token budget cut each chunk of Multi30k-like
        sentences into one full batch and one small one, nearly doubling the steps per line.
        """
        budget = self.max_tokens_for(opts.max_tokens) // max(opts.beam, 1)
        return min(MAX_CHUNK_LINES, max(CHUNK_LINES, budget))

    def translate_chunks(self, chunks: Iterable[Sequence[str]], options: SearchOptions | None = None, *,
                         first_line: int = 1, **overrides: Any) -> Iterator[list[Translation]]:
        """`translate_nbest` of each chunk of lines in turn, yielding each line's translations as its chunk is done.

        For a pipe, chunks can be the lines available so far, so every line is answered
        without waiting for more input (`nmt.data.text.available_lines`). `first_line` is
        the input line number of the first line (from 1), for warnings and for a sampler: the
        draws of line n are keyed by n - 1 (`search`'s `lines`), so a run that starts after
        the lines a stopped run wrote samples what an uninterrupted run samples.
        """
        opts = self._resolve(self.options(options, **overrides))
        first = first_line
        for chunk in chunks:
            yield from self._translate([line.rstrip("\r\n") for line in chunk], opts, first_line=first)
            first += len(chunk)

    @property
    def max_src_len(self) -> int:
        return self.max_source_length(self.options())

    def max_source_length(self, opts: SearchOptions) -> int:
        """Longest source (subwords incl. EOS) the model accepts with the output lengths `opts` allow.

        A model with a position table (`max_positions`) must cover the source and the
        longest output the search may produce (`max_len_a * S + max_len_b`); others take any.
        """
        positions = self.model.max_positions
        if positions is None:
            return 1 << 30
        longest = longest_source(positions, opts.max_len_a, opts.max_len_b)
        if longest < 2:  # not even one subword and EOS
            raise UserError(
                f"max_len_a {opts.max_len_a:g} and max_len_b {opts.max_len_b} allow outputs of more than the "
                f"{positions - 1} tokens the model's {positions} positions hold, even from a one-subword source (2 "
                f"positions with EOS): lower --max-len-a or --max-len-b (decode.max_len_a, decode.max_len_b) so that "
                f"2 x max_len_a + max_len_b is at most {positions - 1}")
        return longest

    def max_tokens_for(self, max_tokens: int | None = None) -> int:
        """The batch budget a call with `max_tokens` uses: it, else the checkpoint's
        `decode.max_tokens`, else (0: auto) `AUTO_MAX_TOKENS` for this device; at most half
        the last batch that ran out of CUDA memory, once one has."""
        budget = max_tokens or self.cfg.decode.max_tokens or AUTO_MAX_TOKENS.get(self.device.type, DEFAULT_MAX_TOKENS)
        return budget if self._max_tokens_cap is None else min(budget, self._max_tokens_cap)

    def _resolve(self, opts: SearchOptions) -> SearchOptions:
        """`opts` with its strategy made a step function once, so an unseeded sampler draws its seed once
        for every batch and chunk of the call (`make_sample_step`)."""
        if opts.wants_attention and not self.model.has_attention:
            asked = [f"the coverage penalty ({opts.coverage_penalty:g})"] if opts.coverage_penalty > 0 else []
            asked += ["attention plots"] if opts.attention else []
            verb = "need" if opts.attention else "needs"
            raise UserError(f"{self.model.name} has no attention: {' and '.join(asked)} {verb} a model with attention")
        return dataclasses.replace(opts, strategy=opts.step_fn(self.device))

    def _translate(self, lines: list[str], opts: SearchOptions, first_line: int = 1) -> list[list[Translation]]:
        # The phases are labelled for torch.profiler (`bench/decode_speed.py --profile`).
        with record_function("nmt.tokenize"):
            ids, cut = self._encode(lines, self.max_source_length(opts), first_line)
        # An empty line's one translation is the empty one; the rest of an n-best list the search could not fill.
        results = [[_empty(), *_missing(opts.nbest - 1)] for _ in lines]
        todo = [i for i, seq in enumerate(ids) if len(seq) > 1]  # only EOS: an empty line
        budget = max(1, self.max_tokens_for(opts.max_tokens) // opts.beam)  # source tokens per batch
        with inference(self.model):
            for chunk in inference_batches([len(ids[i]) for i in todo], budget):
                rows = [todo[j] for j in chunk]
                # A line's number in the input, from 0, across chunks: what a sampler's draws are keyed by.
                hyps = self._search([ids[i] for i in rows], opts, [first_line - 1 + i for i in rows])
                with record_function("nmt.detokenize"):
                    for row, translations in zip(rows, self._finish(hyps, [ids[i] for i in rows])):
                        results[row] = translations + _missing(opts.nbest - len(translations))
                        if row in cut:
                            results[row] = [dataclasses.replace(t, truncated=True) for t in results[row]]
                        if not translations:  # its every hypothesis scored -inf or NaN: the line stays empty
                            log.warning("line %d: no translation with a finite score (the model's output was not "
                                        "finite; an fp16 overflow?); its output line is empty", first_line + row)
        return results

    def _search(self, sources: list[list[int]], opts: SearchOptions, lines: list[int]) -> list[list[Hypothesis]]:
        """The hypotheses of `sources` (ids with EOS; input `lines`, from 0) as one batch, or, where that runs out
        of CUDA memory, as two batches of half as many sentences each (in turn halved as needed).

        A batch too large for the device is the default's risk on a small GPU: the 128,000 tokens of
        `AUTO_MAX_TOKENS` were sized on GPUs of 80 GB and more, and a search's memory grows with the
        batch, the beam, the layers and the vocabulary. After such a batch the budget of every later
        batch is at most half of it (`max_tokens_for`), so that they do not run out of memory in turn.

        Raises:
            UserError: a single sentence runs out of memory.
        """
        longest, beam, half = max(len(s) for s in sources), opts.beam, len(sources) // 2
        cap = self._max_tokens_cap
        if cap is not None and half and len(sources) * longest * beam > cap:  # cut before the budget was lowered
            return self._search(sources[:half], opts, lines[:half]) + self._search(sources[half:], opts, lines[half:])
        try:
            return self._search_batch(sources, opts, lines)
        except torch.cuda.OutOfMemoryError as err:
            detail = headline(err)
        # Out of the handler, the failed batch's tensors (held by the traceback's frames) are freed.
        if not half:
            raise UserError(
                f"CUDA out of memory translating one sentence of {longest} subwords at beam {beam} on {self.device}: "
                f"lower --beam, or translate on the CPU with --device cpu ({detail})")
        self._max_tokens_cap = half * longest * beam
        log.warning("CUDA out of memory on a batch of %d sentences (%d padded source tokens x beam %d): translating "
                    "it in halves, and later batches in at most %d tokens; --max-tokens (decode.max_tokens) %d starts "
                    "there", len(sources), len(sources) * longest, beam, self._max_tokens_cap, self._max_tokens_cap)
        torch.cuda.empty_cache()  # give the failed batch's cached blocks back before the smaller ones
        return self._search(sources[:half], opts, lines[:half]) + self._search(sources[half:], opts, lines[half:])

    def _search_batch(self, sources: list[list[int]], opts: SearchOptions, lines: list[int]) -> list[list[Hypothesis]]:
        with record_function("nmt.search"):
            src, mask = _pad(sources, self.device)
            return search(self.model, src, mask, opts, lines=lines)

    def _encode(self, lines: Sequence[str], limit: int, first_line: int = 1) -> tuple[list[list[int]], set[int]]:
        """Source ids with EOS, each cut to `limit`, and the positions in `lines` of those cut; whitespace runs
        (line breaks, tabs, other controls) become one space, as for training (`normalize_spaces`)."""
        cleaned = [normalize_spaces(line) for line in lines]
        encoded = self.tokenizer.encode_src(cleaned)
        out, cut = [], set()
        for i, seq in enumerate(encoded):
            if len(seq) + 1 > limit:
                log.warning("line %d has %d subwords; truncated to the model's limit of %d",
                            first_line + i, len(seq), limit - 1)
                seq = seq[: limit - 1]
                cut.add(i)
            out.append(seq + [EOS_ID])
        return out, cut

    def _finish(self, hyps: list[list[Hypothesis]], src_ids: list[list[int]]) -> list[list[Translation]]:
        """Each sentence's hypotheses as text: one detokenizer call for the whole batch
        (per hypothesis, sentencepiece's call overhead cost 70x more than the decoding itself).

        A subword may hold a line break other than '\\n' (U+2028, NEL, '\\r': a tokenizer that does
        not normalize them away, learnt from text that holds them); each becomes a space (`one_line`),
        so that every output, a file, standard output, `nmt serve` or `nmt eval`'s, is one line.
        """
        texts = iter(self.tokenizer.decode_tgt([h.tokens for sentence in hyps for h in sentence]))
        return [[Translation(
            text=one_line(next(texts)),
            score=h.score,
            log_prob=h.log_prob,
            tokens=self.tokenizer.tgt_pieces(h.tokens),
            src_tokens=self.tokenizer.src_pieces(src),
            attention=None if h.attention is None else h.attention.float().cpu(),
        ) for h in sentence] for sentence, src in zip(hyps, src_ids, strict=True)]


# --------------------------------------------------------------------------- helpers


def _empty() -> Translation:
    return Translation(text="", score=0.0, log_prob=0.0, tokens=[], src_tokens=[])


def _missing(n: int) -> list[Translation]:
    """`n` places of an n-best list that no hypothesis fills (a beam that found fewer, an empty line's
    others): empty, at a score of -inf, so that every line holds `nbest` translations ranked by score."""
    return [Translation(text="", score=-math.inf, log_prob=-math.inf, tokens=[], src_tokens=[]) for _ in range(n)]


def _pad(seqs: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (B, S) and their pad mask (B, S), True at padding."""
    width = max(len(s) for s in seqs)
    src = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        src[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    src = src.to(device)
    return src, src.eq(PAD_ID)


def _resolve_precision(precision: str, device: torch.device) -> str:
    return "fp32" if precision == "auto" else precision

