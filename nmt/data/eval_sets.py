"""The sets a model is scored on: a config's validation or test sets, or a pair of files."""

from __future__ import annotations

from pathlib import Path

from nmt.config import ExperimentConfig
from nmt.data.corpus import clean_pairs, load_pairs
from nmt.data.text import read_parallel
from nmt.errors import DataError, UserError

EvalSets = dict[str, tuple[list[str], list[str]]]
"""{name: (sources, references)}."""


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
    files = file_set(src, ref)
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
            raw = load_pairs(spec, src_lang=data.src_lang, tgt_lang=data.tgt_lang)
            pairs, _ = clean_pairs(raw)
            if not len(pairs):  # found now, not once a run has trained and comes to score it
                why = f"each of its {len(raw)} pairs has an empty side" if len(raw) else "its files are empty"
                raise DataError(f"{spec.path}: nothing to score: {why}")
        except DataError as err:
            key = "data.valid" if spec is data.valid else f"data.test.{name}"
            if not of_checkpoint:
                raise DataError(f"{key}: {err}") from None
            raise DataError(f"the checkpoint's {key}: {err}; or score other files with --src and --ref") from None
        sets[name] = (list(pairs["src"]), list(pairs["tgt"]))
    return sets


def file_set(src: str | Path | None, ref: str | Path | None) -> EvalSets | None:
    """{src: (sources, references)} from `--src` and `--ref`, or None when neither is given."""
    if src is None and ref is None:
        return None
    if src is None or ref is None:
        raise UserError("--src and --ref go together: give both, or neither to use --split")
    return {str(src): read_parallel(src, ref)}
