"""A checkpoint write on a full disk: one clear line, the previous file intact, no temporary left."""

from __future__ import annotations

import pytest
import torch

from nmt.checkpoint import load_checkpoint, save_checkpoint
from nmt.errors import UserError
from nmt.fileio import write_atomic
from nmt.train.saving import CheckpointWriter


def test_a_checkpoint_too_big_for_the_disk_says_disk_full_and_keeps_the_old_one(small_disk):
    path = small_disk / "ckpt_1.pt"
    save_checkpoint({"model": {"w": torch.zeros(100)}}, path)  # fits
    with pytest.raises(UserError, match=r"ckpt_1\.pt: disk full .* MiB free there.*previous file is unchanged"):
        save_checkpoint({"model": {"w": torch.zeros(1_000_000)}}, path)  # 4 MB does not
    assert load_checkpoint(path)["model"]["w"].shape == (100,)
    assert [p.name for p in small_disk.iterdir()] == ["ckpt_1.pt"]


def test_plain_writes_that_fill_the_disk_say_so_too(small_disk):
    with pytest.raises(UserError, match="disk full"):
        write_atomic(small_disk / "out.txt", lambda f: f.write(b"x" * 1_000_000))
    assert list(small_disk.iterdir()) == []


def test_a_checkpoint_written_in_the_background_says_disk_full_in_the_training_thread(small_disk):
    """Training writes its checkpoints on a writer thread (`nmt.train.saving`): the same one line, raised where
    the loop calls the writer next, the checkpoint before it intact."""
    writer = CheckpointWriter(small_disk, keep_last=5)
    writer.submit({"model": {"w": torch.zeros(100)}}, small_disk / "ckpt_1.pt", best=False)
    writer.submit({"model": {"w": torch.zeros(1_000_000)}}, small_disk / "ckpt_2.pt", best=True)
    with pytest.raises(UserError, match=r"ckpt_2\.pt: disk full .* MiB free there.*previous file is unchanged"):
        writer.close()
    assert load_checkpoint(small_disk / "ckpt_1.pt")["model"]["w"].shape == (100,)
    assert [p.name for p in small_disk.iterdir()] == ["ckpt_1.pt"]
