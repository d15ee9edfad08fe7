"""Counter-based random numbers: a uniform that is a pure function of (seed, line, step).

A seeded sampler that consumes one `torch.Generator` batch after batch gives a line
the numbers that its batch's place in the stream left it, so its sample changed with
the batch budget, a pipe's timing or a resumed run. Here the number of a line at an
output step is a hash of the seed, the line and the step alone, as in counter-based
generators (Salmon et al., 2011, "Parallel random numbers: as easy as 1, 2, 3"), so no
state is carried from batch to batch and any row can be drawn in any batch.

The hash is a chain of 32-bit xorshift-multiply mixers (`mix32`, the shape of
MurmurHash3's `fmix32`, constants of C. Wellons's `lowbias32` and MurmurHash2). Its
multipliers are below 2**31, so a 32-bit value times one stays below 2**63: the
int64 tensor arithmetic never overflows, and gives the same bits on every device. The
seed and the step are the same for every row of a step and are mixed on the host,
in Python; only the line's part runs on the device, as a few element-wise operations
on a (B,) tensor, which never wait for it.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import Tensor

MASK32 = 0xFFFF_FFFF
_MUL1, _MUL2 = 0x7FEB_352D, 0x5BD1_E995  # odd and < 2**31: x < 2**32 times either is < 2**63
_KEYS = (0x9E37_79B9, 0x85EB_CA6B, 0xC2B2_AE35, 0x27D4_EB2F)  # tell the mixes of one chain apart
UNIFORM_BITS = 48
"""Bits of each uniform: (k + 1/2) / 2**48 for a 48-bit k, exact in float64 and 2**-49 from 0 and 1."""

Int = TypeVar("Int", int, Tensor)


def mix32(x: Int) -> Int:
    """A bijection of [0, 2**32) that spreads every input bit over the output bits.

    Args:
        x: a Python int or an int64 tensor, every value in [0, 2**32).

    Returns:
        The same type, values in [0, 2**32): equal for an int and a tensor holding it.
    """
    x = x ^ (x >> 16)
    x = (x * _MUL1) & MASK32
    x = x ^ (x >> 15)
    x = (x * _MUL2) & MASK32
    return x ^ (x >> 16)


def step_keys(seed: int, step: int) -> tuple[int, int, int]:
    """Three 32-bit keys of (seed, step), shared by every line: mixed on the host, once per step.

    Args:
        seed: any int; taken modulo 2**64 (as `torch.manual_seed` takes it).
        step: the output position, >= 0.
    """
    seed %= 1 << 64
    k = mix32((seed & MASK32) ^ _KEYS[0])
    k = mix32(k ^ (seed >> 32))
    k = mix32(k ^ (step & MASK32))
    k = mix32(k ^ ((step >> 32) & MASK32))
    return k, mix32(k ^ _KEYS[1]), mix32(k ^ _KEYS[2])


def uniform(seed: int, lines: Tensor, step: int) -> Tensor:
    """One uniform number in (0, 1) per line, a pure function of (seed, line, step).

    The same on a CPU and a GPU, for any batch the lines come in and in any order.

    Args:
        seed: the sampler's seed (modulo 2**64).
        lines: int64 line numbers, any shape; every int64 is a distinct line.
        step: the output position.

    Returns:
        float64, `lines`'s shape and device, each value (k + 1/2) / 2**48 for a
        48-bit k: strictly inside (0, 1), so its log is finite.
    """
    a, b, c = step_keys(seed, step)
    low, high = lines & MASK32, (lines >> 32) & MASK32  # each in [0, 2**32), negative lines too
    h1 = mix32(low ^ a)
    h2 = mix32(h1 ^ high ^ b)
    h3 = mix32(h2 ^ c)
    k = (h2 << 16) | (h3 >> 16)  # 48 bits: 32 of h2, the top 16 of h3
    return (k.double() + 0.5) * 2.0 ** -UNIFORM_BITS


def random_seed() -> int:
    """A seed from torch's global generator: unseeded sampling follows `torch.manual_seed`."""
    return int(torch.randint(0, 1 << 62, (), dtype=torch.long))
