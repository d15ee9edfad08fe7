"""Hard kills: a SIGKILLed run resumes exactly, and kills at random moments never leave a broken run directory."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from nmt.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    periodic_checkpoints,
)
from nmt.fileio import TMP_PREFIX
from nmt.train.loop import train
from tests.train.helpers import nmt_process, same_weights, tiny_cfg, wait_for, weights, write_cfg


@pytest.mark.slow
def test_sigkill_after_a_checkpoint_then_resume_is_bitwise_exact(small_corpus, tmp_path):
    """20 uninterrupted updates equal 10, a SIGKILL, and 10 more after resuming (CPU, fp32, dropout on)."""
    killed = tmp_path / "killed"
    # `nmt train` in a process of its own, which SIGKILL ends with no chance to clean up. (A forked
    # child of this test process could deadlock in torch on a lock held by a thread it does not inherit.)
    config = write_cfg(tmp_path / "killed.yaml", small_corpus, killed, max_steps=100_000, save_every=10, keep_last=100)
    proc = nmt_process("train", str(config))
    try:
        wait_for(lambda: (killed / "ckpt_10.pt").exists(), proc, poll=0.002)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert latest_checkpoint(killed).name == "ckpt_10.pt", "killed too late: the run got past step 20"

    # the other two runs in processes like the first: one environment (threads, caches) for all three
    straight = tmp_path / "straight"
    for path, run, keep in ((tmp_path / "straight.yaml", straight, 2), (tmp_path / "resumed.yaml", killed, 100)):
        finish = nmt_process("train", str(write_cfg(path, small_corpus, run, max_steps=20, save_every=10,
                                                     keep_last=keep)))
        _, err = finish.communicate(timeout=300)
        assert finish.returncode == 0, err[-3000:]
    assert load_checkpoint(killed / "ckpt_20.pt")["progress"]["step"] == 20
    assert same_weights(weights(straight / "ckpt_20.pt"), weights(killed / "ckpt_20.pt"))


@pytest.mark.slow
def test_random_sigkills_always_leave_a_resumable_run(small_corpus, tmp_path):
    """Kill a training process at 12 seeded random moments (start-up, steps, checkpoint writes), resuming each time."""
    rng = random.Random(4)
    run = tmp_path / "run"
    # A step budget no process reaches before its kill, however fast the steps (a run that
    # finished on its own would be one kill fewer); the last run below sets a reachable one.
    config = write_cfg(tmp_path / "tiny.yaml", small_corpus, run, max_steps=100_000, save_every=3, valid_every=9,
                       keep_last=2)
    written = run / ".lock"  # each start writes its PID there once it holds the run directory
    kills = 0
    for _ in range(12):
        before = latest_checkpoint(run)
        before_step = load_checkpoint(before)["progress"]["step"] if before else 0
        stamp = written.stat().st_mtime_ns if written.exists() else None
        proc = nmt_process("train", str(config))
        # Past the imports the run locks its directory: from there on, preparing data, loading, steps, saving.
        wait_for(lambda stamp=stamp: written.exists() and written.stat().st_mtime_ns != stamp, proc)
        time.sleep(rng.uniform(0.0, 2.5))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
        after = latest_checkpoint(run)
        if after is not None:
            payload = load_checkpoint(after)  # never a broken file
            assert payload["progress"]["step"] == int(after.stem.split("_")[1]) >= before_step
    assert kills == 12
    last = latest_checkpoint(run)
    end = (load_checkpoint(last)["progress"]["step"] if last else 0) // 3 * 3 + 6  # two more checkpoints
    summary = train(tiny_cfg(small_corpus, run, max_steps=end, save_every=3, valid_every=9, keep_last=2))
    assert summary["step"] == end
    assert [p.name for p in periodic_checkpoints(run)] == [f"ckpt_{end - 3}.pt", f"ckpt_{end}.pt"]
    assert load_checkpoint(run / f"ckpt_{end}.pt")["progress"]["step"] == end
    assert not list(run.glob(f"{TMP_PREFIX}*")) and not (run / ".write-test").exists()
