"""An output file written line by line that an interrupted run finishes later instead of starting over.

`nmt translate -i big.txt -o out.txt` can run for hours (back-translating millions of
lines). Its lines go to `out.txt.partial`, flushed as they come, beside a small
`out.txt.partial.json` that describes the job (input, checkpoints, search settings).
When every line is written, the partial file is synced and renamed to `out.txt` (or, for
`out.txt.gz`, compressed into it) and the description removed, so `out.txt` itself is never half written. When the run is
stopped (Ctrl-C, SIGTERM, a crash, a full disk, SIGKILL), both stay; the same command
then finds them, keeps the complete lines (a line cut off by a kill is dropped),
and goes on after them. A different job refuses to append to them, naming what
differs; `restart=True` discards them.

One writer at a time: the partial file is locked (`flock`) while it is written.
A stopped translation says on stderr what it kept and how to go on (`reports_a_stop`).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from nmt.errors import UserError
from nmt.fileio import disk_full, fsync_dir, gzip_named, write_atomic, write_gzip
from nmt.interrupts import Terminated

try:
    import fcntl
except ImportError:  # Windows: no lock
    fcntl = None

log = logging.getLogger(__name__)

SUFFIX = ".partial"
"""Appended to the output's name for the lines written so far; `SUFFIX + ".json"` for the job's description."""


@dataclass
class Partial:
    """An open partial output: write lines to `file`; `done` lines were there before this run."""

    file: TextIO
    done: int


def partial_paths(output: str | Path) -> tuple[Path, Path]:
    """The partial file and its job description beside `output` (a symlink's target: that is what gets replaced)."""
    real = Path(os.path.realpath(output))
    return real.with_name(real.name + SUFFIX), real.with_name(real.name + SUFFIX + ".json")


@contextlib.contextmanager
def resumable_output(output: str | Path, job: Mapping[str, Any], *, restart: bool = False) -> Iterator[Partial]:
    """Write `output` line by line through its partial file, resuming the lines an interrupted run of `job` left.

    On leaving the block normally the partial file becomes `output` (its mode, where it
    existed, kept). On an exception it stays, with every line written so far flushed
    to disk, for the next run of the same job.

    Args:
        output: the final file.
        job: what the lines depend on (plain JSON data); a partial file of another job is refused.
        restart: discard a partial file left by an earlier run, whatever its job.

    Raises:
        UserError: another process is writing the same output; a partial file of another job
            or of unknown origin (unless `restart`); the disk is full (the lines so far are kept).
    """
    job = json.loads(json.dumps(job))  # as it reads back: tuples become lists
    path = Path(os.path.realpath(output))
    part, desc = partial_paths(output)
    fd = _open_locked(part, output)
    finished = False
    try:
        if restart:
            os.ftruncate(fd, 0)
        done = _resume_point(fd, part, desc, job) if os.fstat(fd).st_size else 0
        if done:
            log.info("%s: resuming after the %s lines in %s", output, f"{done:,}", part)
        write_atomic(desc, lambda f: f.write(json.dumps({"job": job}, indent=1).encode()))
        os.lseek(fd, 0, os.SEEK_END)
        # line buffering: each line reaches the file as it is written, so a kill loses none before it
        text = io.TextIOWrapper(os.fdopen(os.dup(fd), "wb"), encoding="utf-8", line_buffering=True)
        try:
            yield Partial(file=text, done=done)
            text.flush()
        except BaseException as err:
            with contextlib.suppress(OSError, ValueError):
                text.flush()
            if disk_full(err):
                raise UserError(f"{output}: disk full; the lines written so far are kept in {part}: free some "
                                "space and run the same command again to go on from there") from None
            raise
        finally:
            with contextlib.suppress(OSError, ValueError):
                text.close()
            with contextlib.suppress(OSError):
                os.fsync(fd)
        if gzip_named(path):  # the partial file is plain text, resumed line by line; the output is compressed whole
            with open(part, "rb") as plain:
                write_atomic(path, lambda raw: write_gzip(raw, lambda packed: shutil.copyfileobj(plain, packed)))
            part.unlink()
        else:
            if path.exists():
                os.fchmod(fd, stat.S_IMODE(path.stat().st_mode))
            os.replace(part, path)
        fsync_dir(path.parent)
        desc.unlink(missing_ok=True)
        finished = True
    finally:
        if not finished and not os.fstat(fd).st_size:  # stopped before its first line: nothing to resume
            part.unlink(missing_ok=True)
            desc.unlink(missing_ok=True)
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def reports_a_stop(input: str | Path, output: str | Path) -> Iterator[None]:
    """Around a translation of the file `input` into the file `output`: a run stopped inside says on stderr, in one
    line, what it kept of `output` and what the same command does next.

    A signal says so whenever it comes, even before the first line is written (nothing is kept then); another
    failure, whose own error follows, only where a partial file holds lines. A `UserError` says what to do itself,
    and standard input or output ("-") has no partial file to speak of.
    """
    try:
        yield
    except UserError:
        raise
    except BaseException as err:
        if output != "-" and input != "-" and Path(input).is_file():
            _report_stop(err, output)
        raise


def _report_stop(err: BaseException, output: str | Path) -> None:
    kept = partial_paths(output)[0]
    by = " by SIGTERM" if isinstance(err, Terminated) else " by SIGINT (Ctrl-C)" if isinstance(
        err, KeyboardInterrupt) else ""
    if kept.exists():
        log.warning("stopped%s: the chunks of lines translated so far are kept in %s; the same command goes on "
                    "after them (--restart starts over)", by, kept)
    elif by:  # stopped in its first chunk, whose empty partial file `resumable_output` removed
        log.warning("stopped%s before its first chunk of lines was translated (lines are kept a whole chunk at a "
                    "time): nothing was written to %s; the same command starts from the first line", by, output)


def _open_locked(part: Path, output: str | Path) -> int:
    """A descriptor on the partial file (created if needed), locked for this process."""
    while True:
        try:
            fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as err:
            raise UserError(f"{part}: cannot be written ({err.strerror}); choose another -o") from None
        if fcntl is None:
            return fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(f"{output}: another process is writing it (it holds {part}); "
                            "wait for it to finish, stop it, or choose another -o") from None
        try:
            if os.stat(part).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # a writer that held the lock renamed the file to its output meanwhile: open the name again


def _resume_point(fd: int, part: Path, desc: Path, job: dict[str, Any]) -> int:
    """Complete lines in the partial file of `job` (a cut-off last line is cut away); refuse another job's."""
    try:
        earlier = json.loads(desc.read_text(encoding="utf-8"))["job"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{part} holds lines of an earlier run but {desc.name} does not say of which; "
                        "delete it, or pass --restart to start over") from None
    lines, end = _complete_lines(fd)
    if earlier != job:
        key, then, now = _first_difference(earlier, job)
        changed = _changed_file(earlier, key)
        if changed:  # the same command cannot finish it: the file it read is not there as it was
            raise UserError(f"{part} holds {lines:,} lines of an interrupted run, but {changed} has changed since "
                            f"(its {key.rpartition('.')[2]}: {then!r}, now {now!r}), so they may not be its "
                            "translations: pass --restart to start over")
        raise UserError(f"{part} holds {lines:,} lines of an interrupted run with another {key} ({then!r}, now "
                        f"{now!r}); repeat that run's command to finish it, or pass --restart to start over")
    os.ftruncate(fd, end)
    return lines


def _changed_file(earlier: dict[str, Any], key: str) -> str | None:
    """"the input file PATH" or "the checkpoint PATH" where `key` is the size or the modification time of one
    that the job read at the same path (`translation_job`); else None."""
    where, _, field = key.rpartition(".")
    if field not in ("bytes", "modified_ns"):
        return None
    if where == "input":
        return f"the input file {earlier['input']['path']}"
    if where.startswith("checkpoints["):
        index = int(where.removeprefix("checkpoints[").removesuffix("]"))
        return f"the checkpoint {earlier['checkpoints'][index]['path']}"
    return None


def _complete_lines(fd: int) -> tuple[int, int]:
    """(newline-terminated lines, the byte offset just after the last one) of the file behind `fd`."""
    lines = end = offset = 0
    while block := os.pread(fd, 1 << 20, offset):
        count = block.count(b"\n")
        if count:
            lines += count
            end = offset + block.rindex(b"\n") + 1
        offset += len(block)
    return lines, end


def _first_difference(a: Any, b: Any, key: str = "") -> tuple[str, Any, Any]:
    """The key (`search.beam`, `checkpoints[0].path`) of the first value that differs between two
    JSON-like values, and the two values there."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in [*a, *(k for k in b if k not in a)]:
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{key}.{k}" if key else k)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{key}[{i}]")
    return key or "job", a, b
