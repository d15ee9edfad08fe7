"""Kernel choices: the GPU's attention kernels and their order, TF32, the bf16 speed check.

The attention flags are process-wide and settable without a GPU, so the choices a GPU would run are checked here
on a CPU-only machine too.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

from nmt import kernels
from tests.op_counts import OpCounter

SDPA_FLAGS = {
    "cudnn": torch.backends.cuda.cudnn_sdp_enabled, "flash": torch.backends.cuda.flash_sdp_enabled,
    "efficient": torch.backends.cuda.mem_efficient_sdp_enabled, "math": torch.backends.cuda.math_sdp_enabled,
}


def sdpa_flags() -> dict[str, bool]:
    return {name: enabled() for name, enabled in SDPA_FLAGS.items()}


def kernel_order() -> list[str]:
    """The kernels torch tries, in its order (torch 2.6 on; flash first before)."""
    from torch.nn.attention import SDPBackend

    return [SDPBackend(b).name for b in torch._C._get_sdp_priority_order()]


ordered = pytest.mark.skipif(not hasattr(torch._C, "_get_sdp_priority_order"),
                             reason="this torch tries the attention kernels in a fixed order (before 2.6)")


@pytest.fixture
def restored_kernels():
    """The process-wide attention flags, their order and TF32 as they were before the test."""
    from torch.nn.attention import _cur_sdpa_kernel_backends as current
    from torch.nn.attention import sdpa_kernel

    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    with sdpa_kernel(current(with_priority=True), set_priority=True):
        yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def test_attention_kernels_leave_cudnn_out_on_a_gpu_for_the_block_only():
    # The flags are process-wide and settable without a GPU; the choice is what a GPU would run.
    before = sdpa_flags()
    assert before["cudnn"], "torch's default allows cuDNN attention; this test would not show the switch"
    with kernels.attention_kernels(torch.device("cuda", 0)):
        assert sdpa_flags() == {"cudnn": False, "flash": True, "efficient": True, "math": True}
    assert sdpa_flags() == before
    with kernels.attention_kernels(torch.device("cpu")):
        assert sdpa_flags() == before  # off CUDA nothing changes


@ordered
def test_a_gpu_tries_the_memory_efficient_kernel_before_flash_in_training_and_inference_blocks(restored_kernels):
    before = kernel_order()
    assert before.index("FLASH_ATTENTION") < before.index("EFFICIENT_ATTENTION"), "torch's default order changed"
    with kernels.attention_kernels(torch.device("cuda", 0)):
        assert kernel_order()[:3] == ["EFFICIENT_ATTENTION", "FLASH_ATTENTION", "MATH"]
    assert kernel_order() == before  # for the block only
    kernels.enable_fast_math(torch.device("cpu"))
    assert kernel_order() == before  # off CUDA nothing changes
    kernels.enable_fast_math(torch.device("cuda", 0))  # training: for the whole process
    assert kernel_order()[:3] == ["EFFICIENT_ATTENTION", "FLASH_ATTENTION", "MATH"]
    assert sdpa_flags() == {"cudnn": False, "flash": True, "efficient": True, "math": True}
    kernels.set_attention_kernels(["cudnn", "flash"])  # what bench/train_speed.py --attention asks for
    assert kernel_order()[:2] == ["CUDNN_ATTENTION", "FLASH_ATTENTION"] and sorted(kernel_order()) == sorted(before)
    assert sdpa_flags() == {"cudnn": True, "flash": True, "efficient": False, "math": False}


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_training_on_a_gpu_runs_short_attention_calls_with_the_memory_efficient_kernel(restored_kernels, causal):
    """Causal calls without a mask, which flash would take first, and calls with a padding bias, which it refuses."""
    kernels.enable_fast_math(torch.device("cuda"))
    q, k, v = (torch.randn(64, 8, 16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    bias = None if causal else torch.zeros(64, 1, 1, 16, device="cuda", dtype=torch.bfloat16)
    with OpCounter() as ops:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal).sum().backward()
    assert ops.counts["_scaled_dot_product_efficient_attention"] == 1, ops.counts
    assert ops.counts["_scaled_dot_product_efficient_attention_backward"] == 1, ops.counts
    assert not any("flash" in name for name in ops.counts), ops.counts


def test_bf16_warns_on_a_cpu_whose_bf16_matrix_products_are_slower_and_nothing_else_does(caplog):
    with caplog.at_level(logging.WARNING):
        kernels.warn_if_slow_precision(torch.device("cpu"), "bf16", "train.precision:", speedup=0.55)
    assert caplog.text.count("\n") == 1
    assert "train.precision: bf16 on this CPU" in caplog.text and "at 0.55x the speed of fp32" in caplog.text
    assert "use fp32" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        kernels.warn_if_slow_precision(torch.device("cpu"), "bf16", "train.precision:", speedup=kernels.SLOW_HALF)
        kernels.warn_if_slow_precision(torch.device("cpu"), "bf16", "train.precision:", speedup=1.7)
        for precision in ("fp32", "fp16"):  # nothing is timed: these never warn
            kernels.warn_if_slow_precision(torch.device("cpu"), precision, "train.precision:", speedup=0.01)
        for major in (8, 9):  # an A100, an H100: bf16 tensor cores, whatever a CPU's speed would say
            kernels.warn_if_slow_precision(torch.device("cuda", 0), "bf16", "train.precision:", speedup=0.01,
                                           capability=(major, 0))
    assert caplog.text == ""


def test_bf16_warns_on_a_gpu_without_bf16_tensor_cores(caplog):
    with caplog.at_level(logging.WARNING):
        kernels.warn_if_slow_precision(torch.device("cuda", 0), "bf16", "precision:", capability=(7, 5))  # a T4
    assert caplog.text.count("\n") == 1
    assert "precision: bf16 on this GPU (compute capability 7.5), which has no bf16 tensor cores" in caplog.text
    assert "use fp16, which its tensor cores run, or fp32" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for precision in ("fp32", "fp16"):
            kernels.warn_if_slow_precision(torch.device("cuda", 0), precision, "precision:", capability=(7, 0))
    assert caplog.text == ""


@pytest.mark.gpu
def test_bf16_on_this_gpu_warns_only_below_compute_capability_8(caplog):
    device = torch.device("cuda", torch.cuda.current_device())
    with caplog.at_level(logging.WARNING):
        kernels.warn_if_slow_precision(device, "bf16", "train.precision:")
    assert ("no bf16 tensor cores" in caplog.text) == (torch.cuda.get_device_capability(device)[0] < 8)


def test_the_bf16_speed_probe_times_real_products_and_leaves_the_random_stream_alone():
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    speedup = kernels.half_matmul_speedup(torch.bfloat16, n=128, reps=2)
    assert math.isfinite(speedup) and speedup > 0
    assert torch.equal(torch.rand(4), expected)  # a resumed run's restored state is not drawn from
