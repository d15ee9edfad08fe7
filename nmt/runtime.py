"""Where the code runs: device, precision, seeding, random-state capture, torch.distributed.

Everything hardware-specific lives here, once, so that the training loop,
translation and benchmarks share one obvious switch. Which kernels run there, for
speed (attention kernels, TF32, the bf16 speed check, torch.compile), is `nmt.kernels`.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import os
import platform
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from nmt.config.ranges import CUDA_INDEX, device_problem
from nmt.errors import NodeError, RelayedError, UserError, shorten
from nmt.kernels import attention_kernels

T = TypeVar("T")

HALF_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The torch dtype of each reduced precision: autocast's in training, the weights' in decoding."""


def pick_device(name: str = "auto") -> torch.device:
    """`auto`: CUDA, then MPS, then CPU; `cuda:N` names one GPU. An unknown or absent device is a user error."""
    problem = device_problem(name)
    if problem:
        raise NodeError(f"device {shorten(repr(name), 60)} (train.device or --device): {problem}")
    if numbered := CUDA_INDEX.fullmatch(name):
        index, count = int(numbered[1]), torch.cuda.device_count() if torch.cuda.is_available() else 0
        if index >= count:
            have = f"{count} CUDA device{'s' if count != 1 else ''}" + (f" (cuda:0 to cuda:{count - 1})" if count else "")
            raise NodeError(f"device {name!r} (train.device or --device): this machine has {have}; use 'auto' or 'cpu'")
        torch.cuda.set_device(index)  # what CUDA calls without a device (streams, recorded graphs) then use
        return torch.device("cuda", index)
    if name == "auto":
        if torch.cuda.is_available():
            return _local_gpu()
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise NodeError("device 'cuda' (train.device or --device): no CUDA device is available; use 'auto' or 'cpu'")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise NodeError("device 'mps' (train.device or --device): MPS is not available; use 'auto' or 'cpu'")
    if name == "cuda":
        return _local_gpu()
    return torch.device(name)


def _local_gpu() -> torch.device:
    """The GPU of this process's LOCAL_RANK (0 outside torchrun), which must exist."""
    rank, count = local_rank(), torch.cuda.device_count()
    if rank >= count:  # rank 0 alone may use the GPU even where its node runs more processes than GPUs
        check_gpus_per_node(rank, local_world_size(), count)
    return torch.device("cuda", rank)


def hardware(device: torch.device) -> str:
    """A short description of what trained on `device`: its GPUs (one a process), or the CPU (and, under torchrun,
    how many processes)."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if device.type == "cuda":  # the GPUs this run used, not all the machine has
        return f"{processes}x {torch.cuda.get_device_name(device)}"
    if device.type == "mps":
        return "Apple GPU (MPS)"
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    threads = torch.get_num_threads()
    per_process = f"{threads} thread{'s' if threads > 1 else ''}"
    if processes > 1:
        per_process = f"{processes} processes x {per_process}"
    return f"CPU, {os.cpu_count()} cores, {per_process} ({model})"


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed-precision context for `precision` in fp32 | bf16 | fp16 (fp32: no autocast)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=HALF_DTYPES[precision])


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """A gradient scaler, active only for fp16 (bf16 and fp32 need none).

    Raises:
        NodeError: fp16 on a device this torch cannot scale gradients on.
    """
    try:
        return torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    except (AttributeError, RuntimeError, TypeError, ValueError) as err:
        raise NodeError(f"train.precision fp16 is not supported on {device.type} by torch {torch.__version__} "
                        f"({err}); use bf16 or fp32") from None


def peak_memory_mb(device: torch.device) -> dict[str, float]:
    """Peak memory so far: allocated GPU memory on CUDA, the process's resident set elsewhere."""
    if device.type == "cuda":
        return {"peak_mem_mb": round(torch.cuda.max_memory_allocated(device) / 2**20, 1)}
    try:
        import resource
    except ImportError:  # Windows
        return {}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return {"peak_rss_mb": round(rss / (2**20 if sys.platform == "darwin" else 2**10), 1)}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_states() -> dict[str, Any]:
    """Every random generator's state, for exact resumption, as tensors and plain data.

    Checkpoints load with `torch.load(weights_only=True)`, which refuses numpy
    arrays: numpy's state `(name, keys, pos, has_gauss, cached)` is kept with its
    624 uint32 keys as an int64 tensor.
    """
    name, keys, pos, has_gauss, cached = np.random.get_state()
    states: dict[str, Any] = {
        "python": random.getstate(),  # (version, tuple of ints, None)
        "numpy": (str(name), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what `rng_states` returned (or, from older checkpoints, numpy's own state tuple)."""
    random.setstate(tuple(states["python"]))
    name, keys, pos, has_gauss, cached = states["numpy"]
    if isinstance(keys, torch.Tensor):
        keys = keys.numpy()
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


# --------------------------------------------------------------------------- distributed


@dataclass(frozen=True)
class Dist:
    """This process's place in a (possibly single-process) job."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def local_world_size() -> int:
    """Processes on this node: torchrun's LOCAL_WORLD_SIZE, else at least this process's LOCAL_RANK + 1."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", str(local_rank() + 1)))


def check_gpus_per_node(local_rank: int, local_world_size: int, device_count: int) -> None:
    """Fail unless each of this node's processes can have a CUDA device of its own.

    Process `local_rank` uses `cuda:local_rank`; two processes cannot share one GPU under
    NCCL. Checked before any CUDA call or rendezvous, so every rank fails at once with
    the same line instead of one dying on `invalid device ordinal` and the others hanging.

    Raises:
        NodeError: more processes on this node than CUDA devices, naming both counts.
    """
    processes = max(local_world_size, local_rank + 1)
    if processes <= device_count:
        return
    gpus = f"{device_count} CUDA device{'s' if device_count != 1 else ''}"
    raise NodeError(f"torchrun --nproc_per_node: {processes} processes on this node (LOCAL_WORLD_SIZE) but {gpus}, "
                    f"and NCCL needs a GPU per process; use --nproc_per_node {device_count} or fewer, "
                    f"or --set train.device=cpu to train on the CPU with gloo")


def is_main_process() -> bool:
    """Rank 0 of a torchrun job, or a lone process (reads the launcher's RANK, so it holds after teardown too)."""
    return int(os.environ.get("RANK", "0")) == 0


def init_distributed(device_name: str = "auto") -> Dist:
    """Join the process group when launched by torchrun (RANK/WORLD_SIZE set): NCCL on GPUs, gloo on CPU.

    Raises:
        NodeError: NCCL with more processes on this node than GPUs (see `check_gpus_per_node`); a GPU by
            number (`cuda:N`), where each process takes the GPU of its LOCAL_RANK.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return Dist()
    if CUDA_INDEX.fullmatch(device_name):
        raise NodeError(f"train.device: {device_name} names one GPU, but torchrun gives each of its {world_size} "
                        f"processes the GPU of its LOCAL_RANK; set train.device: cuda (or auto)")
    if not dist.is_initialized():
        use_nccl = device_name in ("auto", "cuda") and torch.cuda.is_available()
        if use_nccl:  # check before touching a GPU or waiting for the other ranks
            check_gpus_per_node(local_rank(), local_world_size(), torch.cuda.device_count())
            torch.cuda.set_device(local_rank())
        # torch.distributed.nn binds `group=group.WORLD` as default arguments when it is
        # imported, and DDP imports it (through torch._dynamo). Imported after the group
        # exists, it would hold the group for the life of the process: `shutdown_distributed`
        # could not end gloo's worker threads, and one freeing a tensor while the
        # interpreter exits aborts the process. Imported first, it binds None.
        importlib.import_module("torch.distributed.nn")

        dist.init_process_group(backend="nccl" if use_nccl else "gloo")
    return Dist(rank=dist.get_rank(), world_size=dist.get_world_size())


def shutdown_distributed() -> None:
    """Destroy the process group. It is torn down at once (gloo's threads joined) if nothing else holds it:
    a DDP module does, so drop those first. A group still running when the interpreter exits can abort
    the process ("terminate called without an active exception"): a gloo thread that frees a tensor
    of its last collective then can no longer take the GIL."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce(values: list[float], device: torch.device, ctx: Dist, op: str = "sum") -> list[float]:
    """Sum (or `op="max"`) floats over ranks; the identity in a single process. Waits for the result."""
    if not ctx.enabled:
        return values
    return reduce_on_device(values, device, ctx, op=op).tolist()


def reduce_on_device(values: Sequence[float], device: torch.device, ctx: Dist, *, op: str = "sum",
                     dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """`values` summed (or `op="max"`) over ranks into a tensor on `device`, which nothing here reads.

    The host queues the copy and the collective and goes on: on CUDA the values travel
    from pinned memory behind the work already queued, and NCCL reduces them on the
    device's stream. (`torch.tensor(values, device=...)` would wait for that work first.)
    """
    if device.type == "cuda":
        t = torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
    else:
        t = torch.tensor(values, dtype=dtype, device=device)
    if ctx.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t


class HostCopy:
    """Small tensors copied to the host as the device gets to them, read later without waiting for more.

    Reading a value on the device (`.item()`, `bool(t)`, `.tolist()`) waits for every
    kernel queued on its stream so far. The training loop reads an update's outcome
    after it has queued the next update; such a read would wait for that one as well,
    and the GPU would then idle while the host prepares the update after it. Here the
    values are copied into pinned host memory right behind the kernels that compute
    them, and `values()` waits for that copy alone (a CUDA event). Elsewhere the values
    are read when asked for.
    """

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self._event: torch.cuda.Event | None = None
        if tensors and all(t.device.type == "cuda" for t in tensors):
            self._values = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
            for host, t in zip(self._values, tensors, strict=True):
                host.copy_(t.detach(), non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._values = [t.detach() for t in tensors]

    def values(self) -> list[Any]:
        """The tensors' values as Python numbers or lists, in order (waits for the device to reach them)."""
        if self._event is not None:
            self._event.synchronize()
        return [t.tolist() for t in self._values]


def all_gather(obj: Any, ctx: Dist) -> list[Any]:
    """Every rank's `obj` (picklable), in rank order; `[obj]` in a single process."""
    if not ctx.enabled:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(ctx: Dist) -> None:
    """Wait for every rank (a no-op in a single process)."""
    if ctx.enabled:
        dist.barrier()


def on_main(fn: Callable[[], T], ctx: Dist) -> T | None:
    """`fn()` on rank 0 while the other ranks wait; a UserError it raises is raised on every rank.

    For what rank 0 does alone before the others go on (lock and prepare the run directory,
    check the disk). Were its error raised there alone, the others would meet it at their next
    collective as gloo's or NCCL's "connection closed by peer", or wait until the process
    group times out. Other exceptions are rank 0's alone.

    Returns:
        What `fn` returned, on rank 0; None on the other ranks.
    """
    result, problem = None, None
    if ctx.is_main:
        try:
            result = fn()
        except UserError as err:
            problem = err
    message = all_gather(None if problem is None else str(problem), ctx)[0]  # rank 0's outcome, everywhere
    if problem is not None:
        raise problem
    if message is not None:
        raise RelayedError(message)
    return result


def on_every_rank(fn: Callable[[], T], ctx: Dist) -> T:
    """`fn()` on every rank; a UserError that any of them meets stops them all, its line printed once.

    The lowest rank that met one raises its own; the others raise it as a `RelayedError`, which the CLI
    does not print again. For what every rank does alike and can fail alike (load a checkpoint and check
    it against the config), where N processes would otherwise print N copies of one line, or a rank
    that met an error alone would leave the others waiting for it.
    """
    result, problem = None, None
    try:
        result = fn()
    except UserError as err:
        problem = err
    messages = all_gather(None if problem is None else str(problem), ctx)
    first = next((rank for rank, message in enumerate(messages) if message is not None), None)
    if first is None:
        return result  # type: ignore[return-value]
    if first == ctx.rank and problem is not None:
        raise problem
    raise RelayedError(messages[first])


@contextlib.contextmanager
def inference(model: torch.nn.Module) -> Iterator[None]:
    """Evaluation mode, no autograd and `attention_kernels`, restoring the previous mode afterwards."""
    was_training = model.training
    device = next(itertools.chain(model.parameters(), model.buffers()), torch.empty(0)).device
    model.eval()
    try:
        with torch.inference_mode(), attention_kernels(device):
            yield
    finally:
        model.train(was_training)
