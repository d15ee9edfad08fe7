"""One reproducible experiment: train (or resume), evaluate every test set, write results JSON.

`make multi30k-transformer` and friends call `nmt experiment CONFIG`; the JSON in
`results/<experiment>.json` is what `make results` renders into the README.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nmt.analysis import bleu_by_length
from nmt.checkpoint import latest_checkpoint, load_checkpoint, periodic_step
from nmt.config import DataConfig, ExperimentConfig
from nmt.data.eval_sets import eval_sets
from nmt.decode import SearchOptions
from nmt.errors import CheckpointError, UserError, shorten
from nmt.fileio import write_atomic, write_lines
from nmt.launch import is_main_process
from nmt.metrics import METRICS, score, with_metrics
from nmt.runtime import hardware, pick_device
from nmt.train.loop import train
from nmt.train.validate import early_stop_metric
from nmt.translate import Translator

log = logging.getLogger(__name__)

NAME_MAX = 255
"""The most bytes a file name may have on the common file systems (ext4, xfs, btrfs; APFS and NTFS count characters)."""


def logged(metrics_file: Path) -> list[dict[str, Any]]:
    """The records of a run's `metrics.jsonl` (none without the file)."""
    if not metrics_file.is_file():
        return []
    return [json.loads(line) for line in metrics_file.read_text(encoding="utf-8").splitlines()]


def trained_on(records: list[dict[str, Any]], fallback: str) -> str:
    """The hardware the run's sessions trained on, from their `start` records, each named once in order
    (`fallback` for a run logged before sessions recorded it)."""
    names = [r["hardware"] for r in records if r.get("event") == "start" and r.get("hardware")]
    return " + ".join(dict.fromkeys(names)) or fallback


def training_speed(records: list[dict[str, Any]]) -> float | None:
    """Median target tokens/s over the logged training windows (None without any)."""
    speeds = [r["tokens_per_s"] for r in records if r.get("event") == "train" and r.get("step", 0) > 1]
    return round(statistics.median(speeds), 1) if speeds else None


def validation_at(records: list[dict[str, Any]], step: int) -> dict[str, float] | None:
    """The validation scores logged at `step` (the last such record, after a resume), or None."""
    found = [r for r in records if r.get("event") == "valid" and r.get("step") == step]
    return {k: v for k, v in found[-1].items() if k not in ("event", "step", "best", "seconds")} if found else None


def search_options(translator: Translator, cfg: ExperimentConfig) -> SearchOptions:
    """The search `cfg.decode` describes, for `translator` (whose own defaults are its checkpoint's)."""
    return translator.options(**dataclasses.asdict(cfg.decode))


def pick_checkpoint(
    run_dir: Path, cfg: ExperimentConfig, device: str | None = None
) -> tuple[Path, Any, dict[str, dict[str, float]]]:
    """A `Translator` of the checkpoint to report: `best.pt`, or `averaged.pt` where training
    wrote one and it translates the validation set at least as well (with `cfg`'s search settings
    and scoring), on `device` (None: the config's `train.device`, where the run trained).

    "As well" is by the metric that picked `best.pt` (`train.early_stop_metric`: BLEU, chrF or TER),
    then BLEU, then chrF, each scored whatever `eval.metrics` says; a run that picked by the validation
    loss is judged by BLEU, since the choice is about the translations reported.

    An `averaged.pt` of an earlier end of the run (one continued since with `train.average_last: 0`, which
    leaves the file as it was) is left out, with a warning: its weights are not those of the run reported.

    Averaging pays off near convergence; over a short run the average reaches back to weak
    early checkpoints and can lose to the best single one, so the validation set decides.
    Returns the checkpoint, its `Translator`, and the validation BLEU and chrF (and the early-stopping
    metric) of each candidate ({} when there is only best.pt).
    """
    averaged = run_dir / "averaged.pt"
    candidates = [p for p in (averaged, run_dir / "best.pt") if p.is_file() and not (p == averaged and _stale(p, run_dir))]
    if not candidates:
        raise CheckpointError(f"{run_dir}: no best.pt to score; train first")
    translators = [Translator.from_checkpoint(p, device=device or cfg.train.device) for p in candidates]
    if len(translators) == 1:
        return candidates[0], translators[0], {}
    valid = eval_sets(cfg, split="valid")["valid"]
    sources, refs = valid.sources, valid.references
    first = METRICS[early_stop_metric(cfg)]
    first = first if first.scorer is not None else METRICS["bleu"]
    order = list(dict.fromkeys([first.name, "bleu", "chrf"]))
    scores = {}
    for path, translator in zip(candidates, translators):
        s = score(translator.translate(sources, search_options(translator, cfg)), refs,
                  with_metrics(cfg.eval, order, besides=False))  # the choice reads these only
        scores[path.name] = {name: s[name] for name in order}
    best = [p.name for p in candidates].index(better_checkpoint(scores, order))
    return candidates[best], translators[best], scores


def better_checkpoint(scores: dict[str, dict[str, float]], order: Sequence[str]) -> str:
    """The name in `scores` whose scores are best by the first metric of `order` (each in its own direction:
    TER is better lower), a tie broken by the next; a tie on all of them goes to the name listed first."""
    names = list(scores)

    def rank(name: str) -> tuple[float, ...]:
        s = scores[name]
        return *(s[m] if METRICS[m].higher_is_better else -s[m] for m in order), -names.index(name)

    return max(names, key=rank)


def _stale(averaged: Path, run_dir: Path) -> bool:
    """Whether the run in `run_dir` trained on past the newest checkpoint that `averaged` is the mean of (said
    in a warning). Training writes averaged.pt at its end (`train.average_last`), and `nmt average --last`
    after it, so the newest checkpoint averaged is the run's newest; a checkpoint that does not name those it
    averages counts as current."""
    latest = latest_checkpoint(run_dir)
    steps = [periodic_step(p) for p in load_checkpoint(averaged).get("averaged", [])]
    if latest is None or not steps or None in steps:
        return False
    newest, end = max(steps), periodic_step(latest)
    if end is None or newest >= end:
        return False
    log.warning("%s: the mean of checkpoints up to step %d, but the run has trained on to step %d since: it is "
                "left out, and best.pt is scored; set train.average_last to write the average of the run's end, "
                "or run nmt average --last N %s", averaged, newest, end, run_dir)
    return True


def _say_if_another_runs(out: Path, run_dir: Path) -> None:
    """Warn when `out` holds the results of a run in another directory than `run_dir`: two configs of one file name
    (`a/exp.yaml`, `b/exp.yaml`) write one results file, and the second would replace the first's unsaid."""
    try:
        earlier = json.loads(out.read_text(encoding="utf-8"))["checkpoint"]
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or not a results file of ours
        return
    if Path(earlier).resolve().parent != run_dir.resolve():
        log.warning("%s held the results of the run in %s, not this one's (%s): replaced; give nmt experiment "
                    "--name to keep both", out, Path(earlier).parent, run_dir)


def run_experiment(cfg: ExperimentConfig, name: str, *, results_dir: str | Path = "results",
                   restart: bool = False, device: str | None = None,
                   overrides: Sequence[str] = ()) -> dict[str, Any] | None:
    """Train `cfg` (resuming an interrupted run), score the checkpoint `pick_checkpoint` chooses
    on every test set, and write `results_dir/<name>.json`.

    The test sets are translated on `device`, by default the config's `train.device`: a run kept off a GPU
    (`train.device: cpu`) or given one GPU (`cuda:1`) is scored there too, not on the GPU `auto` picks. The
    JSON's `scored_on` names it.

    The test sets, the search settings and the scoring are `cfg`'s (`data.test`, `decode`, `eval`), not those
    stored in the checkpoint, and the JSON records the search settings used. BLEU and chrF, on which the
    results table and the choice of checkpoint are built, are scored whatever `eval.metrics` says, and
    those metrics besides.

    Under torchrun every process trains and rank 0 alone scores and writes; the others return None.

    The JSON's `valid` is the run's last validation (at `valid_step`), `best_valid` that of `best.pt` (at
    `best_step`), the checkpoint the test sets are scored with unless `checkpoint` names `averaged.pt`
    (`valid_by_checkpoint` then has both candidates' scores with `cfg`'s search).

    `overrides` are the `--set` options `cfg` was loaded with; the JSON records them so that a
    number trained with a shorter budget than its config says is never mistaken for the full run.
    """
    if not name or name in (".", "..") or "/" in name or "\0" in name:  # before training, not when writing its results
        raise UserError(f"--name {shorten(repr(name))}: not a file name; the results go to {results_dir}/<name>.json, "
                        "which the results table reads (python -m nmt.results): give a name without '/'")
    if len(os.fsencode(f"{name}.json")) > NAME_MAX:  # else refused by the file system after the whole run
        raise UserError(f"--name {shorten(repr(name))}: too long for a file name (NAME.json may have at "
                        f"most {NAME_MAX} bytes, the most file systems take); give a shorter name")
    if not cfg.data.test:  # found out before training, not after it
        raise UserError("data.test: no test sets, and nmt experiment scores them after training: add them to "
                        "the config (data.test: {NAME: {kind: text, path: PREFIX}}), or use nmt train")
    # read before training, so that a test set that cannot be read fails now, not after the run
    test_sets = eval_sets(cfg, split="test", of_checkpoint=False) if is_main_process() else None
    summary = train(cfg, restart=restart)
    if not is_main_process():
        return None
    run_dir = Path(cfg.run_dir)
    checkpoint, translator, valid_scores = pick_checkpoint(run_dir, cfg, device)
    options = search_options(translator, cfg)
    tests = {}
    for set_name, test_set in (test_sets or eval_sets(cfg, split="test")).items():
        sources, refs = test_set.sources, test_set.references
        log.info("%s: translating %d sentences (beam %d)", set_name, len(sources), options.beam)
        hyps = translator.translate(sources, options)
        tests[set_name] = {
            **score(hyps, refs, with_metrics(cfg.eval)),
            "by_length": bleu_by_length(sources, hyps, refs, cfg=cfg.eval),
        }
        write_lines(run_dir / f"{DataConfig.set_file_stem(set_name)}.hyp", test_set.hyp_lines(hyps))
    records = logged(run_dir / "metrics.jsonl")
    result = {
        "experiment": name,
        "direction": f"{cfg.data.src_lang}-{cfg.data.tgt_lang}",
        "model": translator.model.name,
        "checkpoint": str(checkpoint),
        "valid_by_checkpoint": valid_scores,
        "beam": options.beam,
        "decode": dataclasses.asdict(cfg.decode),
        "overrides": list(overrides),
        "parameters": summary["parameters"],
        "steps": summary["step"],
        "train_seconds": summary["train_seconds"],
        "stopped_by": summary["stop"],
        "tokens_per_s": training_speed(records),
        "hardware": trained_on(records, fallback=hardware(pick_device(cfg.train.device))),
        "scored_on": str(translator.device),
        "valid": summary["last_valid"],
        "valid_step": summary["validated_step"],
        "best_step": summary["best_step"],
        "best_valid": validation_at(records, summary["best_step"]),
        "test": tests,
    }
    out = Path(results_dir) / f"{name}.json"
    _say_if_another_runs(out, run_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = (json.dumps(result, indent=2) + "\n").encode("utf-8")
    write_atomic(out, lambda f: f.write(text))  # a crash leaves the earlier results whole
    return result
