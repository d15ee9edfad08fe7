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
optimizer (`step_unless`); in fp16 by the gradient scaler, whose loss scale, checks and
growth are tensors and kernels on the device too (it hands the fused optimizer its
`found_inf`). The graphs of all shapes share one memory pool; what an update returns is
copied out of the pool before the next replay can overwrite it. An RNN's recorded updates
run without cuDNN, whose recorded kernels an eager cuDNN call in between (validation)
left wrong (`without_cudnn`; more likely, validation moved the weights, which
`weights_in_place` now finds after each validation).

With `train.accumulate` above 1 an update is several batches, of shapes in any order, so
it is recorded in parts, each with its own uses and recording as above:

    each batch shape's forward and backward pass  ->  its loss, weighted by a tensor the host fills
                                                      with 1 / the update's target tokens before the
                                                      update's batches, adds its gradients to the fp32
                                                      `.grad`s and its loss to the update's sums
    the rest of the update, once for all shapes   ->  clipping and the optimizer's step on those
                                                      gradients, then the gradients and sums zeroed

The gradients and sums outlive the graphs (every parameter keeps its `.grad`, zero where an
update begins): a graph's own memory is only its own until the next one runs.

Where it applies (`check_update_graphs`): CUDA, one process, any precision (autocast's casts are
kernels like any other), static batch shapes, and a model whose training step never waits for the GPU (its
`graph_safe` attribute, `contract.Seq2Seq`): the Transformer and the RNNs, whose encoder
reads no source length on the host.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nmt.config import TrainConfig
from nmt.data.collate import Batch
from nmt.distributed import Dist
from nmt.errors import NodeError, UserError
from nmt.train.step import StepResult, Trainable, apply_gradients, forward_backward, update

log = logging.getLogger(__name__)

# Eager updates of a batch shape before its graph is recorded: the first sets up the optimizer's state and
# the kernel libraries' choices, the second runs with all of it in place, as the recording will.
EAGER_USES = 2


@dataclass
class _Recorded:
    """One recorded graph: how to replay it, the batch it reads (None: it reads none), the tensor it leaves its
    results in."""

    replay: Callable[[], object]
    batch: Batch | None  # the inputs, for this shape
    # an update's or its end's: (4,) fp32, summed loss, summed NLL, gradient norm, skipped (0 or 1); a batch's
    # part of an update leaves the update's sums so far, (2,)
    results: Tensor


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
        self.uses: Counter[tuple[object, ...]] = Counter()  # by what is recorded: an update or a part, its shape
        self.recorded: dict[tuple[object, ...], _Recorded] = {}
        self.in_parts = tc.accumulate > 1
        if self.in_parts:  # what outlives the parts' graphs: the gradients, the weight and sums of the update
            for p in t.model.parameters():
                p.grad = torch.zeros_like(p)
            self.weight = torch.zeros((), device=device)  # 1 / the update's target tokens
            self.sums = torch.zeros(2, device=device)  # the update's summed loss and NLL so far
        # recorded updates read the rate where the schedule writes it, one tensor for the groups (one rate)
        rate = torch.tensor(float(t.scheduler.lr), dtype=torch.float32, device=device)
        for group in t.optimizer.param_groups:
            group["lr"] = rate
            group["capturable"] = True  # the fused kernels are; torch asks for the flag to let them be recorded
        t.optimizer.register_state_dict_post_hook(_as_without_graphs)
        self._pool: Any = None  # the graphs' memory pool, and the stream of the eager updates (on first use)
        self._side: torch.cuda.Stream | None = None
        self._addresses: list[int] | None = None  # of the weights the graphs read and write (`weights_in_place`)

    @property
    def count(self) -> int:
        """Graphs recorded so far: one per batch shape met `EAGER_USES` times before (and with `accumulate`
        above 1, one more for the update's end)."""
        return len(self.recorded)

    def step(self, t: Trainable, group: list[Batch]) -> StepResult:
        """The update of `t` over `group`: each part eager for its first uses, then its recording's replay."""
        tokens = sum(b.ntokens for b in group)
        if not self.in_parts:
            (batch,) = group
            results = self._use(t, ("update", *batch.shape), batch, lambda b: _results(
                update(t, [b], self.tc, self.device, tokens_on_device=True)))
        else:
            self.weight.fill_(1 / max(tokens, 1))
            for b in group:
                self._use(t, ("batch", *b.shape), b, lambda b: self._add_batch(t, b))
            results = self._use(t, ("end",), None, lambda _: self._end(t))
        results = results.clone()  # the next replay (of any shape: one pool) writes over the recorded ones
        return StepResult(loss=results[0], nll=results[1], tokens=tokens, update_tokens=tokens,
                          grad_norm=results[2], skipped=results[3].bool())

    def weights_in_place(self, t: Trainable) -> bool:
        """Check, after work outside the updates (validation), that the weights are where the graphs recorded
        them; if not, drop the graphs, which each shape then records anew, and warn. Returns whether they were.

        A graph reads and writes the addresses its recording saw: weights moved to new memory (an `nn.LSTM`'s
        `Module.to`, which flattens them into a new cuDNN buffer) would leave the replays updating freed
        memory while the model's weights stood still."""
        addresses = _weight_addresses(t)
        if self._addresses is None or addresses == self._addresses:
            return True
        moved = sum(a != b for a, b in zip(addresses, self._addresses, strict=True))
        log.warning("train.cuda_graphs: %d of the %d weights moved in memory since the updates were recorded; "
                    "recording them again", moved, len(addresses))
        self.recorded.clear()
        self.uses.clear()
        self._addresses = None
        return False

    def _use(self, t: Trainable, key: tuple[object, ...], batch: Batch | None,
             run: Callable[[Batch | None], Tensor]) -> Tensor:
        """`run(batch)`: eager for the first `EAGER_USES` uses of `key`, then recorded, and replayed ever after."""
        recorded = self.recorded.get(key)
        if recorded is None:
            self.uses[key] += 1
            with without_cudnn():
                if self.uses[key] <= EAGER_USES:
                    return self.run_eagerly(lambda: run(batch))
                # the shape's inputs for good: later batches are copied into them
                inputs = batch.clone() if batch is not None else None
                before = _optimizer_state_keys(t.optimizer)
                replay, results = self.record(t, lambda: run(inputs))
                _refuse_state_set_up_in_recording(t, before, key)
                self._addresses = self._addresses or _weight_addresses(t)
            recorded = self.recorded[key] = _Recorded(replay=replay, batch=inputs, results=results)
        elif batch is not None:
            assert recorded.batch is not None
            recorded.batch.copy_(batch)
        recorded.replay()
        return recorded.results

    def _add_batch(self, t: Trainable, b: Batch) -> Tensor:
        """A batch of an update of several: its gradients added to the fp32 `.grad`s, its loss to the sums."""
        loss, nll = forward_backward(t, b, self.device, self.tc.precision, self.weight)
        if t.half is not None:
            t.half.add_grads_to_master()
        self.sums.add_(torch.stack([loss, nll]))
        return self.sums

    def _end(self, t: Trainable) -> Tensor:
        """An update of several batches, after its batches: the optimizer's step, then the sums and gradients
        zeroed for the next update; the update's results."""
        grad_norm, skipped = apply_gradients(t, self.tc)
        if t.half is not None:
            t.half.refresh()
        results = torch.cat([self.sums, grad_norm.float().reshape(1), skipped.float().reshape(1)])
        self.sums.zero_()
        torch._foreach_zero_([p.grad for p in t.model.parameters()])
        return results

    def run_eagerly(self, update_: Callable[[], Tensor]) -> Tensor:
        """An update (or part) as it is, on a side stream (as torch asks of what runs before a recording)."""
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        main = torch.cuda.current_stream(self.device)
        self._side.wait_stream(main)
        with torch.cuda.stream(self._side):
            result = update_()
        main.wait_stream(self._side)
        return result

    def record(self, t: Trainable, update_: Callable[[], Tensor]) -> tuple[Callable[[], object], Tensor]:
        """`update_` (an update or part) recorded as a CUDA graph (recording runs nothing: the caller replays it),
        and the tensor the graph leaves its results in."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: a DataLoader's pin-memory thread may allocate page-locked memory meanwhile, which the
        # default ("global") would count as an error of this recording
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            results = update_()
        return graph.replay, results


@contextmanager
def without_cudnn() -> Iterator[None]:
    """No cuDNN in what runs under it: the updates that are recorded, and their eager uses before, which set up
    what the recording uses.

    cuDNN's RNN kernels, recorded in a graph, replayed wrongly once cuDNN's RNN had run eagerly in between, as
    validation runs it: on an H200 (2026-11-27) the recorded updates of Multi30k's no-attention RNN trained
    as its eager ones up to its first validation, then its loss rose (5.85 to 6.24 fifty updates later, in
    bf16; in fp32 too), and it went NaN some hundred updates on. Without cuDNN in the whole process, torch's
    own fused cell kernels run each step, a replay launches them all at once, and the same run trained as the
    eager one (loss 4.60 against 4.56 at update 700, BLEU 8.5 against 8.1); without it in the recorded updates
    alone, as here, it has not yet run on a GPU. The RNNs are the only models here with cuDNN kernels; eager
    updates and validation keep them.

    A likelier cause, found since by reading torch (2026-12-02) and not yet run on a GPU: validation built its
    `Translator` with `Module.to`, which makes an `nn.LSTM` or `nn.GRU` with cuDNN flatten its weights into a
    new buffer, so the replays updated freed memory (without cuDNN in the process nothing is flattened, which
    fits the run above). `Translator` now leaves a model in place as it is, and `UpdateGraphs.weights_in_place`
    records again where weights moved; whether recorded updates then need cuDNN off is for a GPU to tell."""
    with switched_off(torch.backends.cudnn):
        yield


@contextmanager
def switched_off(backend: Any) -> Iterator[None]:
    """`backend` (a module of `torch.backends` with an `enabled` switch: cudnn, mkldnn) off under it, then as it was."""
    enabled = backend.enabled
    backend.enabled = False
    try:
        yield
    finally:
        backend.enabled = enabled


def _weight_addresses(t: Trainable) -> list[int]:
    """Where the weights the updates read and write lie: the model's, and its bf16 or fp16 copy's."""
    halves = t.half.halves if t.half is not None else []
    return [p.data_ptr() for p in (*t.model.parameters(), *halves)]


def _optimizer_state_keys(optimizer: torch.optim.Optimizer) -> dict[int, frozenset[str]]:
    """What state the optimizer holds, by parameter: the names of its entries (Adam's step and moments)."""
    return {id(p): frozenset(s) for p, s in optimizer.state.items()}


def _refuse_state_set_up_in_recording(t: Trainable, before: dict[int, frozenset[str]], key: tuple[object, ...]) -> None:
    """Raise if recording `key` set up optimizer state that was not there before it.

    The optimizer sets up a parameter's state (Adam's moments, zeros) at its first gradient. A parameter that got
    no gradient in the eager uses of a shape but gets one in its recording would have that setting-up recorded:
    every replay would zero its moments and step count again, and the run would train wrongly without a word.
    Every parameter of this project's models gets a gradient from every batch, so this guards models to come.

    Raises:
        UserError: naming the parameters and the batch shape.
    """
    after = _optimizer_state_keys(t.optimizer)
    if after == before:
        return
    names = {id(p): name for name, p in t.model.named_parameters()}
    new = [names.get(i, "a parameter outside the model") for i, keys in after.items() if keys != before.get(i)]
    shown = ", ".join(new[:3]) + (f" and {len(new) - 3} more" if len(new) > 3 else "")
    what = "the end of an update" if key == ("end",) else f"the {key[0]} of batch shape {key[1:]}"
    raise UserError(f"train.cuda_graphs: recording {what} set up optimizer state for {len(new)} "
                    f"parameter(s) that got no gradient in its {EAGER_USES} eager uses ({shown}); every replay "
                    f"would reset it. Set train.cuda_graphs: false for this model")


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


def resolve_update_graphs(tc: TrainConfig, device: torch.device, ctx: Dist, model_type: str) -> tuple[bool, str]:
    """Whether a run records its updates, `train.cuda_graphs` auto decided, and why not where it does not (""
    where it does, or where the config says false).

    Auto records where whole runs were measured with it: the Transformer on one CUDA device, in fp32 or bf16 on
    the bf16 copy, with settings an update can be recorded with (`TrainConfig.cuda_graphs_needs`); fp16 and
    autocast are recorded where the config says true. On an H200 its recorded updates ran 3.6x
    (fp32) and 4.5x (bf16) as fast as eager ones, and three Multi30k Transformers trained to early stopping
    with them (2026-11-27). The RNNs' recorded updates went wrong there with cuDNN's kernels, and their runs
    without them are not yet repeated on a GPU, so auto leaves them eager.
    """
    if tc.cuda_graphs != "auto":
        return bool(tc.cuda_graphs), ""
    if device.type != "cuda":
        return False, f"training runs on {device.type}"
    if ctx.enabled:
        return False, f"{ctx.world_size} processes (recorded updates are one process's)"
    if model_type != "transformer":
        return False, f"the {model_type} model (auto records the Transformer's updates only)"
    if tc.precision == "fp16" or (tc.precision == "bf16" and not tc.on_half_copy()):
        how = "on an fp16 copy" if tc.on_half_copy() else "under autocast"
        return False, (f"precision {tc.precision} {how} (auto records fp32 and bf16 on the bf16 copy, the "
                       f"precisions whole runs were measured with)")
    needs = tc.cuda_graphs_needs()
    if needs:
        return False, f"recording needs {'; '.join(needs)}"
    return True, ""


def check_update_graphs(tc: TrainConfig, device: torch.device, ctx: Dist, model: torch.nn.Module | None = None) -> None:
    """Refuse `train.cuda_graphs` where an update cannot be recorded (what the config alone shows is
    checked when it loads); `model` is checked where one is given.

    Raises:
        NodeError: not on CUDA, several processes, or a model whose training step waits for the GPU.
    """
    if device.type != "cuda":
        raise NodeError(f"train.cuda_graphs: true records updates as CUDA graphs, which needs a CUDA device "
                        f"(training runs on {device.type}); set train.cuda_graphs: false")
    if ctx.enabled:
        raise NodeError(f"train.cuda_graphs: true records the updates of one process, and this run has "
                        f"{ctx.world_size}; set train.cuda_graphs: false under torchrun")
    if model is not None and not getattr(model, "graph_safe", False):
        raise NodeError(f"train.cuda_graphs: true needs a model whose training step never waits for the GPU, and "
                        f"the {getattr(model, 'name', type(model).__name__)} model's does; set "
                        f"train.cuda_graphs: false")
