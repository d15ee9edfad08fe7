"""Plain-text parallel corpora into Arrow: sharded, `.gz` or not, at C speed, in bounded memory.

A text corpus is one or more shards, each a pair of files PREFIX.SRC and PREFIX.TGT
with one sentence per line (either may be `.gz`). `path` names the prefixes: one
prefix, a glob of prefixes (`wmt/part-*` matches `wmt/part-000.de` and its partner),
or a list of either; shards are read in the order given, a glob's matches sorted.

The files are read in blocks of a few MB: each block is decoded, checked as UTF-8
and split into lines by Arrow compute functions, source and target blocks are
aligned line for line, and the pairs are written straight to an Arrow file in the
cache folder, which the `Dataset` then memory-maps. No line ever becomes a Python
string, and memory stays at a few blocks whatever the corpus size. The file's name
carries each shard's path, size and modification time, so a second run with the
same files opens it at once and an edited file is read again.

Line rules (the same as for every line-based source): only '\\n' ends a line, a
'\\r' right before it is dropped, a leading UTF-8 byte-order mark is dropped, and
nothing else is changed: `clean_pairs` folds whitespace (`nmt.data.text.normalize_spaces`).
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset

from nmt.data.text import READ_ERRORS, open_binary, read_problem
from nmt.errors import DataError, headline
from nmt.fileio import umask

log = logging.getLogger(__name__)

BLOCK_BYTES = 1 << 22
"""Bytes read from a file at a time (4 MiB)."""
FORMAT = 1
"""Bumped whenever the Arrow files written here change, so old caches are not reused."""
SCHEMA = pa.schema([("src", pa.string()), ("tgt", pa.string())])


def text_prefixes(entries: Sequence[str], src_lang: str) -> list[str]:
    """The shard prefixes that `entries` (prefixes or globs of prefixes) name, in order.

    A glob is matched against the source-side files (`PATTERN.SRC` and `PATTERN.SRC.gz`).

    Raises:
        DataError: a glob that matches no source file.
    """
    prefixes: list[str] = []
    for entry in entries:
        if not is_glob(entry, suffixes=(f".{src_lang}", f".{src_lang}.gz")):
            prefixes.append(entry)
            continue
        found = set()
        for suffix in (f".{src_lang}", f".{src_lang}.gz"):
            found.update(p[: -len(suffix)] for p in glob.glob(entry + suffix))
        if not found:
            raise DataError(f"{entry}: no files match {entry}.{src_lang} or {entry}.{src_lang}.gz{path_hint(entry)}")
        prefixes += sorted(found)
    return prefixes


def is_glob(path: str, *, suffixes: Sequence[str] = ("",)) -> bool:
    """Whether `path` is a pattern to match: it holds `*`, `?` or `[`, and names no file as written (with one of
    `suffixes`), so that a folder named `corpus[v2]` is read as the folder it is."""
    return any(c in path for c in "*?[") and not any(os.path.lexists(path + suffix) for suffix in suffixes)


def read_text_shards(shards: Sequence[tuple[str, str]], cache_dir: str | None) -> Dataset:
    """The pairs of every (source file, target file) shard, in order, as a memory-mapped `Dataset`.

    Args:
        shards: (source path, target path) of each shard.
        cache_dir: where the Arrow file goes (None: the `datasets` cache).

    Raises:
        DataError: an unreadable file, invalid UTF-8 (file, line and byte), or a
            shard whose two files have different numbers of lines.
    """
    folder = Path(cache_dir or datasets.config.HF_DATASETS_CACHE)
    stamps = [(file_stamp(s), file_stamp(t)) for s, t in shards]
    key = hashlib.sha256(json.dumps([FORMAT, stamps]).encode()).hexdigest()[:24]
    path = folder / f"text-pairs-{key}.arrow"
    if path.is_file():
        try:
            return Dataset.from_file(str(path))
        except (pa.ArrowException, OSError) as err:  # written whole (below), so damaged since: read the text again
            log.warning("%s: unreadable cache (%s); reading the corpus again", path, headline(err))
            path.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    # A name no other writer has, even a process of the same id on another node sharing the folder.
    fd, name = tempfile.mkstemp(prefix=f"{path.name}.", suffix=".tmp", dir=folder)
    os.fchmod(fd, 0o666 & ~umask())  # a new file's mode, not mkstemp's 0600: a shared cache is read by others
    os.close(fd)
    tmp = Path(name)
    try:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
            for src_path, tgt_path in shards:
                for src, tgt in _aligned(src_path, tgt_path):
                    writer.write_batch(pa.record_batch([src, tgt], schema=SCHEMA))
        os.replace(tmp, path)  # whole or absent: a killed run leaves no half file behind
    finally:
        tmp.unlink(missing_ok=True)
        pa.default_memory_pool().release_unused()  # the blocks' buffers, kept by the allocator otherwise
    return Dataset.from_file(str(path))


def _aligned(src_path: str, tgt_path: str) -> Iterator[tuple[pa.Array, pa.Array]]:
    """Equal-length runs of source and target lines, in order."""
    src_blocks, tgt_blocks = line_blocks(src_path), line_blocks(tgt_path)
    empty = pa.array([], pa.string())
    src, tgt, n = empty, empty, 0
    while True:
        if len(src) == 0:
            src = next(src_blocks, None)
        if len(tgt) == 0:
            tgt = next(tgt_blocks, None)
        if src is None or tgt is None:
            if src is None and tgt is None:
                return
            rest = len(src if tgt is None else tgt) + sum(len(b) for b in (src_blocks if tgt is None else tgt_blocks))
            n_src, n_tgt = (n + rest, n) if tgt is None else (n, n + rest)
            raise DataError(f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}: "
                            "a parallel corpus needs the same number of lines on both sides")
        k = min(len(src), len(tgt))
        if k:
            yield src[:k], tgt[:k]
        src, tgt, n = src[k:], tgt[k:], n + k


def line_blocks(path: str) -> Iterator[pa.Array]:
    """The lines of a text file (gzip's decompressed) as Arrow string arrays of a block's lines each."""
    lines_before = 0
    try:
        with open_binary(path) as f:
            carry = f.read(3)
            carry = carry.removeprefix(b"\xef\xbb\xbf")  # a byte-order mark is not text
            while True:
                block = f.read(BLOCK_BYTES)
                data = carry + block
                cut = data.rfind(b"\n") + 1
                if cut:
                    lines = _split(data[:cut], path, lines_before, last=False)
                    lines_before += len(lines)
                    yield lines
                carry = data[cut:]
                if not block:  # end of file: a last line without its '\n'
                    if carry:
                        yield _split(carry, path, lines_before, last=True)
                    return
    except READ_ERRORS as err:
        raise DataError(read_problem(path, err, lines_before)) from None


def _split(data: bytes, path: str, lines_before: int, *, last: bool) -> pa.Array:
    """The lines of `data` (ending in '\\n' unless `last`) as strings, '\\r\\n' endings removed."""
    try:
        text = pa.array([data if last else data[:-1]], pa.binary()).cast(pa.string())  # validates UTF-8 in C
    except pa.ArrowInvalid:
        _raise_utf8_error(data, path, lines_before)
    lines = pc.split_pattern(text, "\n").flatten()
    if last:  # the file's last line has no '\n', so no '\r\n' ending either
        return lines
    return pc.replace_substring_regex(lines, pattern="\r$", replacement="")


def _raise_utf8_error(data: bytes, path: str, lines_before: int) -> None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = data.rfind(b"\n", 0, err.start) + 1
        lineno = lines_before + data.count(b"\n", 0, err.start) + 1
        raise DataError(f"{path}:{lineno}: invalid UTF-8 at byte {err.start - line_start} of the line ({err.reason}); "
                        "convert the file to UTF-8") from None
    raise DataError(f"{path}: after line {lines_before}: not valid UTF-8 text")


def file_stamp(path: str) -> tuple[str, int, int]:
    """What the cache key knows of a file: an edited file gets a new cache."""
    st = os.stat(path)
    return (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def path_hint(path: str) -> str:
    """Why a path may not be where the user thinks: an unset variable, or a relative path."""
    if "$" in path:
        return " (an environment variable in it is not set)"
    if not os.path.isabs(path):
        return f" (relative paths are read from the working directory {os.getcwd()})"
    return ""
