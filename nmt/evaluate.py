"""Scoring with sacreBLEU (BLEU and chrF on detokenized text, with their signatures)."""

from __future__ import annotations

from collections.abc import Sequence
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


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file (`.gz` allowed), without line endings.

    Raises:
        DataError: missing file, or invalid UTF-8 (with the line number).
    """
    import gzip

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    opener = gzip.open if path.suffix == ".gz" else open
    lines = []
    with opener(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                lines.append(raw.decode("utf-8").rstrip("\r\n"))
            except UnicodeDecodeError as err:
                raise DataError(f"{path}:{number}: invalid UTF-8 ({err.reason} at byte {err.start})") from None
    return lines


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

    translator = Translator.from_checkpoint(checkpoint, device=device)
    cfg = translator.cfg
    results = {}
    for name, (sources, references) in eval_sets(cfg, split=split, src=src, ref=ref).items():
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

    if src is not None or ref is not None:
        if src is None or ref is None:
            raise UserError("--src and --ref go together")
        return {str(src): (read_lines(src), read_lines(ref))}
    data = cfg.data
    split = split or "test"
    if split == "valid" and data.valid is not None:
        specs = {"valid": data.valid}
    elif split == "test":
        specs = dict(data.test)
    elif split in data.test:
        specs = {split: data.test[split]}
    else:
        names = ", ".join(["valid", "test", *data.test])
        raise UserError(f"--split {split!r}: not in the checkpoint's data config (choose from {names})")
    if not specs:
        raise UserError("the checkpoint's config has no data.test sets; use --src and --ref")
    sets = {}
    for name, spec in specs.items():
        pairs, _ = clean_pairs(load_pairs(spec, src_lang=data.src_lang, tgt_lang=data.tgt_lang))
        sets[name] = (list(pairs["src"]), list(pairs["tgt"]))
    return sets
