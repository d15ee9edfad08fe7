"""Device choice: `pick_device` takes the GPU of its torchrun local rank, inference blocks set the model's kernels, and `hardware` names what a run used.

CUDA is faked here (`fake_gpus`), so the GPU paths run on a CPU-only machine.
"""

from __future__ import annotations

import os

import pytest
import torch

from nmt import runtime
from nmt.errors import UserError
from nmt.runtime import pick_device
from tests.test_distributed import as_torchrun_rank, fake_gpus


def test_pick_device_takes_the_gpu_of_its_local_rank_and_refuses_one_that_is_missing(monkeypatch):
    fake_gpus(monkeypatch, 1)
    assert pick_device("auto") == torch.device("cuda", 0)  # outside torchrun
    as_torchrun_rank(monkeypatch, 0, 2)
    assert pick_device("auto") == torch.device("cuda", 0)  # rank 0 alone, e.g. scoring after a gloo job
    as_torchrun_rank(monkeypatch, 1, 2)
    for device in ("auto", "cuda"):
        with pytest.raises(UserError, match="2 processes on this node .* but 1 CUDA device"):
            pick_device(device)


def test_inference_blocks_choose_the_attention_kernels_of_the_model_device():
    model = torch.nn.Linear(2, 2).train()
    with runtime.inference(model):
        assert not model.training and torch.is_inference_mode_enabled()
        assert torch.backends.cuda.cudnn_sdp_enabled()  # a CPU model: untouched
    assert model.training


def test_hardware_names_the_device_that_trained_not_the_machine_s_first_gpu(monkeypatch):
    cpu = runtime.hardware(torch.device("cpu"))  # on a machine with GPUs too: a CPU run is a CPU's result
    assert cpu.startswith(f"CPU, {os.cpu_count()} cores, {torch.get_num_threads()} thread")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")  # torchrun sets both; WORLD_SIZE alone is a lone process's stale variable
    assert f"CPU, {os.cpu_count()} cores, 2 processes x {torch.get_num_threads()} thread" in runtime.hardware(torch.device("cpu"))


@pytest.mark.gpu
def test_hardware_counts_the_gpus_a_run_used():
    last = torch.device("cuda", torch.cuda.device_count() - 1)
    assert runtime.hardware(last) == f"1x {torch.cuda.get_device_name(last)}"  # one process: one GPU, however many there are
