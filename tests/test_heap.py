"""nmt.heap: with freed memory kept, a block freed and allocated again is reused, not faulted in anew."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from nmt.heap import keep_freed_memory

BLOCK_MIB = 64
"""Above glibc's own ceiling for the mmap threshold (32 MiB): by default such a block is mapped anew each time."""

PROBE = f"""
import resource, sys
import torch
from nmt.heap import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else False
n = ({BLOCK_MIB} << 20) // 4  # fp32 elements
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):  # the heap grows to its size
    x = torch.ones(n); y = torch.ones(n // 3); del x, y
start = faults()
for _ in range(10):  # as a step does: its tensors allocated and freed again
    x = torch.ones(n); y = torch.ones(n // 3); del x, y
print(kept, (faults() - start) / 10)
"""

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="nmt.heap sets glibc's malloc; this C library is another")


def _faults_per_step(mode: str) -> tuple[bool, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env, timeout=120,
                         check=True).stdout.split()
    return out[0] == "True", float(out[1])


@glibc
def test_a_block_freed_and_taken_again_is_reused_without_page_faults():
    pages = (BLOCK_MIB << 20) // os.sysconf("SC_PAGE_SIZE")
    kept, with_kept = _faults_per_step("keep")
    assert kept
    _, by_default = _faults_per_step("default")
    assert by_default >= pages  # glibc's own settings: the block is mapped, zeroed by the kernel, faulted in
    assert with_kept < pages / 20


@glibc
def test_it_can_be_called_again():
    assert keep_freed_memory() and keep_freed_memory()


ARENA_PROBE = """
import ctypes, sys, tempfile, threading
import torch
from nmt.heap import keep_freed_memory, share_arenas
keep_freed_memory()  # as the nmt command does
shared = share_arenas() if sys.argv[1] == "share" else False
lock, started, done = threading.Lock(), threading.Barrier(8), threading.Barrier(8)
def search():  # as nmt serve's connection threads: alive together, their searches one at a time
    torch.ones(1000)
    started.wait()
    with lock:
        x = torch.ones((40 << 20) // 4); del x
    done.wait()
threads = [threading.Thread(target=search) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, (ctypes.c_char_p, ctypes.c_char_p)
libc.malloc_info.argtypes, libc.fclose.argtypes = (ctypes.c_int, ctypes.c_void_p), (ctypes.c_void_p,)
with tempfile.NamedTemporaryFile(suffix=".xml") as f:
    fp = libc.fopen(f.name.encode(), b"w")
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    print(shared, open(f.name).read().count("<heap nr="))
"""


@glibc
def test_threads_that_search_in_turn_share_malloc_arenas():
    """`nmt serve` ran each connection's search on its own thread; each thread's malloc arena kept the memory of
    its search after it, so the server grew with the connections open at once (12 concurrent requests: 831 MB
    where one took 321 MB; 386 MB shared). Counted by glibc's own report of its arenas (`malloc_info`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}

    def arenas(mode: str) -> tuple[bool, int]:
        out = subprocess.run([sys.executable, "-c", ARENA_PROBE, mode], capture_output=True, text=True, env=env,
                             timeout=120, check=True).stdout.split()
        return out[0] == "True", int(out[1])

    (_, apart), (shared, together) = arenas("apart"), arenas("share")
    assert shared and together <= 2 < apart, (apart, together)
