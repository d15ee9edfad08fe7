"""sentencepiece subwords: training, loading, encoding, decoding.

This is the one place where the special ids are defined. Every sentencepiece
model `nmt` trains uses them, so source and target vocabularies agree on them
and a joint vocabulary can be shared by both embeddings.
"""

from __future__ import annotations

import json
import logging
import random
import re
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from nmt.config import TokenizerConfig
from nmt.errors import DataError
from nmt.fileio import write_atomic

log = logging.getLogger(__name__)

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3


class Tokenizer:
    """Source and target sentencepiece models (the same one when the vocabulary is joint).

    The serialized models travel inside checkpoints (`to_state`/`from_state`), so a
    checkpoint alone is enough to translate.
    """

    def __init__(self, *, src_model: bytes, tgt_model: bytes | None = None) -> None:
        self._src_bytes = src_model
        self._tgt_bytes = tgt_model
        self.src = spm.SentencePieceProcessor(model_proto=src_model)
        self.tgt = self.src if tgt_model is None else spm.SentencePieceProcessor(model_proto=tgt_model)

    @property
    def joint(self) -> bool:
        return self._tgt_bytes is None

    @property
    def src_vocab_size(self) -> int:
        return self.src.get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self.tgt.get_piece_size()

    def encode_src(self, lines: Sequence[str]) -> list[list[int]]:
        """Source ids, without special symbols."""
        return self.src.encode(list(lines))

    def encode_tgt(self, lines: Sequence[str]) -> list[list[int]]:
        """Target ids, without special symbols."""
        return self.tgt.encode(list(lines))

    def src_pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.src.id_to_piece(i) for i in ids]

    def tgt_pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.tgt.id_to_piece(i) for i in ids]

    def decode_tgt(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Detokenized target text; special ids are dropped."""
        return self.tgt.decode([[i for i in seq if i > EOS_ID] for seq in ids])

    def to_state(self) -> dict[str, bytes | None]:
        return {"src_model": self._src_bytes, "tgt_model": self._tgt_bytes}

    @classmethod
    def from_state(cls, state: dict[str, bytes | None]) -> Tokenizer:
        return cls(src_model=state["src_model"], tgt_model=state.get("tgt_model"))  # type: ignore[arg-type]

    def save(self, directory: str | Path) -> None:
        """Write `spm.model` (joint) or `spm.src.model` and `spm.tgt.model`."""
        directory = Path(directory)
        files = {"spm.model": self._src_bytes} if self.joint else {
            "spm.src.model": self._src_bytes, "spm.tgt.model": self._tgt_bytes}
        for name, data in files.items():
            write_atomic(directory / name, lambda f, data=data: f.write(data))

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer | None:
        """The tokenizer saved in `directory`, or None when there is none.

        Raises:
            DataError: a model file there that sentencepiece cannot read (emptied or overwritten).
        """
        directory = Path(directory)
        names = (["spm.model"] if (directory / "spm.model").is_file() else
                 ["spm.src.model", "spm.tgt.model"] if all((directory / n).is_file() for n in ("spm.src.model",
                                                                                                "spm.tgt.model"))
                 else [])
        if not names:
            return None
        models = {name: (directory / name).read_bytes() for name in names}

        def damaged(name: str, problem: str) -> DataError:
            return DataError(f"{directory / name}: not a sentencepiece model ({problem}), damaged since the run "
                             "wrote it: restore it, or start the run over with --restart")

        for name, data in models.items():
            if not data:  # which loads, and fails at its first use
                raise damaged(name, "an empty file")
        try:
            return cls(src_model=models[names[0]], tgt_model=models[names[1]] if len(names) > 1 else None)
        except RuntimeError:  # which of the files: each loaded alone
            for name, data in models.items():
                try:
                    spm.SentencePieceProcessor(model_proto=data)
                except RuntimeError as err:
                    raise damaged(name, str(err).strip()) from None
            raise


def train_tokenizer(
    cfg: TokenizerConfig, src_lines: Iterable[str], tgt_lines: Iterable[str], *, seed: int = 0, where: str = "data.train"
) -> Tokenizer:
    """Train sentencepiece on the training text (a seeded sample of `cfg.max_sentences` per side).

    Args:
        where: how errors name the text's origin, e.g. "data.train (corpus/train)".

    Raises:
        DataError: no text at all, or the corpus is too small for `cfg.vocab_size`.
    """
    src_sample = _sample(src_lines, cfg.max_sentences, seed)
    tgt_sample = _sample(tgt_lines, cfg.max_sentences, seed + 1)
    with tempfile.TemporaryDirectory(prefix="nmt-spm-") as folder:
        files = []
        for name, sample in (("src.txt", src_sample), ("tgt.txt", tgt_sample)):
            path = Path(folder) / name
            path.write_text("".join(f"{line.replace(chr(10), ' ')}\n" for line in sample), encoding="utf-8")
            files.append(path)
        return train_tokenizer_on_files(cfg, files[0], files[1], where=where)


def train_tokenizer_on_files(cfg: TokenizerConfig, src_file: Path, tgt_file: Path, *, where: str) -> Tokenizer:
    """Train sentencepiece on text files of one sentence per line (source, target), in a child process.

    sentencepiece holds its whole input, and what it builds from it, in memory; in a
    child process all of it goes back to the system when training ends, so a million
    training sentences never weigh on the memory of the process that then trains the model.

    Raises:
        DataError: no text at all, or too little for `cfg.vocab_size`.
    """
    if cfg.joint:
        tokenizer = Tokenizer(src_model=_train_one(cfg, [src_file, tgt_file], "joint", where))
    else:
        tokenizer = Tokenizer(src_model=_train_one(cfg, [src_file], "source", where),
                              tgt_model=_train_one(cfg, [tgt_file], "target", where))
    with open(tgt_file, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line, _ in zip(f, range(NORMALIZATION_SAMPLE))]
    warn_if_normalized(tokenizer.tgt, lines, f"{where}: sentencepiece's {cfg.normalization} normalization",
                       "set tokenizer.normalization: identity to keep the text as it is")
    return tokenizer


NORMALIZATION_SAMPLE = 10_000
"""Target sentences of the tokenizer's sample that training checks against the normalization."""


def normalized(processor: spm.SentencePieceProcessor, text: str) -> str:
    """`text` as the model reads it, and so as a model trained on it writes it: sentencepiece's normalization
    (`tokenizer.normalization`), its word marks read as spaces."""
    return processor.normalize(text).replace("\u2581", " ").strip(" ")


def warn_if_normalized(processor: spm.SentencePieceProcessor, lines: Sequence[str], what: str, advice: str) -> None:
    """Warn when the normalization (`what` names it, and where the `lines` are from) changes target sentences:
    the model can only write their normalized forms, which the references (the text as it is) do not hold.
    `advice` ends the warning: what to do."""
    changed = [line for line in lines if normalized(processor, line) != line]
    if not changed:
        return
    example = next((f"{c!r} U+{ord(c):04X} becomes {normalized(processor, c)!r}" for c in changed[0]
                    if normalized(processor, c) != c and not c.isspace()), f"{changed[0]!r} becomes "
                   f"{normalized(processor, changed[0])!r}")
    log.warning("%s changes %d of %d target sentences (%s): the model learns and writes the normalized text, which "
                "the references do not hold; %s", what, len(changed), len(lines), example, advice)


def warn_if_unknown(tokenizer: Tokenizer, src_lines: Sequence[str], tgt_lines: Sequence[str], *, given: str,
                    where: str, advice: str) -> None:
    """Warn when a tokenizer made from other text (`given`: "tokenizer.model: FILE") maps characters of training
    sentences (of `where`) to <unk>: the model cannot tell those of the source apart, and translations leave out
    those of the target (`Tokenizer.decode_tgt` drops <unk>), silently, in every sentence that holds them.
    `advice` ends the warning: what to do."""
    sides = (("source", tokenizer.src, src_lines, "the model reads them all as one unknown symbol"),
             ("target", tokenizer.tgt, tgt_lines, "translations leave them out"))
    for side, processor, lines, effect in sides:
        unknown = [line for line, ids in zip(lines, processor.encode(list(lines))) if UNK_ID in ids]
        if not unknown:
            continue
        counts = Counter(c for line in unknown[:1000] for c in set(line))
        chars = [c for c, _ in counts.most_common() if UNK_ID in processor.encode(c)]  # the commonest first
        shown = " ".join(f"{c!r} U+{ord(c):04X}" for c in chars[:5]) + (" ..." if len(chars) > 5 else "")
        log.warning("%s: maps characters of %d of %d %s sentences of %s to <unk> (%s): %s; %s", given, len(unknown),
                    len(lines), side, where, shown, effect, advice)


def _sample(lines: Iterable[str], k: int, seed: int) -> list[str]:
    """Reservoir sample of k non-empty lines, in corpus order, reproducible from the seed."""
    rng = random.Random(seed)
    reservoir: list[tuple[int, str]] = []
    for i, line in enumerate(line for line in lines if line):
        if len(reservoir) < k:
            reservoir.append((i, line))
        else:
            j = rng.randint(0, i)
            if j < k:
                reservoir[j] = (i, line)
    return [line for _, line in sorted(reservoir)]


def _train_one(cfg: TokenizerConfig, files: list[Path], which: str, where: str) -> bytes:
    if all(Path(f).stat().st_size == 0 for f in files):
        raise DataError(
            f"{where}: no {which} training text for the tokenizer: no pair is left after dropping those "
            "with an empty side; check that both files hold text"
        )
    options = dict(
        input=",".join(str(f) for f in files),
        model_type=cfg.type,
        vocab_size=cfg.vocab_size,
        character_coverage=cfg.character_coverage,
        normalization_rule_name=cfg.normalization,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        input_sentence_size=0,  # all of them: the sample already bounds the size
        shuffle_input_sentence=False,
        num_threads=2,
        minloglevel=2,
        max_sentence_length=MAX_SENTENCE_BYTES,
    )
    with tempfile.TemporaryDirectory(prefix="nmt-spm-") as folder:
        model_path = Path(folder) / "spm.model"
        job = subprocess.run([sys.executable, "-c", _CHILD, str(model_path)], input=json.dumps(options), text=True,
                             capture_output=True)
        if job.returncode == 0 and model_path.is_file():
            return _without_input_paths(model_path.read_bytes())
    error = job.stderr.strip().splitlines()[-1] if job.stderr.strip() else f"exit status {job.returncode}"
    found = re.search(r"value <= (\d+)", error)
    if "Vocabulary size is too large" in error or "Vocabulary size too high" in error:
        limit = f" to at most {found.group(1)}" if found else ""
        raise DataError(
            f"tokenizer.vocab_size ({cfg.vocab_size}) is too large for the {which} text of {where}; lower it{limit}"
        )
    needed = re.search(r"smaller than required_chars\. \d+ vs (\d+)", error)
    if needed:  # the characters to cover and the special symbols take that many pieces before any subword
        usual = (" (0.9995 is usual for Chinese and Japanese, whose thousands of characters include many rare "
                 "ones: those then become <unk>)" if cfg.character_coverage > CJK_COVERAGE else "")
        raise DataError(
            f"tokenizer.vocab_size ({cfg.vocab_size}) is below the {needed.group(1)} pieces that the characters of "
            f"the {which} text of {where} and the special symbols take; raise it to at least {needed.group(1)}, "
            f"or lower tokenizer.character_coverage ({cfg.character_coverage:g}){usual}")
    if "!sentences_.empty()" in error:  # it skips longer sentences, and had none left
        raise DataError(
            f"{where}: every sentence of the {which} text is longer than the {MAX_SENTENCE_BYTES:,} bytes sentencepiece learns "
            "from; only '\\n' ends a line: convert a file whose lines end in '\\r' alone (an old Mac file) with "
            "`tr '\\r' '\\n'`, or split its text into sentences")
    raise DataError(f"{where}: sentencepiece failed on the {which} text: {error}")


MAX_SENTENCE_BYTES = 1 << 16
"""The longest sentence (in UTF-8 bytes) sentencepiece learns from; it skips longer ones."""

CJK_COVERAGE = 0.9995
"""The `character_coverage` sentencepiece's authors advise for languages of large character sets (Chinese,
Japanese)."""


# The child process: sentencepiece alone (no torch, no datasets), options as JSON on stdin.
_CHILD = """
import io, json, sys
import sentencepiece as spm
model = io.BytesIO()
try:
    spm.SentencePieceTrainer.train(model_writer=model, **json.load(sys.stdin))
except RuntimeError as err:
    sys.exit(str(err).strip().splitlines()[0] if str(err).strip() else 'RuntimeError')
open(sys.argv[1], 'wb').write(model.getvalue())
"""


def _without_input_paths(model: bytes) -> bytes:
    """The model without the paths of its (temporary) input files, which it records: the same
    sentences give the same bytes, whatever file they were read from.

    Read in protobuf's wire format (https://protobuf.dev/programming-guides/encoding/) rather than
    through sentencepiece's generated `sentencepiece_model_pb2`: that module needs the protobuf
    package, which sentencepiece does not require, at the version that generated it. The path is
    `ModelProto.trainer_spec` (field 2) `.input` (field 1, repeated); the bytes are those protobuf
    writes after clearing it, every other field kept as it was, in its order.
    """
    return _rewrite_field(model, 2, lambda spec: _rewrite_field(spec, 1, None))


def _rewrite_field(message: bytes, number: int, change) -> bytes:
    """`message` with each length-delimited field `number` replaced by `change(its bytes)`, or dropped
    where `change` is None."""
    out = bytearray()
    pos = 0
    while pos < len(message):
        start = pos
        key, key_end = _varint(message, pos)
        wire = key & 7
        if wire == 0:
            _, pos = _varint(message, key_end)
        elif wire in (1, 5):
            pos = key_end + (8 if wire == 1 else 4)
        elif wire == 2:
            size, body = _varint(message, key_end)
            pos = body + size
            if key >> 3 == number:
                if change is not None:
                    inner = change(message[body:pos])
                    out += message[start:key_end] + _encode_varint(len(inner)) + inner
                continue
        else:
            raise ValueError(f"not a sentencepiece model: protobuf wire type {wire} at byte {start}")
        out += message[start:pos]
    if pos != len(message):
        raise ValueError("not a sentencepiece model: its last field runs past the end")
    return bytes(out)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The base-128 varint at `pos` and the position after it."""
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("not a sentencepiece model: it ends inside a number")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        shift += 7
        if byte < 0x80:
            return value, pos


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
