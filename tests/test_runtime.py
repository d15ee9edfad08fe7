"""Device choice and joining a torchrun job: too many processes for the node's GPUs fail at once, in one line.

CUDA is faked here (`fake_gpus`), so the GPU paths run on a CPU-only machine.
"""

from __future__ import annotations

import logging
import math
import sys

import pytest
import torch

from nmt import cli, runtime
from nmt.errors import UserError
from nmt.runtime import (
    Dist,
    HostCopy,
    check_gpus_per_node,
    init_distributed,
    pick_device,
    reduce_on_device,
)
from tests.op_counts import OpCounter


@pytest.mark.parametrize(("local_rank", "local_world_size", "device_count"), [
    (0, 1, 1),  # one process, one GPU
    (0, 1, 8),  # one process on a node of 8 GPUs
    (1, 2, 2),
    (3, 4, 4),  # the last process of a full node
    (1, 2, 4),  # fewer processes than GPUs
])
def test_one_gpu_per_process_is_fine(local_rank, local_world_size, device_count):
    check_gpus_per_node(local_rank, local_world_size, device_count)


@pytest.mark.parametrize(("local_rank", "local_world_size", "device_count", "counts"), [
    (1, 2, 1, "2 processes on this node (LOCAL_WORLD_SIZE) but 1 CUDA device,"),
    (0, 2, 1, "2 processes on this node (LOCAL_WORLD_SIZE) but 1 CUDA device,"),  # rank 0 fails too: nobody waits
    (5, 8, 4, "8 processes on this node (LOCAL_WORLD_SIZE) but 4 CUDA devices,"),
    (2, 1, 2, "3 processes on this node (LOCAL_WORLD_SIZE) but 2 CUDA devices,"),  # no LOCAL_WORLD_SIZE: rank + 1
])
def test_more_processes_than_gpus_names_both_counts_and_what_to_do(local_rank, local_world_size, device_count,
                                                                   counts):
    with pytest.raises(UserError) as err:
        check_gpus_per_node(local_rank, local_world_size, device_count)
    message = str(err.value)
    assert counts in message
    assert f"use --nproc_per_node {device_count} or fewer" in message
    assert "--set train.device=cpu" in message and "\n" not in message


class FakeGroup:
    """Stands in for torch.distributed's process group; records how it was joined."""

    def __init__(self):
        self.backend: str | None = None

    def join(self, backend: str) -> None:
        self.backend = backend


@pytest.fixture
def group(monkeypatch) -> FakeGroup:
    fake = FakeGroup()
    monkeypatch.setattr(runtime.dist, "is_initialized", lambda: fake.backend is not None)
    monkeypatch.setattr(runtime.dist, "init_process_group", fake.join)
    monkeypatch.setattr(runtime.dist, "get_rank", lambda: int(runtime.os.environ["RANK"]))
    monkeypatch.setattr(runtime.dist, "get_world_size", lambda: int(runtime.os.environ["WORLD_SIZE"]))
    return fake


def as_torchrun_rank(monkeypatch, rank: int, nproc: int) -> None:
    """The environment torchrun gives process `rank` of `--standalone --nproc_per_node nproc`."""
    for key, value in {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": nproc, "LOCAL_WORLD_SIZE": nproc}.items():
        monkeypatch.setenv(key, str(value))


def fake_gpus(monkeypatch, count: int) -> list[int]:
    """Pretend this machine has `count` CUDA devices; returns the list `torch.cuda.set_device` appends to."""
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def no_cuda_calls(monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("CUDA was consulted")

    for name in ("is_available", "device_count", "set_device"):
        monkeypatch.setattr(torch.cuda, name, fail)


def test_cpu_under_torchrun_joins_with_gloo_without_consulting_cuda(monkeypatch, group):
    as_torchrun_rank(monkeypatch, 1, 2)
    no_cuda_calls(monkeypatch)
    assert init_distributed("cpu") == Dist(rank=1, world_size=2)
    assert group.backend == "gloo"
    assert pick_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("device", ["auto", "cuda"])
@pytest.mark.parametrize("rank", [0, 1])
def test_two_processes_on_one_gpu_fail_before_touching_it_or_waiting(monkeypatch, group, device, rank):
    as_torchrun_rank(monkeypatch, rank, 2)
    chosen = fake_gpus(monkeypatch, 1)
    with pytest.raises(UserError, match="2 processes on this node .* but 1 CUDA device"):
        init_distributed(device)
    assert chosen == [] and group.backend is None


def test_one_process_per_gpu_joins_with_nccl_on_its_own_gpu(monkeypatch, group):
    as_torchrun_rank(monkeypatch, 1, 2)
    chosen = fake_gpus(monkeypatch, 2)
    assert init_distributed("auto") == Dist(rank=1, world_size=2)
    assert chosen == [1] and group.backend == "nccl"
    assert pick_device("auto") == pick_device("cuda") == torch.device("cuda", 1)


def test_pick_device_takes_the_gpu_of_its_local_rank_and_refuses_one_that_is_missing(monkeypatch):
    fake_gpus(monkeypatch, 1)
    assert pick_device("auto") == torch.device("cuda", 0)  # outside torchrun
    as_torchrun_rank(monkeypatch, 0, 2)
    assert pick_device("auto") == torch.device("cuda", 0)  # rank 0 alone, e.g. scoring after a gloo job
    as_torchrun_rank(monkeypatch, 1, 2)
    for device in ("auto", "cuda"):
        with pytest.raises(UserError, match="2 processes on this node .* but 1 CUDA device"):
            pick_device(device)


@pytest.mark.parametrize("rank", [0, 1])
def test_the_cli_prints_one_line_on_local_rank_0_and_every_rank_exits_2(rank, monkeypatch, capsys, group,
                                                                         tiny_config_file):
    """Every process of the node meets the error; its local rank 0 alone prints it, not one line per process."""
    as_torchrun_rank(monkeypatch, rank, 2)
    fake_gpus(monkeypatch, 1)
    monkeypatch.setattr(cli, "SILENT_EXIT_WAIT_S", 0.0)  # the wait for torchrun to stop a silent process
    monkeypatch.setattr(sys, "argv", ["nmt", "train", str(tiny_config_file)])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    if rank == 0:
        assert err.startswith("nmt: error: torchrun --nproc_per_node: 2 processes on this node") and err.count("\n") == 1
    else:
        assert err == ""


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
    with runtime.attention_kernels(torch.device("cuda", 0)):
        assert sdpa_flags() == {"cudnn": False, "flash": True, "efficient": True, "math": True}
    assert sdpa_flags() == before
    with runtime.attention_kernels(torch.device("cpu")):
        assert sdpa_flags() == before  # off CUDA nothing changes


@ordered
def test_a_gpu_tries_the_memory_efficient_kernel_before_flash_in_training_and_inference_blocks(restored_kernels):
    before = kernel_order()
    assert before.index("FLASH_ATTENTION") < before.index("EFFICIENT_ATTENTION"), "torch's default order changed"
    with runtime.attention_kernels(torch.device("cuda", 0)):
        assert kernel_order()[:3] == ["EFFICIENT_ATTENTION", "FLASH_ATTENTION", "MATH"]
    assert kernel_order() == before  # for the block only
    runtime.enable_fast_math(torch.device("cpu"))
    assert kernel_order() == before  # off CUDA nothing changes
    runtime.enable_fast_math(torch.device("cuda", 0))  # training: for the whole process
    assert kernel_order()[:3] == ["EFFICIENT_ATTENTION", "FLASH_ATTENTION", "MATH"]
    assert sdpa_flags() == {"cudnn": False, "flash": True, "efficient": True, "math": True}
    runtime.set_attention_kernels(["cudnn", "flash"])  # what bench/train_speed.py --attention asks for
    assert kernel_order()[:2] == ["CUDNN_ATTENTION", "FLASH_ATTENTION"] and sorted(kernel_order()) == sorted(before)
    assert sdpa_flags() == {"cudnn": True, "flash": True, "efficient": False, "math": False}


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_training_on_a_gpu_runs_short_attention_calls_with_the_memory_efficient_kernel(restored_kernels, causal):
    """Causal calls without a mask, which flash would take first, and calls with a padding bias, which it refuses."""
    runtime.enable_fast_math(torch.device("cuda"))
    q, k, v = (torch.randn(64, 8, 16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    bias = None if causal else torch.zeros(64, 1, 1, 16, device="cuda", dtype=torch.bfloat16)
    with OpCounter() as ops:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal).sum().backward()
    assert ops.counts["_scaled_dot_product_efficient_attention"] == 1, ops.counts
    assert ops.counts["_scaled_dot_product_efficient_attention_backward"] == 1, ops.counts
    assert not any("flash" in name for name in ops.counts), ops.counts


def test_inference_blocks_choose_the_attention_kernels_of_the_model_device():
    model = torch.nn.Linear(2, 2).train()
    with runtime.inference(model):
        assert not model.training and torch.is_inference_mode_enabled()
        assert sdpa_flags()["cudnn"]  # a CPU model: untouched
    assert model.training


def test_bf16_warns_on_a_cpu_whose_bf16_matrix_products_are_slower_and_nothing_else_does(caplog):
    with caplog.at_level(logging.WARNING):
        runtime.warn_if_slow_precision(torch.device("cpu"), "bf16", "train.precision:", speedup=0.55)
    assert caplog.text.count("\n") == 1
    assert "train.precision: bf16 on this CPU" in caplog.text and "at 0.55x the speed of fp32" in caplog.text
    assert "use fp32" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        runtime.warn_if_slow_precision(torch.device("cpu"), "bf16", "train.precision:", speedup=runtime.SLOW_HALF)
        runtime.warn_if_slow_precision(torch.device("cpu"), "bf16", "train.precision:", speedup=1.7)
        for precision in ("fp32", "fp16"):  # nothing is timed: these never warn
            runtime.warn_if_slow_precision(torch.device("cpu"), precision, "train.precision:", speedup=0.01)
        for major in (8, 9):  # an A100, an H100: bf16 tensor cores, whatever a CPU's speed would say
            runtime.warn_if_slow_precision(torch.device("cuda", 0), "bf16", "train.precision:", speedup=0.01,
                                           capability=(major, 0))
    assert caplog.text == ""


def test_bf16_warns_on_a_gpu_without_bf16_tensor_cores(caplog):
    with caplog.at_level(logging.WARNING):
        runtime.warn_if_slow_precision(torch.device("cuda", 0), "bf16", "precision:", capability=(7, 5))  # a T4
    assert caplog.text.count("\n") == 1
    assert "precision: bf16 on this GPU (compute capability 7.5), which has no bf16 tensor cores" in caplog.text
    assert "use fp16, which its tensor cores run, or fp32" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for precision in ("fp32", "fp16"):
            runtime.warn_if_slow_precision(torch.device("cuda", 0), precision, "precision:", capability=(7, 0))
    assert caplog.text == ""


@pytest.mark.gpu
def test_bf16_on_this_gpu_warns_only_below_compute_capability_8(caplog):
    device = torch.device("cuda", torch.cuda.current_device())
    with caplog.at_level(logging.WARNING):
        runtime.warn_if_slow_precision(device, "bf16", "train.precision:")
    assert ("no bf16 tensor cores" in caplog.text) == (torch.cuda.get_device_capability(device)[0] < 8)


def test_the_bf16_speed_probe_times_real_products_and_leaves_the_random_stream_alone():
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    speedup = runtime.half_matmul_speedup(torch.bfloat16, n=128, reps=2)
    assert math.isfinite(speedup) and speedup > 0
    assert torch.equal(torch.rand(4), expected)  # a resumed run's restored state is not drawn from


def test_host_copy_gives_the_values_as_python_numbers():
    values = HostCopy([torch.tensor(True), torch.tensor([3.0, 0.0]), torch.tensor(7)]).values()
    assert values == [True, [3.0, 0.0], 7] and type(values[2]) is int


def test_reduce_on_device_in_one_process_keeps_the_values_in_a_tensor():
    t = reduce_on_device([3, 4], torch.device("cpu"), Dist(), dtype=torch.int64)
    assert t.dtype == torch.int64 and t.tolist() == [3, 4]


@pytest.mark.gpu
def test_on_cuda_neither_waits_for_the_work_queued_after_its_values():
    """What lets the training loop read an update's outcome with the next update still running."""
    x = torch.arange(5, device="cuda")
    copy = HostCopy([x.sum(), x > 2])
    torch.cuda._sleep(2_000_000_000)  # a kernel of about a second, queued behind the copy
    assert copy.values() == [10, [False, False, False, True, True]]
    assert not torch.cuda.current_stream().query()  # the sleep still runs: the read did not wait for it
    sums = reduce_on_device([1, 2], torch.device("cuda"), Dist(), dtype=torch.int64)
    assert not torch.cuda.current_stream().query()  # queued behind the sleep, not waited for
    assert sums.tolist() == [1, 2]
    assert torch.cuda.current_stream().query()  # reading the tensor itself waits for everything
