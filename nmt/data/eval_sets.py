"""The sets a model is scored on: a config's validation or test sets, or a pair of files."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nmt.config import ExperimentConfig
from nmt.data.corpus import load_pairs
from nmt.data.text import normalize_spaces, read_scored
from nmt.errors import DataError, UserError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalSet:
    """The pairs of a set that are scored, and where they stand among the set's rows.

    A config's set leaves out each pair with an empty side, as training does (`nmt.data.cleaning.clean_pairs`);
    `kept` keeps the row of each pair scored, so that a file of translations (`hyp_lines`) still has one
    line per row of the set, and so lines up with its files.

    Attributes:
        sources, references: the pairs scored, whitespace folded (`normalize_spaces`) for a config's set,
            as read for files given by name.
        kept: the row (from 0) of each pair among the set's `rows`.
        rows: the rows of the set, those left out included.
        more_references: further references of each source, a list per reference file after the first
            (files given by name only).
    """

    sources: list[str]
    references: list[str]
    kept: list[int]
    rows: int
    more_references: tuple[list[str], ...] = ()

    def hyp_lines(self, hyps: Sequence[str]) -> list[str]:
        """The translations `hyps` of the pairs scored, one line per row of the set: empty at a row left out."""
        lines = [""] * self.rows
        for row, hyp in zip(self.kept, hyps, strict=True):
            lines[row] = hyp
        return lines


EvalSets = dict[str, EvalSet]
"""{name: the set}."""


def eval_sets(cfg: ExperimentConfig, *, split: str | None = None, src: str | Path | None = None,
              ref: str | Path | None = None, of_checkpoint: bool = True) -> EvalSets:
    """The files `src` and `ref`, or the config's `split`
    ('valid', 'test' for every test set, or one test set's name; default 'test'). Errors speak of the
    checkpoint's config, or with `of_checkpoint` False of the config a run is about to train.

    Raises:
        UserError: only one of `src` and `ref`, or a split the config does not have.
        DataError: a file that cannot be read, sources and references of different lengths, or a set
            without a pair to score.
    """
    files = file_set(src, [] if ref is None else [ref])
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
        key = "data.valid" if spec is data.valid else f"data.test.{name}"
        try:
            raw = load_pairs(spec, src_lang=data.src_lang, tgt_lang=data.tgt_lang)
            sets[name] = _scored_pairs(raw["src"], raw["tgt"], where=spec.path, key=key)
        except DataError as err:
            if not of_checkpoint:
                raise DataError(f"{key}: {err}") from None
            raise DataError(f"the checkpoint's {key}: {err}; or score other files with --src and --ref") from None
    return sets


def _scored_pairs(sources: Sequence[str | None], targets: Sequence[str | None], *, where: object,
                  key: str) -> EvalSet:
    """The pairs with text on both sides, whitespace folded as `clean_pairs` folds it (nulls are empty);
    a warning names those left out.

    Raises:
        DataError: no pair left to score; the message names `where` (the set's path).
    """
    src = [normalize_spaces(s or "") for s in sources]
    tgt = [normalize_spaces(t or "") for t in targets]
    kept = [i for i, (s, t) in enumerate(zip(src, tgt, strict=True)) if s and t]
    if not kept:  # found now, not once a run has trained and comes to score it
        why = f"each of its {len(src)} pairs has an empty side" if src else "its files are empty"
        raise DataError(f"{where}: nothing to score: {why}")
    if len(kept) < len(src):
        left_out = sorted(set(range(len(src))) - set(kept))
        shown = ", ".join(str(i + 1) for i in left_out[:5]) + (", ..." if len(left_out) > 5 else "")
        one = len(left_out) == 1
        log.warning("%s (%s): %d of its %d pairs %s an empty side and %s not scored (%s %s, counting from 1); its "
                    "saved translations hold an empty line for %s", key, where, len(left_out), len(src),
                    "has" if one else "have", "is" if one else "are", "pair" if one else "pairs", shown,
                    "it" if one else "each")
    return EvalSet([src[i] for i in kept], [tgt[i] for i in kept], kept, len(src))


def check_src_ref(src: str | Path | None, refs: Sequence[str | Path] | None) -> None:
    """Refuse `--src` without `--ref` or the reverse, before any model loads.

    Raises:
        UserError: naming both options.
    """
    if (src is None) != (not refs):
        raise UserError("--src and --ref go together: give both, or neither to use --split")


def file_set(src: str | Path | None, refs: Sequence[str | Path] = ()) -> EvalSets | None:
    """{src: the set} of `--src` and its `--ref` files (several: several references of each line), every line
    scored as read, or None when neither is given."""
    check_src_ref(src, refs)
    if src is None:
        return None
    sources, (first, *more) = read_scored(src, refs, "sources and references")
    return {str(src): EvalSet(sources, first, list(range(len(sources))), len(sources), tuple(more))}
