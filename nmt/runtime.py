"""Where the code runs: device, precision, seeding, random-state capture, torch.distributed.

Everything hardware-specific lives here, once, so that the training loop,
translation and benchmarks share one obvious switch.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import logging
import os
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from nmt.config.schema import CUDA_INDEX, device_problem
from nmt.errors import NodeError, RelayedError, UserError, shorten

log = logging.getLogger(__name__)

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


ATTENTION_KERNELS = ("efficient", "flash", "math")
"""The `scaled_dot_product_attention` kernels nmt allows on a GPU, in the order torch tries them (the first that
accepts a call runs it); cuDNN's is left out.

Flash attention accepts only calls without a mask: here the decoder's causal self-attention (the others carry a
padding bias, which only the memory-efficient and plain kernels take). On translation's short sentences it was
the slower of the two for those calls. On an H200 in bf16, one causal call's forward and backward at
Transformer-base's batches of 32,768 positions took 1.91 ms with flash against 0.86 ms with the memory-efficient
kernel at 16 positions a sentence, 1.09 / 0.58 ms at 32, 0.74 / 0.48 ms at 64 and 0.52 / 0.51 ms at 128
(`bench/attention_speed.py`, 2026-11-27). In the profile of a recorded Multi30k update, flash's backward took 73 us
a call and the memory-efficient kernel's, with its padding bias, 36 us. Flash stays second, for what the other
refuses."""


SDPA_KERNELS = ("flash", "efficient", "math", "cudnn")
"""The names of torch's `scaled_dot_product_attention` kernels, as settings and benches spell them."""


def sdpa_backends(names: Sequence[str]) -> list[Any]:
    """torch's `SDPBackend` of each kernel name (`SDPA_KERNELS`)."""
    from torch.nn.attention import SDPBackend

    members = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "math": SDPBackend.MATH, "cudnn": SDPBackend.CUDNN_ATTENTION}
    return [members[name] for name in names]


def _ordered() -> bool:
    """Whether this torch lets the kernels' order be chosen (2.6 on); before it, flash comes first."""
    return hasattr(torch._C, "_set_sdp_priority_order")


def set_attention_kernels(names: Sequence[str] = ATTENTION_KERNELS) -> None:
    """For the whole process: `scaled_dot_product_attention` may use the kernels `names` and no other, tried in
    that order where this torch lets the order be chosen (`ATTENTION_KERNELS` by default)."""
    enable = {"flash": torch.backends.cuda.enable_flash_sdp, "efficient": torch.backends.cuda.enable_mem_efficient_sdp,
              "math": torch.backends.cuda.enable_math_sdp, "cudnn": torch.backends.cuda.enable_cudnn_sdp}
    for name in SDPA_KERNELS:
        enable[name](name in names)
    if _ordered():
        first = [int(b) for b in sdpa_backends(names)]
        torch._C._set_sdp_priority_order(first + [b for b in torch._C._get_sdp_priority_order() if b not in first])


def enable_fast_math(device: torch.device) -> None:
    """TF32 matrix products and `ATTENTION_KERNELS`, for the whole process, on GPUs (a no-op elsewhere).

    Training sets this once; inference (`inference`) makes the same kernel choice for
    its block only, and keeps full fp32 matrix products, so that fp32 translations on
    a GPU match the CPU's.
    """
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        set_attention_kernels()


def attention_kernels(device: torch.device) -> contextlib.AbstractContextManager:
    """Within the block, `scaled_dot_product_attention` on a GPU uses `ATTENTION_KERNELS`, in their order.

    Left to itself, torch may pick cuDNN's attention for bf16/fp16 on recent GPUs;
    cuDNN builds a new execution plan for every new (batch, length) shape, and both
    token-budget batching and search (whose keys grow by one position per step) make
    a new shape at almost every call (measured on an H100: bf16 training 7.7x slower
    than fp32). Flash attention (causal, unmasked) and the memory-efficient kernel
    (padding masks) need no per-shape planning, with the plain maths as the fallback.
    A no-op off CUDA.
    """
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel

    if _ordered():
        return sdpa_kernel(sdpa_backends(ATTENTION_KERNELS), set_priority=True)
    return sdpa_kernel(sdpa_backends(ATTENTION_KERNELS))


SLOW_HALF = 0.8
"""Below this many times fp32's speed, a CPU's bf16 matrix products make bf16 not worth it: `warn_if_slow_precision`."""


def half_matmul_speedup(dtype: torch.dtype, n: int = 512, reps: int = 5) -> float:
    """How many times faster an n x n matrix product runs in `dtype` than in fp32 on this CPU (below 1: slower).

    Each product is timed as its fastest of `reps` runs after one untimed: about 20 ms in all at n = 512
    on 2 cores.
    """
    def fastest(a: torch.Tensor, b: torch.Tensor) -> float:
        a @ b
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        return min(times)

    draw = torch.Generator().manual_seed(0)  # its own: training's random stream stays as it was
    a, b = torch.randn(n, n, generator=draw), torch.randn(n, n, generator=draw)
    return fastest(a, b) / fastest(a.to(dtype), b.to(dtype))


def warn_if_slow_precision(device: torch.device, precision: str, where: str, *, speedup: float | None = None,
                           capability: tuple[int, int] | None = None) -> None:
    """Warn when `precision` is bf16 on a CPU whose bf16 matrix products are clearly slower than fp32 ones,
    or on an NVIDIA GPU without bf16 tensor cores.

    A CPU's instruction flags do not tell: on a 2-core Intel Xeon VM with AVX512-BF16 and no AMX,
    bf16 products ran at 0.55x the speed of fp32 ones, and a Multi30k Transformer trained at 0.55x
    fp32's speed (beam search at 0.9x); on a 2-core AMD EPYC with AVX2 only, an update took 68 s in bf16
    against 2.7 s in fp32. So one product is timed each way (`half_matmul_speedup`, about 20 ms), or
    `speedup` is taken as that measure, and the warning comes below `SLOW_HALF`.

    A GPU's compute capability does tell: bf16 tensor cores came with 8.0 (Ampere), and torch emulates
    bf16 below it (`torch.cuda.is_bf16_supported`), where fp16 has tensor cores (a T4, 7.5; a V100,
    7.0). `capability` stands for the device's (major, minor).
    """
    if precision != "bf16":
        return
    if device.type == "cuda" and not torch.version.hip:
        major, minor = torch.cuda.get_device_capability(device) if capability is None else capability
        if major < 8:
            log.warning("%s bf16 on this GPU (compute capability %d.%d), which has no bf16 tensor cores (they "
                        "came with 8.0) and runs bf16 emulated; use fp16, which its tensor cores run, or fp32",
                        where, major, minor)
        return
    if device.type != "cpu":
        return
    speedup = half_matmul_speedup(torch.bfloat16) if speedup is None else speedup
    if speedup >= SLOW_HALF:
        return
    log.warning("%s bf16 on this CPU (%s), whose bf16 matrix products ran at %.2fx the speed of fp32 ones: "
                "bf16 is slower than fp32 here; use fp32", where, torch.backends.cpu.get_cpu_capability(), speedup)


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


def compile_model(model: torch.nn.Module, *, mode: str = "default", backend: str = "inductor",
                  dynamic: bool = True, shapes: int = 0, in_place: bool = False) -> torch.nn.Module:
    """`torch.compile(model)`, or `model` itself with a warning where compiling is unsupported.

    By default shapes are compiled as dynamic from the start: token-budget batches
    change batch size and length at every step, and specialising on each would
    recompile again and again (lengths padded to a multiple of `train.pad_to_multiple`
    keep the number of distinct shapes small for the kernels chosen inside, and
    `train.batch_shapes` the number of CUDA graphs `reduce-overhead` records).
    With `dynamic` false, each shape gets a graph compiled for its exact sizes
    instead, which only suits a bounded number of shapes (static batch shapes):
    `shapes`, that number, is how many graphs dynamo then keeps per function
    before it gives up compiling (torch's own limit where it is larger).
    Errors while compiling a graph (at its first call) also fall back to eager
    execution: dynamo's `suppress_errors` logs them and runs that graph uncompiled.

    Args:
        mode: torch.compile's mode: "default", "reduce-overhead" (CUDA graphs),
            "max-autotune" or "max-autotune-no-cudagraphs".
        dynamic: one graph for all shapes; false: a graph per shape.
        shapes: with `dynamic` false, the number of distinct shapes the model will see.
        in_place: compile through `model.compile` and return `model`: its parameter names stay
            as they are, and a model may choose what to compile (`compile_by_step` models,
            `nmt.models.contract.Seq2Seq`).
    """
    try:
        import torch._dynamo  # deferred: importing dynamo costs seconds, and only compiled runs need it

        torch._dynamo.config.suppress_errors = True
        if not dynamic:
            limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
            setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), shapes))
        options = dict(backend=backend, mode=None if mode == "default" else mode, dynamic=dynamic)
        if in_place:
            model.compile(**options)
            return model
        return torch.compile(model, **options)
    except Exception as err:  # unsupported Python or platform, unknown backend
        log.warning("train.compile: torch.compile is unavailable here (%s: %s); training uncompiled",
                    type(err).__name__, str(err).splitlines()[0] if str(err) else "")
        return model


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
