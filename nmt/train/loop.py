"""The training loop: one importable function over a run built beforehand (`nmt.train.setup`).

`train(cfg)` builds the run (`build_run`: data, tokenizer, model, optimizer and
schedule, resumed from the newest checkpoint in the run directory when there is
one) and trains it with periodic validation (`nmt.train.validate`: loss,
perplexity, metrics of greedy translations), best/last checkpoints and early
stopping.

Under torchrun every process runs `train(cfg)`: rank 0 prepares the run directory
and data first while the others wait, DDP keeps the replicas in step, each rank
trains on its own share of every epoch, validation is sharded and its results
reduced so every rank sees the same numbers, and only rank 0 writes files."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from nmt.checkpoint import average_checkpoints, last_checkpoints, latest_checkpoint, save_checkpoint
from nmt.config import ExperimentConfig, config_to_dict
from nmt.data.collate import Batch
from nmt.distributed import HostCopy, all_gather, lost_peers_named, reduce_on_device
from nmt.metrics import METRICS
from nmt.models import count_parameters
from nmt.runtime import hardware, peak_memory_mb, rng_states
from nmt.train.data import batch_loader, batch_padding
from nmt.train.faults import (
    Interrupted,
    StopSignals,
    TrainingDiverged,
    out_of_memory,
    stops_before_training,
)
from nmt.train.loss import perplexity
from nmt.train.metrics import MetricsLog
from nmt.train.saving import CheckpointWriter
from nmt.train.setup import Run, build_run
from nmt.train.step import StepResult, train_step
from nmt.train.validate import early_stop_metric, validate

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- the run


@dataclass
class _Launched:
    """An update queued on the device, with what the loop reads of it when it settles."""

    result: StepResult
    host: HostCopy  # skipped, then under torchrun the ranks' agreed wishes to stop (signal, out of time)
    positions: int  # target positions the update's batches computed, padding included
    lr: float  # the learning rate the update ran with


@dataclass
class _Window:
    """Sums over the updates since the last log line (loss, nll and grad_norm stay on the device until logged)."""

    loss: Any = 0.0
    nll: Any = 0.0
    tokens: int = 0
    update_tokens: Any = 0  # an int, or a tensor on the device under DDP
    grad_norm: Any = 0.0
    steps: int = 0
    positions: int = 0  # target positions computed, padding included
    lr: float = 0.0  # the rate of the last update
    t0: float = field(default_factory=time.perf_counter)

    def add(self, r: StepResult, positions: int, lr: float) -> None:
        self.loss, self.nll, self.tokens = self.loss + r.loss, self.nll + r.nll, self.tokens + r.tokens
        self.positions, self.lr = self.positions + positions, lr
        self.update_tokens += r.update_tokens
        self.grad_norm += r.grad_norm
        self.steps += 1


def train(cfg: ExperimentConfig, *, restart: bool = False) -> dict[str, Any]:
    """Train the model `cfg` describes in `cfg.run_dir`; resume there unless `restart`.

    Returns:
        A summary: steps, best metric, last validation scores, paths of checkpoints.

    Raises:
        Interrupted: SIGINT or SIGTERM stopped training (after writing a checkpoint), or the run being built.
        TrainingDiverged: `train.max_bad_steps` non-finite updates in a row.
        UserError: bad config, data, run directory, or CUDA out of memory.
        PeerStopped: under torchrun, another process stopped and left this one waiting for it.
    """
    with lost_peers_named():
        with stops_before_training():
            run = build_run(cfg, restart=restart)
        try:
            return train_run(run)
        finally:
            run.close()


def train_run(run: Run) -> dict[str, Any]:
    """Train a built run until a stop condition; validate once more if needed; return the summary."""
    with stops_before_training():  # until the loop's own handling of the signals (`StopSignals`) begins
        loop = _Loop(run)
    try:
        return loop.run()
    finally:
        try:
            if loop.writer is not None:
                loop.writer.close()  # a checkpoint being written is finished before the run ends, however it ends
        finally:
            loop.metrics.close()


def skipped_update_message(step: int, r: StepResult, fp16_scale: float | None = None) -> str:
    """The log line of an update skipped as non-finite: its loss a target token, as the log lines give it,
    where the summed loss of the batches (thousands for a healthy one) read as a divergence."""
    loss = float(r.loss) / max(r.tokens, 1)
    lowered = f", fp16 loss scale lowered to {fp16_scale:g}" if fp16_scale is not None else ""
    return (f"step {step}: non-finite loss or gradient (loss {loss:.4g} a target token, gradient norm "
            f"{float(r.grad_norm):.4g}); update skipped{lowered}")


class _Loop:
    """The loop over a `Run`: updates, logs, validation, checkpoints and stop conditions.

    What it keeps besides the run: the metrics log, the window of updates since the
    last log line, the count of skipped updates in a row, and the last saved step.
    """

    def __init__(self, run: Run) -> None:
        cfg, t = run.cfg, run.trainable
        self.cfg, self.tc, self.ctx, self.device, self.data = cfg, cfg.train, run.ctx, run.device, run.data
        self.trainable, self.model = t, t.model
        self.optimizer, self.scheduler, self.scaler, self.p = t.optimizer, t.scheduler, t.scaler, run.progress
        self.sampler, self.run_dir = run.sampler, run.run_dir
        self.n_params = count_parameters(self.model)
        self.saved_step = self.p.step if self.p.step else -1
        # a checkpoint off the save schedule (where the run stopped) is replaced by the run's next one
        self.replaces = self.run_dir / f"ckpt_{self.p.step}.pt" if self.p.off_schedule else None
        self.bad_steps = 0
        self.stop: tuple[int, bool] | None = None  # (signal, out of time) once known; agreed by the ranks under torchrun
        self.metric = METRICS[early_stop_metric(cfg)]
        self.metrics = MetricsLog(self.run_dir, resume_step=self.p.step, enabled=self.ctx.is_main,
                                  tensorboard=self.tc.tensorboard)
        self.window = _Window()
        # rank 0 writes the checkpoints, in the background (`nmt.train.saving`)
        self.writer = CheckpointWriter(self.run_dir, self.tc.keep_last) if self.ctx.is_main else None

    def run(self) -> dict[str, Any]:
        """Train until a stop condition, validate once more if needed, and return the summary."""
        p, tc = self.p, self.tc
        self.model.train()
        self.session_start = time.perf_counter() - p.train_seconds
        # the signals are caught up to the last checkpoint: one during a validation outside training (where
        # fine-tuning starts, or the final one) lets it and its checkpoint finish, then stops as during training,
        # after the next update if there is one (a second one stops at once)
        with StopSignals() as signals:
            if self.tc.init_from and p.step == 0 and p.validated_step < 0:
                self._validate_and_save()  # where fine-tuning starts: the parent's scores on this validation set
            if self._out_of_time():  # a finished run started again has nothing to do (its time, from the
                self.stop = (0, True)  # checkpoint, is the same on every rank)
            reason = self._stop_reason()
            if reason is None:
                # what this session trains on: a run resumed elsewhere names each machine (`nmt.experiment`)
                self.metrics.write({"event": "start", "step": p.step, "hardware": hardware(self.device),
                                    "precision": tc.precision, "torch": torch.__version__})
                with contextlib.closing(self._groups()) as groups:
                    reason = self._train(groups, signals)
            if p.validated_step != p.step:
                self._validate_and_save()
            if self.writer is not None:
                self.writer.wait()  # every checkpoint on disk: averaging reads them, and the summary names them
            signum = signals.signum
            if self.ctx.enabled:  # one rank may have been signalled alone: all stop alike (every rank is here)
                signum = int(reduce_on_device([signum], self.device, self.ctx, op="max")[0])
            if signum:
                self.metrics.write({"event": "interrupted", "step": p.step, "signal": signum})
                raise Interrupted(signum, self.run_dir / f"ckpt_{p.step}.pt", p.step)
        averaged = self._write_average() if tc.average_last and self.ctx.is_main else None
        summary = {
            "event": "summary", "stop": reason, "step": p.step, "epoch": p.epoch,
            "train_seconds": round(p.train_seconds, 1), "parameters": self.n_params,
            "best_metric": p.best_metric, "metric": self.metric.name, "best_step": p.best_step,
            "validated_step": p.validated_step, "last_valid": p.last_valid,
            "best_checkpoint": str(self.run_dir / "best.pt"),
            **({"averaged_checkpoint": str(averaged)} if averaged else {}),
        }
        self.metrics.write(summary)
        if self.ctx.is_main:
            log.info("done (%s): step %d, best valid %s %.4g, %.0fs", reason, p.step, self.metric.name,
                     p.best_metric or 0.0, p.train_seconds)
        return summary

    def _groups(self) -> Iterator[list[Batch]]:
        """Groups of `accumulate` batches on the device, from the saved position on, epoch after epoch."""
        p, tc = self.p, self.tc
        while not (tc.max_epochs and p.epoch >= tc.max_epochs):
            batch_lists = self.sampler.batch_list(p.epoch)[p.batch_in_epoch:]
            loader = batch_loader(self.data.train, batch_lists, num_workers=tc.num_workers,
                                  pin_memory=self.device.type == "cuda",
                                  padding=batch_padding(tc, self.device, self.cfg.model))
            group: list[Batch] = []
            for batch in loader:
                group.append(batch.to(self.device, non_blocking=True))
                if len(group) == tc.accumulate:
                    p.batch_in_epoch += len(group)
                    yield group
                    group = []
            if group:  # the epoch's last, smaller group
                p.batch_in_epoch += len(group)
                yield group
            p.epoch, p.batch_in_epoch = p.epoch + 1, 0

    def _train(self, groups: Iterator[list[Batch]], signals: StopSignals) -> str:
        """Update after update until a stop condition.

        The outcome of an update (applied, or skipped as non-finite) is read one
        update late: the next update is already queued on the device when the
        loop waits for the previous one (and for it alone: `HostCopy`), so the GPU
        never idles on the host. It is read at once when the next step number is a
        log, validation, checkpoint or stop point, so those always see every update
        before them. Under torchrun the same holds: the ranks agree on stopping
        through values reduced on the device and read with the update's outcome.
        """
        p, tc = self.p, self.tc
        # A bar only on a terminal (disable=None); log lines go above it, not onto it.
        bar = tqdm(total=tc.max_steps or None, initial=p.step, disable=None if self.ctx.is_main else True,
                   unit="step", dynamic_ncols=True, leave=False)
        self.window = _Window()
        with logging_redirect_tqdm():
            return self._updates(groups, signals, bar)

    def _updates(self, groups: Iterator[list[Batch]], signals: StopSignals, bar: tqdm) -> str:
        p, tc = self.p, self.tc
        pending: _Launched | None = None
        try:
            for group in groups:
                launched = self._launch(group, signals)
                if pending is not None:
                    self._settle(pending, bar)
                pending = launched
                if self._is_checkpoint(p.step + 1) or self.stop is not None:
                    self._settle(pending, bar)
                    pending = None
                reason = self._stop_reason()
                if reason:
                    return reason
            if pending is not None:
                self._settle(pending, bar)
            return self._stop_reason() or f"max_epochs={tc.max_epochs}"
        finally:
            bar.close()

    def _launch(self, group: list[Batch], signals: StopSignals) -> _Launched:
        """Queue one update, and with it this process's wish to stop (a signal, or `train.max_time` reached).

        In a single process a wish is followed at once. Under torchrun the ranks share
        their wishes on the device with each update, and the loop reads them, agreed,
        when it settles that update: every rank then stops after the same update.
        """
        lr = self.scheduler.lr  # the rate this update runs with (`train_step` then sets the next one)
        result = self._update(group)
        positions = sum(b.tgt_out.numel() for b in group)
        self.p.train_seconds = time.perf_counter() - self.session_start
        wish = (signals.signum, self._out_of_time())  # read once, after the update: a signal during it counts
        if not self.ctx.enabled:
            if any(wish):
                self.stop = wish
            return _Launched(result, HostCopy([result.skipped]), positions, lr)
        wishes = reduce_on_device(wish, self.device, self.ctx, op="max")  # read when the update settles
        return _Launched(result, HostCopy([result.skipped, wishes]), positions, lr)

    def _out_of_time(self) -> bool:
        return bool(self.tc.max_time and self.p.train_seconds >= self.tc.max_time)

    def _is_checkpoint(self, step: int) -> bool:
        """Whether reaching `step` logs, validates, saves or stops, so it must be known at once."""
        tc = self.tc
        return (step % tc.log_every == 0 or step == 1 or step % tc.valid_every == 0
                or bool(tc.save_every and step % tc.save_every == 0) or bool(tc.max_steps and step >= tc.max_steps))

    def _settle(self, launched: _Launched, bar: tqdm) -> None:
        """Count an update whose outcome is now read (this waits for the device to finish it, not the next one)."""
        skipped, *wishes = launched.host.values()
        if wishes and any(wishes[0]):  # under torchrun: the ranks' wishes to stop, agreed
            signum, out_of_time = wishes[0]
            self.stop = (int(signum), bool(out_of_time))
        result = launched.result
        if not skipped:
            self.bad_steps = 0
            self.p.step += 1
            self.window.add(result, launched.positions, launched.lr)
            bar.update(1)
            self._after_update(bar)
        else:
            self.scheduler.unstep()
            self._skipped(result)

    def _update(self, group: list[Batch]) -> StepResult:
        try:
            return train_step(self.trainable, group, self.tc, self.device, ctx=self.ctx)
        except torch.cuda.OutOfMemoryError as err:
            b = max(group, key=lambda b: b.src.numel() + b.tgt_in.numel())
            shapes = "{} sentences x {} source / {} target tokens".format(*b.shape)
            raise out_of_memory(err, max_tokens=self.tc.max_tokens, accumulate=self.tc.accumulate, shapes=shapes) from err

    def _after_update(self, bar: tqdm) -> None:
        p, tc = self.p, self.tc
        if p.step % tc.log_every == 0 or p.step == 1:
            self._log_train(bar)
        if self.writer is not None:
            self.writer.raise_if_failed()  # a full disk stops training at the update after the failed write
        t0 = time.perf_counter()
        if p.step % tc.valid_every == 0:
            self._validate_and_save()
        elif tc.save_every and p.step % tc.save_every == 0:
            self._save()
        self.window.t0 += time.perf_counter() - t0  # throughput counts training time only

    def _skipped(self, r: StepResult) -> None:
        self.bad_steps += 1
        fp16 = self.scaler.is_enabled()
        if self.ctx.is_main:  # fp16 overflows now and then by design: the scaler then lowers its scale
            log.log(logging.INFO if fp16 else logging.WARNING, "%s",
                    skipped_update_message(self.p.step + 1, r, self.scaler.get_scale() if fp16 else None))
        if self.tc.max_bad_steps and self.bad_steps >= self.tc.max_bad_steps:
            last = latest_checkpoint(self.run_dir)
            raise TrainingDiverged(
                f"training diverged after step {self.p.step}: the loss or gradients were not finite for "
                f"{self.bad_steps} updates in a row (train.max_bad_steps); lower train.lr (now {self.tc.lr:g}) "
                f"or raise train.warmup_steps{', or use bf16 instead of fp16' if fp16 else ''}; "
                f"the last good checkpoint is {last or 'none yet'}")

    def _stop_reason(self) -> str | None:
        """Why training stops after the updates settled so far, or None; a signal saves a checkpoint and raises.

        Every input is the same on every rank: the step count, the validations, and the
        wishes to stop as agreed (`_launch`).
        """
        p, tc = self.p, self.tc
        signum, out_of_time = self.stop or (0, False)
        if signum:
            path = self._save() if self.saved_step != p.step else self.run_dir / f"ckpt_{p.step}.pt"
            if self.writer is not None:
                self.writer.wait()  # on disk before the run says so
            self.metrics.write({"event": "interrupted", "step": p.step, "signal": int(signum)})
            raise Interrupted(int(signum), path, p.step)
        if tc.max_steps and p.step >= tc.max_steps:
            return f"max_steps={tc.max_steps}"
        if out_of_time:
            return f"max_time={tc.max_time:g}s"
        if tc.patience and p.bad_validations >= tc.patience:
            return f"no improvement in {tc.patience} validations"
        return None

    def _log_train(self, bar: tqdm) -> None:
        w, p = self.window, self.p
        seconds = max(time.perf_counter() - w.t0, 1e-9)
        lr = w.lr
        loss, nll, tokens, positions = float(w.loss), float(w.nll), w.tokens, w.positions  # this process's share
        if self.ctx.enabled:  # every rank logs at the same steps: the figures of the whole updates, as grad_norm's
            loss, nll, tokens, positions = reduce_on_device([loss, nll, tokens, positions], self.device, self.ctx).tolist()
        record = {
            "event": "train", "step": p.step, "epoch": p.epoch,
            "updates": w.steps,  # that the line's figures average: fewer than log_every after step 1 and a resume
            "loss": round(loss / max(tokens, 1), 4), "ppl": round(perplexity(nll, max(tokens, 1)), 2),
            "lr": float(f"{lr:.6g}"),  # the schedule's float, not its last bits (0.00030000000000000003)
            "grad_norm": round(float(w.grad_norm) / max(w.steps, 1), 4),
            "tokens_per_s": round(float(w.update_tokens) / seconds, 1),
            "tokens_per_update": round(float(w.update_tokens) / max(w.steps, 1), 1),
            # the share of the target positions computed that held a real token (the rest: padding, `bench/batch_shapes.py`)
            "real_tokens": round(tokens / max(positions, 1), 4),
            **peak_memory_mb(self.device),
        }
        bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{record['tokens_per_s']:.0f}")
        if bar.disable and self.ctx.is_main:  # no bar (no terminal: CI, nohup, a log file): a line instead
            log.info("step %d: loss %.3f ppl %.2f lr %.2e %.0f tokens/s", p.step, record["loss"], record["ppl"], lr,
                     record["tokens_per_s"])
        self.metrics.write(record)
        self.window = _Window()

    def _validate_and_save(self) -> None:
        """Validate, track the best metric and plateaus, and write checkpoints."""
        p = self.p
        t0 = time.perf_counter()
        result = p.last_valid = validate(self.model, self.data, self.cfg, self.device, self.ctx)
        if self.trainable.update_graphs is not None:
            self.trainable.update_graphs.weights_in_place(self.trainable)  # re-recorded if validation moved them
        seconds = time.perf_counter() - t0  # time away from training, a share that grows as updates get faster
        metric = result[self.metric.name]
        improved = self.metric.better(metric, p.best_metric)
        if improved:
            p.best_metric, p.best_step, p.bad_validations = metric, p.step, 0
        else:
            p.bad_validations += 1
        p.validated_step = p.step
        lowered = self.scheduler.observe(metric, higher_is_better=self.metric.higher_is_better)
        self.metrics.write({"event": "valid", "step": p.step, **result, "best": improved, "seconds": round(seconds, 2)})
        if self.ctx.is_main:
            log.info("step %d valid: %s%s, %.1f s", p.step, " ".join(f"{k}={v}" for k, v in result.items()),
                     " (best)" if improved else "", seconds)
            if lowered:
                log.info("plateau: learning rate lowered to %.3g", self.scheduler.get_last_lr()[0])
        self._save(best=improved)

    def _save(self, *, best: bool = False) -> Path:
        """Write `ckpt_<step>.pt` (and `best.pt`) from rank 0, in the background (`self.writer`); every rank must
        call it (RNG states are gathered)."""
        p, tc = self.p, self.tc
        # validations count as the time the next update would have counted them (`_launch`), so that a run
        # resumed from this checkpoint has as much of train.max_time left as one that goes on now
        p.train_seconds = time.perf_counter() - self.session_start
        on_schedule = p.step % tc.valid_every == 0 or bool(tc.save_every and p.step % tc.save_every == 0)
        p.off_schedule = p.step == 0 or not on_schedule  # a stop's, or the parent's where fine-tuning starts
        payload = {
            "config": config_to_dict(self.cfg),
            "tokenizer": self.data.tokenizer.to_state(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "progress": dataclasses.asdict(self.p),
            "rng": all_gather(rng_states(), self.ctx),  # one entry per rank
            "parameters": self.n_params,
        }
        path = self.run_dir / f"ckpt_{p.step}.pt"
        if self.writer is not None:  # in the order `nmt.train.saving.write_checkpoints` gives
            self.writer.submit(payload, path, best=best, off_schedule=p.off_schedule, replaces=self.replaces)
        self.saved_step = p.step
        self.replaces = path if p.off_schedule else None
        return path

    def _write_average(self) -> Path:
        paths = last_checkpoints(self.run_dir, self.tc.average_last)
        out = self.run_dir / "averaged.pt"
        save_checkpoint(average_checkpoints(paths), out)
        log.info("wrote %s: mean of %s", out, ", ".join(p.name for p in paths))
        return out

