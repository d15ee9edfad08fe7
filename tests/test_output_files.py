"""`nmt translate -o FILE`: never the input file, never half written (issue #17, item 1).

A stopped run's lines wait in FILE.partial for the next run: `tests/test_translate_resume.py`.

Through the real CLI (`nmt.cli.main`, and `python -m nmt` where only a process
shows it) on the randomly initialised checkpoint of `tests/test_translate.py`.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nmt import cli
from nmt import translate_io as translate_module
from nmt.partial import partial_paths
from nmt.translate import Translator
from tests import test_translate

checkpoints = test_translate.checkpoints  # the fixture: randomly initialised tiny models, no training

SOURCE = "the man sees the dog .\na woman rides a bike .\n\ntwo dogs play in the park .\n"
OLD = "an earlier translation\nkept byte for byte\n"


def nmt(monkeypatch, *args: str) -> tuple[int, list[str]]:
    """(exit status, stderr lines other than progress logs) of `nmt ARGS` through the console entry point."""
    monkeypatch.setattr(sys, "argv", ["nmt", "--quiet", *args])
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as ex:
        cli.main()
    return ex.value.code, [line for line in err.getvalue().splitlines() if not line.startswith("[nmt] ")]


def signal_once(proc: subprocess.Popen, signum: int, ready: Callable[[], bool], never: str) -> str:
    """Send `signum` to `proc` once `ready()` holds (within two minutes), and return its standard error."""
    try:
        deadline = time.monotonic() + 120
        while not ready() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert ready(), never
        proc.send_signal(signum)
        return proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".tmp-"))


@contextlib.contextmanager
def ctrl_c_after(lines: int, monkeypatch) -> Iterator[list[str]]:
    """Inside the block, a translation stops as Ctrl-C stops it once `lines` output lines are made (yielded)."""
    format_nbest, written = translate_module.format_nbest, []

    def then_ctrl_c(*args, **kwargs):
        if len(written) == lines:
            raise KeyboardInterrupt
        written.append(format_nbest(*args, **kwargs))
        return written[-1]

    monkeypatch.setattr(translate_module, "format_nbest", then_ctrl_c)
    try:
        yield written
    finally:
        monkeypatch.setattr(translate_module, "format_nbest", format_nbest)


@pytest.fixture
def doc(tmp_path) -> Path:
    path = tmp_path / "doc.txt"
    path.write_bytes(SOURCE.encode())
    return path


def _same(doc: Path) -> str:
    return str(doc)


def _spelled_otherwise(doc: Path) -> str:
    (doc.parent / "sub").mkdir()
    return str(doc.parent / "sub" / ".." / doc.name)


def _symlink(doc: Path) -> str:
    (doc.parent / "link.txt").symlink_to(doc)
    return str(doc.parent / "link.txt")


def _hard_link(doc: Path) -> str:
    os.link(doc, doc.parent / "hard.txt")
    return str(doc.parent / "hard.txt")


@pytest.mark.parametrize("alias", [_same, _spelled_otherwise, _symlink, _hard_link],
                         ids=["same-path", "other-spelling", "symlink", "hard-link"])
@pytest.mark.parametrize("model", ["good", "missing"])
def test_output_that_is_the_input_is_refused_before_the_model_loads(alias, model, doc, checkpoints, monkeypatch):
    ckpt = checkpoints["transformer"] if model == "good" else doc.parent / "none.pt"  # not even read
    out = alias(doc)
    status, errors = nmt(monkeypatch, "translate", "-c", str(ckpt), "-i", str(doc), "-o", out)
    assert status == 2 and len(errors) == 1, errors
    assert errors[0] == (f"nmt: error: {out}: output is the same file as the input {doc}; "
                         "translating would overwrite it, so write to another file")
    assert doc.read_bytes() == SOURCE.encode()
    assert leftovers(doc.parent) == []


def test_standard_input_redirected_from_the_output_is_refused(doc, checkpoints):
    with open(doc, "rb") as stdin:
        proc = subprocess.run([sys.executable, "-m", "nmt", "translate", "-c", str(checkpoints["transformer"]),
                               "-o", str(doc)], stdin=stdin, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"nmt: error: {doc}: output is the same file as the input standard input; "
                                        "translating would overwrite it, so write to another file"]
    assert doc.read_bytes() == SOURCE.encode()


def test_missing_output_folder_is_one_line(doc, checkpoints, monkeypatch):
    out = doc.parent / "nodir" / "out.txt"
    status, errors = nmt(monkeypatch, "translate", "-c", str(checkpoints["transformer"]), "-i", str(doc), "-o", str(out))
    assert status == 2
    assert errors == [f"nmt: error: {out}: output folder {out.parent} does not exist; create it or choose another -o"]


def test_output_that_is_a_folder_is_one_line(doc, checkpoints, monkeypatch):
    status, errors = nmt(monkeypatch, "translate", "-c", str(checkpoints["transformer"]), "-i", str(doc),
                         "-o", str(doc.parent))
    assert status == 2
    assert errors == [f"nmt: error: {doc.parent}: output is a folder; give a file name"]


def test_an_output_that_is_the_checkpoint_is_one_line(doc, checkpoints, monkeypatch, tmp_path):
    """`-o best.pt` (a slip for `-c best.pt -o best.txt`) replaced the model by its translations."""
    ckpt = tmp_path / "best.pt"
    ckpt.write_bytes(checkpoints["transformer"].read_bytes())
    (tmp_path / "link.pt").symlink_to(ckpt)
    for out in (ckpt, tmp_path / "link.pt"):
        status, errors = nmt(monkeypatch, "translate", "-c", str(ckpt), "-i", str(doc), "-o", str(out))
        assert status == 2 and errors == [f"nmt: error: {out}: output is the checkpoint {ckpt}; translating would "
                                          "overwrite it, so write to another file"]
    assert ckpt.read_bytes() == checkpoints["transformer"].read_bytes()


def test_an_output_named_as_a_folder_is_one_line(doc, checkpoints, monkeypatch):
    """`-o new/`: a folder that does not exist, where a file named `new` was written."""
    out = f"{doc.parent / 'new'}{os.sep}"
    status, errors = nmt(monkeypatch, "translate", "-c", str(checkpoints["transformer"]), "-i", str(doc), "-o", out)
    assert status == 2 and errors == [f"nmt: error: {out}: output is a folder; give a file name"]
    assert not (doc.parent / "new").exists()


@pytest.mark.parametrize(("closed", "args", "message"), [
    (0, [], "standard input is closed: give an input file with -i"),
    (1, ["-i", "{doc}"], "standard output is closed: give an output file with -o"),
])
def test_a_closed_standard_stream_is_one_line_before_the_model_loads(doc, checkpoints, closed, args, message):
    """`nmt translate <&-` and `>&-`: Python's sys.stdin or sys.stdout is None; it was an AttributeError (for
    standard output, after translating the whole file)."""
    proc = subprocess.run([sys.executable, "-m", "nmt", "--quiet", "translate", "-c", str(checkpoints["transformer"]),
                           *(a.format(doc=doc) for a in args)],
                          stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          preexec_fn=lambda: os.close(closed))
    assert proc.returncode == 2 and proc.stderr.splitlines() == [f"nmt: error: {message}"], proc.stderr


def test_a_closed_standard_error_translates_as_usual(doc, checkpoints):
    """`nmt translate 2>&-` (some schedulers start jobs so): Python's sys.stderr is None, and the first log line or
    progress check failed, silently since the error line could not be printed either: exit status 1, no output."""
    command = [sys.executable, "-m", "nmt", "translate", "-c", str(checkpoints["transformer"]), "-i", str(doc)]
    expected = subprocess.run(command, capture_output=True, check=True).stdout
    proc = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, preexec_fn=lambda: os.close(2))
    assert proc.returncode == 0 and proc.stdout == expected and len(expected.splitlines()) == 4


def test_success_replaces_the_output_with_the_usual_file_mode(doc, checkpoints, monkeypatch):
    ckpt = str(checkpoints["transformer"])
    new, old = doc.parent / "new.txt", doc.parent / "old.txt"
    old.write_text(OLD)
    old.chmod(0o640)
    for out in (new, old):
        status, errors = nmt(monkeypatch, "translate", "-c", ckpt, "-i", str(doc), "-o", str(out), "--beam", "1")
        assert status == 0, errors
    assert new.read_text() == old.read_text() != OLD
    assert len(new.read_text().split("\n")) == len(SOURCE.split("\n"))  # one line per input line
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~umask  # as `open(..., "w")` makes it, not 0600
    assert stat.S_IMODE(old.stat().st_mode) == 0o640  # a replaced file keeps its mode
    assert leftovers(doc.parent) == []


def test_output_through_a_symlink_replaces_the_target(doc, checkpoints, monkeypatch):
    target = doc.parent / "target.txt"
    target.write_text(OLD)
    (doc.parent / "out.txt").symlink_to(target)
    status, errors = nmt(monkeypatch, "translate", "-c", str(checkpoints["transformer"]), "-i", str(doc),
                         "-o", str(doc.parent / "out.txt"), "--beam", "1")
    assert status == 0, errors
    assert (doc.parent / "out.txt").is_symlink() and target.read_text() != OLD


def test_bad_input_leaves_the_previous_output_and_no_temporary_file(tmp_path, checkpoints, monkeypatch):
    src, out = tmp_path / "src.txt", tmp_path / "out.txt"
    src.write_bytes(SOURCE.encode() + b"caf\xe9 .\n")
    out.write_text(OLD)
    status, errors = nmt(monkeypatch, "translate", "-c", str(checkpoints["transformer"]), "-i", str(src), "-o", str(out))
    assert status == 2 and len(errors) == 1 and errors[0].startswith(f"nmt: error: {src}:5: invalid UTF-8"), errors
    assert out.read_text() == OLD
    assert leftovers(tmp_path) == []


def test_a_run_stopped_after_some_lines_leaves_the_previous_output(doc, checkpoints, monkeypatch):
    """Ctrl-C once two translations are written: exit 130 (Typer's), the old file untouched, no temporary
    file, and the two lines kept in out.txt.partial for the next run (`tests/test_translate_resume.py`)."""
    out, partial = doc.parent / "out.txt", doc.parent / "out.txt.partial"
    out.write_text(OLD)
    format_nbest, written = translate_module.format_nbest, []

    def then_ctrl_c(*args, **kwargs):
        if len(written) == 2:
            assert partial.read_text().splitlines() == written  # each line reaches the file as it is written
            raise KeyboardInterrupt
        written.append(format_nbest(*args, **kwargs))
        return written[-1]

    monkeypatch.setattr(translate_module, "format_nbest", then_ctrl_c)
    status, errors = nmt(monkeypatch, "translate", "-c", str(checkpoints["transformer"]), "-i", str(doc),
                         "-o", str(out), "--beam", "1")
    assert status == 130 and not any("Traceback" in line for line in errors), errors
    assert len(written) == 2
    assert out.read_text() == OLD
    assert partial.read_text().splitlines() == written
    assert leftovers(doc.parent) == []


@pytest.mark.parametrize(("signum", "status", "closed"), [(signal.SIGINT, 130, None),
                                                          (signal.SIGTERM, -signal.SIGTERM, None),
                                                          (signal.SIGTERM, -signal.SIGTERM, 1)],
                         ids=["sigint", "sigterm", "sigterm-stdout-closed"])
def test_a_signal_during_a_real_run_leaves_the_previous_output(tmp_path, checkpoints, signum, status, closed):
    """Ctrl-C, or SIGTERM (a scheduler's or `kill`'s), which ended the process where it stood, without the
    message; the process still ends by SIGTERM, as its sender expects, even with standard output closed
    (`>&-`), where flushing it raised an AttributeError."""
    src, out = tmp_path / "src.txt", tmp_path / "out.txt"
    src.write_text(SOURCE * 1000)
    out.write_text(OLD)
    proc = subprocess.Popen([sys.executable, "-m", "nmt", "--quiet", "translate", "-c", str(checkpoints["transformer"]),
                             "-i", str(src), "-o", str(out), "--beam", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=None if closed is None else lambda: os.close(closed))
    partial = tmp_path / "out.txt.partial"
    stderr = signal_once(proc, signum, lambda: partial.exists() and partial.stat().st_size > 0,
                         "the translation never started writing")
    assert proc.returncode == status, stderr
    assert "Traceback" not in stderr
    assert f"the chunks of lines translated so far are kept in {partial}; the same command goes on after them" in stderr
    assert out.read_text() == OLD
    assert partial.read_text().count("\n") > 0
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(("signum", "status", "name"), [(signal.SIGTERM, -signal.SIGTERM, "SIGTERM"),
                                                        (signal.SIGINT, 130, "SIGINT (Ctrl-C)")],
                         ids=["sigterm", "sigint"])
def test_a_signal_before_the_first_chunk_is_translated_says_nothing_was_kept(tmp_path, checkpoints, signum, status,
                                                                             name):
    """A signal while the first chunk is searched, before any line is written: SIGTERM ended the process with
    status 143 and not a word, where a stop a chunk later says what it kept. It says so in one line, with the
    status a later stop has, and leaves the old output and no partial or temporary file."""
    src, out = tmp_path / "src.txt", tmp_path / "out.txt"
    src.write_text(SOURCE * 1000)  # one chunk of 4,000 lines (--max-tokens over the beam): seconds to search
    out.write_text(OLD)
    proc = subprocess.Popen([sys.executable, "-m", "nmt", "--quiet", "translate", "-c", str(checkpoints["transformer"]),
                             "-i", str(src), "-o", str(out), "--beam", "1", "--max-tokens", "4000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    partial = tmp_path / "out.txt.partial"
    stderr = signal_once(proc, signum, partial.exists, "the translation never started")
    assert proc.returncode == status, stderr
    assert stderr.splitlines() == [
        f"[nmt] stopped by {name} before its first chunk of lines was translated (lines are kept a whole chunk at a "
        f"time): nothing was written to {out}; the same command starts from the first line"], stderr
    assert out.read_text() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "src.txt"]  # no partial, nor temporary file


def test_sigterm_while_standard_input_is_translated_into_a_file_leaves_no_temporary_file(tmp_path, checkpoints):
    """`nmt translate -o OUT < pipe` writes a temporary file beside OUT until the input ends; SIGTERM left it
    there for good (nothing removes temporary files beside translations)."""
    out = tmp_path / "out.txt"
    out.write_text(OLD)
    proc = subprocess.Popen([sys.executable, "-m", "nmt", "--quiet", "translate", "-c", str(checkpoints["transformer"]),
                             "-o", str(out), "--beam", "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(SOURCE.encode())
        proc.stdin.flush()  # and left open: the command waits for more
        deadline = time.monotonic() + 120
        while not any(tmp_path.glob(".tmp-*")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert any(tmp_path.glob(".tmp-*")), "the translation never started writing"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGTERM, stderr
    assert b"Traceback" not in stderr
    assert out.read_text() == OLD
    assert leftovers(tmp_path) == []


def test_standard_output_on_a_full_disk_is_one_line(checkpoints, doc):
    """`> /dev/full`: every write fails with ENOSPC, as on a full file system."""
    for stdin, args in ((subprocess.DEVNULL, ["-i", str(doc)]), (open(doc, "rb"), [])):
        with open("/dev/full", "w") as full:
            proc = subprocess.run([sys.executable, "-m", "nmt", "--quiet", "translate", "-c",
                                   str(checkpoints["transformer"]), *args], stdin=stdin, stdout=full,
                                  stderr=subprocess.PIPE, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            "nmt: error: standard output: disk full; the translations before it were written: free some space "
            "or write elsewhere"], proc.stderr


def test_a_reader_that_stops_reading_ends_the_translation_quietly_with_status_141(checkpoints, tmp_path):
    """`nmt translate ... | head -2` exited 1, the status of a runtime failure; a Unix tool whose reader has gone
    stops quietly with 141 (SIGPIPE), and so does nmt, from a file and from standard input alike."""
    doc = tmp_path / "long.txt"
    doc.write_text("the man sees the dog .\n" * 5000)  # more lines than one chunk
    for stdin, args in ((subprocess.DEVNULL, ["-i", str(doc)]), (open(doc, "rb"), [])):
        proc = subprocess.Popen([sys.executable, "-m", "nmt", "translate", "-c", str(checkpoints["transformer"]),
                                 "--max-len-a", "0", "--max-len-b", "2", *args], stdin=stdin, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE,
                                env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        first = [proc.stdout.readline() for _ in range(2)]
        proc.stdout.close()  # as `head -2` does once it has its lines
        stderr = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 141, stderr
        assert all(line.endswith(b"\n") for line in first)
        assert "Traceback" not in stderr and "error" not in stderr, stderr


def test_a_gzip_input_is_translated_and_resumed_as_its_text_would_be(doc, checkpoints, monkeypatch):
    """`-i doc.txt.gz` was refused as "invalid UTF-8 ... convert the input to UTF-8", where `nmt eval` read it."""
    ckpt = str(checkpoints["transformer"])
    packed = doc.parent / "doc.txt.gz"
    packed.write_bytes(gzip.compress(doc.read_bytes()))
    plain, from_gz = doc.parent / "plain.txt", doc.parent / "from_gz.txt"
    assert nmt(monkeypatch, "translate", "-c", ckpt, "-i", str(doc), "-o", str(plain))[0] == 0
    with ctrl_c_after(2, monkeypatch):  # stopped after two lines, then resumed from the compressed file
        assert nmt(monkeypatch, "translate", "-c", ckpt, "-i", str(packed), "-o", str(from_gz))[0] == 130
    status, errors = nmt(monkeypatch, "translate", "-c", ckpt, "-i", str(packed), "-o", str(from_gz))
    assert status == 0, errors
    assert from_gz.read_text() == plain.read_text()
    for name, data in (("plain.gz", doc.read_bytes()), ("packed.txt", gzip.compress(doc.read_bytes()))):
        (doc.parent / name).write_bytes(data)  # told by its first bytes, not its name
        status, errors = nmt(monkeypatch, "translate", "-c", ckpt, "-i", str(doc.parent / name), "-o",
                             str(doc.parent / f"{name}.out"))
        assert status == 0, errors
        assert (doc.parent / f"{name}.out").read_text() == plain.read_text()
    packed.write_bytes(gzip.compress(doc.read_bytes())[:-12])  # cut short
    status, errors = nmt(monkeypatch, "translate", "-c", ckpt, "-i", str(packed))
    assert status == 2 and errors == [f"nmt: error: {packed}: cannot read: Compressed file ended before the "
                                      "end-of-stream marker was reached"]


def test_an_output_named_gz_is_compressed_whole_after_a_resume_and_from_standard_input(doc, checkpoints, monkeypatch):
    """`-o out.gz` wrote plain text under the name, which zcat refused."""
    ckpt = str(checkpoints["transformer"])
    plain, packed = doc.parent / "plain.txt", doc.parent / "out.txt.gz"
    assert nmt(monkeypatch, "translate", "-c", ckpt, "-i", str(doc), "-o", str(plain))[0] == 0
    with ctrl_c_after(2, monkeypatch) as written:
        assert nmt(monkeypatch, "translate", "-c", ckpt, "-i", str(doc), "-o", str(packed))[0] == 130
    part = partial_paths(packed)[0]
    assert part.read_text().splitlines() == written and not packed.exists()  # the lines so far, plain, to resume
    assert nmt(monkeypatch, "translate", "-c", ckpt, "-i", str(doc), "-o", str(packed)) == (0, [])
    assert gzip.decompress(packed.read_bytes()).decode() == plain.read_text() and not part.exists()
    from_stdin = doc.parent / "stdin.txt.gz"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(doc.read_bytes()), encoding="utf-8"))
    assert nmt(monkeypatch, "translate", "-c", ckpt, "-o", str(from_stdin)) == (0, [])
    assert gzip.decompress(from_stdin.read_bytes()).decode() == plain.read_text()
    assert leftovers(doc.parent) == []


def test_eval_reads_a_named_pipe_and_names_a_folder(doc, tmp_path, monkeypatch):
    """`nmt eval --hyp <(cut -f2 out.tsv) --ref ref.txt` said "/dev/fd/63: file not found"."""
    ref = tmp_path / "ref.txt"
    ref.write_text(SOURCE)
    fifo = tmp_path / "hyp_pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_bytes, args=(SOURCE.encode(),))
    writer.start()
    monkeypatch.setattr(sys, "argv", ["nmt", "--quiet", "eval", "--hyp", str(fifo), "--ref", str(ref), "--json"])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit) as done:
        cli.main()
    if writer.is_alive():  # the pipe was never opened: read it, so that the writer ends and the test fails
        fifo.read_bytes()
    writer.join()
    assert done.value.code == 0, printed.getvalue()
    assert json.loads(printed.getvalue())[str(fifo)]["bleu"] == 100.0
    status, errors = nmt(monkeypatch, "eval", "--hyp", str(tmp_path), "--ref", str(ref))
    assert status == 2 and errors == [f"nmt: error: {tmp_path}: a folder, not a text file"]


def test_a_named_pipe_as_input_is_read_once_as_standard_input_is(doc, checkpoints, monkeypatch):
    """`-i <(zcat doc.gz)`: a pipe cannot be read twice or resumed; it is translated as it comes, and `-o` written
    whole, as from standard input. A folder as input is named as one."""
    ckpt = str(checkpoints["transformer"])
    from_file = doc.parent / "from_file.txt"
    assert nmt(monkeypatch, "translate", "-c", ckpt, "-i", str(doc), "-o", str(from_file))[0] == 0
    fifo = doc.parent / "pipe"
    for out in (doc.parent / "from_pipe.txt", None):
        os.mkfifo(fifo)
        writer = threading.Thread(target=fifo.write_bytes, args=(SOURCE.encode(),))
        writer.start()
        if out is not None:
            status, errors = nmt(monkeypatch, "translate", "-c", ckpt, "-i", str(fifo), "-o", str(out))
            assert status == 0, errors
            assert out.read_text() == from_file.read_text() and not partial_paths(out)[0].exists()
        else:
            printed, translator = io.StringIO(), Translator.from_checkpoint(ckpt)
            with contextlib.redirect_stdout(printed):
                translate_module.translate_io(translator, translator.options(), input=str(fifo))
            assert printed.getvalue() == from_file.read_text()
        writer.join()
        fifo.unlink()
    status, errors = nmt(monkeypatch, "translate", "-c", ckpt, "-i", str(doc.parent))
    assert status == 2 and errors == [f"nmt: error: {doc.parent}: a folder, not an input file"]
    os.mkfifo(fifo)  # as an output: it would be replaced by a file, its reader left waiting
    status, errors = nmt(monkeypatch, "translate", "-c", ckpt, "-i", str(doc), "-o", str(fifo))
    assert status == 2 and errors == [f"nmt: error: {fifo}: output is a pipe or a device; write to standard output "
                                      "instead (leave out -o and redirect it)"]
    assert stat.S_ISFIFO(fifo.stat().st_mode)
