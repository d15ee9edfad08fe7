"""Plain text files: UTF-8 lines read with errors that name the file and line."""

from __future__ import annotations

import gzip
import os
import select
import zlib
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import BinaryIO

from nmt.errors import DataError

# What reading a file raises when it cannot be read: the system's errors, and a gzip file cut short or
# damaged (a damaged deflate stream raises zlib's error, not an OSError).
READ_ERRORS = (OSError, EOFError, zlib.error)


def read_problem(path: str | Path, err: BaseException, lines_before: int = 0) -> str:
    """`PATH: cannot read[ after line N]: WHY` for one of `READ_ERRORS`: an OS error by its reason alone
    ("Permission denied", where its text would repeat the path), a damaged or cut-short .gz by what gzip
    says; the line number only where some lines were read."""
    why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    after = f" after line {lines_before}" if lines_before else ""
    return f"{path}: cannot read{after}: {why}"


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file (`.gz` allowed) or a pipe (`<(zcat f.gz)`), without line endings.

    Raises:
        DataError: missing or unreadable file, a folder, or invalid UTF-8 (with the line number).
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: a folder, not a text file")
    if not path.exists():
        raise DataError(f"{path}: file not found")
    try:
        with open_binary(path) as f:
            return list(decode_lines(f, str(path)))
    except READ_ERRORS as err:
        raise DataError(read_problem(path, err)) from None


def open_binary(path: str | Path) -> BinaryIO:
    """A text file opened for reading bytes; one that gzip wrote (whatever its name) decompressed as it is read.

    A regular file is told by its first bytes, so that `doc.gz` holding plain text is read as it is; a pipe,
    which cannot be read twice, by its name.
    """
    if os.path.isfile(path):
        with open(path, "rb") as f:
            head = f.read(10)
        packed = head.startswith(_GZIP_MAGIC)
        for magics, tool, command in _OTHER_PACKINGS:
            if head.startswith(magics):
                raise DataError(f"{path}: a file compressed with {tool}, where nmt reads UTF-8 text and gzip: "
                                f"decompress it ({command} {path}), or give it as a pipe: <({command} -c {path})")
    else:
        packed = Path(path).suffix == ".gz"
    return gzip.open(path, "rb") if packed else open(path, "rb")  # type: ignore[return-value]


_GZIP_MAGIC = b"\x1f\x8b"
_OTHER_PACKINGS = [
    (tuple(b"BZh%d1AY&SY" % level for level in range(1, 10)), "bzip2", "bunzip2"),
    ((b"\xfd7zXZ\x00",), "xz", "unxz"),
    ((b"\x28\xb5\x2f\xfd",), "zstd", "unzstd"),
]
"""The first bytes of compressed files that nmt does not unpack (they would read as invalid UTF-8), and the tool
that does."""


def decode_lines(raw_lines: Iterable[bytes], name: str, *, first: int = 1) -> Iterator[str]:
    """Decode the lines of a binary stream (a file, or `sys.stdin.buffer` as "<stdin>") as UTF-8,
    one at a time, by the line rules; `first` is the number of the first line.

    The line rules, which every reader of lines follows (`nmt.data.textfiles` in Arrow): only '\\n'
    ends a line, and a '\\r' right before it is dropped with it; a leading UTF-8 byte-order mark is
    dropped, so a file holding only one has no line; a last line without '\\n' is a line. Every
    other character, '\\r' and the Unicode line separators included, is text of its line.
    `raw_lines` are the stream's lines with their '\\n' (as iterating a binary file gives them).

    Raises:
        DataError: invalid UTF-8; the message names `name` and the line number.
    """
    for number, raw in enumerate(raw_lines, start=first):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise DataError(
                f"{name}:{number}: invalid UTF-8 at byte {err.start} of the line ({err.reason}); convert the input to UTF-8"
            ) from None
        if number == 1:
            line = line.removeprefix("\ufeff")
        if line.endswith("\n"):
            yield line[:-1].removesuffix("\r")
        elif line:  # a last line without '\n'; after a lone byte-order mark, nothing
            yield line


def normalize_spaces(text: str) -> str:
    """`text` as the model reads it, in training (`nmt.data.cleaning.clean_pairs`, in Arrow) as in
    translation: each run of whitespace (`str.isspace`: tabs, NEL, U+3000, ...) one space, none at
    either end."""
    return " ".join(text.split())


LINE_BREAKS = "\n\x0b\x0c\r\x1c\x1d\x1e\x85\u2028\u2029"
"""The characters `str.splitlines()` ends a line at. Only '\\n' ends one here, but other programs
(and Python's own `splitlines`) read the others as line breaks too."""
_ONE_LINE = str.maketrans(dict.fromkeys(LINE_BREAKS, " "))


def one_line(text: str) -> str:
    """`text` with each of `LINE_BREAKS` replaced by a space: what an output line holds, so that a
    file of translations has one line per input line whoever reads it."""
    return text.translate(_ONE_LINE)


def check_pairing(a: str | Path, a_lines: Sequence[str], b: str | Path, b_lines: Sequence[str], what: str) -> None:
    """Raise `DataError` naming both files and counts unless they have as many lines."""
    if len(a_lines) != len(b_lines):
        raise DataError(f"{a} has {len(a_lines)} lines but {b} has {len(b_lines)}: {what} must pair line by line")


def reference_files(ref: str | Path | Sequence[str | Path] | None) -> list[str | Path]:
    """`ref` as a list of files: one path, several (several references of each line), or none."""
    return [] if ref is None else [ref] if isinstance(ref, (str, Path)) else list(ref)


def read_scored(path: str | Path, refs: Sequence[str | Path], what: str) -> tuple[list[str], list[list[str]]]:
    """The lines of `path` (sources or translations) and of each of its reference files `refs` (at least one), read
    once each.

    Raises:
        DataError: a file is missing or unreadable, a reference file has another number of lines, or all are empty.
    """
    lines, streams = read_lines(path), []
    for ref in refs:
        streams.append(read_lines(ref))
        check_pairing(path, lines, ref, streams[-1], what)
    if not lines:  # found before a model loads, naming the files
        raise DataError(f"{path} and {refs[0]}: both empty, nothing to score")
    return lines, streams


def available_lines(raw: BinaryIO, name: str, *, max_lines: int) -> Iterator[list[str]]:
    """The lines of a pipe in chunks of those that have arrived (at most `max_lines`), decoded as `decode_lines` does.

    A chunk is yielded as soon as at least one whole line is there and nothing more
    can be read without waiting, so a line written to the pipe is answered before
    the next one is sent. While more can be read at once, only full chunks are yielded:
    a file (given as standard input) is cut every `max_lines` lines, as `islice` cuts it,
    so that its batches, and a seeded sampler's draws, are those of the same file read by
    name; a fast producer gives full chunks too.
    Reads the file descriptor directly: Python's buffered readers would wait for
    a full buffer.
    """
    try:
        fd = raw.fileno()
    except OSError:  # an in-memory stream: everything is there already
        lines = decode_lines(raw, name)
        yield from iter(lambda: list(islice(lines, max_lines)), [])
        return
    pending: list[bytes] = []
    partial: list[bytes] = []  # the pieces of the unfinished line: joined once it ends, not at every read of it
    number = 0
    at_end = False
    while not at_end:
        data = os.read(fd, 1 << 16)  # waits for the first bytes
        while data:
            lines = data.split(b"\n")
            if len(lines) > 1:
                lines[0] = b"".join([*partial, lines[0]])
                partial = []
            partial.append(lines.pop())
            pending += [line + b"\n" for line in lines]  # with their ending, as `decode_lines` takes them
            if len(pending) >= max_lines or not select.select([fd], [], [], 0)[0]:
                break
            data = os.read(fd, 1 << 16)
        if not data:
            at_end = True
            if any(partial):
                pending.append(b"".join(partial))
        # The lines short of a full chunk wait for the next read only where it would not wait.
        last = at_end or not select.select([fd], [], [], 0)[0]
        while len(pending) >= max_lines or (pending and last):
            chunk, pending = pending[:max_lines], pending[max_lines:]
            decoded = list(decode_lines(chunk, name, first=number + 1))
            number += len(chunk)
            if decoded:  # a lone byte-order mark is no line
                yield decoded
