"""SIGINT and SIGTERM: a checkpoint, exit status 130 or 143, and a run that continues from the saved step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nmt import cli
from nmt.checkpoint import load_checkpoint
from nmt.train import setup
from nmt.train.faults import Interrupted, StopSignals
from nmt.train.loop import train
from tests.train.helpers import nmt_process, tiny_cfg, wait_for, write_cfg


def test_first_signal_is_noted_a_duplicate_ignored_and_a_later_second_interrupts_at_once():
    previous = signal.getsignal(signal.SIGINT)
    with StopSignals(repeat_after=0.2) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # delivered twice at once, as under torchrun: one signal
        time.sleep(0.01)  # Python runs handlers between bytecodes
        assert stop.signum == signal.SIGTERM
        time.sleep(0.2)
        with pytest.raises(Interrupted) as err:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
    assert err.value.exit_code == 130 and err.value.checkpoint is None
    assert signal.getsignal(signal.SIGINT) is previous  # handlers restored


def signal_when(path: Path, signum: int) -> threading.Thread:
    """Send `signum` to this process once `path` exists (the run is then inside its training loop)."""

    def run() -> None:
        deadline = time.monotonic() + 60
        while not path.exists():
            if time.monotonic() > deadline:
                return
            time.sleep(0.002)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_during_training_saves_exits_and_resumes(signum, code, small_corpus, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    config = write_cfg(tmp_path / "tiny.yaml", small_corpus, run, max_steps=100_000, save_every=2)
    thread = signal_when(run / "ckpt_2.pt", signum)
    monkeypatch.setattr(sys, "argv", ["nmt", "--quiet", "train", str(config)])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    thread.join()
    assert exit_.value.code == code
    err = capsys.readouterr().err
    assert f"stopped by {signal.Signals(signum).name} at step" in err and "run the same command to continue" in err
    saved = int(err.split(" at step ")[1].split(";")[0])
    assert saved >= 2 and load_checkpoint(run / f"ckpt_{saved}.pt")["progress"]["step"] == saved

    summary = train(tiny_cfg(small_corpus, run, max_steps=saved + 2, save_every=2))
    assert summary["step"] == saved + 2
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["event"] == "train"]
    assert steps == list(range(1, saved + 3))  # continued right after the saved step, nothing repeated


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_while_the_run_is_prepared_says_so_and_the_same_command_starts_it(signum, code, small_corpus,
                                                                                   tmp_path, monkeypatch, capsys):
    """Before the loop handles the signals (the data, the tokenizer, the model being prepared), SIGTERM ended the
    process without a word and SIGINT left it silently with 130; both now stop at once with one line, and the
    run directory is left unlocked, as it was before the start."""
    run = tmp_path / "run"
    config = write_cfg(tmp_path / "tiny.yaml", small_corpus, run, max_steps=2)
    build_trainable = setup.build_trainable

    def signalled_while_the_model_is_built(*args, **kwargs):
        os.kill(os.getpid(), signum)  # Python runs the handler before the next line
        return build_trainable(*args, **kwargs)

    monkeypatch.setattr(setup, "build_trainable", signalled_while_the_model_is_built)
    monkeypatch.setattr(sys, "argv", ["nmt", "--quiet", "train", str(config)])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == code
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after datasets' progress bars, in this process
    assert err == (f"nmt: stopped by {signal.Signals(signum).name} before training began (while the data, tokenizer "
                   "and model were prepared); run the same command again")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and not list(run.glob("ckpt_*.pt"))

    monkeypatch.setattr(setup, "build_trainable", build_trainable)
    assert train(tiny_cfg(small_corpus, run, max_steps=2))["step"] == 2


@pytest.mark.slow
def test_signals_to_a_training_process_exit_with_130_and_143(small_corpus, tmp_path):
    """SIGTERM to the process as a scheduler sends it; SIGINT to its whole group (with a DataLoader worker)
    as a terminal's Ctrl-C does."""
    procs = {}
    for signum, workers in ((signal.SIGTERM, 0), (signal.SIGINT, 1)):
        run = tmp_path / signum.name
        # keep_last high: both runs train at once, and the second must not prune ckpt_2.pt before it is seen
        config = write_cfg(tmp_path / f"{signum.name}.yaml", small_corpus, run, max_steps=100_000, save_every=2,
                           num_workers=workers, keep_last=10_000)
        procs[signum] = (run, nmt_process("train", str(config)))
    for signum, (run, proc) in procs.items():
        wait_for(lambda run=run: (run / "ckpt_2.pt").exists(), proc, timeout=300)
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
    for signum, (run, proc) in procs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + signum, err
        saved = int(err.split(" at step ")[1].split(";")[0])
        assert load_checkpoint(run / f"ckpt_{saved}.pt")["progress"]["step"] == saved


@pytest.mark.slow
def test_sigterm_to_the_process_group_leaves_the_dataloader_workers_running_until_the_checkpoint(small_corpus,
                                                                                                 tmp_path):
    """torchrun stops a worker by sending SIGTERM to its process group (and Slurm's scancel to every process of
    the job): the DataLoader workers get it too, and must leave it to the training process, which saves a
    checkpoint; killed by it, they failed its next batch instead ("DataLoader worker is killed")."""
    run = tmp_path / "run"
    config = write_cfg(tmp_path / "tiny.yaml", small_corpus, run, max_steps=100_000, save_every=2, num_workers=1)
    proc = nmt_process("train", str(config))
    wait_for(lambda: (run / "ckpt_2.pt").exists(), proc, timeout=120)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    saved = int(err.split(" at step ")[1].split(";")[0])
    assert load_checkpoint(run / f"ckpt_{saved}.pt")["progress"]["step"] == saved


SIGNAL_IN_FINAL_VALIDATION = """
import os, signal, sys
import nmt.train.loop as loop
from nmt import cli

validate = loop.validate

def validate_and_be_stopped(*args, **kwargs):  # the run's only validation, after its last update
    result = validate(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    return result

loop.validate = validate_and_be_stopped
sys.argv = ["nmt", "--quiet", "train", sys.argv[1]]
cli.main()
"""


@pytest.mark.slow
def test_a_signal_during_the_final_validation_keeps_it_and_its_checkpoint(small_corpus, tmp_path):
    """A run that reached max_steps between validations validates once more, then stops: a signal there
    (as `max_time` and a scheduler's SIGTERM meet) lets that validation and its checkpoint finish."""
    run = tmp_path / "run"
    config = write_cfg(tmp_path / "tiny.yaml", small_corpus, run, max_steps=5, valid_every=100)
    proc = subprocess.run([sys.executable, "-c", SIGNAL_IN_FINAL_VALIDATION, str(config)], capture_output=True,
                          text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 143, proc.stderr
    assert f"stopped by SIGTERM at step 5; saved {run / 'ckpt_5.pt'}" in proc.stderr
    assert load_checkpoint(run / "ckpt_5.pt")["progress"]["validated_step"] == 5
    events = [json.loads(line)["event"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert events[-2:] == ["valid", "interrupted"]
    summary = train(tiny_cfg(small_corpus, run, max_steps=5, valid_every=100))  # the same run: nothing left to do
    assert summary["step"] == 5 and summary["stop"] == "max_steps=5"


SIGNAL_IN_FIRST_VALIDATION = """
import os, signal, sys
import nmt.train.loop as loop
from nmt import cli

validate = loop.validate
calls = []

def validate_and_be_stopped(*args, **kwargs):  # the validation at step 0, where fine-tuning starts
    result = validate(*args, **kwargs)
    if not calls:
        os.kill(os.getpid(), signal.SIGTERM)
    calls.append(1)
    return result

loop.validate = validate_and_be_stopped
sys.argv = ["nmt", "--quiet", "train", sys.argv[1]]
cli.main()
"""


@pytest.mark.slow
def test_a_signal_during_the_validation_where_fine_tuning_starts_keeps_it_and_stops_after_one_update(
        small_corpus, tmp_path):
    """The parent's scores at step 0 are a validation like the others: a scheduler's SIGTERM there lets it and
    its checkpoint finish, and the run stops as during training, with a checkpoint to resume from."""
    parent = train(tiny_cfg(small_corpus, tmp_path / "parent", max_steps=2))["best_checkpoint"]
    run = tmp_path / "run"
    config = write_cfg(tmp_path / "child.yaml", small_corpus, run, max_steps=100, init_from=parent)
    proc = subprocess.run([sys.executable, "-c", SIGNAL_IN_FIRST_VALIDATION, str(config)], capture_output=True,
                          text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 143, proc.stderr
    assert f"stopped by SIGTERM at step 1; saved {run / 'ckpt_1.pt'}" in proc.stderr
    assert load_checkpoint(run / "best.pt")["progress"]["validated_step"] == 0  # the parent's weights, scored
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["event"], r["step"]) for r in records if r["event"] != "train"] == [("valid", 0), ("start", 0), ("interrupted", 1)]
