"""The run directory: making it ready, the progress record, and resuming from its newest checkpoint."""

from __future__ import annotations

import dataclasses
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nmt.checkpoint import first_difference, load_checkpoint, periodic_checkpoints, stored_config
from nmt.config import ExperimentConfig, TokenizerConfig, config_to_dict
from nmt.distributed import Dist, all_gather, on_every_rank, on_main
from nmt.errors import CheckpointError, UserError
from nmt.fileio import remove_stale_temporaries, write_atomic
from nmt.metrics import METRICS, Metric
from nmt.runtime import seed_everything, set_rng_states
from nmt.train.data import TOKENIZER_RECORD
from nmt.train.lock import unwritable_run_dir
from nmt.train.optim import Schedule, load_optimizer_state
from nmt.train.validate import early_stop_metric, stop_metric

log = logging.getLogger(__name__)


EPOCH_CUT = ("max_tokens", "seed", "batch_order", "pad_to_multiple", "length_buckets", "batch_shapes")
"""The `train` settings that can change how an epoch is cut into batches (the padding ones where batch shapes are
static or pairs are sorted by both lengths): a run resumed mid-epoch with one of them changed may take the rest of
the epoch from another cut, while `Progress.batch_in_epoch` counts batches of the first."""


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
    best_step: int = -1  # step of the best validation, the step best.pt holds; -1 in checkpoints before it was kept
    off_schedule: bool = False  # this checkpoint was written where training stopped, or where fine-tuning starts,
    # off the save schedule: the run's next checkpoint replaces it (`nmt.train.saving.write_checkpoints`)


def resume_run(run_dir: Path, cfg: ExperimentConfig, ctx: Dist, model: nn.Module, optimizer: torch.optim.Optimizer,
               scheduler: Schedule, scaler: torch.amp.GradScaler) -> Progress:
    """Resume from the newest readable checkpoint of `run_dir`; a fresh `Progress` when it has none.

    Rank 0 first chooses it, setting unreadable newer checkpoints aside, checks that this config can resume
    it, and makes `best.pt` agree with the progress it records (`restore_best`); the other ranks wait, then
    read the file it chose. An error any rank meets stops every rank, printed once (`on_main`, `on_every_rank`).

    Raises:
        CheckpointError: `run_dir` has periodic checkpoints but none of them is readable, or the newest
            cannot be resumed.
        UserError: the checkpoint's model or tokenizer section is not this config's.
    """
    chosen = on_main(lambda: _choose_checkpoint(run_dir, cfg), ctx)
    path, payload = chosen if chosen is not None else (None, None)
    named = all_gather(None if path is None else str(path), ctx)[0]  # rank 0's choice, on every rank

    def load_and_resume() -> Progress:
        nonlocal payload
        if named is None:
            return Progress()
        if payload is None:  # another rank than 0
            payload = load_checkpoint(Path(named))
        return resume(Path(named), payload, cfg, ctx, model, optimizer, scheduler, scaler)

    return on_every_rank(load_and_resume, ctx)


def _choose_checkpoint(run_dir: Path, cfg: ExperimentConfig) -> tuple[Path | None, dict[str, Any] | None]:
    """Rank 0's part of `resume_run`: the newest readable checkpoint and its payload, checked, with `best.pt`
    repaired; (None, None) when there is none."""
    path, payload = newest_readable_checkpoint(run_dir)
    if path is None or payload is None:
        return None, None
    check_resumable(path, payload)
    check_same_model(payload, cfg, path)
    restore_best(run_dir, payload["progress"])
    return path, payload


def check_resumable(path: Path, payload: dict[str, Any]) -> None:
    """Raise `CheckpointError` unless `payload` holds the training state a run resumes from."""
    missing = [k for k in ("model", "optimizer", "scheduler", "progress", "rng") if k not in payload]
    if missing:
        raise CheckpointError(f"{path}: holds no training state ({', '.join(missing)}), so a run cannot resume "
                              "from it (an averaged or copied checkpoint?); to start a new run from its weights, "
                              "set train.init_from to it and use a run_dir without ckpt_*.pt files")


def newest_readable_checkpoint(run_dir: Path) -> tuple[Path | None, dict[str, Any] | None]:
    """The newest periodic checkpoint that loads, and its payload; (None, None) when there are none.

    Newer ones that do not load (truncated, empty, not a checkpoint) are renamed to
    `ckpt_<step>.pt.damaged`, never deleted, with one warning each. When none loads, nothing is
    renamed: the run stops with the newest one's error instead of silently starting over.

    Raises:
        CheckpointError: no periodic checkpoint of `run_dir` loads.
    """
    found = periodic_checkpoints(run_dir)
    damaged: list[tuple[Path, CheckpointError]] = []
    for path in reversed(found):
        try:
            payload = load_checkpoint(path)
        except CheckpointError as err:
            damaged.append((path, err))
            continue
        for bad, err in damaged:
            aside = bad.with_name(bad.name + ".damaged")
            bad.replace(aside)
            log.warning("%s; set aside as %s, resuming from %s", err, aside.name, path.name)
        return path, payload
    if damaged:
        raise CheckpointError(f"{damaged[0][1]}; no earlier checkpoint in {run_dir} is readable either: "
                              "move the damaged files away, or use --restart to start over")
    return None, None


def restore_best(run_dir: Path, progress: dict[str, Any]) -> None:
    """Make `best.pt` the checkpoint of the best step that `progress` records.

    Training (`nmt.train.saving.CheckpointWriter`) writes `ckpt_<step>.pt`, then `best.pt`, then
    prunes, each atomically: a kill between the first two leaves a `best.pt` of an earlier step, or
    none, while the progress and `metrics.jsonl` already name the new best step; its `ckpt_<step>.pt`
    is still there, since pruning comes last. Copying it over `best.pt` (atomically) repairs the run directory.
    """
    best_step = progress.get("best_step", -1)
    if best_step < 0:  # no validation yet, or a checkpoint from before best_step was kept
        return
    best = run_dir / "best.pt"
    try:
        held_step = load_checkpoint(best)["progress"]["step"]
        if held_step == best_step:
            return
        held = f"holds step {held_step}"
    except CheckpointError as err:
        held = "is missing" if not best.exists() else f"is unreadable ({err})"
    except (KeyError, TypeError):
        held = "holds no progress record"
    source = run_dir / f"ckpt_{best_step}.pt"
    if not source.is_file():
        log.warning("%s %s, but the best validation was at step %d and %s is gone: best.pt is not that "
                    "step's model until a later validation improves on it", best, held, best_step, source.name)
        return
    with source.open("rb") as f:
        write_atomic(best, lambda out: shutil.copyfileobj(f, out))
    log.warning("%s %s, but the best validation was at step %d (an interrupted save?): rebuilt it from %s",
                best, held, best_step, source.name)


def resume(path: Path, payload: dict[str, Any], cfg: ExperimentConfig, ctx: Dist, model: nn.Module,
           optimizer: torch.optim.Optimizer, scheduler: Schedule, scaler: torch.amp.GradScaler) -> Progress:
    """Load every piece of training state from `payload`, read from `path`; return the progress it records."""
    check_resumable(path, payload)  # again here: the other ranks of a torchrun job read the file themselves
    check_same_model(payload, cfg, path)
    model.load_state_dict(payload["model"])
    try:
        load_optimizer_state(optimizer, model, payload["optimizer"], payload["model"])
    except ValueError as err:
        raise CheckpointError(f"{path}: cannot resume its optimizer ({err}); to start a new run from its weights, "
                              "set train.init_from to it and use a run_dir without ckpt_*.pt files") from None
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
        # The writers took the epoch's first `batch_in_epoch` x writers batches between them (rank r every
        # writers-th): the processes now share the rest. Cut for another count, the epoch's list may split a
        # batch more or less, so a few pairs at the seam are taken again, or left for the next epoch.
        taken = progress.batch_in_epoch * len(states)
        progress.batch_in_epoch = taken // ctx.world_size
        if ctx.is_main:
            log.warning("%s was written by %d process(es), now %d: they go on after the %d batches of this epoch "
                        "taken so far (a few pairs at the seam again, or not until the next epoch), with new random "
                        "streams; resume with %d for the run's own order", path, len(states), ctx.world_size, taken,
                        len(states))
    saved_train = payload.get("config", {}).get("train", {})
    changed = [(key, saved_train.get(key, "longer" if key == "batch_order" else None), getattr(cfg.train, key))
               for key in EPOCH_CUT]  # a checkpoint from before batch_order was cut in the longer order
    changed = [(key, old, new) for key, old, new in changed if old is not None and old != new]
    if changed and ctx.is_main:
        log.warning("%s was trained with %s: this epoch's remaining batches may be cut anew, so that some of its "
                    "pairs come again and others not until the next epoch; set %s to resume in the run's order", path,
                    ", ".join(f"train.{key}: {old}, now {new}" for key, old, new in changed),
                    ", ".join(f"train.{key}: {old}" for key, old, _ in changed))
    restart_best(path, payload.get("config", {}), cfg, progress, scheduler, ctx)
    now_train = config_to_dict(cfg.train)
    other_optimizer = [f"train.{key}: {now_train[key]} (the checkpoint's: {saved_train[key]})" for key in OPTIMIZER
                       if key in saved_train and saved_train[key] != now_train[key]]
    if other_optimizer and ctx.is_main:
        log.info("%s: resuming with %s; the optimizer's moments and step count carry over", path,
                 ", ".join(other_optimizer))
    saved_data, data = payload.get("config", {}).get("data", {}), config_to_dict(cfg.data)
    other_data = [f"data.{key}" for key in TRAINING_SET if key in saved_data and saved_data[key] != data[key]]
    if other_data and ctx.is_main:  # fine-tuning on in a run directory, say: allowed, and said
        log.warning("%s was trained with another %s: training goes on with this config's, its epoch %d after the "
                    "first %d batches of this config's own, the optimizer and schedule as they were", path,
                    " and ".join(other_data), progress.epoch, progress.batch_in_epoch)
    if ctx.is_main:
        log.info("resumed from %s at step %d", path, progress.step)
    return progress


def restart_best(path: Path, saved: dict[str, Any], cfg: ExperimentConfig, progress: Progress,
                 scheduler: Schedule, ctx: Dist) -> None:
    """Forget the best score, the validations without improvement and the plateau schedule's record when the
    checkpoint's run picked its best by another metric (`train.early_stop_metric`, or the loss it falls back to
    without `train.valid_bleu`), or scored it otherwise: under other `eval` settings (BLEU's `tokenize`, say, which
    `auto` now decides by the target language), on another validation set (`data.valid`, or for a text metric
    another `train.valid_max_sentences`), or, for the loss, with another `train.label_smoothing`. Such scores do
    not compare, so the next validation is the first of the new metric and the best so far. The plateau's rate
    reductions already made stay.

    Args:
        saved: the checkpoint's config, as a dict.
    """
    saved_train = saved.get("train", {})
    name = saved_train.get("early_stop_metric")
    if name not in METRICS:  # a checkpoint that does not say
        return
    before, now = stop_metric(name, valid_bleu=saved_train.get("valid_bleu", True)), early_stop_metric(cfg)
    scoring = _scored_otherwise(saved, cfg, METRICS[now]) if before == now else []
    if before == now and not scoring:
        return
    if ctx.is_main:
        best = "none yet" if progress.best_metric is None else f"{before} {progress.best_metric:.4g} at step " \
                                                               f"{progress.best_step}"
        change = (f"scored {now} with {', '.join(scoring)}" if scoring else
                  f"picked its best checkpoint by {before}, this config picks it by {now} (train.early_stop_metric)")
        log.warning("%s %s: their scores do not compare, so the best (%s), the count of validations without "
                    "improvement (%d) and the plateau schedule's best start anew at the next validation, whose "
                    "checkpoint becomes best.pt", path, change, best, progress.bad_validations)
    progress.best_metric, progress.best_step, progress.bad_validations = None, -1, 0
    scheduler.best, scheduler.bad = None, 0


def _scored_otherwise(saved: dict[str, Any], cfg: ExperimentConfig, metric: Metric) -> list[str]:
    """The settings `metric`'s validation score reads that the checkpoint's config (`saved`) had otherwise, as
    "KEY OLD, now NEW"; keys a checkpoint does not record are taken as unchanged."""
    now = config_to_dict(cfg)
    reads = [("eval", key) for key in metric.reads] + [("data", "valid")]
    reads += [("train", "valid_max_sentences")] if metric.scorer is not None else [("train", "label_smoothing")]
    changed = []
    for section, key in reads:
        if key not in saved.get(section, {}) or saved[section][key] == now[section][key]:
            continue
        old, new = saved[section][key], now[section][key]
        if isinstance(old, dict) and isinstance(new, dict):  # a corpus: named by the keys that changed (its path)
            changed += [f"{section}.{key}.{k} {old.get(k)!r}, now {new.get(k)!r}" for k in sorted(old.keys() | new.keys())
                        if old.get(k) != new.get(k)]
        else:
            changed.append(f"{section}.{key} {old!r}, now {new!r}")
    return changed


def _same_model_file(saved: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether two tokenizer sections each give a sentencepiece model file (`tokenizer.model`) and agree but for
    its path (moved, or named from another folder) and the keys that only training one reads. Whether the file
    holds the run's models is checked by their content (`nmt.train.data`)."""
    ignored = {"model", *TokenizerConfig.TRAINING_KEYS}
    return bool(saved["model"] and now["model"]) and all(
        saved[k] == now[k] for k in saved.keys() | now.keys() if k not in ignored)


def _in_use(config: dict[str, Any], section: str) -> dict[str, Any]:
    """`config[section]`, without the model section's sizes of the type it does not build (a Transformer's
    `rnn` keys): a difference there is named after one in the sizes the weights have."""
    unused = {"rnn", "transformer"} - {config["model"]["type"]} if section == "model" else set()
    return {key: value for key, value in config[section].items() if key not in unused}


OPTIMIZER = ("optimizer", "betas", "eps", "weight_decay")
"""The `train` keys that set the optimizer's groups: a resumed run takes them from its config (`load_optimizer_state`)."""

TRAINING_SET = ("train", "max_len", "max_ratio")
"""The `data` keys that decide which pairs training takes: a resume with others changes the corpus under the epoch."""


REPLACED = ".replaced"
"""The folder in a run directory where `--restart` keeps the run it replaces until the new one has started."""


def _run_outputs(run_dir: Path) -> list[Path]:
    """What a run writes into its directory besides config.yaml and `.lock`: what `--restart` replaces."""
    named = [run_dir / name for name in ("best.pt", "averaged.pt", "metrics.jsonl", TOKENIZER_RECORD, "cache",
                                         "tensorboard")]
    return [*run_dir.glob("ckpt_*.pt"), *run_dir.glob("spm*.model"), *(p for p in named if p.exists())]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def prepare_run_dir(run_dir: Path, restart: bool) -> None:
    """Create the run directory and make sure it is writable before any work starts.

    The caller holds the run directory's lock (`nmt.train.lock`). `restart` moves the run's
    outputs (checkpoints, tokenizer, caches, logs; never `.lock`, which another process may be
    waiting on) into `REPLACED`, where they stay until the new run has started
    (`drop_replaced`): a restart that fails first, on a mistyped corpus path for instance, puts
    them back (`restore_replaced`), so that it leaves the old run as it was. A restart killed
    before its run started leaves them there: the next start puts them back, or, restarting
    again, keeps them aside for its own start.
    """
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_bytes(b"0" * 4096)
        probe.unlink()
    except OSError as err:
        raise unwritable_run_dir(run_dir, err) from None
    remove_stale_temporaries(run_dir)
    aside = run_dir / REPLACED
    if restart and aside.exists() and not aside.is_dir():  # else mkdir's bare FileExistsError below
        raise UserError(f"{aside}: a file, where --restart sets the earlier run aside; move it away")
    if aside.is_dir():  # a --restart that never started: what it wrote since is no run
        if restart:
            for p in _run_outputs(run_dir):
                _remove(p)
        else:
            log.warning("%s: putting back the run that a --restart killed before its start had set aside", run_dir)
            restore_replaced(run_dir)
    elif restart:
        aside.mkdir()
        for p in _run_outputs(run_dir):
            p.rename(aside / p.name)
    _check_run_entries(run_dir)


RUN_FILES = ("config.yaml", "metrics.jsonl", "best.pt", "averaged.pt", TOKENIZER_RECORD, "spm.model", "spm.src.model",
             "spm.tgt.model")
"""The files a run writes in its directory under fixed names (besides `ckpt_N.pt`, which a resume sets aside when
unreadable, and the `tensorboard` folder, checked where it is made)."""


def _check_run_entries(run_dir: Path) -> None:
    """Refuse a folder where the run writes one of its files, and a file where it keeps its corpus cache: found
    at the first write, such a thing ended the run with a bare IsADirectoryError or FileExistsError (status 1),
    the one of best.pt only at the first validation."""
    for name in RUN_FILES:
        if (run_dir / name).is_dir():
            raise UserError(f"{run_dir / name}: a folder, where the run writes its file {name}; move it away")
    cache = run_dir / "cache"
    if cache.exists() and not cache.is_dir():
        raise UserError(f"{cache}: a file, where the run keeps its folder of prepared corpora; move it away")


def restore_replaced(run_dir: Path) -> None:
    """Put the run that `prepare_run_dir` set aside for a restart back in its place (nothing if none was)."""
    aside = run_dir / REPLACED
    if not aside.is_dir():
        return
    for p in _run_outputs(run_dir):  # the failed restart's own, in the way
        _remove(p)
    for p in aside.iterdir():
        p.rename(run_dir / p.name)
    aside.rmdir()


def drop_replaced(run_dir: Path) -> None:
    """Delete the run that a restart set aside, once the new run has started."""
    shutil.rmtree(run_dir / REPLACED, ignore_errors=True)


def check_same_model(payload: dict[str, Any], cfg: ExperimentConfig, path: Path) -> None:
    """Refuse to resume when the config changed what the weights mean: the model or tokenizer section, or the
    language pair or its direction. The checkpoint's config is read as configs are, so that a key added since it
    was written (`tokenizer.normalization`) counts as its default."""
    saved = config_to_dict(stored_config(payload.get("config", {}), path))
    now = config_to_dict(cfg)
    for section in ("model", "tokenizer"):
        if saved[section] == now[section] or (section == "tokenizer" and _same_model_file(saved[section], now[section])):
            continue
        difference = first_difference(_in_use(saved, section), _in_use(now, section), section) or \
            first_difference(saved[section], now[section], section)
        parent = saved["train"]["init_from"]
        if parent and parent != cfg.train.init_from:  # its model and tokenizer were the parent's, not the config's
            raise UserError(
                f"{path}: the run directory holds a run fine-tuned from {parent} (train.init_from), whose model "
                f"and tokenizer it took, and this config names {cfg.train.init_from or 'no parent'}, so its "
                f"{section} section differs ({difference}, the run's vs this config's); set train.init_from: "
                f"{parent} to resume the run")
        raise UserError(
            f"{path}: the run directory holds a run with a different {section} section ({difference}, the run's vs "
            f"this config's); use --restart to start over or choose another run_dir")
    pair, now_pair = (saved["data"]["src_lang"], saved["data"]["tgt_lang"]), (cfg.data.src_lang, cfg.data.tgt_lang)
    if pair != now_pair:  # the weights (and a separate tokenizer's models) are each side's language
        raise UserError(
            f"{path}: the run directory holds a run that translates {pair[0]} to {pair[1]}, and this config "
            f"{now_pair[0]} to {now_pair[1]} (data.src_lang, data.tgt_lang); use --restart to start over, or start "
            f"another run_dir from its weights with train.init_from")
