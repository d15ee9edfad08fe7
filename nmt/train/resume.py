"""The run directory: making it ready, the progress record, and resuming from its newest checkpoint."""

from __future__ import annotations

import dataclasses
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nmt.config import ExperimentConfig, config_to_dict
from nmt.errors import UserError
from nmt.runtime import Dist, seed_everything, set_rng_states
from nmt.train.checkpoint import load_checkpoint, remove_stale_temporaries

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of this epoch already consumed
    best_metric: float | None = None
    bad_validations: int = 0
    train_seconds: float = 0.0
    validated_step: int = -1  # step of the last validation
    last_valid: dict[str, float] = dataclasses.field(default_factory=dict)  # its scores


def resume(path: Path, cfg: ExperimentConfig, ctx: Dist, model, optimizer, scheduler, scaler) -> Progress:
    """Load every piece of training state from `path`; return the progress it records."""
    payload = load_checkpoint(path)
    check_same_model(payload, cfg, path)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    if scaler.is_enabled() and payload.get("scaler"):
        scaler.load_state_dict(payload["scaler"])
    known = {f.name for f in dataclasses.fields(Progress)}
    progress = Progress(**{k: v for k, v in payload["progress"].items() if k in known})
    progress.last_valid = progress.last_valid or payload.get("valid", {})  # where older checkpoints kept it
    states = payload["rng"] if isinstance(payload["rng"], list) else [payload["rng"]]
    if len(states) == ctx.world_size:
        set_rng_states(states[ctx.rank])
    else:
        seed_everything(cfg.train.seed + ctx.rank + progress.step)
        log.warning("%s was written by %d processes, now %d: data order and random streams change on resume",
                    path, len(states), ctx.world_size)
    if ctx.is_main:
        log.info("resumed from %s at step %d", path, progress.step)
    return progress


def prepare_run_dir(run_dir: Path, restart: bool) -> None:
    """Create the run directory and make sure it is writable before any work starts.

    The caller holds the run directory's lock (`nmt.train.lock`); `restart` deletes the run's
    outputs but never `.lock`, which another process may be waiting on.
    """
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_bytes(b"0" * 4096)
        probe.unlink()
    except OSError as err:
        raise UserError(f"run_dir {run_dir}: not writable ({err.strerror}); choose another run_dir") from None
    remove_stale_temporaries(run_dir)
    if restart:
        for p in [*run_dir.glob("ckpt_*.pt"), run_dir / "best.pt", run_dir / "averaged.pt", run_dir / "metrics.jsonl"]:
            p.unlink(missing_ok=True)
        for p in run_dir.glob("spm*.model"):
            p.unlink()
        shutil.rmtree(run_dir / "cache", ignore_errors=True)
        shutil.rmtree(run_dir / "tensorboard", ignore_errors=True)


def check_same_model(payload: dict[str, Any], cfg: ExperimentConfig, path: Path) -> None:
    """Refuse to resume when the config changed what the weights mean."""
    saved = payload.get("config", {})
    now = config_to_dict(cfg)
    for section in ("model", "tokenizer"):
        if saved.get(section) != now[section]:
            raise UserError(
                f"{path}: the run directory holds a run with a different {section} section; "
                f"use --restart to start over or choose another run_dir"
            )
