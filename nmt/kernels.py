"""Which kernels run, for speed: torch's attention kernels and TF32 on a GPU, whether bf16 pays here, torch.compile.

The device and the precision themselves are `nmt.runtime`'s (the process group, `nmt.distributed`'s);
this module chooses how the work runs there. Training makes its choices for the whole process
(`enable_fast_math`, `compile_model`), inference for its block only (`attention_kernels`,
which `nmt.runtime.inference` enters).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

log = logging.getLogger(__name__)


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
