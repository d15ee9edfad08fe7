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
