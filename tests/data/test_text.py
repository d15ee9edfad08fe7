"""Reading lines as they arrive (`available_lines`): whole chunks from a file, every line at once from a pipe."""

from __future__ import annotations

import os
from pathlib import Path

from nmt.data.text import available_lines


def test_a_file_as_a_stream_is_cut_into_full_chunks_as_islice_cuts_it(tmp_path: Path) -> None:
    """A file read as standard input is cut where `-i FILE` cuts it: the reads of 64 KiB each end within
    a chunk, and the lines short of a chunk wait for the next read, which does not wait."""
    lines = [f"line {i} " + "x" * (i % 50) for i in range(5000)]  # 170 KiB: three reads
    path = tmp_path / "lines.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with open(path, "rb") as raw:
        chunks = list(available_lines(raw, str(path), max_lines=2000))
    assert [len(chunk) for chunk in chunks] == [2000, 2000, 1000]
    assert [line for chunk in chunks for line in chunk] == lines


def test_a_pipes_lines_are_given_as_soon_as_nothing_more_has_arrived() -> None:
    read, write = os.pipe()
    with open(read, "rb") as raw:
        chunks = available_lines(raw, "<pipe>", max_lines=2000)
        os.write(write, b"one\ntwo\nthr")
        assert next(chunks) == ["one", "two"]  # without waiting for more input
        os.write(write, b"ee\nfour\n")
        assert next(chunks) == ["three", "four"]
        os.write(write, b"five")
        os.close(write)
        assert next(chunks) == ["five"]
        assert next(chunks, None) is None


def test_a_line_of_many_reads_comes_through_whole_between_its_neighbours(tmp_path: Path) -> None:
    """The unfinished line is kept in pieces, joined once it ends: joined to each new read, it was copied whole
    every 64 KiB, and a 64 MB line (a file whose lines end in a lone '\\r' is one) took about a minute."""
    long = "word " * 200_000  # 1 MB: 16 reads
    path = tmp_path / "long.txt"
    path.write_text(f"first\n{long}\nlast", encoding="utf-8")
    with open(path, "rb") as raw:
        assert [line for chunk in available_lines(raw, str(path), max_lines=2000) for line in chunk] == [
            "first", long, "last"]
