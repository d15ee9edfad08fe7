"""Plain text files: UTF-8 lines read with errors that name the file and line."""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from nmt.errors import DataError


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file (`.gz` allowed), without line endings.

    Raises:
        DataError: missing or unreadable file, or invalid UTF-8 (with the line number).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            return list(decode_lines(f, str(path)))
    except (OSError, EOFError) as err:
        raise DataError(f"{path}: cannot read: {err}") from None


def decode_lines(raw_lines: Iterable[bytes], name: str) -> Iterator[str]:
    """Decode the lines of a binary stream (a file, or `sys.stdin.buffer` as "<stdin>") as UTF-8,
    one at a time, without line endings or a leading byte-order mark.

    Raises:
        DataError: invalid UTF-8; the message names `name` and the line number.
    """
    for number, raw in enumerate(raw_lines, start=1):
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as err:
            raise DataError(
                f"{name}:{number}: invalid UTF-8 at byte {err.start} of the line ({err.reason}); convert the input to UTF-8"
            ) from None
        yield line.removeprefix("\ufeff") if number == 1 else line


def check_pairing(a: str | Path, a_lines: Sequence[str], b: str | Path, b_lines: Sequence[str], what: str) -> None:
    """Raise `DataError` naming both files and counts unless they have as many lines."""
    if len(a_lines) != len(b_lines):
        raise DataError(f"{a} has {len(a_lines)} lines but {b} has {len(b_lines)}: {what} must pair line by line")


def read_parallel(src: str | Path, ref: str | Path, what: str = "sources and references") -> tuple[list[str], list[str]]:
    """The lines of two files that pair line by line.

    Raises:
        DataError: a file is missing or unreadable, or they differ in length.
    """
    a, b = read_lines(src), read_lines(ref)
    check_pairing(src, a, ref, b, what)
    return a, b
