"""Counter-based uniforms: a pure function of (seed, line, step), exact at the int64 edges, and uniform."""

from __future__ import annotations

import math

import pytest
import torch

from nmt.decode.counter_random import MASK32, UNIFORM_BITS, mix32, step_keys, uniform

EDGES = [0, 1, 2, 2**31 - 2, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 2, 2**32 - 1, 2**32, 2**32 + 1,
         2**33 + 7, 2**62, 2**63 - 2, 2**63 - 1, -1, -2, -(2**31), -(2**32), -(2**63)]


def reference_mix32(x: int) -> int:
    """`mix32` in unbounded Python ints, written from its definition: no int64 is involved."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) % 2**32
    x ^= x >> 15
    x = (x * 0x5BD1E995) % 2**32
    return x ^ (x >> 16)


def reference_uniform(seed: int, line: int, step: int) -> float:
    a, b, c = step_keys(seed, step)
    line %= 2**64  # two's complement, as the int64 tensor holds it
    h1 = reference_mix32((line % 2**32) ^ a)
    h2 = reference_mix32(h1 ^ (line >> 32) ^ b)
    h3 = reference_mix32(h2 ^ c)
    return ((h2 << 16 | h3 >> 16) + 0.5) / 2**UNIFORM_BITS


def test_the_tensor_mix_is_the_exact_one_at_the_int32_and_uint32_edges():
    values = [v for v in EDGES if 0 <= v <= MASK32] + [0x7FEB352D, 0x80000000 | 12345, 0xDEADBEEF]
    assert mix32(torch.tensor(values)).tolist() == [reference_mix32(v) for v in values]
    assert [mix32(v) for v in values] == [reference_mix32(v) for v in values]
    # a bijection of 32 bits: no two of 2**20 consecutive inputs collide, whatever the high bits
    for start in (0, 2**31 - 2**19, 2**32 - 2**20):
        assert mix32(torch.arange(start, start + 2**20)).unique().numel() == 2**20


@pytest.mark.parametrize("seed", [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1, -1])
@pytest.mark.parametrize("step", [0, 5, 2**31 - 1, 2**31, 2**32 - 1, 2**32])
def test_uniforms_are_the_exact_ones_at_the_edges_and_strictly_inside_0_1(seed, step):
    u = uniform(seed, torch.tensor(EDGES), step)
    assert u.dtype == torch.float64
    assert u.tolist() == [reference_uniform(seed, line, step) for line in EDGES]
    assert bool(((u > 0) & (u < 1)).all()) and bool(u.log().neg().isfinite().all())
    assert u.unique().numel() == len(EDGES)  # every line its own number


def test_the_extreme_uniforms_are_inside_0_1_in_float64_and_in_float32():
    lowest, highest = 0.5 / 2**UNIFORM_BITS, (2**UNIFORM_BITS - 0.5) / 2**UNIFORM_BITS
    assert 0 < lowest and highest < 1 and math.isfinite(-math.log(highest)) and -math.log(lowest) < 40
    assert 0 < torch.tensor(lowest).float() and torch.tensor(highest).float() <= 1  # (float32 rounds it to 1)


def test_a_uniform_depends_on_seed_line_and_step_alone_and_on_every_one_of_them():
    lines = torch.tensor([3, 0, 7, 2**33 + 3])
    u = uniform(9, lines, 4)
    for i, line in enumerate(lines.tolist()):  # alone, in another batch, in another order
        assert uniform(9, torch.tensor([line]), 4).item() == u[i].item()
    assert torch.equal(uniform(9, lines.flip(0), 4), u.flip(0))
    for other in (uniform(10, lines, 4), uniform(9 + 2**32, lines, 4), uniform(9, lines, 5), uniform(9, lines + 1, 4),
                  uniform(9, lines + 2**32, 4)):
        assert not torch.isin(other, u).any()


def test_the_numbers_of_version_one_do_not_change():
    """Seeded samples are a promise across releases: a change of the hash changes every user's samples."""
    pinned = [float.fromhex(h) for h in ("0x1.94f04707d3d30p-1", "0x1.9fa5eba099480p-4", "0x1.73cc1304be710p-1")]
    assert uniform(1, torch.tensor([0, 1, 2]), 0).tolist() == pinned
    assert [reference_uniform(1, line, 0) for line in (0, 1, 2)] == pinned


def test_uniform_over_many_lines_and_steps_and_uncorrelated_neighbours():
    """10^6 numbers of a (line, step) grid: a chi-square over 100 bins, and no correlation between the
    numbers of neighbouring lines, neighbouring steps, neighbouring seeds or lines 2**32 apart."""
    lines, steps = torch.arange(2**31 - 2500, 2**31 + 2500), range(200)  # across the int32 edge
    grid = torch.stack([uniform(5, lines, s) for s in steps])  # (steps, lines)
    n = grid.numel()
    counts = torch.histc(grid.float(), bins=100, min=0.0, max=1.0)
    chi2 = float(((counts - n / 100) ** 2 / (n / 100)).sum())
    assert chi2 < 99 + 6 * math.sqrt(2 * 99), chi2  # 6 sigma of chi-square(99)
    assert abs(float(grid.mean()) - 0.5) < 6 * math.sqrt(1 / 12 / n)
    bound = 6 / math.sqrt(grid[:, 1:].numel())

    def corr(x: torch.Tensor, y: torch.Tensor) -> float:
        return float(torch.corrcoef(torch.stack([x.flatten(), y.flatten()]))[0, 1])

    assert abs(corr(grid[:, 1:], grid[:, :-1])) < bound  # line l and line l + 1
    assert abs(corr(grid[1:], grid[:-1])) < bound  # step s and step s + 1
    other_seed = torch.stack([uniform(6, lines, s) for s in steps])
    assert abs(corr(grid, other_seed)) < bound
    far = torch.stack([uniform(5, lines + 2**32, s) for s in steps])
    assert abs(corr(grid, far)) < bound
    # the low bits too: the parity of the 48-bit integer is a fair, independent coin between neighbours
    bits = (grid * 2**UNIFORM_BITS - 0.5).long() & 1
    assert abs(float(bits.double().mean()) - 0.5) < 6 * math.sqrt(0.25 / n)
    assert abs(corr(bits[:, 1:].double(), bits[:, :-1].double())) < bound


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_computes_the_cpus_numbers():
    lines = torch.cat([torch.tensor(EDGES), torch.arange(100_000)])
    for seed, step in [(0, 0), (2**63 - 1, 7), (-1, 2**32 + 1)]:
        assert torch.equal(uniform(seed, lines.cuda(), step).cpu(), uniform(seed, lines, step))

