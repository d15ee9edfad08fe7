"""One training per run directory: a second one is refused at once, a dead holder's lock is taken over."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from nmt.errors import UserError
from nmt.train.lock import RunLock, lock_run_dir
from nmt.train.loop import train_run
from nmt.train.setup import build_run
from tests.test_distributed import start_ranks
from tests.train.helpers import nmt_process, tiny_cfg, wait_for, write_cfg

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the lock needs fcntl (POSIX)")


def train_steps(run: Path) -> list[int]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in lines if r["event"] == "train"]


def refused(proc, timeout: float = 60.0) -> str:
    """The stderr of `proc`, which must exit with status 2 within `timeout` seconds."""
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 2, err[-3000:]
    return err


@pytest.mark.slow
def test_a_second_training_exits_2_naming_the_first_which_then_finishes(small_corpus, tmp_path):
    run = tmp_path / "run"
    config = write_cfg(tmp_path / "tiny.yaml", small_corpus, run, max_steps=40, save_every=20)
    first = nmt_process("--quiet", "train", str(config))
    try:
        wait_for(lambda: (run / "metrics.jsonl").exists(), first)
        os.killpg(first.pid, signal.SIGSTOP)  # hold it inside its loop, lock held, while the second starts
        started = time.monotonic()
        err = refused(nmt_process("--quiet", "train", str(config)))
        assert time.monotonic() - started < 30  # interpreter and torch start-up; no waiting on the lock
        line = err.strip()
        assert "\n" not in line, err
        assert line.startswith(f"nmt: error: {run} is in use by another training (PID {first.pid}, started 20"), line
        assert line.endswith("; wait for it, stop it, or use another run_dir"), line
        experiment = refused(nmt_process("--quiet", "experiment", str(config), "--results", str(tmp_path)))
        assert f"(PID {first.pid}," in experiment
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err[-3000:]
    assert train_steps(run) == list(range(1, 41))  # one writer: no step twice, none lost


@pytest.mark.slow
def test_a_killed_trainings_lock_is_taken_over_and_the_run_resumes(small_corpus, tmp_path):
    run = tmp_path / "run"
    config = write_cfg(tmp_path / "tiny.yaml", small_corpus, run, max_steps=100_000, save_every=2, num_workers=1)
    first = nmt_process("--quiet", "train", str(config))
    try:
        wait_for(lambda: (run / "ckpt_2.pt").exists(), first)
        os.kill(first.pid, signal.SIGKILL)  # the trainer alone: its DataLoader worker may outlive it a while
        first.wait(timeout=10)
        assert (run / ".lock").read_text().startswith(f"{first.pid} ")  # the stale lock file stays
        lock = RunLock.acquire(run)  # free at once, though the worker may still be alive
        lock.release()
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
    saved = max(int(p.stem.split("_")[1]) for p in run.glob("ckpt_*.pt"))
    config = write_cfg(tmp_path / "tiny.yaml", small_corpus, run, max_steps=saved + 2, save_every=2)
    second = nmt_process("--quiet", "train", str(config))
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err[-3000:]
    assert (run / ".lock").read_text().startswith(f"{second.pid} ")
    assert train_steps(run)[-3:] == [saved, saved + 1, saved + 2]  # resumed after the saved step


def test_setup_holds_the_lock_until_close(small_corpus, tmp_path):
    cfg = tiny_cfg(small_corpus, tmp_path / "run", max_steps=1)
    trainer = build_run(cfg)
    try:
        with pytest.raises(UserError, match=rf"is in use by another training \(PID {os.getpid()}, started "):
            build_run(cfg)
    finally:
        trainer.close()
    trainer = build_run(cfg, restart=True)  # free again; --restart keeps the lock file it holds
    try:
        assert train_run(trainer)["step"] == 1
        assert (tmp_path / "run" / ".lock").exists()
    finally:
        trainer.close()
    trainer.close()  # closing twice is harmless
    RunLock.acquire(tmp_path / "run").release()


def test_a_setup_that_fails_releases_the_lock(small_corpus, tmp_path):
    cfg = tiny_cfg(small_corpus, tmp_path / "run", max_steps=1)
    (small_corpus.parent / "missing").mkdir(exist_ok=True)
    broken = tiny_cfg(small_corpus.parent / "missing" / "corpus", tmp_path / "run", max_steps=1)
    with pytest.raises(UserError, match="corpus"):  # raised after the lock was taken
        build_run(broken)
    build_run(cfg).close()


def test_a_forked_child_does_not_keep_the_lock(tmp_path):
    lock = RunLock.acquire(tmp_path)
    ready, tell = os.pipe()
    child = os.fork()
    if child == 0:  # a DataLoader worker, say, that outlives the trainer
        os.write(tell, b"1")  # the fork hooks have run
        time.sleep(30)
        os._exit(0)
    try:
        assert os.read(ready, 1) == b"1"
        lock.release()  # as the trainer's death would
        RunLock.acquire(tmp_path).release()
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        os.close(ready), os.close(tell)


def _lock_rank(rank: int, world_size: int, port: int, cfg, out: str) -> None:
    """One rank trying to lock a run directory another process holds; it records what it was told."""
    from tests.test_distributed import _as_rank

    _as_rank(rank, world_size, port)
    from nmt.distributed import init_distributed, shutdown_distributed

    ctx = init_distributed("cpu")
    try:
        lock_run_dir(Path(cfg.run_dir), ctx)
    except UserError as err:
        Path(out, f"rank{rank}.err").write_text(str(err), encoding="utf-8")
    finally:
        shutdown_distributed()


@pytest.mark.slow
def test_every_rank_is_refused_when_rank_0_cannot_lock(small_corpus, tmp_path):
    cfg = tiny_cfg(small_corpus, tmp_path / "run")
    held = RunLock.acquire(tmp_path / "run")
    try:
        start_ranks(_lock_rank, 2, cfg, tmp_path)  # returns: rank 1 does not wait for rank 0 forever
    finally:
        held.release()
    for rank in (0, 1):
        assert f"in use by another training (PID {os.getpid()}," in (tmp_path / f"rank{rank}.err").read_text()
