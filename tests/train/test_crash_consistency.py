"""Crash consistency of the run directory: damaged newest checkpoints are set aside, best.pt follows metrics.jsonl."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from nmt.checkpoint import load_checkpoint, periodic_checkpoints
from nmt.errors import CheckpointError
from nmt.train.loop import train
from nmt.train.resume import restore_best
from tests.train.helpers import same_weights, tiny_cfg, weights

SETTINGS = {"save_every": 3, "valid_every": 3, "keep_last": 100}


@pytest.fixture(scope="module")
def trained(small_corpus, tmp_path_factory) -> Path:
    """A finished 12-step run with checkpoints and validations at steps 3, 6, 9 and 12."""
    run = tmp_path_factory.mktemp("trained") / "run"
    train(tiny_cfg(small_corpus, run, max_steps=12, **SETTINGS))
    return run


def copy_run(trained: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    return run


def best_valid_step(run: Path) -> int:
    """The step of the last validation that `metrics.jsonl` marks as a new best."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records if r["event"] == "valid" and r["best"]][-1]


def step_of(path: Path) -> int:
    return load_checkpoint(path)["progress"]["step"]


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def empty(path: Path) -> None:
    path.write_bytes(b"")


def foreign(path: Path) -> None:
    path.write_text("not a checkpoint\n", encoding="utf-8")


@pytest.mark.parametrize("damage", [truncate, empty, foreign])
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_previous_one_resumed(
        damage, small_corpus, trained, tmp_path, caplog):
    run = copy_run(trained, tmp_path)
    damage(run / "ckpt_12.pt")
    damaged_bytes = (run / "ckpt_12.pt").read_bytes()
    with caplog.at_level(logging.WARNING):
        summary = train(tiny_cfg(small_corpus, run, max_steps=15, **SETTINGS))
    warnings = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"{run / 'ckpt_12.pt'}: ")
    assert warnings[0].endswith("; set aside as ckpt_12.pt.damaged, resuming from ckpt_9.pt")
    assert (run / "ckpt_12.pt.damaged").read_bytes() == damaged_bytes  # kept as it was, never deleted
    assert summary["step"] == 15
    assert [step_of(p) for p in periodic_checkpoints(run)] == [3, 6, 9, 12, 15]  # steps 10-12 trained again
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["event"] == "train"]
    assert steps == list(range(1, 16))  # the records of the lost steps 10-12 were dropped, then written again
    assert step_of(run / "best.pt") == best_valid_step(run)


def test_resuming_past_a_damaged_checkpoint_equals_an_uninterrupted_run(small_corpus, trained, tmp_path):
    run = copy_run(trained, tmp_path)
    truncate(run / "ckpt_12.pt")
    train(tiny_cfg(small_corpus, run, max_steps=15, **SETTINGS))
    straight = tmp_path / "straight"
    train(tiny_cfg(small_corpus, straight, max_steps=15, **SETTINGS))
    assert same_weights(weights(straight / "ckpt_15.pt"), weights(run / "ckpt_15.pt"))


def test_no_readable_checkpoint_stops_with_the_newest_ones_error_and_renames_nothing(small_corpus, trained, tmp_path):
    run = copy_run(trained, tmp_path)
    for path in periodic_checkpoints(run):
        truncate(path)
    with pytest.raises(CheckpointError) as err:
        train(tiny_cfg(small_corpus, run, max_steps=15, **SETTINGS))
    message = str(err.value)
    assert message.startswith(f"{run / 'ckpt_12.pt'}: cannot read checkpoint (truncated"), message
    assert message.endswith(f"; no earlier checkpoint in {run} is readable either: "
                            "move the damaged files away, or use --restart to start over"), message
    assert [p.name for p in periodic_checkpoints(run)] == ["ckpt_3.pt", "ckpt_6.pt", "ckpt_9.pt", "ckpt_12.pt"]
    assert not list(run.glob("*.damaged"))


def test_best_pt_lost_by_a_kill_before_it_was_written_is_rebuilt(small_corpus, trained, tmp_path, caplog):
    """A kill between `ckpt_<step>.pt` and `best.pt` leaves no best.pt (first validation) or an older one."""
    for lose in ("delete", "older"):
        run = copy_run(trained, tmp_path / lose)
        best = best_valid_step(run)
        if lose == "delete":
            (run / "best.pt").unlink()
        else:
            shutil.copyfile(run / "ckpt_3.pt", run / "best.pt")
            assert best != 3, "the loss never improved after step 3: this case checks nothing"
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            summary = train(tiny_cfg(small_corpus, run, max_steps=12, **SETTINGS))  # finished: only the repair
        held = "is missing" if lose == "delete" else "holds step 3"
        assert [r.getMessage() for r in caplog.records] == [
            f"{run / 'best.pt'} {held}, but the best validation was at step {best} (an interrupted save?): "
            f"rebuilt it from ckpt_{best}.pt"]
        assert summary["best_checkpoint"] == str(run / "best.pt")
        assert step_of(run / "best.pt") == best == best_valid_step(run)
        assert (run / "best.pt").read_bytes() == (run / f"ckpt_{best}.pt").read_bytes()


def test_a_resumed_run_continues_from_a_killed_save_and_ends_with_the_right_best_pt(small_corpus, trained, tmp_path):
    run = copy_run(trained, tmp_path)
    shutil.copyfile(run / "ckpt_3.pt", run / "best.pt")
    train(tiny_cfg(small_corpus, run, max_steps=18, **{**SETTINGS, "keep_last": 1}))
    assert step_of(run / "best.pt") == best_valid_step(run)
    assert [p.name for p in periodic_checkpoints(run)] == ["ckpt_18.pt"]


def test_falling_back_past_a_damaged_checkpoint_also_brings_best_pt_back(small_corpus, trained, tmp_path):
    """best.pt of step 12 belongs to steps that will be trained again: the fallback's best step wins."""
    run = copy_run(trained, tmp_path)
    truncate(run / "ckpt_12.pt")
    (run / "ckpt_9.pt").replace(run / "kept_9.pt")
    summary = train(tiny_cfg(small_corpus, run, max_steps=6, **SETTINGS))  # resumes at step 6: nothing to train
    assert summary["step"] == 6
    assert step_of(run / "best.pt") == load_checkpoint(run / "ckpt_6.pt")["progress"]["best_step"]
    assert step_of(run / "best.pt") == best_valid_step(run)


def test_a_best_checkpoint_already_pruned_gives_a_warning(tmp_path, caplog):
    (tmp_path / "best.pt").write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        restore_best(tmp_path, {"step": 9, "best_step": 6})
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"{tmp_path / 'best.pt'} is unreadable ({tmp_path / 'best.pt'}: not a checkpoint: an "
                              "empty file")
    assert message.endswith("), but the best validation was at step 6 and ckpt_6.pt is gone: "
                            "best.pt is not that step's model until a later validation improves on it")
    assert (tmp_path / "best.pt").read_bytes() == b""


def test_checkpoints_from_before_best_step_was_kept_are_left_alone(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        restore_best(tmp_path, {"step": 9, "best_metric": 3.2})  # an older progress record: no best_step
    assert not caplog.records and not (tmp_path / "best.pt").exists()
