"""The command line end to end: train a few steps, translate, evaluate; in-process and as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from typer.testing import CliRunner

from nmt.checkpoint import load_checkpoint
from nmt.cli import app

runner = CliRunner()


def run_ok(*args: str, input: str | None = None):
    result = runner.invoke(app, list(args), input=input)
    assert result.exit_code == 0, result.output
    return result


def test_train_translate_eval_in_process(tiny_config_file, small_corpus, tmp_path):
    out = run_ok("train", str(tiny_config_file))
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["step"] == 6
    run = tmp_path / "run"
    assert (run / "best.pt").is_file() and (run / "config.yaml").is_file() and (run / "spm.model").is_file()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["event"] for r in records} == {"start", "train", "valid", "summary"}
    [start] = [r for r in records if r["event"] == "start"]
    assert start["step"] == 0 and start["hardware"].startswith("CPU, ") and start["precision"] == "fp32"
    assert [r["step"] for r in records if r["event"] == "valid"] == [3, 6]
    assert all(r["seconds"] > 0 for r in records if r["event"] == "valid")  # validation's own time
    assert load_checkpoint(run / "best.pt")["progress"]["step"] in (3, 6)

    # one output line per input line, empty lines stay empty
    src = "the man sees the dog .\n\n" + (small_corpus / "test.en").read_text().splitlines()[0] + "\n"
    tr = run_ok("translate", "-c", str(run / "best.pt"), "--beam", "2", input=src)
    lines = tr.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""

    ev = run_ok("eval", "-c", str(run / "best.pt"), "--split", "test", "--json", "--beam", "1")
    scores = json.loads(ev.stdout)["test"]
    assert 0.0 <= scores["bleu"] <= 100.0 and scores["sentences"] == 30
    assert scores["bleu_signature"].startswith("nrefs:1")

    hyp = tmp_path / "hyp.txt"
    hyp.write_text((small_corpus / "test.de").read_text())
    ev = run_ok("eval", "--hyp", str(hyp), "--ref", str(small_corpus / "test.de"), "--json")
    assert json.loads(ev.stdout)[str(hyp)]["bleu"] == 100.0


def test_resume_continues_from_last_checkpoint(tiny_config_file, tmp_path):
    run_ok("train", str(tiny_config_file), "--set", "train.max_steps=3")
    out = run_ok("train", str(tiny_config_file), "--set", "train.max_steps=6")
    assert json.loads(out.stdout.strip().splitlines()[-1])["step"] == 6
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["event"] == "train"]
    assert steps == sorted(steps) and steps[0] == 1 and 4 in steps  # the second run started at step 4


def test_user_errors_are_one_line_with_exit_code_2(tmp_path, tiny_config_file):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  max_stepz: 3\n")
    for args, needle in [
        (["train", str(tmp_path / "missing.yaml")], "config file not found"),
        (["train", str(bad)], "did you mean 'max_steps'"),
        (["translate", "-c", str(tmp_path / "none.pt")], "checkpoint not found"),
        (["train", str(tiny_config_file), "--set", "model.transformer.heads=3"], "must be divisible by heads (3)"),
    ]:
        proc = subprocess.run([sys.executable, "-m", "nmt", *args], capture_output=True, text=True)
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_subprocess_pipeline(tiny_config_file, small_corpus, tmp_path):
    nmt = [sys.executable, "-m", "nmt", "--quiet"]
    # --quiet after the command name works as well as before it (`hoist_global_flags`)
    trained = subprocess.run([sys.executable, "-m", "nmt", "train", str(tiny_config_file), "--quiet"],
                             capture_output=True, text=True)
    assert trained.returncode == 0, trained.stderr
    assert "[nmt]" not in trained.stderr
    ckpt = str(tmp_path / "run" / "best.pt")
    src = (small_corpus / "test.en").read_text()
    proc = subprocess.run([*nmt, "translate", "-c", ckpt], input=src, capture_output=True, text=True, check=True)
    assert len(proc.stdout.splitlines()) == len(src.splitlines())
    hyp = tmp_path / "hyp.de"
    hyp.write_text(proc.stdout)
    proc = subprocess.run([*nmt, "eval", "--hyp", str(hyp), "--ref", str(small_corpus / "test.de")],
                          capture_output=True, text=True, check=True)
    assert "BLEU" in proc.stdout and "chrF" in proc.stdout


def test_standard_output_is_utf8_whatever_the_locale():
    """In a Latin-1 locale (here its stand-in, PYTHONIOENCODING) standard output took the locale's encoding, so that
    `nmt translate > out.txt` wrote a file `nmt eval` refused as invalid UTF-8, and a character the locale lacks
    (config-reference's arrows and dashes) stopped the command with a UnicodeEncodeError."""
    command = [sys.executable, "-m", "nmt", "config-reference"]
    utf8 = subprocess.run(command, capture_output=True, check=True).stdout
    latin1 = subprocess.run(command, capture_output=True, env={**os.environ, "PYTHONIOENCODING": "latin-1"})
    assert latin1.returncode == 0, latin1.stderr
    assert latin1.stdout == utf8 and not utf8.isascii()


def test_a_reader_that_leaves_ends_any_command_quietly_with_status_141():
    """`nmt config-reference | head -1` (or `nmt eval ... | head`) exited 1, the status of a runtime failure, where
    `nmt translate` and Unix tools stop quietly with 141 once their reader has gone."""
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first write
    try:
        proc = subprocess.run([sys.executable, "-m", "nmt", "config-reference"], stdout=write, stderr=subprocess.PIPE,
                              text=True)
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (141, "")
