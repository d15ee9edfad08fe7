"""Scoring a checkpoint or ready translations with sacreBLEU (`nmt eval`).

The metrics themselves are in `nmt.metrics`, the sets to score in `nmt.data.eval_sets`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nmt.config import DataConfig, EvalConfig
from nmt.data.text import read_scored, reference_files
from nmt.fileio import write_lines
from nmt.metrics import check_tokenizer, score

log = logging.getLogger(__name__)


def score_files(hyp: str | Path, ref: str | Path | Sequence[str | Path], cfg: EvalConfig | None = None
                ) -> dict[str, Any]:
    """`score` of a file of translations against a file of references, line by line, or against several (a list:
    several references of each line).

    Raises:
        DataError: a missing file, invalid UTF-8, or files of different lengths
            (both names and both counts).
    """
    hyps, (first, *more) = read_scored(hyp, reference_files(ref), "translations and references")
    return score(hyps, first, cfg, more_refs=more)


def evaluate_checkpoint(
    checkpoint: str | Path | Sequence[str | Path],
    *,
    split: str | None = None,
    src: str | Path | None = None,
    ref: str | Path | Sequence[str | Path] | None = None,
    beam: int | None = None,
    device: str = "auto",
    save_dir: str | Path | None = None,
    tokenize: str | None = None,
    metrics: Sequence[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Translate with `checkpoint` (several: their ensemble, with the first's config) and score the sets
    `eval_sets` picks. Returns {set name: scores}.

    With `save_dir`, each set's translations are also written to `save_dir/<set>.hyp`
    (the file name of `src` when scoring files), one line per row of the set, an empty one where a pair with
    an empty side was not scored (`EvalSet.hyp_lines`); `tokenize` and `metrics` replace the checkpoint's
    `eval.tokenize` and `eval.metrics`.
    """
    # imported here: scoring ready translations (`score_files`) needs neither torch nor datasets, 2 s of imports
    from nmt.data.eval_sets import eval_sets, file_set
    from nmt.decode.options import check_search_flags
    from nmt.translate import Translator

    check_search_flags(beam=beam)  # this and the files are checked before the model loads
    files = file_set(src, reference_files(ref))
    translator = Translator.from_checkpoint(checkpoint, device=device)
    cfg = translator.cfg
    settings = dataclasses.replace(cfg.eval, tokenize=tokenize or cfg.eval.tokenize,
                                   metrics=list(metrics or cfg.eval.metrics))
    first = checkpoint if isinstance(checkpoint, (str, Path)) else checkpoint[0]
    check_tokenizer(settings, str(first))  # before translating, not after
    out = Path(save_dir) if save_dir is not None else None
    results = {}
    for name, scored in (files or eval_sets(cfg, split=split)).items():
        log.info("%s: translating %d sentences (beam %d)", name, len(scored.sources), beam or cfg.decode.beam)
        hyps = translator.translate(scored.sources, beam=beam)
        results[name] = {**score(hyps, scored.references, settings, more_refs=scored.more_references),
                         "beam": beam or cfg.decode.beam}
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)  # once there is something to put in it: a failed eval makes none
            stem = Path(name).name if files else DataConfig.set_file_stem(name)
            write_lines(out / f"{stem}.hyp", scored.hyp_lines(hyps))
    return results
