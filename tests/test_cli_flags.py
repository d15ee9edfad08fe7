"""The command line's own flags: anywhere on the line, -h, --version, help without type noise."""

from __future__ import annotations

import subprocess
import sys

from nmt import __version__
from nmt.cli import hoist_global_flags


def nmt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nmt", *args], capture_output=True, text=True)


def test_global_flags_move_before_the_command_but_not_past_a_double_dash():
    assert hoist_global_flags(["train", "c.yaml", "--quiet", "--set", "a=1", "--debug"]) == [
        "--quiet", "--debug", "train", "c.yaml", "--set", "a=1"]
    assert hoist_global_flags(["translate", "--", "-q"]) == ["translate", "--", "-q"]


def test_debug_works_after_the_command_name_and_training_logs_lines_without_a_terminal(tiny_config_file):
    """--quiet after the command name: `test_cli.py::test_subprocess_pipeline`, whose training it silences."""
    loud = nmt("train", str(tiny_config_file), "--set", "train.max_steps=2")
    assert "[nmt] " in loud.stderr
    # no terminal (as under CI or nohup): no progress bar frames, a log line per train.log_every steps instead
    assert "\r" not in loud.stderr and "[nmt] step 2: loss " in loud.stderr
    debug = nmt("eval", "--hyp", "missing.txt", "--ref", "missing.txt", "--debug")
    assert debug.returncode == 2 and "Traceback" in debug.stderr
    plain = nmt("eval", "--hyp", "missing.txt", "--ref", "missing.txt")
    assert plain.stderr == "nmt: error: missing.txt: file not found\n"


def test_version_and_short_help():
    assert nmt("--version").stdout == f"nmt {__version__}\n"
    short, long = nmt("translate", "-h"), nmt("translate", "--help")
    assert short.returncode == 0 and short.stdout == long.stdout
    assert "--nbest" in short.stdout and "<bool>" not in short.stdout


def nmt_importing(*args: str) -> tuple[str, set[str]]:
    """The standard output of a successful `python -m nmt ARGS`, and the modules it imported (`-X importtime`)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "nmt", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout, {line.rpartition("|")[2].strip() for line in done.stderr.splitlines() if "import time:" in line}


def test_help_and_version_import_no_heavy_library():
    """`nmt --help` takes 0.1 s and `nmt translate --help` 0.2 s because the commands import torch,
    datasets and sacrebleu (1.5 s or more) inside their functions; a module-level import would undo it."""
    for args in (["--help"], ["translate", "--help"], ["train", "--help"], ["--version"]):
        _, imported = nmt_importing(*args)
        assert "typer" in imported and not imported & {"torch", "datasets", "sacrebleu", "numpy"}, args


def test_scoring_ready_translations_imports_neither_torch_nor_datasets(tmp_path):
    """`nmt eval --hyp --ref` reads two files and runs sacreBLEU: 0.4 s, where importing the translating side
    (torch, datasets) took 2.6 s."""
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("Ein Mann fährt Fahrrad.\nZwei Hunde spielen.\n", encoding="utf-8")
    stdout, imported = nmt_importing("eval", "--hyp", str(hyp), "--ref", str(hyp))
    assert stdout.startswith(f"{hyp}: BLEU = 100.00")
    assert "sacrebleu" in imported and not imported & {"torch", "datasets"}


def test_every_commands_help_names_the_flags_it_takes_after_its_name():
    """`nmt train --help` did not say that --quiet and --debug work there too (they are `nmt`'s own)."""
    from typer.main import get_command
    from typer.testing import CliRunner

    from nmt.cli import app

    names = sorted(get_command(app).commands)
    assert len(names) == 9
    for name in names:
        shown = CliRunner().invoke(app, [name, "--help"], terminal_width=200)
        assert shown.exit_code == 0, name
        assert "-q/--quiet" in shown.output and "--debug" in shown.output, name


def test_a_warning_of_the_hub_libraries_is_printed_once(tmp_path):
    """`datasets` and `huggingface_hub` print their records with handlers of their own; the command line's logging
    printed each a second time ("Retrying in 8s" twice per retry while an offline `kind: hf` waited for the hub).
    The libraries are imported after the command line set its logging up, as a command does."""
    script = (
        "from nmt.cli import _main\n"
        "_main(debug=False, quiet=False, version=False)\n"
        "import logging, datasets, huggingface_hub\n"
        "logging.getLogger('huggingface_hub.utils._http').warning('Retrying in 8s [Retry 5/5].')\n"
        "logging.getLogger('datasets.load').warning('no data files found')\n"
        "logging.getLogger('nmt').warning('our own')\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert [line for line in lines if "Retrying" in line] == ["Retrying in 8s [Retry 5/5]."]
    assert [line for line in lines if "no data files" in line] == ["no data files found"]
    assert "[nmt] our own" in lines
