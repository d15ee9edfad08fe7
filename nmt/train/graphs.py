"""`train.cuda_graphs`: each batch shape's whole update recorded once as a CUDA graph, then replayed.

A model of Multi30k's size launches about 400 kernels per update, each a few
microseconds of GPU work, so on a GPU its step is bound by the host that launches
them (H200 profiles of 2026-11-26). `compile_mode: reduce-overhead` records the
forward and backward passes as CUDA graphs, but leaves the rest of the update to the
host: the gradients' clipping, the optimizer, the bf16 copy's bookkeeping. Here the
whole of `nmt.train.step.update` is one graph, replayed with one launch:

    first uses of a shape (`EAGER_USES`)  ->  the update runs as it is, on a side stream,
                                               which sets up what the graph will use
                                               (optimizer state, the fp32 gradients of the
                                               bf16 copy, the kernel libraries' workspaces)
    the next use                          ->  recorded into a graph, with the batch copied
                                               into tensors kept for that shape, and replayed
    every later use                       ->  the batch copied in (one copy: the batch is one
                                               buffer), the graph replayed

What a graph records is fixed: shapes, and every number the host passes to a kernel.
So the update counts its target tokens on the device (`update(tokens_on_device=True)`),
the learning rate is a tensor on the device that the schedule writes into
(`Schedule._apply`), and a skipped update is decided on the device by the fused
optimizer (`step_unless`). The graphs of all shapes share one memory pool; what an
update returns is copied out of the pool before the next replay can overwrite it.

Where it applies (`check_update_graphs`): CUDA, one process, one batch per update,
fp32 or bf16 on the bf16 copy, static batch shapes, and a model whose training step
never waits for the GPU (its `graph_safe` attribute, `contract.Seq2Seq`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nmt.config import TrainConfig
from nmt.data.batching import Batch
from nmt.errors import UserError
from nmt.runtime import Dist
from nmt.train.step import StepResult, Trainable, update

# Eager updates of a batch shape before its graph is recorded: the first sets up the optimizer's state and
# the kernel libraries' choices, the second runs with all of it in place, as the recording will.
EAGER_USES = 2


@dataclass
class _Recorded:
    """One batch shape's recorded update: how to replay it, the batch it reads, the tensor it leaves results in."""

    replay: Callable[[], object]
    batch: Batch  # the inputs, for this shape
    results: Tensor  # (4,) fp32: summed loss, summed NLL, gradient norm, skipped (0 or 1)


class UpdateGraphs:
    """Replays each batch shape's recorded update (see the module docstring).

    `run_eagerly` and `record` are where CUDA comes in; everything else is the same on any device.

    Args:
        t: what the updates update; its optimizer's learning rates become tensors on `device`.
        tc: the training config.
        device: the training device.
    """

    def __init__(self, t: Trainable, tc: TrainConfig, device: torch.device) -> None:
        self.tc, self.device = tc, device
        self.uses: Counter[tuple[int, ...]] = Counter()
        self.recorded: dict[tuple[int, ...], _Recorded] = {}
        # recorded updates read the rate where the schedule writes it, one tensor for the groups (one rate)
        rate = torch.tensor(float(t.scheduler.lr), dtype=torch.float32, device=device)
        for group in t.optimizer.param_groups:
            group["lr"] = rate
            group["capturable"] = True  # the fused kernels are; torch asks for the flag to let them be recorded
        t.optimizer.register_state_dict_post_hook(_as_without_graphs)
        self._pool: Any = None  # the graphs' memory pool, and the stream of the eager updates (on first use)
        self._side: torch.cuda.Stream | None = None

    @property
    def count(self) -> int:
        """Updates recorded so far (one per batch shape met `EAGER_USES` times before)."""
        return len(self.recorded)

    def step(self, t: Trainable, group: list[Batch]) -> StepResult:
        """The update of `t` over `group` (one batch): eager for a shape's first uses, then its recording's replay."""
        (batch,) = group
        shape = (*batch.src.shape, *batch.tgt_in.shape)
        recorded = self.recorded.get(shape)
        if recorded is None:
            def update_on(b: Batch) -> StepResult:
                return update(t, [b], self.tc, self.device, tokens_on_device=True)

            self.uses[shape] += 1
            if self.uses[shape] <= EAGER_USES:
                return self.run_eagerly(lambda: update_on(batch))
            inputs = batch.clone()  # the shape's inputs for good, which later batches are copied into
            replay, results = self.record(t, lambda: _results(update_on(inputs)))
            recorded = self.recorded[shape] = _Recorded(replay=replay, batch=inputs, results=results)
        else:
            recorded.batch.copy_(batch)
        recorded.replay()
        results = recorded.results.clone()  # the next replay (of any shape: one pool) writes over the recorded ones
        return StepResult(loss=results[0], nll=results[1], tokens=batch.ntokens, update_tokens=batch.ntokens,
                          grad_norm=results[2], skipped=results[3].bool())

    def run_eagerly(self, update_: Callable[[], StepResult]) -> StepResult:
        """An update as it is, on a side stream (as torch asks of what runs before a recording)."""
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        main = torch.cuda.current_stream(self.device)
        self._side.wait_stream(main)
        with torch.cuda.stream(self._side):
            result = update_()
        main.wait_stream(self._side)
        return result

    def record(self, t: Trainable, update_: Callable[[], Tensor]) -> tuple[Callable[[], object], Tensor]:
        """`update_` recorded as a CUDA graph (recording runs nothing: the caller replays it), and the tensor the
        graph leaves the update's results in."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: a DataLoader's pin-memory thread may allocate page-locked memory meanwhile, which the
        # default ("global") would count as an error of this recording
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            results = update_()
        return graph.replay, results


def _results(r: StepResult) -> Tensor:
    """The device values of an update's result as one (4,) fp32 tensor: loss, NLL, gradient norm, skipped."""
    return torch.stack([r.loss.float(), r.nll.float(), r.grad_norm.float(), r.skipped.float()])


def _as_without_graphs(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    """Checkpoints hold the optimizer's groups as they are without graphs: the rate a float (reading it waits
    for the device, as saving a checkpoint does anyway), `capturable` off (which a run resumed from them
    on a device without the fused kernels would otherwise have to honour)."""
    for group in state["param_groups"]:
        if isinstance(group["lr"], Tensor):
            group["lr"] = group["lr"].item()
        group["capturable"] = False
    return state


def check_update_graphs(tc: TrainConfig, device: torch.device, ctx: Dist, model: torch.nn.Module | None = None) -> None:
    """Refuse `train.cuda_graphs` where an update cannot be recorded (what the config alone shows is
    checked when it loads); `model` is checked where one is given.

    Raises:
        UserError: not on CUDA, several processes, or a model whose training step waits for the GPU.
    """
    if device.type != "cuda":
        raise UserError(f"train.cuda_graphs: true records updates as CUDA graphs, which needs a CUDA device "
                        f"(training runs on {device.type}); set train.cuda_graphs: false")
    if ctx.enabled:
        raise UserError(f"train.cuda_graphs: true records the updates of one process, and this run has "
                        f"{ctx.world_size}; set train.cuda_graphs: false under torchrun")
    if model is not None and not getattr(model, "graph_safe", False):
        raise UserError(f"train.cuda_graphs: true needs a model whose training step never waits for the GPU, and "
                        f"the {getattr(model, 'name', type(model).__name__)} model's does (the RNNs read their "
                        f"source lengths on the host); set train.cuda_graphs: false, or train a transformer")
