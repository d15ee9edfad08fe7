"""Everything a training run is made of, built by plain functions.

`build_run(cfg)` finds where the run starts (`nmt.train.start`: random weights, or
another run's checkpoint), joins the process group, locks and prepares the run directory,
prepares the data (rank 0 first), builds the model and its optimizer, resumes
from the newest checkpoint and readies the step (`prepare_step`: a bf16 copy of the
model, DDP, `torch.compile`). `build_trainable` and `prepare_step` are the parts that
need no run directory: `bench/train_speed.py` uses them to measure exactly what
`nmt train` runs.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from nmt.config import ExperimentConfig, TrainConfig, save_config
from nmt.data.batching import TokenBatchSampler
from nmt.data.tokenizer import PAD_ID, Tokenizer
from nmt.distributed import (
    Dist,
    all_gather,
    init_distributed,
    on_every_rank,
    on_main,
    shutdown_distributed,
)
from nmt.errors import ConfigError, NodeError
from nmt.kernels import compile_model, enable_fast_math, warn_if_slow_precision
from nmt.models import build_model, count_parameters
from nmt.runtime import HALF_DTYPES, grad_scaler, pick_device, seed_everything
from nmt.train.data import RunData, batch_padding, build_sampler, padding_problem, prepare_run
from nmt.train.faults import check_free_space
from nmt.train.graphs import EAGER_USES, UpdateGraphs, check_update_graphs, resolve_update_graphs
from nmt.train.half import HalfCopy
from nmt.train.lock import RunLock, lock_run_dir
from nmt.train.loss import Objective
from nmt.train.optim import build_optimizer, build_scheduler
from nmt.train.resume import Progress, drop_replaced, prepare_run_dir, restore_replaced, resume_run
from nmt.train.start import starting_point
from nmt.train.step import Trainable

log = logging.getLogger(__name__)


@dataclass
class Run:
    """One training run, ready for `nmt.train.loop.train_run`."""

    cfg: ExperimentConfig
    ctx: Dist
    device: torch.device
    data: RunData
    trainable: Trainable
    progress: Progress
    sampler: TokenBatchSampler
    lock: RunLock | None = None
    owns_group: bool = False

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run_dir)

    def close(self) -> None:
        """Leave the process group this run joined and release the run directory.

        The step's wrappers go first (`release_step`): DDP holds the process group, and only
        a group nothing holds is torn down at once, its gloo threads joined (`shutdown_distributed`).
        Closed as an error leaves the run, the error's frames may hold DDP too (a `train_step` that
        failed, DDP's own forward): their locals are dropped first (`_drop_locals_of_the_error`).
        """
        try:
            if self.owns_group:
                release_step(self.trainable)
                _drop_locals_of_the_error()
                shutdown_distributed()
        finally:
            if self.lock is not None:
                self.lock.release()


def _drop_locals_of_the_error() -> None:
    """Free what the frames of the error now leaving the run hold (nothing outside an error).

    A DDP module those frames kept would hold the process group past `shutdown_distributed`, to be freed as the
    interpreter exits: its reducer lets go of the group without releasing the GIL, and gloo's thread, finishing
    a collective then, waits for the GIL while holding the lock the group's teardown needs. That process never
    exits, and torchrun waits for it (a rank that failed alone hung so in 2 of 38 torchrun runs). Finished frames are
    cleared, the running ones (this call's callers) are left alone.
    """
    err = sys.exc_info()[1]
    if err is not None:
        traceback.clear_frames(err.__traceback__)
        gc.collect()  # a module sits in reference cycles (its hooks)


def build_trainable(cfg: ExperimentConfig, tokenizer: Tokenizer, device: torch.device, *,
                    model: nn.Module | None = None) -> Trainable:
    """The config's model (or `model`) on `device` with its loss, optimizer, schedule and scaler, unwrapped."""
    tc = cfg.train
    if model is None:
        try:
            model = build_model(cfg.model, src_vocab_size=tokenizer.src_vocab_size,
                                tgt_vocab_size=tokenizer.tgt_vocab_size, pad_id=PAD_ID)
        except RuntimeError as err:  # torch's CPU allocator: "can't allocate memory: you tried to allocate N bytes"
            asked = re.search(r"can't allocate memory: you tried to allocate (\d+) bytes", str(err))
            if asked is None:
                raise
            raise NodeError(f"model.{cfg.model.type}: its sizes make a model too large for this machine's memory (one "
                            f"weight alone would take {int(asked.group(1)) / 2**30:.1f} GiB); make it smaller") from None
    model.to(device)
    optimizer = build_optimizer(model, tc, device)
    return Trainable(model=model, objective=Objective(model, pad_id=PAD_ID, smoothing=tc.label_smoothing),
                     optimizer=optimizer, scheduler=build_scheduler(optimizer, tc),
                     scaler=grad_scaler(device, tc.precision))


def prepare_step(t: Trainable, tc: TrainConfig, device: torch.device, ctx: Dist, *, shapes: int = 0) -> None:
    """Make `t.objective` what a training step calls, once the weights are loaded.

    With bf16 or fp16 on a copy (`train.half_weights`) it runs on a copy of the model in that precision
    (`t.half`); under DDP when there are several processes; compiled when `train.compile`,
    a graph per batch shape where `train.compile_dynamic` is false, or auto with static batch
    shapes (`shapes` of them), else one graph with symbolic sizes: the objective, or for a
    model that compiles by step (`contract.Seq2Seq`) that step, in place. With
    `train.cuda_graphs`, each batch shape's whole update is then recorded (`t.update_graphs`).

    Raises:
        NodeError: `train.compile_dynamic` false where batch shapes are not static;
            `train.cuda_graphs` where updates cannot be recorded.
    """
    objective = t.objective
    if tc.on_half_copy():
        t.half = HalfCopy(t.model, HALF_DTYPES[tc.precision])
        objective = Objective(t.half.copy, pad_id=objective.pad_id, smoothing=objective.smoothing)
    if ctx.enabled:
        objective = torch.nn.parallel.DistributedDataParallel(
            objective, device_ids=[device.index] if device.type == "cuda" else None)
    if tc.compile:
        static = bool(batch_padding(tc, device).fill_tokens)
        if tc.compile_dynamic is False and not static:
            raise NodeError(f"train.compile_dynamic: false compiles a graph per batch shape, which needs static "
                            f"batch shapes, and train.batch_shapes {tc.batch_shapes} gives free ones on {device.type}"
                            f" (auto is static only with compile_mode reduce-overhead on CUDA): set "
                            f"train.batch_shapes: static, or train.compile_dynamic: true")
        dynamic = not static if tc.compile_dynamic == "auto" else tc.compile_dynamic
        if tc.compile_mode == "reduce-overhead" and device.type == "cuda" and not static and ctx.is_main:
            log.warning("train.batch_shapes: free under CUDA graphs (compile_mode reduce-overhead) records a graph "
                        "for every distinct batch shape, and with dynamic shapes such a run died of a segmentation "
                        "fault on an H200; train.batch_shapes: auto or static gives one shape per length bucket")
        options = dict(mode=tc.compile_mode, dynamic=dynamic, shapes=shapes)
        runner = t.half.copy if t.half is not None else t.model  # the model the objective runs
        if getattr(runner, "compile_by_step", False):  # it compiles one step of its loop (contract.Seq2Seq),
            options["shapes"] = 2 * shapes  # its first step apart where the state carries no gradient yet
            compile_model(runner, in_place=True, **options)
        else:  # the model with its loss, one graph
            objective = compile_model(objective, **options)
        # (where compiling is unavailable, marking each update's start for CUDA graphs does nothing)
        t.graphs = tc.compile_mode == "reduce-overhead" and device.type == "cuda"
    t.objective = objective
    if tc.cuda_graphs is True:  # auto is decided by `build_run` (`resolve_update_graphs`); unresolved, it is off
        check_update_graphs(tc, device, ctx, t.model)
        t.update_graphs = UpdateGraphs(t, tc, device)


def release_step(t: Trainable) -> None:
    """Undo `prepare_step`'s wrappers (torch.compile's, then DDP's): `t.objective` is the plain objective again."""
    objective = getattr(t.objective, "_orig_mod", t.objective)
    if isinstance(objective, torch.nn.parallel.DistributedDataParallel):
        objective = objective.module
    t.objective = objective
    t.graphs = False
    t.update_graphs = None


def batch_shape_count(sampler: TokenBatchSampler, tc: TrainConfig, device: torch.device) -> int:
    """Distinct batch shapes `sampler`'s batches take with static shapes (one per length bucket); 0 with free ones."""
    return len(np.unique(sampler.lengths)) if batch_padding(tc, device).fill_tokens else 0


def train_sampler(data: RunData, tc: TrainConfig, device: torch.device, ctx: Dist) -> TokenBatchSampler:
    """This rank's shuffled token-budget batches of the training split, cut as `device`'s batch padding needs."""
    return build_sampler(data.train, max_tokens=tc.max_tokens, shuffle=True, seed=tc.seed, rank=ctx.rank,
                         world_size=ctx.world_size, parts=data.train_parts,
                         rounding=batch_padding(tc, device).sampler_rounding, order=tc.batch_order)


def _prepare_first(cfg: ExperimentConfig, run_dir: Path, restart: bool, tokenizer: Tokenizer | None) -> RunData:
    """Rank 0's part before the others start: the run directory, the tokenizer and the data."""
    prepare_run_dir(run_dir, restart)
    return prepare_run(cfg, run_dir, tokenizer=tokenizer)


def _started(given: ExperimentConfig, run_dir: Path) -> None:
    """Rank 0, once the run can start: its config.yaml, and the run a restart replaces gone. A run that fails
    before this (bad data, a refused resume) leaves both as they were."""
    save_config(given, run_dir / "config.yaml")
    drop_replaced(run_dir)


def _log_run(run: Run, given: ExperimentConfig, shapes: int, why_not: str) -> None:
    """The lines that say what a run trains, on what and how: the model, the data, the batches, the precision,
    and whether updates are recorded (`given` is the config as asked, `train.cuda_graphs` auto included)."""
    tc, t, data, ctx = run.cfg.train, run.trainable, run.data, run.ctx
    log.info("model: %s, %d parameters; %d training pairs, %d batches per epoch per process",
             t.model.name, count_parameters(t.model), len(data.train), len(run.sampler.batch_list(0)))
    parts = data.train_parts or []
    for i, (rows, weight) in enumerate(parts if len(parts) > 1 else []):  # one corpus: the line above
        log.info("data.train[%d]: %d pairs, weight %g: about %d pairs per epoch", i, rows, weight, round(rows * weight))
    how = "" if tc.precision == "fp32" else " on a copy of the weights" if tc.on_half_copy() else " under autocast"
    log.info("batches of up to %d tokens x %d accumulated x %d processes = %d tokens per update; %s%s on %s",
             tc.max_tokens, tc.accumulate, ctx.world_size, tc.max_tokens * tc.accumulate * ctx.world_size,
             tc.precision, how, run.device)
    warn_if_slow_precision(run.device, tc.precision, "train.precision:")
    if shapes:
        log.info("static batch shapes: %d, one per length bucket (%s)", shapes, batch_padding(tc, run.device).rounding)
    if tc.cuda_graphs:
        log.info("train.cuda_graphs%s: each batch shape's update runs eagerly %d times, then is recorded "
                 "as a CUDA graph and replayed", " (auto)" if given.train.cuda_graphs == "auto" else "", EAGER_USES)
    elif why_not and run.device.type == "cuda":  # auto, off: a GPU user may want to know why
        log.info("train.cuda_graphs auto: updates not recorded (%s)", why_not)


def build_run(cfg: ExperimentConfig, *, restart: bool = False) -> Run:
    """Build (or resume, unless `restart`) the run `cfg` describes in `cfg.run_dir`.

    Under torchrun every process calls it: rank 0 prepares the run directory and
    the data while the others wait, then they read what it wrote.

    Raises:
        UserError: bad config, data or run directory, or another training holds the run directory.
    """
    if (problem := cfg.training_problem()) is not None:  # before the run directory is made: nothing written
        raise ConfigError(problem)
    owns_group = not (dist.is_available() and dist.is_initialized())
    ctx = init_distributed(cfg.train.device)
    try:
        # a bad init_from or tokenizer.model fails before anything is written, its line printed once
        start = on_every_rank(lambda: starting_point(cfg), ctx)
        cfg = start.cfg
        run_dir = Path(cfg.run_dir)
        device = pick_device(cfg.train.device)
        # the run's settings: train.cuda_graphs auto decided for this device and process count (config.yaml
        # keeps the given config, auto included, so the run directory resumes anywhere as it was asked)
        graphs, why_not = resolve_update_graphs(cfg.train, device, ctx, cfg.model.type)
        given, cfg = cfg, dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, cuda_graphs=graphs))
        tc = cfg.train
        if (problem := padding_problem(cfg, device)) is not None:  # else the first long batch stops the run
            raise ConfigError(problem)
        if tc.cuda_graphs:  # before the data is prepared: the model is checked when the step is (`prepare_step`)
            check_update_graphs(tc, device, ctx)
        enable_fast_math(device)
        lock = lock_run_dir(run_dir, ctx)  # a second training in this run directory stops here, on every rank
    except BaseException:
        if owns_group:
            shutdown_distributed()
        raise
    try:
        if not ctx.is_main:
            logging.getLogger("nmt").setLevel(logging.WARNING)
        # rank 0 first, the others waiting: no races on the run directory, the tokenizer or the
        # caches; a bad corpus or setting stops every rank with rank 0's error
        data = on_main(lambda: _prepare_first(given, run_dir, restart, start.tokenizer), ctx)
        if ctx.enabled:  # rank 0's tokenizer, sent to the others: they neither judge nor write the run's files
            tokenizer = Tokenizer.from_state(all_gather(data.tokenizer.to_state() if ctx.is_main else None, ctx)[0])
            if not ctx.is_main:
                data = prepare_run(cfg, run_dir, tokenizer=tokenizer, prepared=True)

        seed_everything(tc.seed)
        t = build_trainable(cfg, data.tokenizer, device)
        on_main(lambda: check_free_space(run_dir, count_parameters(t.model), tc.keep_last), ctx)
        if start.weights is not None:  # the run's own checkpoints, if any, replace them just below
            t.model.load_state_dict(start.weights)
        seed_everything(tc.seed + ctx.rank)  # DDP copies rank 0's weights; dropout differs per rank
        progress = resume_run(run_dir, cfg, ctx, t.model, t.optimizer, t.scheduler, t.scaler)
        if start.weights is not None and ctx.is_main:
            taken = "weights, model and tokenizer" if progress.step == 0 else "model and tokenizer (weights resumed)"
            log.info("fine-tuning: %s from %s", taken, tc.init_from)
        sampler = train_sampler(data, tc, device, ctx)
        shapes = batch_shape_count(sampler, tc, device)  # 0 unless batch shapes are static
        prepare_step(t, tc, device, ctx, shapes=shapes)
        run = Run(cfg=cfg, ctx=ctx, device=device, data=data, trainable=t, progress=progress,
                  sampler=sampler, lock=lock, owns_group=owns_group)
        if ctx.is_main:
            _started(given, run_dir)
            _log_run(run, given, shapes, why_not)
        return run
    except BaseException:
        try:
            if ctx.is_main:
                restore_replaced(run_dir)
            if owns_group:
                shutdown_distributed()
        finally:
            if lock is not None:
                lock.release()
        raise
