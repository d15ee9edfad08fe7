"""Label-smoothed cross-entropy over target tokens, ignoring padding.

With smoothing eps the target distribution puts 1 - eps on the reference token
and spreads eps uniformly over the whole vocabulary (Szegedy et al., 2016,
sec. 7), so the loss is (1 - eps) * NLL + eps * mean_v(-log p_v).

Per row, with log p = log_softmax(x) of logits x:

    NLL            = -log p_y
    mean_v(-log p) = -mean_v(log p_v)
    d loss / d x_v = softmax(x)_v - (1 - eps) [v = y] - eps / V

so the forward pass needs two numbers per row, and the backward pass recomputes
the softmax from the logits. `_SmoothedCrossEntropy` does this over chunks of
rows in fp32 while the logits stay in their own dtype (bf16 under autocast or on
the bf16 copy): no fp32 copy of the (B, T, V) logits nor of their log-softmax is
ever held whole, which for large batches and vocabularies is the largest tensor
of a training step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

# Rows of logits converted to fp32 at once: 2^24 elements (64 MiB) per chunk.
_CHUNK_ELEMENTS = 1 << 24


@dataclass
class LossOutput:
    """Sums over the non-pad tokens of a batch; divide by `ntokens` for means.

    All three are tensors on the logits' device, so computing them never waits on a GPU.
    """

    loss: Tensor  # smoothed loss, summed (differentiable)
    nll: Tensor  # plain negative log-likelihood, summed (for perplexity)
    ntokens: Tensor  # non-pad target tokens


def _compute_dtype(logits: Tensor) -> torch.dtype:
    """fp32 for bf16, fp16 and fp32 logits; fp64 for fp64 ones."""
    return torch.promote_types(logits.dtype, torch.float32)


# Whether torch's CUDA softmax kernels read rows of this dtype (bf16) and write fp32 themselves (`half_to_float`):
# `torch.softmax(x, dtype=torch.float32)` lets them do so for fp16 only, and casts bf16 to fp32 first, a pass
# over the logits more each way. Unknown until tried (torch versions differ), then remembered.
_READS_HALF: dict[torch.dtype, bool] = {}


def _softmax_in(dtype: torch.dtype, x: Tensor, *, log: bool) -> Tensor:
    """The softmax (log: log-softmax) of rows x (n, V) in `dtype`, reading bf16/fp16 rows as they are on CUDA."""
    if x.dtype != dtype and x.is_cuda and dtype == torch.float32 and _READS_HALF.get(x.dtype, True):
        try:
            return (torch._log_softmax if log else torch._softmax)(x, -1, True)
        except RuntimeError:  # "conversion is supported for Half type only"
            _READS_HALF[x.dtype] = False
    return (torch.log_softmax if log else torch.softmax)(x, dim=-1, dtype=dtype)


def _writes_cast(device: torch.device) -> bool:
    """Whether one kernel should write fp32 results into a bf16/fp16 tensor there: a GPU's elementwise kernels
    convert as they write, at no cost; on a CPU such a kernel is many times slower than a copy after it."""
    return device.type == "cuda"


def _sums(x: Tensor, target: Tensor, keep: Tensor, smoothing: float) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row lse (n,), summed NLL and summed smoothed loss of logits x (n, V) already in the compute dtype.

    `keep` (n,) is 1 at real tokens and 0 at padding (bool or float).
    """
    lse = torch.logsumexp(x, dim=-1)  # (n,)
    nll = ((lse - x.gather(-1, target[:, None]).squeeze(-1)) * keep).sum()
    if smoothing == 0:
        return lse, nll, nll
    uniform = ((lse - x.mean(dim=-1)) * keep).sum()  # sum of mean_v(-log p_v)
    return lse, nll, (1.0 - smoothing) * nll + smoothing * uniform


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed loss and NLL of logits (N, V) against targets (N,), chunk by chunk in fp32.

    Each kernel launch counts where a GPU's step is bound by launching them, so a chunk costs few:
    forward, one log-softmax in fp32 (on a CPU bf16 logits are cast first), the gather of the targets'
    log-probabilities and their mean per row (both into (N,) columns); backward, the softmax, the
    targets' -(1 - eps) and the scaled write into the gradient. What is per row and not per
    (row, vocabulary entry) is computed once for all chunks: the sums (two dot products with the
    mask of real tokens) and the rows' gradient weights. At about 20 operations a chunk before, the
    loss made a third of the operations of a Transformer-base update of 32,768 tokens (16 chunks).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, keep: Tensor, smoothing: float) -> tuple[Tensor, Tensor]:
        N, V = logits.shape
        rows = max(1, _CHUNK_ELEMENTS // V)
        dtype = _compute_dtype(logits)
        picked = torch.empty(N, dtype=dtype, device=logits.device)  # log p of each row's target
        mean = torch.empty(N, dtype=dtype, device=logits.device) if smoothing else None  # mean_v log p_v per row
        for i in range(0, N, rows):
            logp = _softmax_in(dtype, logits[i : i + rows], log=True)  # (n, V), one pass
            torch.gather(logp, -1, target[i : i + rows, None], out=picked[i : i + rows, None])
            if mean is not None:
                torch.mean(logp, dim=-1, out=mean[i : i + rows])
        minus_keep = keep.to(dtype).neg()  # (N,): -1 at real tokens, 0 at padding
        nll = torch.dot(picked, minus_keep)
        # (1 - eps) * NLL + eps * sum of mean_v(-log p_v); the NLL returned apart, not differentiable
        loss = nll.clone() if mean is None else torch.lerp(nll, torch.dot(mean, minus_keep), smoothing)
        ctx.save_for_backward(logits, target, keep)
        ctx.smoothing = smoothing
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor, None, None, None]:
        # Per chunk, two passes over (n, V) values: the softmax, then w * (softmax - eps / V) with
        # w = keep * grad_loss (-(1 - eps) added at the targets in between) written into the
        # gradient. On a CPU, bf16 logits take two more: a cast to fp32 before the softmax, and a
        # copy of the result into the bf16 gradient; on a GPU the kernels read and write bf16 as
        # they go (where this torch's softmax reads bf16: `_softmax_in`). Spelled as exp(x - lse),
        # cast and scaled step by step, it took six passes, and a seventh to cast.
        logits, target, keep = ctx.saved_tensors
        eps, (N, V) = ctx.smoothing, logits.shape
        dtype = _compute_dtype(logits)
        rows = max(1, _CHUNK_ELEMENTS // V)
        w = (keep.to(dtype) * grad_loss.to(dtype))[:, None]  # (N, 1), the rows' weights
        offset = w * (-eps / V)  # (N, 1)
        at_target = torch.full((min(rows, N), 1), -(1.0 - eps), dtype=dtype, device=logits.device)
        grad = torch.empty_like(logits)  # (N, V), the logits' dtype
        direct = grad.dtype == dtype or _writes_cast(grad.device)
        for i in range(0, N, rows):
            g = _softmax_in(dtype, logits[i : i + rows], log=False)  # (n, V)
            g.scatter_add_(-1, target[i : i + rows, None], at_target[: g.size(0)])
            if direct:
                torch.addcmul(offset[i : i + rows], g, w[i : i + rows], out=grad[i : i + rows])
            else:
                grad[i : i + rows] = torch.addcmul(offset[i : i + rows], g, w[i : i + rows], out=g)
        return grad, None, None, None


def label_smoothed_loss(logits: Tensor, target: Tensor, *, pad_id: int, smoothing: float) -> LossOutput:
    """Loss of logits (B, T, V) against target (B, T); positions equal to `pad_id` count for nothing.

    The logits may be bf16 or fp16: the arithmetic is done in fp32 a chunk of rows at a time.
    """
    V = logits.size(-1)
    flat_target = target.reshape(-1)  # (B*T,)
    keep = flat_target.ne(pad_id)  # (B*T,)
    if torch.compiler.is_compiling():
        # The compiler fuses these reductions into a few kernels that read the logits
        # once, so it needs no chunks (whose count would make it recompile for every
        # batch size); autograd derives the same gradient.
        _, nll, loss = _sums(logits.reshape(-1, V).to(_compute_dtype(logits)), flat_target, keep, smoothing)
        return LossOutput(loss=loss, nll=nll.detach(), ntokens=keep.sum())
    loss, nll = _SmoothedCrossEntropy.apply(logits.reshape(-1, V), flat_target, keep.to(torch.float32), smoothing)
    return LossOutput(loss=loss, nll=nll, ntokens=keep.sum())


class Objective(nn.Module):
    """A model and its training loss as one module, so DDP and `torch.compile` see the whole step's graph.

    Args:
        model: any `Seq2Seq`; its parameters are this module's.
        pad_id: target padding id.
        smoothing: label smoothing eps.
    """

    def __init__(self, model: nn.Module, *, pad_id: int, smoothing: float) -> None:
        super().__init__()
        self.model, self.pad_id, self.smoothing = model, pad_id, smoothing

    def forward(self, src: Tensor, src_pad_mask: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> tuple[Tensor, Tensor]:
        """Summed smoothed loss (differentiable) and summed NLL of one batch."""
        logits = self.model(src, src_pad_mask, tgt_in)  # (B, T, V)
        out = label_smoothed_loss(logits, tgt_out, pad_id=self.pad_id, smoothing=self.smoothing)
        return out.loss, out.nll


def perplexity(nll_sum: float, ntokens: int) -> float:
    """exp(mean NLL), capped to stay finite in logs."""
    return math.exp(min(float(nll_sum) / max(int(ntokens), 1), 50.0))
