"""Label-smoothed cross-entropy over target tokens, ignoring padding.

With smoothing eps the target distribution puts 1 - eps on the reference token
and spreads eps uniformly over the whole vocabulary (Szegedy et al., 2016,
sec. 7), so the loss is (1 - eps) * NLL + eps * mean_v(-log p_v).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class LossOutput:
    """Sums over the non-pad tokens of a batch; divide by `ntokens` for means."""

    loss: Tensor  # smoothed loss, summed (differentiable)
    nll: Tensor  # plain negative log-likelihood, summed (for perplexity)
    ntokens: int


def label_smoothed_loss(logits: Tensor, target: Tensor, *, pad_id: int, smoothing: float) -> LossOutput:
    """Loss of logits (B, T, V) against target (B, T); positions equal to `pad_id` count for nothing."""
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (B, T, V) in fp32 even under autocast
    keep = target.ne(pad_id)  # (B, T)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
    nll = nll.masked_fill(~keep, 0.0).sum()
    if smoothing > 0:
        uniform = -lprobs.mean(dim=-1).masked_fill(~keep, 0.0).sum()
        loss = (1.0 - smoothing) * nll + smoothing * uniform
    else:
        loss = nll
    return LossOutput(loss=loss, nll=nll.detach(), ntokens=int(keep.sum()))


def perplexity(nll_sum: float, ntokens: int) -> float:
    """exp(mean NLL), capped to stay finite in logs."""
    return float(torch.tensor(nll_sum / max(ntokens, 1)).clamp(max=50).exp())
