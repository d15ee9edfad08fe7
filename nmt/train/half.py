"""bf16 training on a bf16 copy of the model, with the fp32 model as the master weights.

Autocast keeps the weights in fp32 and casts each one to bf16 where it is used,
and casts the gradients back in the backward pass: when this module was written,
an update of the Multi30k Transformer (3+3 layers, d_model 256) dispatched 776
operations under bf16 autocast against 495 in fp32, 283 of them casts. On a GPU,
where a model of that size is bound by kernel launches rather than by arithmetic,
those casts made bf16 slower than fp32.

`HalfCopy` keeps a second, bf16 copy of the model (the same modules, tied weights
tied) that runs the forward and backward passes with no casts at all. The fp32
model stays what the optimizer updates, what checkpoints hold and what validation
runs, so nothing outside the training step sees bf16 weights:

    backward on the copy  ->  `grads_to_master`: its gradients, cast, into the fp32 `.grad`s
    optimizer step on the fp32 weights  ->  `refresh`: the fp32 weights, cast, into the copy

Each of the two is one multi-tensor (`torch._foreach_*`) operation (two for the later micro-batches of
`train.accumulate`: widen to fp32, then add, since CUDA adds lists of two dtypes tensor by tensor). The residual
stream then runs in bf16 too, where autocast kept it in fp32; LayerNorm, softmax
and the loss still accumulate in fp32 inside their kernels.

Under DDP the copy is what DDP wraps, so gradients are all-reduced in bf16, and
the micro-batches of `train.accumulate` add up in the copy's bf16 gradients
before the one all-reduce; in a single process each micro-batch's gradients move
to fp32 at once.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class HalfCopy:
    """A copy of `model` in `dtype` for the forward and backward passes; `model` keeps the weights.

    Args:
        model: the fp32 model (its parameters are the optimizer's).
        dtype: the copy's dtype, torch.bfloat16.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        self.model, self.dtype = model, dtype
        self.copy = copy.deepcopy(model).to(dtype)  # deepcopy keeps tied parameters tied
        self.copy.train(model.training)
        self.masters = list(model.parameters())
        self.halves = list(self.copy.parameters())
        names = [n for n, _ in model.named_parameters()]
        if names != [n for n, _ in self.copy.named_parameters()]:  # parameters() order is the modules' order
            raise RuntimeError("the bf16 copy's parameters do not line up with the model's")

    def grads_to_master(self) -> None:
        """Add the copy's gradients to the fp32 parameters' `.grad` (creating them) and clear the copy's."""
        fresh: list[tuple[torch.Tensor, torch.Tensor]] = []  # (fp32 parameter without a gradient, bf16 gradient)
        more: list[tuple[torch.Tensor, torch.Tensor]] = []  # (fp32 parameter with a gradient, bf16 gradient)
        for p, h in zip(self.masters, self.halves, strict=True):
            if h.grad is not None:
                (fresh if p.grad is None else more).append((p, h.grad))
        for p, _ in fresh:
            p.grad = torch.empty_like(p)
        if fresh:
            torch._foreach_copy_([p.grad for p, _ in fresh], [g for _, g in fresh])
        if more:  # a bf16 list added to an fp32 one takes one launch per tensor on CUDA; two fp32 lists, one launch
            widened = [torch.empty_like(p) for p, _ in more]
            torch._foreach_copy_(widened, [g for _, g in more])
            torch._foreach_add_([p.grad for p, _ in more], widened)
        for h in self.halves:
            h.grad = None

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the fp32 weights into the bf16 copy (after every optimizer update, applied or skipped)."""
        torch._foreach_copy_(self.halves, self.masters)
