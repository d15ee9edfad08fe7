"""One optimizer update over a group of batches: mixed precision, accumulation, DDP, clipping, fault checks."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from nmt.data.batching import Batch
from nmt.data.tokenizer import PAD_ID
from nmt.runtime import Dist, all_reduce, autocast
from nmt.train.loss import label_smoothed_loss


@dataclass
class StepResult:
    """What one call of `train_step` did."""

    loss: float  # summed smoothed loss of this rank's batches
    nll: float  # summed negative log-likelihood of this rank's batches
    tokens: int  # target tokens of this rank's batches
    update_tokens: int  # target tokens of the whole update, over all ranks
    grad_norm: float  # before clipping; not finite when the update was skipped

    @property
    def updated(self) -> bool:
        return math.isfinite(self.grad_norm)


def train_step(model, group: list[Batch], optimizer, scheduler, scaler, tc, device: torch.device,
               *, ctx: Dist = Dist()) -> StepResult:
    """One optimizer update over the batches in `group` (gradient accumulation), or none if gradients are not finite.

    The loss is normalised by the target tokens of the whole update on all ranks,
    so accumulating k batches, or k ranks with one batch each, equals one batch k
    times larger. Under DDP, gradients are synchronised only on the last batch.
    A non-finite gradient norm skips the optimizer and the schedule (for fp16 the
    scaler also lowers its scale); the norm is the same on every rank, so is the choice.
    """
    tokens = sum(b.ntokens for b in group)
    update_tokens = int(all_reduce([tokens], device, ctx)[0])
    weight = ctx.world_size / max(update_tokens, 1)  # DDP averages over ranks; undo that
    loss_sum = nll_sum = torch.zeros((), device=device)
    for i, b in enumerate(group):
        sync = model.no_sync() if ctx.enabled and i < len(group) - 1 else contextlib.nullcontext()
        with sync:
            with autocast(device, tc.precision):
                logits = model(b.src, b.src_pad_mask, b.tgt_in)
                out = label_smoothed_loss(logits, b.tgt_out, pad_id=PAD_ID, smoothing=tc.label_smoothing)
            scaler.scale(out.loss * weight).backward()
        loss_sum = loss_sum + out.loss.detach().float()
        nll_sum = nll_sum + out.nll.detach().float()
    scaler.unscale_(optimizer)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, tc.clip_norm if tc.clip_norm > 0 else math.inf))
    if math.isfinite(grad_norm):
        scaler.step(optimizer)
        scheduler.step()
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(float(loss_sum), float(nll_sum), tokens, update_tokens, grad_norm)


