"""Scoring with sacreBLEU (BLEU and chrF on detokenized text, with their signatures)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

from nmt.config import EvalConfig
from nmt.errors import DataError, UserError


def score(hyps: Sequence[str], refs: Sequence[str], cfg: EvalConfig | None = None) -> dict[str, Any]:
    """Corpus BLEU and chrF of `hyps` against one reference each.

    Raises:
        UserError: the two lists differ in length.
    """
    cfg = cfg or EvalConfig()
    if len(hyps) != len(refs):
        raise UserError(f"{len(hyps)} hypotheses but {len(refs)} references: they must pair line by line")
    if not hyps:
        raise UserError("nothing to score: no hypotheses and no references (empty files?)")
    bleu = BLEU(tokenize=cfg.tokenize, lowercase=cfg.lowercase)
    chrf = CHRF()
    b = bleu.corpus_score(list(hyps), [list(refs)])
    c = chrf.corpus_score(list(hyps), [list(refs)])
    return {
        "bleu": round(b.score, 2),
        "chrf": round(c.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "sentences": len(hyps),
    }


def score_files(hyp: str | Path, ref: str | Path, cfg: EvalConfig | None = None) -> dict[str, Any]:
    """`score` of a file of translations against a file of references, line by line.

    Raises:
        DataError: a missing file, invalid UTF-8, or files of different lengths
            (both names and both counts).
    """
    hyps, refs = read_lines(hyp), read_lines(ref)
    _check_pairing(hyp, hyps, ref, refs, "translations and references")
    if not hyps:
        raise DataError(f"{hyp} and {ref}: both empty, nothing to score")
    return score(hyps, refs, cfg)


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file (`.gz` allowed), without line endings.

    Raises:
        DataError: missing or unreadable file, or invalid UTF-8 (with the line number).
    """
    import gzip

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            return list(decode_lines(f, str(path)))
    except (OSError, EOFError) as err:
        raise DataError(f"{path}: cannot read: {err}") from None


def decode_lines(raw_lines: Iterable[bytes], name: str) -> Iterator[str]:
    """Decode the lines of a binary stream (a file, or `sys.stdin.buffer` as "<stdin>") as UTF-8,
    one at a time, without line endings or a leading byte-order mark.

    Raises:
        DataError: invalid UTF-8; the message names `name` and the line number.
    """
    for number, raw in enumerate(raw_lines, start=1):
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as err:
            raise DataError(
                f"{name}:{number}: invalid UTF-8 at byte {err.start} of the line ({err.reason}); convert the input to UTF-8"
            ) from None
        yield line.removeprefix("\ufeff") if number == 1 else line


def _check_pairing(a: str | Path, a_lines: Sequence[str], b: str | Path, b_lines: Sequence[str], what: str) -> None:
    if len(a_lines) != len(b_lines):
        raise DataError(f"{a} has {len(a_lines)} lines but {b} has {len(b_lines)}: {what} must pair line by line")


def format_scores(name: str, scores: dict[str, Any]) -> str:
    """One human-readable line per metric, with the signature."""
    return (
        f"{name}: BLEU = {scores['bleu']:.2f}  chrF = {scores['chrf']:.2f}  ({scores['sentences']} sentences)\n"
        f"  {scores['bleu_signature']}\n  {scores['chrf_signature']}"
    )


def evaluate_checkpoint(
    checkpoint: str | Path,
    *,
    split: str | None = None,
    src: str | Path | None = None,
    ref: str | Path | None = None,
    beam: int | None = None,
    device: str = "auto",
) -> dict[str, dict[str, Any]]:
    """Translate and score the sets `eval_sets` picks. Returns {set name: scores}."""
    from nmt.translate import Translator

    files = _file_set(src, ref)  # read and checked before the model loads
    translator = Translator.from_checkpoint(checkpoint, device=device)
    cfg = translator.cfg
    results = {}
    for name, (sources, references) in (files or eval_sets(cfg, split=split)).items():
        hyps = translator.translate(sources, beam=beam)
        results[name] = {**score(hyps, references, cfg.eval), "beam": beam or cfg.decode.beam}
    return results


def eval_sets(
    cfg, *, split: str | None = None, src: str | Path | None = None, ref: str | Path | None = None
) -> dict[str, tuple[list[str], list[str]]]:
    """{name: (sources, references)}: the files `src` and `ref`, or the config's `split`
    ('valid', 'test' for every test set, or one test set's name; default 'test').
    """
    from nmt.data.corpus import clean_pairs, load_pairs

    files = _file_set(src, ref)
    if files:
        return files
    data = cfg.data
    split = split or "test"
    if split == "valid" and data.valid is not None:
        specs = {"valid": data.valid}
    elif split == "test":
        specs = dict(data.test)
    elif split in data.test:
        specs = {split: data.test[split]}
    else:
        names = ", ".join(dict.fromkeys(["valid", "test", *data.test]))
        raise UserError(
            f"--split {split!r}: not in the checkpoint's data config (choose from {names}); "
            "or score other files with --src and --ref"
        )
    if not specs:
        raise UserError("the checkpoint's config has no data.test sets; use --src and --ref")
    sets = {}
    for name, spec in specs.items():
        try:
            pairs, _ = clean_pairs(load_pairs(spec, src_lang=data.src_lang, tgt_lang=data.tgt_lang))
        except DataError as err:
            key = "data.valid" if spec is data.valid else f"data.test.{name}"
            raise DataError(f"the checkpoint's {key}: {err}; or score other files with --src and --ref") from None
        sets[name] = (list(pairs["src"]), list(pairs["tgt"]))
    return sets


def _file_set(src: str | Path | None, ref: str | Path | None) -> dict[str, tuple[list[str], list[str]]] | None:
    """{src: (sources, references)} from `--src` and `--ref`, or None when neither is given."""
    if src is None and ref is None:
        return None
    if src is None or ref is None:
        raise UserError("--src and --ref go together: give both, or neither to use --split")
    sources, references = read_lines(src), read_lines(ref)
    _check_pairing(src, sources, ref, references, "sources and references")
    return {str(src): (sources, references)}
