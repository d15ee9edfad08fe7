"""`nmt translate -i FILE -o OUT`: a stopped run keeps its lines in OUT.partial and the same command goes on.

Through the real CLI on the randomly initialised checkpoints of `tests/test_translate.py`;
every resumed output is compared with the output of an uninterrupted run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nmt import translate_io as translate_module
from tests import test_translate
from tests.test_output_files import leftovers, nmt

checkpoints = test_translate.checkpoints  # the fixture: randomly initialised tiny models, no training

SOURCE = "".join(f"{line}\n" for line in [
    "the man sees the dog .", "a woman rides a bike .", "", "two dogs play in the park .",
    "the cat sleeps .", "a child eats an apple .", "the dog runs .", "a man reads a book .",
])


@pytest.fixture
def doc(tmp_path) -> Path:
    path = tmp_path / "doc.txt"
    path.write_text(SOURCE)
    return path


def translate(monkeypatch, ckpt: Path, doc: Path, out: Path, *args: str) -> tuple[int, list[str]]:
    """`nmt translate` of `doc` with beam 2, unless `args` give another input (`-i`) or beam (an option given
    twice is refused)."""
    args = list(args)
    if "-i" in args:
        at = args.index("-i")
        doc, args = Path(args[at + 1]), args[:at] + args[at + 2:]
    beam = [] if "--beam" in args else ["--beam", "2"]
    return nmt(monkeypatch, "translate", "-c", str(ckpt), "-i", str(doc), "-o", str(out), *beam, *args)


def uninterrupted(monkeypatch, ckpt: Path, doc: Path, *args: str) -> str:
    ref = doc.parent / "reference.txt"
    status, errors = translate(monkeypatch, ckpt, doc, ref, *args)
    assert status == 0, errors
    return ref.read_text()


def stop_after(monkeypatch, lines: int) -> None:
    """Ctrl-C as translation `lines` + 1 is about to be written."""
    format_nbest, count = translate_module.format_nbest, [0]

    def then_ctrl_c(*args, **kwargs):
        if count[0] == lines:
            raise KeyboardInterrupt
        count[0] += 1
        return format_nbest(*args, **kwargs)

    monkeypatch.setattr(translate_module, "format_nbest", then_ctrl_c)


def count_translations(monkeypatch) -> list[int]:
    """A counter of the lines formatted for output from now on."""
    format_nbest, count = translate_module.format_nbest, [0]

    def counted(*args, **kwargs):
        count[0] += 1
        return format_nbest(*args, **kwargs)

    monkeypatch.setattr(translate_module, "format_nbest", counted)
    return count


def partial_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial" in p.name)


@pytest.mark.parametrize("stopped_after", [0, 3, 7])
def test_the_same_command_goes_on_to_the_uninterrupted_output(stopped_after, doc, checkpoints, monkeypatch):
    ckpt, out = checkpoints["transformer"], doc.parent / "out.txt"
    expected = uninterrupted(monkeypatch, ckpt, doc)
    with monkeypatch.context() as patch:
        stop_after(patch, stopped_after)
        status, _ = translate(patch, ckpt, doc, out)
    assert status == 130 and not out.exists()
    if stopped_after:
        assert (doc.parent / "out.txt.partial").read_text() == "".join(expected.splitlines(True)[:stopped_after])
    else:  # nothing written: nothing kept
        assert partial_files(doc.parent) == []
    translated = count_translations(monkeypatch)
    status, errors = translate(monkeypatch, ckpt, doc, out)
    assert status == 0, errors
    assert translated == [8 - stopped_after]  # only the lines not kept
    assert out.read_text() == expected
    assert partial_files(doc.parent) == [] and leftovers(doc.parent) == []


@pytest.mark.parametrize("stopped_after", [2, 5])
def test_a_seeded_sample_goes_on_to_the_uninterrupted_output(stopped_after, doc, checkpoints, monkeypatch):
    """`--sample --seed`: the lines after a resume are drawn as an uninterrupted run draws them (each line's draws
    are keyed by its number in the file), even with another --max-tokens after the stop."""
    ckpt, out = checkpoints["transformer"], doc.parent / "out.txt"
    sampling = ["--sample", "--seed", "3", "--temperature", "1.5", "--max-len-a", "0.5", "--max-len-b", "4"]

    def run(patch, target: Path, *args: str) -> tuple[int, list[str]]:
        return nmt(patch, "translate", "-c", str(ckpt), "-i", str(doc), "-o", str(target), *sampling, *args)

    status, errors = run(monkeypatch, doc.parent / "reference.txt")
    assert status == 0, errors
    expected = (doc.parent / "reference.txt").read_text()
    assert len(set(expected.splitlines())) > 4  # samples, not one line again and again
    with monkeypatch.context() as patch:
        stop_after(patch, stopped_after)
        status, _ = run(patch, out, "--max-tokens", "1")
    assert status == 130 and (doc.parent / "out.txt.partial").read_text().count("\n") == stopped_after
    translated = count_translations(monkeypatch)
    status, errors = run(monkeypatch, out)
    assert status == 0, errors
    assert translated == [8 - stopped_after]
    assert out.read_bytes() == expected.encode()


def test_a_line_cut_off_by_a_kill_is_translated_again(doc, checkpoints, monkeypatch):
    ckpt, out, partial = checkpoints["transformer"], doc.parent / "out.txt", doc.parent / "out.txt.partial"
    expected = uninterrupted(monkeypatch, ckpt, doc)
    with monkeypatch.context() as patch:
        stop_after(patch, 3)
        translate(patch, ckpt, doc, out)
    with open(partial, "a", encoding="utf-8") as f:
        f.write("half a transl")  # as a SIGKILL in the middle of a write leaves it
    translated = count_translations(monkeypatch)
    status, errors = translate(monkeypatch, ckpt, doc, out)
    assert status == 0, errors
    assert translated == [5]
    assert out.read_text() == expected


@pytest.mark.slow
def test_sigkill_during_a_real_run_then_the_same_command(tmp_path, checkpoints, monkeypatch):
    src, out, partial = tmp_path / "src.txt", tmp_path / "out.txt", tmp_path / "out.txt.partial"
    src.write_text(SOURCE * 500)
    ckpt = checkpoints["transformer"]
    # Two chunks of 2,000 lines (4,000 tokens over beam 2): the kill lands while the second is searched. In one
    # chunk, the whole file could be written between the first bytes seen and the kill.
    chunks = ["--max-tokens", "4000"]
    expected = uninterrupted(monkeypatch, ckpt, src, *chunks)
    command = [sys.executable, "-m", "nmt", "--quiet", "translate", "-c", str(ckpt), "-i", str(src), "-o", str(out),
               "--beam", "2", *chunks]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (partial.exists() and partial.stat().st_size) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert partial.exists() and partial.stat().st_size, "the translation never started writing"
        proc.kill()
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    kept = partial.read_text().count("\n")
    assert 0 < kept < len(expected.splitlines()), kept
    done = subprocess.run([arg for arg in command if arg != "--quiet"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{out}: resuming after the {kept:,} lines in {partial}" in done.stderr
    assert out.read_text() == expected
    assert partial_files(tmp_path) == []


def _other_beam(doc: Path, checkpoints) -> tuple[list[str], str]:
    return ["--beam", "3"], "another search.beam (2, now 3)"


def _scores(doc: Path, checkpoints) -> tuple[list[str], str]:
    return ["--scores"], "another scores (False, now True)"


def _other_checkpoint(doc: Path, checkpoints) -> tuple[list[str], str]:
    return ["-c", str(checkpoints["rnn"])], \
        f"another checkpoints[0].path ('{checkpoints['transformer']}', now '{checkpoints['rnn']}')"


def _other_input(doc: Path, checkpoints) -> tuple[list[str], str]:
    other = doc.parent / "other.txt"
    other.write_text(SOURCE)
    return ["-i", str(other)], f"another input.path ('{doc}', now '{other}')"


def _input_changed(doc: Path, checkpoints) -> tuple[list[str], str]:
    with open(doc, "a", encoding="utf-8") as f:
        f.write("one more line .\n")
    return [], (f"but the input file {doc} has changed since (its bytes: {len(SOURCE.encode())}, now "
                f"{len(SOURCE.encode()) + 16}), so they may not be its translations: pass --restart to start over")


def _input_touched(doc: Path, checkpoints) -> tuple[list[str], str]:
    before = doc.stat().st_mtime_ns
    os.utime(doc, ns=(before + 10**9, before + 10**9))
    return [], (f"but the input file {doc} has changed since (its modified_ns: {before}, now {before + 10**9}), "
                "so they may not be its translations: pass --restart to start over")


def _checkpoint_rewritten(doc: Path, checkpoints) -> tuple[list[str], str]:
    ckpt = checkpoints["transformer"]
    before = ckpt.stat().st_mtime_ns
    os.utime(ckpt, ns=(before + 10**9, before + 10**9))
    return [], (f"but the checkpoint {ckpt} has changed since (its modified_ns: {before}, now {before + 10**9}), "
                "so they may not be its translations: pass --restart to start over")


@pytest.mark.parametrize("change", [_other_beam, _scores, _other_checkpoint, _other_input, _input_changed,
                                    _input_touched, _checkpoint_rewritten],
                         ids=["beam", "scores", "checkpoint", "other-input", "input", "input-touched",
                              "checkpoint-rewritten"])
def test_another_job_is_refused_naming_what_differs_and_restart_discards(change, doc, checkpoints, monkeypatch):
    """A changed setting or another file: the same command as before finishes the job. A file changed at the
    same path: no command can, so the message says so and names the file (it said "repeat that run's
    command", which is what just failed)."""
    ckpt, out, partial = checkpoints["transformer"], doc.parent / "out.txt", doc.parent / "out.txt.partial"
    with monkeypatch.context() as patch:
        stop_after(patch, 3)
        translate(patch, ckpt, doc, out)
    kept = partial.read_bytes()
    args, difference = change(doc, checkpoints)
    if "-c" in args:  # a second -c would make an ensemble: give the other checkpoint alone
        ckpt, args = Path(args[1]), args[2:]
    status, errors = translate(monkeypatch, ckpt, doc, out, *args)
    assert status == 2 and len(errors) == 1, errors
    if difference.startswith("another"):
        assert errors[0] == (f"nmt: error: {partial} holds 3 lines of an interrupted run with {difference}; repeat "
                             "that run's command to finish it, or pass --restart to start over"), errors
    else:
        assert errors[0] == f"nmt: error: {partial} holds 3 lines of an interrupted run, {difference}", errors
    assert partial.read_bytes() == kept and not out.exists()
    expected = uninterrupted(monkeypatch, ckpt, doc, *args)
    status, errors = translate(monkeypatch, ckpt, doc, out, *args, "--restart")
    assert status == 0, errors
    assert out.read_text() == expected
    assert partial_files(doc.parent) == []


def test_a_partial_file_without_its_description_is_refused(doc, checkpoints, monkeypatch):
    out, partial = doc.parent / "out.txt", doc.parent / "out.txt.partial"
    partial.write_text("lines of nobody knows what\n")
    status, errors = translate(monkeypatch, checkpoints["transformer"], doc, out)
    assert status == 2
    assert errors == [f"nmt: error: {partial} holds lines of an earlier run but out.txt.partial.json does not say "
                      "of which; delete it, or pass --restart to start over"]
    assert partial.read_text() == "lines of nobody knows what\n"


def test_a_second_writer_of_the_same_output_is_refused(doc, checkpoints, monkeypatch):
    pytest.importorskip("fcntl", reason="no file locks on this platform")
    out, partial = doc.parent / "out.txt", doc.parent / "out.txt.partial"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)",
                               str(partial)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        status, errors = translate(monkeypatch, checkpoints["transformer"], doc, out)
    finally:
        holder.kill()
        holder.wait()
    assert status == 2
    assert errors == [f"nmt: error: {out}: another process is writing it (it holds {partial}); wait for it to "
                      "finish, stop it, or choose another -o"]
    assert not out.exists()


def test_standard_input_to_a_file_is_still_all_or_nothing(doc, checkpoints):
    out = doc.parent / "out.txt"
    with open(doc, "rb") as stdin:
        proc = subprocess.run([sys.executable, "-m", "nmt", "--quiet", "translate", "-c", str(checkpoints["transformer"]),
                               "-o", str(out), "--beam", "2"], stdin=stdin, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(out.read_text().splitlines()) == len(SOURCE.splitlines())
    assert partial_files(doc.parent) == []


def test_a_full_disk_keeps_the_lines_so_far_for_the_next_run(small_disk, tmp_path, checkpoints, monkeypatch):
    src, out, partial = tmp_path / "src.txt", small_disk / "out.txt", small_disk / "out.txt.partial"
    src.write_text(SOURCE * 2000)
    status, errors = translate(monkeypatch, checkpoints["transformer"], src, out)
    assert status == 2
    assert errors == [f"nmt: error: {out}: disk full; the lines written so far are kept in {partial}: free some "
                      "space and run the same command again to go on from there"]
    assert not out.exists()
    assert partial.read_text().count("\n") > 0


def test_attention_plots_go_on_numbering_the_input_lines(doc, checkpoints, monkeypatch):
    ckpt, out, plots = checkpoints["transformer"], doc.parent / "out.txt", doc.parent / "plots"
    with monkeypatch.context() as patch:
        stop_after(patch, 3)
        translate(patch, ckpt, doc, out, "--attention-plot", str(plots))
    first = sorted(p.name for p in plots.iterdir())
    status, errors = translate(monkeypatch, ckpt, doc, out, "--attention-plot", str(plots))
    assert status == 0, errors
    assert first == ["1.png", "2.png"]  # line 3 is empty: no attention to draw
    assert sorted(p.name for p in plots.iterdir()) == [f"{n}.png" for n in (1, 2, 4, 5, 6, 7, 8)]
