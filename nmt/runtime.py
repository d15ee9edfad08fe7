"""Where the code runs: device, precision, seeding, random-state capture, inference mode.

Everything hardware-specific lives here, once, so that the training loop,
translation and benchmarks share one obvious switch. Which kernels run there, for
speed (attention kernels, TF32, the bf16 speed check, torch.compile), is `nmt.kernels`;
the process group of a torchrun job is `nmt.distributed`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import platform
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nmt.config.ranges import CUDA_INDEX, device_problem
from nmt.distributed import check_gpus_per_node, launched_as, local_rank, local_world_size
from nmt.errors import NodeError, shorten
from nmt.kernels import attention_kernels

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
    processes = launched_as()[0]
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
