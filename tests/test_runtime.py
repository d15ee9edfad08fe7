"""Device choice and joining a torchrun job: too many processes for the node's GPUs fail at once, in one line.

CUDA is faked here (`fake_gpus`), so the GPU paths run on a CPU-only machine.
"""

from __future__ import annotations

import os
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


def test_inference_blocks_choose_the_attention_kernels_of_the_model_device():
    model = torch.nn.Linear(2, 2).train()
    with runtime.inference(model):
        assert not model.training and torch.is_inference_mode_enabled()
        assert torch.backends.cuda.cudnn_sdp_enabled()  # a CPU model: untouched
    assert model.training


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


def test_hardware_names_the_device_that_trained_not_the_machine_s_first_gpu(monkeypatch):
    cpu = runtime.hardware(torch.device("cpu"))  # on a machine with GPUs too: a CPU run is a CPU's result
    assert cpu.startswith(f"CPU, {os.cpu_count()} cores, {torch.get_num_threads()} thread")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert f"CPU, {os.cpu_count()} cores, 2 processes x {torch.get_num_threads()} thread" in runtime.hardware(torch.device("cpu"))


@pytest.mark.gpu
def test_hardware_counts_the_gpus_a_run_used():
    last = torch.device("cuda", torch.cuda.device_count() - 1)
    assert runtime.hardware(last) == f"1x {torch.cuda.get_device_name(last)}"  # one process: one GPU, however many there are
