"""Freed memory kept by the C allocator for reuse, where a training or search step on a CPU refaults it.

PyTorch's CPU tensors come from the C library's `malloc`. glibc serves each block above
its mmap threshold (128 KiB at first, then raised as far as the largest block freed,
at most 32 MiB) with a fresh mapping of its own, and gives a freed one back to the
kernel at once; the top of the heap goes back too once more than the trim threshold
is free. A step allocates and frees the same activations, gradients and caches every
time, so every step makes the kernel map and zero them anew: a page fault for every
4 KiB. On a 2-core CPU, a speed-bench process of 10 Multi30k Transformer updates of
4,096 tokens and their warm-up made 3.1-3.4 million minor faults, 0.39 million with both
thresholds raised, and `nmt train` ran 11-27% faster (README, "Speed on a 2-core CPU").

`keep_freed_memory` raises both thresholds once for the process (`mallopt`; the
same as the environment variables MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_
set before it started). The price: the process keeps the memory of its largest
moment in its heap, where it had given some back, for the next step to reuse (peak
resident memory 5-14% higher in those runs of `nmt train`). A GPU's
memory is not concerned (PyTorch caches that itself), nor are Arrow's tables (their
own allocator). Elsewhere than Linux with glibc (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLDS = (1 << 30, 32 << 20)
"""Tried in turn: 1 GiB, then glibc's own ceiling on 64-bit machines before version 2.35 (32 MiB)."""
_TRIM_THRESHOLD = (1 << 31) - 1  # the largest an int holds: the heap's top stays mapped


_M_ARENA_MAX = -8


def _mallopt():
    """glibc's `mallopt`, or None elsewhere (macOS, musl)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt


def share_arenas(most: int = 2) -> bool:
    """Have the process's threads share at most `most` glibc malloc arenas.

    glibc gives threads arenas of their own, up to 8 per core, each keeping the memory its thread freed. A
    server that answers each connection on a thread of its own (`nmt serve`) runs every search on another
    thread, one at a time: each new thread's arena kept the 40-45 MB of a search after it, and 12 concurrent
    requests held 831 MB where one held 321 MB (on 2 cores; up to 128 arenas on 16). Call it before the
    threads start.

    Returns:
        Whether the setting took effect (False without glibc).
    """
    mallopt = _mallopt()
    return bool(mallopt and mallopt(_M_ARENA_MAX, most))


def keep_freed_memory() -> bool:
    """Have glibc's `malloc` keep freed blocks for reuse instead of returning them to the kernel.

    Call it once, early, in a process that trains or translates (the `nmt` command does).

    Returns:
        Whether the settings took effect (False without glibc).
    """
    mallopt = _mallopt()
    if mallopt is None:
        return False
    # Setting either threshold stops glibc from raising the mmap threshold itself: a trim threshold
    # alone would leave every block above 128 KiB mapped apart, unmapped when freed, faulted in again.
    if not any(mallopt(_M_MMAP_THRESHOLD, size) for size in _MMAP_THRESHOLDS):
        return False
    return bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
