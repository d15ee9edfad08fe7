"""One reproducible experiment: train (or resume), evaluate every test set, write results JSON.

`make multi30k-transformer` and friends call `nmt experiment CONFIG`; the JSON in
`results/<experiment>.json` is what `make results` renders into the README.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from nmt.analysis import bleu_by_length
from nmt.config import ExperimentConfig
from nmt.data.eval_sets import eval_sets
from nmt.errors import CheckpointError
from nmt.metrics import score
from nmt.runtime import is_main_process, pick_device
from nmt.train.loop import train
from nmt.translate import Translator

log = logging.getLogger(__name__)


def hardware(device: torch.device) -> str:
    """A short description of what trained on `device`: its GPUs (one a process), or the CPU (and, under torchrun,
    how many processes)."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if device.type == "cuda":  # the GPUs this run used, not all the machine has
        return f"{processes}x {torch.cuda.get_device_name(device)}"
    if device.type == "mps":
        return "Apple GPU (MPS)"
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    threads = torch.get_num_threads()
    per_process = f"{threads} thread{'s' if threads > 1 else ''}"
    if processes > 1:
        per_process = f"{processes} processes x {per_process}"
    return f"CPU, {os.cpu_count()} cores, {per_process} ({model})"


def training_speed(metrics_file: Path) -> float | None:
    """Median target tokens/s over the logged training windows (None without a log)."""
    if not metrics_file.is_file():
        return None
    speeds = [r["tokens_per_s"] for r in map(json.loads, metrics_file.read_text().splitlines())
              if r.get("event") == "train" and r.get("step", 0) > 1]
    return round(statistics.median(speeds), 1) if speeds else None


def pick_checkpoint(
    run_dir: Path, cfg: ExperimentConfig, device: str = "auto"
) -> tuple[Path, Any, dict[str, dict[str, float]]]:
    """A `Translator` of the checkpoint to report: `best.pt`, or `averaged.pt` where training
    wrote one and it translates the validation set at least as well (with the config's beam;
    BLEU first, then chrF).

    Averaging pays off near convergence; over a short run the average reaches back to weak
    early checkpoints and can lose to the best single one, so the validation set decides.
    Returns the checkpoint, its `Translator`, and the validation BLEU and chrF of each
    candidate ({} when there is only best.pt).
    """
    candidates = [p for p in (run_dir / "averaged.pt", run_dir / "best.pt") if p.is_file()]
    if not candidates:
        raise CheckpointError(f"{run_dir}: no best.pt to score; train first")
    translators = [Translator.from_checkpoint(p, device=device) for p in candidates]
    if len(translators) == 1:
        return candidates[0], translators[0], {}
    sources, refs = eval_sets(cfg, split="valid")["valid"]
    scores = {}
    for path, translator in zip(candidates, translators):
        s = score(translator.translate(sources), refs, cfg.eval)
        scores[path.name] = {"bleu": s["bleu"], "chrf": s["chrf"]}
    def rank(i: int) -> tuple[float, float, int]:  # BLEU decides, chrF breaks a tie, then averaged.pt (listed first)
        s = scores[candidates[i].name]
        return s["bleu"], s["chrf"], -i

    best = max(range(len(candidates)), key=rank)
    return candidates[best], translators[best], scores


def run_experiment(cfg: ExperimentConfig, name: str, *, results_dir: str | Path = "results",
                   restart: bool = False, device: str = "auto", overrides: Sequence[str] = ()) -> dict[str, Any] | None:
    """Train `cfg` (resuming an interrupted run), score the checkpoint `pick_checkpoint` chooses
    on every test set with the config's beam, and write `results_dir/<name>.json`.

    Under torchrun every process trains and rank 0 alone scores and writes; the others return None.

    `overrides` are the `--set` options `cfg` was loaded with; the JSON records them so that a
    number trained with a shorter budget than its config says is never mistaken for the full run.
    """
    summary = train(cfg, restart=restart)
    if not is_main_process():
        return None
    run_dir = Path(cfg.run_dir)
    checkpoint, translator, valid_scores = pick_checkpoint(run_dir, cfg, device)
    tests = {}
    for set_name, (sources, refs) in eval_sets(translator.cfg, split="test").items():
        log.info("%s: translating %d sentences (beam %d)", set_name, len(sources), translator.cfg.decode.beam)
        hyps = translator.translate(sources)
        tests[set_name] = {
            **score(hyps, refs, cfg.eval),
            "by_length": bleu_by_length(sources, hyps, refs, cfg=cfg.eval),
        }
        (run_dir / f"{set_name}.hyp").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    result = {
        "experiment": name,
        "direction": f"{cfg.data.src_lang}-{cfg.data.tgt_lang}",
        "model": translator.model.name,
        "checkpoint": str(checkpoint),
        "valid_by_checkpoint": valid_scores,
        "beam": cfg.decode.beam,
        "overrides": list(overrides),
        "parameters": summary["parameters"],
        "steps": summary["step"],
        "train_seconds": summary["train_seconds"],
        "stopped_by": summary["stop"],
        "tokens_per_s": training_speed(run_dir / "metrics.jsonl"),
        "hardware": hardware(pick_device(cfg.train.device)),
        "valid": summary["last_valid"],
        "test": tests,
    }
    out = Path(results_dir) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result
