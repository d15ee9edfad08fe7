"""The process group of a torchrun job: joining and leaving it, this process's rank, and collectives.

A lone process is a job of one (`Dist()`): every function here is then the identity or a
no-op, so the training loop calls them alike with one process or many. Joined with NCCL on
GPUs, gloo on CPU. Where the code runs (the device, precision, seeding) is `nmt.runtime`.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from nmt.config.ranges import CUDA_INDEX
from nmt.errors import NodeError, PeerStopped, RelayedError, UserError
from nmt.launch import check_rendezvous, launched_as, local_rank, local_world_size, rank, world_size

T = TypeVar("T")


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


def init_distributed(device_name: str = "auto") -> Dist:
    """Join the process group when launched by torchrun (RANK/WORLD_SIZE set): NCCL on GPUs, gloo on CPU.

    Raises:
        NodeError: NCCL with more processes on this node than GPUs (see `check_gpus_per_node`); a GPU by
            number (`cuda:N`), where each process takes the GPU of its LOCAL_RANK.
    """
    size = world_size()
    if size <= 1:
        return Dist()
    rank()  # a RANK of another job's size fails here, not in the rendezvous
    if CUDA_INDEX.fullmatch(device_name):
        raise NodeError(f"train.device: {device_name} names one GPU, but torchrun gives each of its {size} "
                        f"processes the GPU of its LOCAL_RANK; set train.device: cuda (or auto)")
    check_rendezvous()
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


LOST_PEER = ("connection closed by peer", "connection reset by peer", "broken pipe")
"""What gloo's error says (lower-cased) when a process of the group has gone under a collective: its socket
closed (it exited), reset (it was killed) or broken (it left as this one wrote)."""


@contextlib.contextmanager
def lost_peers_named() -> Iterator[None]:
    """Inside, gloo's error for a process of the group that has gone becomes `PeerStopped`, naming this rank.

    A rank that fails alone (an error only it meets, a signal, the OOM killer) leaves the others waiting
    in a collective, which gloo ends with "Connection closed by peer [127.0.0.1]:52121 ... GLHF!": a line
    that names a socket rather than a rank and reads as a second failure. Their error then says that
    another process stopped, and the message of that process stays the one to read.

    Raises:
        PeerStopped: under torchrun (WORLD_SIZE > 1), from gloo's error, which it chains.
    """
    try:
        yield
    except RuntimeError as err:
        lost = any(words in str(err).lower() for words in LOST_PEER)
        size, this_rank, _ = launched_as()
        if not lost or size <= 1:
            raise
        raise PeerStopped(f"another process of this run stopped, and rank {this_rank} cannot go on without it; "
                          f"that process's own message, or torchrun's report of how it ended, says why") from err
