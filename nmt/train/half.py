"""bf16 (or fp16) training on a copy of the model in that precision, with the fp32 model as the master weights.

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

fp16 (`train.half_weights: true`) runs the same way on an fp16 copy, under the gradient scaler: the
copy's scaled gradients, cast, are what the scaler unscales and checks in the fp32 `.grad`s, so a
gradient that overflowed fp16 arrives there as inf and skips the update.

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
        dtype: the copy's dtype, torch.bfloat16 or torch.float16.
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
        self._first = True  # the next gradients begin an update (`grads_to_master`)

    def grads_to_master(self) -> None:
        """Move the copy's gradients to the fp32 parameters' `.grad` and clear the copy's.

        The first backward of an update (after `refresh`) writes over the last update's fp32 gradients,
        whose tensors stay from one update to the next: no allocation per parameter and update, which on a
        GPU is host time that a small model's step, bound by its host, pays in full. A parameter that got no
        gradient has none (`None`, as the optimizer expects). A later backward of the update (micro-batches
        of `train.accumulate`) adds to them.
        """
        grads = [h.grad for h in self.halves]
        for h in self.halves:
            h.grad = None
        if self._first:
            self._first = False
            masters, sources = [], []
            for p, g in zip(self.masters, grads, strict=True):
                if g is None:
                    p.grad = None
                    continue
                if p.grad is None:  # its first gradient of the run, or the first after one it did not get
                    p.grad = torch.empty_like(p)
                masters.append(p.grad)
                sources.append(g)
            if masters:
                torch._foreach_copy_(masters, sources)
            return
        more = [(p.grad, g) for p, g in zip(self.masters, grads, strict=True) if g is not None and p.grad is not None]
        for p, g in zip(self.masters, grads, strict=True):
            if g is not None and p.grad is None:
                p.grad = g.to(p.dtype)
        _add(more)

    def add_grads_to_master(self) -> None:
        """Add the copy's gradients to the fp32 parameters' `.grad`s, which every parameter keeps (zeroed where
        an update begins), and clear the copy's: what each micro-batch of an update recorded as CUDA graphs
        does (`nmt.train.graphs`), since each batch shape's graph must serve any place in an update."""
        grads = [h.grad for h in self.halves]
        for h in self.halves:
            h.grad = None
        _add([(p.grad, g) for p, g in zip(self.masters, grads, strict=True) if g is not None])

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the fp32 weights into the half copy (after every optimizer update, applied or skipped)."""
        torch._foreach_copy_(self.halves, self.masters)
        self._first = True  # the next gradients begin a new update


def _add(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """fp32 += half for each (fp32, bf16 or fp16) pair, in a few multi-tensor launches: a half list added to an
    fp32 one takes one launch per tensor on CUDA, two fp32 lists one launch, so the half ones are widened first."""
    if not pairs:
        return
    widened = [torch.empty_like(total) for total, _ in pairs]
    torch._foreach_copy_(widened, [g for _, g in pairs])
    torch._foreach_add_([total for total, _ in pairs], widened)
