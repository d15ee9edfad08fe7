"""Signals during an import wait for it to finish: raised inside one, they leave modules half made."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SLOW_MODULE = """
import time
print("importing", flush=True)
time.sleep(1.5)  # what torch's import does for seconds: the signal comes here
print("imported whole", flush=True)
"""


def run_until_signalled(tmp_path: Path, program: str, signum: int) -> subprocess.CompletedProcess:
    """Run `program` (which imports `slow`), send `signum` once it is inside that import, and wait for it."""
    (tmp_path / "slow.py").write_text(SLOW_MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(program)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal
    assert proc.stdout.readline() == "importing\n"
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "importing\n" + out, err)


def test_sigterm_during_an_import_stops_the_command_once_the_import_is_done(tmp_path):
    done = run_until_signalled(tmp_path, """
        import time
        from nmt.interrupts import sigterm_interrupts
        with sigterm_interrupts():
            import slow
            time.sleep(30)
            print("went on", flush=True)
    """, signal.SIGTERM)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout == "importing\nimported whole\n"


def test_sigterm_during_an_import_that_ends_the_block_still_stops_the_command(tmp_path):
    done = run_until_signalled(tmp_path, """
        import time
        from nmt.interrupts import sigterm_interrupts
        with sigterm_interrupts():
            import slow
        print("went on after the block", flush=True)
        time.sleep(30)
    """, signal.SIGTERM)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout == "importing\nimported whole\n"


def test_sigterm_held_back_by_an_import_that_ends_the_block_reaches_a_caller_that_says_what_stopped(tmp_path):
    """`ends_process=False` (training's preparation): the signal is raised out of the block, the process lives on
    to say in one line what it stopped, and SIGTERM's handler is the one before the block again."""
    done = run_until_signalled(tmp_path, """
        import signal
        from nmt.interrupts import Terminated, sigterm_interrupts
        try:
            with sigterm_interrupts(ends_process=False):
                import slow
        except Terminated:
            print("the caller was told", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
    """, signal.SIGTERM)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "importing\nimported whole\nthe caller was told True\n"


def test_ctrl_c_during_an_import_interrupts_once_the_import_is_done(tmp_path):
    done = run_until_signalled(tmp_path, """
        import time
        from nmt.interrupts import signals_after_imports
        try:
            with signals_after_imports():
                import slow
                time.sleep(30)
                print("went on", flush=True)
        except KeyboardInterrupt:
            print("interrupted after the import", flush=True)
    """, signal.SIGINT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "importing\nimported whole\ninterrupted after the import\n"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_nmt_command_stops_on_a_signal_during_its_imports_with_its_usual_status(tmp_path, signum):
    """`nmt average` imports torch inside the command: a signal then ends it as the same signal later would,
    even where the command fails (its checkpoints do not exist) before the signal is delivered again."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "nmt", "average", str(tmp_path / "a.pt"),
                             str(tmp_path / "b.pt"), "-o", str(tmp_path / "out.pt")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in proc.stderr:  # -X importtime names each module as its import ends
        if line.split("|")[-1].strip() == "numpy":
            break
    proc.send_signal(signum)  # numpy is in, torch is still importing
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == (-signal.SIGTERM if signum == signal.SIGTERM else 130), err[-2000:]
    assert not any(word in err for word in ("Traceback", "ImportError", "AttributeError")), err[-2000:]


def test_ctrl_c_held_back_by_an_import_that_comes_while_the_error_line_is_printed_exits_130(tmp_path):
    """The command failed at once after the import (here a usage error), and the signal, delivered again, landed
    while its error line was being printed, outside the command: it left a KeyboardInterrupt traceback and
    status -2 (seen once in CI with `nmt average` of missing checkpoints)."""
    done = run_until_signalled(tmp_path, """
        import sys, time, typer
        from nmt import cli, interrupts
        interrupts.RETRY_SECONDS = 0.3
        echo = typer.echo
        def slow_echo(*args, **kwargs):
            time.sleep(3)  # the signal held back by the import comes again here
            echo(*args, **kwargs)
        typer.echo = slow_echo
        run_app = cli._run_app
        def import_then_run_app():
            import slow
            run_app()
        cli._run_app = import_then_run_app
        sys.argv = ["nmt", "--no-such-option"]
        cli.main()
    """, signal.SIGINT)
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr


def test_ctrl_c_held_back_by_an_import_does_not_come_again_while_the_process_exits(tmp_path):
    """The block ended (the command failed) while the signal still waited to be sent again: it ends the process
    with 130, and the copy still on its way is not raised in the interpreter's exit (a KeyboardInterrupt in
    an atexit callback, with its traceback)."""
    done = run_until_signalled(tmp_path, """
        import atexit, time
        from nmt import interrupts
        interrupts.RETRY_SECONDS = 0.5  # the import ends with the signal still to come again
        atexit.register(time.sleep, 1.0)  # the exit's own work, during which it would come
        with interrupts.signals_after_imports():
            import slow
            raise SystemExit(2)  # the command fails before the signal is delivered
    """, signal.SIGINT)
    assert done.returncode == 130, done.stderr
    assert done.stderr == ""
    assert done.stdout == "importing\nimported whole\n"
