"""One optimizer update over a group of batches: mixed precision, accumulation, DDP, clipping, fault checks.

Nothing here waits for the GPU: the loss, the gradient norm and the "skipped"
flag stay on the device, and a non-finite update is skipped there too (the fused
Adam kernels take a `found_inf` flag, as with a gradient scaler). Under DDP the
update's token count is summed over ranks on the device as well. The training
loop reads these values later, when the device has moved on (`nmt.train.loop`).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn
from torch.profiler import record_function

from nmt.config import TrainConfig
from nmt.data.collate import Batch
from nmt.data.tokenizer import PAD_ID
from nmt.distributed import Dist, reduce_on_device
from nmt.runtime import autocast
from nmt.train.half import HalfCopy
from nmt.train.optim import Schedule


class RecordedUpdates(Protocol):
    """Updates recorded once and replayed (`nmt.train.graphs.UpdateGraphs`), which `train_step` hands a group to."""

    def step(self, t: Trainable, group: list[Batch]) -> StepResult: ...

    def weights_in_place(self, t: Trainable) -> bool: ...


@dataclass
class Trainable:
    """A model with what updates it.

    Attributes:
        model: the raw module, whose state dict checkpoints hold.
        objective: the module a step calls: the model (or its bf16 copy) with its loss
            (`Objective`), wrapped by DDP and compiled as the config asks (`prepare_step`).
        half: the bf16 or fp16 copy the objective runs on (`train.half_weights`), else None.
        graphs: the objective replays CUDA graphs (compiled in `reduce-overhead` mode on CUDA).
    """

    model: nn.Module
    objective: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Schedule
    scaler: torch.amp.GradScaler
    half: HalfCopy | None = None
    graphs: bool = False
    update_graphs: RecordedUpdates | None = None  # `train.cuda_graphs`: each batch shape's update as a CUDA graph


@dataclass
class StepResult:
    """What one call of `train_step` did; the tensors live on the training device.

    `skipped` is True when the loss or the gradients were not finite: the
    parameters and the optimizer state were then left unchanged.
    """

    loss: Tensor  # summed smoothed loss of this rank's batches
    nll: Tensor  # summed negative log-likelihood of this rank's batches
    tokens: int  # target tokens of this rank's batches
    update_tokens: int | Tensor  # target tokens of the whole update, over all ranks (on the device under DDP)
    grad_norm: Tensor  # before clipping
    skipped: Tensor  # bool

    @property
    def updated(self) -> bool:
        """Whether the update was applied (reading it waits for the device)."""
        return not bool(self.skipped)


def train_step(t: Trainable, group: list[Batch], tc: TrainConfig, device: torch.device, *,
               ctx: Dist = Dist()) -> StepResult:
    """One optimizer update of `t` over the batches in `group` (`update`), then the schedule's step.

    With `t.update_graphs` (`train.cuda_graphs`) the update is its batch shape's recorded one, replayed.
    """
    if t.update_graphs is not None:
        result = t.update_graphs.step(t, group)
    else:
        result = update(t, group, tc, device, ctx=ctx)
    t.scheduler.step()
    return result


def update(t: Trainable, group: list[Batch], tc: TrainConfig, device: torch.device, *,
           ctx: Dist = Dist(), tokens_on_device: bool = False) -> StepResult:
    """One optimizer update of `t` over the batches in `group` (gradient accumulation); skipped if gradients are not finite.

    The loss is normalised by the target tokens of the whole update on all ranks,
    so accumulating k batches, or k ranks with one batch each, equals one batch k
    times larger. Under DDP, gradients are synchronised only on the last batch.
    A non-finite gradient norm skips the optimizer on the device (for fp16 the
    scaler also lowers its scale); the norm is the same on every rank, so is the
    choice. With a half copy (`t.half`) the passes run on it without autocast, its
    gradients move to the fp32 weights after each synchronised backward, and the
    updated weights back to it after the optimizer. The learning rate is the
    schedule's as it stands: `train_step` steps the schedule after the update, in
    any case (the loop, which learns of a skipped update later, steps it back:
    `Schedule.unstep`).

    `tokens_on_device` counts the target tokens that normalise the loss from the batches'
    tensors, on the device, rather than from their host-side counts: a CUDA graph recording
    this update (`nmt.train.graphs`) would otherwise keep the count of the batch it was
    recorded with for every batch it replays.
    """
    objective, optimizer, half = t.objective, t.optimizer, t.half
    tokens = sum(b.ntokens for b in group)
    if tokens_on_device:  # one process (graphs record no collective)
        counted = sum(b.tgt_out.ne(PAD_ID).sum() for b in group)
        update_tokens, weight = tokens, 1 / counted.clamp(min=1).float()
    elif ctx.enabled:  # summed over ranks on the device: reading the sum here would wait for the last update
        update_tokens: int | Tensor = reduce_on_device([tokens], device, ctx, dtype=torch.int64)[0]
        weight: float | Tensor = ctx.world_size / update_tokens.clamp(min=1).float()  # DDP averages over ranks; undo that
    else:
        update_tokens, weight = tokens, 1 / max(tokens, 1)
    loss_sum = nll_sum = torch.zeros((), device=device)
    if t.graphs:  # a new update: the graphs' outputs of the last one (copied below) may be overwritten
        torch.compiler.cudagraph_mark_step_begin()
    for i, b in enumerate(group):  # the phases are labelled for torch.profiler (bench/train_speed.py --profile)
        synced = not ctx.enabled or i == len(group) - 1  # DDP all-reduces the last backward only
        with record_function("nmt.forward_backward"), contextlib.nullcontext() if synced else objective.no_sync():
            loss, nll = forward_backward(t, b, device, tc.precision, weight)
        if half is not None and synced:
            half.grads_to_master()
        loss_sum, nll_sum = loss_sum + loss, nll_sum + nll
    with record_function("nmt.optimizer"):
        grad_norm, skipped = apply_gradients(t, tc)
        if half is not None:  # the next update's gradients overwrite these (`HalfCopy.grads_to_master`)
            half.refresh()
        else:
            optimizer.zero_grad(set_to_none=True)
    return StepResult(loss_sum, nll_sum, tokens, update_tokens, grad_norm, skipped)


def forward_backward(t: Trainable, b: Batch, device: torch.device, precision: str,
                     weight: float | Tensor) -> tuple[Tensor, Tensor]:
    """The forward and backward passes of one batch in `precision` (`train.precision`), its loss weighted by
    `weight`; its summed loss and NLL (fp32).

    They autocast to `precision`, except on a half copy (`t.half`), which is in that precision already.
    Gradients add to those already there: the model's `.grad`s, or the half copy's, which the caller moves
    to the fp32 weights.
    """
    with autocast(device, "fp32" if t.half is not None else precision):
        loss, nll = t.objective(b.src, b.src_pad_mask, b.tgt_in, b.tgt_out)
    t.scaler.scale(loss * weight).backward()
    return loss.detach().float(), nll.detach().float()


def apply_gradients(t: Trainable, tc: TrainConfig) -> tuple[Tensor, Tensor]:
    """The optimizer's step on the gradients summed in the fp32 `.grad`s, skipped on the device where they
    are not finite: unscaled (fp16), clipped to `train.clip_norm`. The gradient norm (before clipping) and
    whether the step was skipped, both on the device; the gradients are left as they are."""
    optimizer, scaler = t.optimizer, t.scaler
    scaler.unscale_(optimizer)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, tc.clip_norm if tc.clip_norm > 0 else math.inf)
    skipped = ~torch.isfinite(grad_norm)
    if scaler.is_enabled():
        scaler.step(optimizer)  # skips on non-finite gradients, on the device for fused optimizers
    else:
        step_unless(optimizer, skipped)
    scaler.update()
    return grad_norm.detach(), skipped


def step_unless(optimizer: torch.optim.Optimizer, skip: Tensor) -> None:
    """`optimizer.step()` unless `skip` (a bool tensor), decided on the device where the optimizer can.

    Fused Adam/AdamW read a `found_inf` attribute (how `torch.amp.GradScaler`
    drives them): with it set they leave parameters, moments and step counts
    unchanged, with no host synchronisation. Other optimizers are asked on the host.
    """
    if optimizer.defaults.get("fused"):
        optimizer.found_inf = skip.to(torch.float32)
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
    elif not bool(skip):
        optimizer.step()
