"""Checkpoints written in the background (`nmt.train.saving`): in order, from a copy taken when submitted,
with a failed write raised in the caller's thread."""

from __future__ import annotations

import threading

import pytest
import torch

from nmt.checkpoint import load_checkpoint, periodic_checkpoints
from nmt.train.saving import CheckpointWriter, to_host


class _HeldWhilePickled:
    """Pickles as 0, once `release` is set: a write that holds it cannot finish before the test lets it."""

    def __init__(self) -> None:
        self.pickling, self.release = threading.Event(), threading.Event()

    def __reduce__(self):
        self.pickling.set()
        assert self.release.wait(timeout=30)
        return (int, (0,))


def test_checkpoints_are_written_in_order_with_best_and_pruned_to_keep_last(tmp_path):
    writer = CheckpointWriter(tmp_path, keep_last=2)
    for step in (10, 20, 30):
        writer.submit({"model": {"w": torch.full((3,), float(step))}, "step": step}, tmp_path / f"ckpt_{step}.pt",
                      best=step == 20)
    writer.close()
    assert [p.name for p in periodic_checkpoints(tmp_path)] == ["ckpt_20.pt", "ckpt_30.pt"]
    assert load_checkpoint(tmp_path / "best.pt")["step"] == 20
    assert torch.equal(load_checkpoint(tmp_path / "ckpt_30.pt")["model"]["w"], torch.full((3,), 30.0))
    assert not list(tmp_path.glob(".tmp*"))


def test_submit_returns_before_the_write_ends_with_the_state_as_it_was_when_submitted(tmp_path):
    weights = torch.zeros(4)
    state = {"exp_avg": torch.ones(2)}
    held = _HeldWhilePickled()
    writer = CheckpointWriter(tmp_path, keep_last=5)
    writer.submit({"model": {"w": weights}, "optimizer": {"state": [state]}, "held": held},
                  tmp_path / "ckpt_1.pt", best=False)
    assert held.pickling.wait(timeout=30)  # the writer thread is inside the write, and submit has returned
    assert not (tmp_path / "ckpt_1.pt").exists()
    weights += 5  # the next updates change the live tensors in place
    state["exp_avg"].mul_(3)
    held.release.set()
    writer.close()
    saved = torch.load(tmp_path / "ckpt_1.pt", weights_only=False)  # the test's own file: `held` pickled as a call
    assert torch.equal(saved["model"]["w"], torch.zeros(4)) and torch.equal(saved["optimizer"]["state"][0]["exp_avg"],
                                                                            torch.ones(2))
    assert saved["held"] == 0


def test_a_failed_write_is_raised_in_the_callers_thread_and_leaves_the_checkpoints_before_it(tmp_path):
    writer = CheckpointWriter(tmp_path, keep_last=5)
    writer.submit({"step": 1}, tmp_path / "ckpt_1.pt", best=False)
    writer.submit({"step": 2}, tmp_path / "missing" / "ckpt_2.pt", best=False)  # no such folder
    with pytest.raises(FileNotFoundError):
        writer.wait()
    writer.wait()  # raised once
    assert load_checkpoint(tmp_path / "ckpt_1.pt")["step"] == 1
    writer.submit({"step": 3}, tmp_path / "missing" / "ckpt_3.pt", best=False)
    while writer._last is not None and not writer._last.done():
        threading.Event().wait(0.01)
    with pytest.raises(FileNotFoundError):
        writer.raise_if_failed()
    writer.close()


def test_to_host_copies_tensors_and_rebuilds_containers():
    live = {"a": [torch.ones(2), (torch.zeros(1), 3)], "b": "text", "c": None}
    copy = to_host(live)
    live["a"][0].add_(1)
    assert torch.equal(copy["a"][0], torch.ones(2)) and isinstance(copy["a"][1], tuple)
    assert copy["a"][1][1] == 3 and copy["b"] == "text" and copy["c"] is None
