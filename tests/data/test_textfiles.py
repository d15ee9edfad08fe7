"""Text corpora into Arrow: block reading, shards (globs, lists, `.gz`), and the same cleaning and report."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import re
import threading
from pathlib import Path

import pytest
import yaml

from nmt.config import CorpusConfig, DataConfig, load_config
from nmt.data import line_files, textfiles
from nmt.data.corpus import load_pairs
from nmt.data.dataset import prepare_split
from nmt.data.text import available_lines, decode_lines, read_lines
from nmt.data.tokenizer import Tokenizer
from nmt.errors import ConfigError, DataError
from tests.data.test_scale import python_calls

from .conftest import toy_corpus


def write(path: Path, data: bytes) -> None:
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def write_lines(path: Path, lines: list[str]) -> None:
    write(path, "".join(f"{line}\n" for line in lines).encode("utf-8"))


def load(tmp_path: Path, kind: str, path: str | list[str]):
    return load_pairs(CorpusConfig(kind=kind, path=path), src_lang="de", tgt_lang="en", cache_dir=tmp_path / "cache")


def reference_lines(data: bytes) -> list[str]:
    """The line rules, one line at a time: only '\\n' ends a line, '\\r\\n' counts as '\\n', BOM dropped."""
    text = data.decode("utf-8").removeprefix("\ufeff")
    if not text:
        return []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
        return [line.removesuffix("\r") for line in lines]
    return [line.removesuffix("\r") for line in lines[:-1]] + [lines[-1]]


TRICKY = [
    b"",
    b"\n",
    b"\n\n",
    b"\xef\xbb\xbfbom first\r\nsecond\n",
    "gr\u00fc\u00dfe \u2028 inside\r\nk\u00e4se\r\r\n\r\nlast without newline\r".encode(),
    "\u65e5\u672c\u8a9e \u00e9\u00e8\n".encode() * 5 + b" tail",
]


@pytest.mark.parametrize("block", [1, 2, 3, 7, 1 << 22])
@pytest.mark.parametrize("data", TRICKY, ids=range(len(TRICKY)))
def test_blocks_of_any_size_split_lines_as_the_line_rules_say(tmp_path: Path, monkeypatch, block: int,
                                                               data: bytes) -> None:
    monkeypatch.setattr(textfiles, "BLOCK_BYTES", block)
    for name in ("t.de", "t.de.gz"):
        write(tmp_path / name, data)
        lines = [s for arr in textfiles.line_blocks(str(tmp_path / name)) for s in arr.to_pylist()]
        assert lines == reference_lines(data)


AWKWARD = {
    "empty": b"",
    "bom only": b"\xef\xbb\xbf",
    "bom and text": b"\xef\xbb\xbfeins\nzwei\n",
    "bom then newline": b"\xef\xbb\xbf\n",
    "no trailing newline": b"eins\nzwei",
    "crlf": b"eins\r\nzwei\r\n",
    "lone cr inside": b"ein\rhund\nzwei\n",
    "cr cr lf and a last cr": b"eins\r\r\nzwei\r",
    "nel and separators inside": "ein\x85hund\u2028x\u2029y\x0bz\x0c\x1c\x1d\x1e\nzwei\n".encode(),
}


def pipe_lines(data: bytes, max_lines: int) -> list[str]:
    """`available_lines` over a real pipe, as `nmt translate` reads standard input."""
    read_end, write_end = os.pipe()

    def feed() -> None:
        with open(write_end, "wb") as w:
            w.write(data)

    writer = threading.Thread(target=feed)
    writer.start()
    with open(read_end, "rb", buffering=0) as r:
        lines = [line for chunk in available_lines(r, "<stdin>", max_lines=max_lines) for line in chunk]
    writer.join()
    return lines


@pytest.mark.parametrize("data", AWKWARD.values(), ids=AWKWARD.keys())
def test_every_reader_counts_the_lines_the_line_rules_count(tmp_path: Path, data: bytes) -> None:
    """One rule for every reader of lines: only '\\n' ends a line (see `reference_lines`)."""
    expected = reference_lines(data)
    for name in ("t.txt", "t.txt.gz"):
        path = tmp_path / name
        write(path, data)
        with open(path, "rb") as f:
            raw_file = list(decode_lines(gzip.open(f) if name.endswith(".gz") else f, name))
        readers = {
            "read_lines": read_lines(path),
            "decode_lines": raw_file,
            "line_files._lines": list(line_files._lines(str(path))),
            "textfiles.line_blocks": [s for arr in textfiles.line_blocks(str(path)) for s in arr.to_pylist()],
        }
        assert readers == dict.fromkeys(readers, expected), name
    streams = {
        "pipe": pipe_lines(data, max_lines=2000),
        "pipe, a line a chunk": pipe_lines(data, max_lines=1),
        "in-memory stream": [s for c in available_lines(io.BytesIO(data), "<stdin>", max_lines=2) for s in c],
    }
    assert streams == dict.fromkeys(streams, expected)


def test_invalid_utf8_in_a_later_block_names_the_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(textfiles, "BLOCK_BYTES", 8)
    write(tmp_path / "t.de", b"one\ntwo\nthree\nfo\xffur\nfive\n")
    write_lines(tmp_path / "t.en", ["a"] * 5)
    with pytest.raises(DataError, match=r"t\.de:4: invalid UTF-8 at byte 2 of the line"):
        load(tmp_path, "text", str(tmp_path / "t"))


@pytest.mark.parametrize(("block", "where"), [(1 << 22, ""), (8, r" after line [1-9]\d*")])
def test_a_gzip_file_cut_short_is_named_with_the_lines_read_before(tmp_path: Path, monkeypatch, block: int,
                                                                 where: str) -> None:
    """Cut short within its first block, a file has no line to count: the message said "after line 0". In
    blocks of 8 bytes, the lines of the blocks read whole are counted."""
    monkeypatch.setattr(textfiles, "BLOCK_BYTES", block)
    packed = gzip.compress("".join(f"line {i}\n" for i in range(2000)).encode(), mtime=0)
    (tmp_path / "t.de.gz").write_bytes(packed[: len(packed) // 2])
    write_lines(tmp_path / "t.en", ["a"] * 2000)
    with pytest.raises(DataError) as info:
        load(tmp_path, "text", str(tmp_path / "t"))
    assert re.fullmatch(re.escape(f"{tmp_path / 't.de.gz'}: cannot read") + where + re.escape(
        ": Compressed file ended before the end-of-stream marker was reached"), str(info.value)), str(info.value)


@pytest.mark.parametrize(("pack", "tool", "command"), [
    (bz2.compress, "bzip2", "bunzip2"), (lzma.compress, "xz", "unxz")])
def test_a_file_compressed_otherwise_than_by_gzip_is_named_so(tmp_path: Path, pack, tool: str, command: str) -> None:
    """An .xz or .bz2 corpus was refused as "invalid UTF-8 at byte 0 of the line", in training and translation."""
    lines = [f"line {i}" for i in range(50)]
    write(tmp_path / "t.de", pack("".join(f"{line}\n" for line in lines).encode()))
    write_lines(tmp_path / "t.en", lines)
    path = tmp_path / "t.de"
    said = (f"{path}: a file compressed with {tool}, where nmt reads UTF-8 text and gzip: decompress it ({command} "
            f"{path}), or give it as a pipe: <({command} -c {path})")
    with pytest.raises(DataError) as info:
        load(tmp_path, "text", str(tmp_path / "t"))
    assert str(info.value) == said
    with pytest.raises(DataError) as info:
        read_lines(path)
    assert str(info.value) == said
    write(path, b"BZh is how this line begins\n")  # text that starts as bzip2's files do, no more
    assert read_lines(path) == ["BZh is how this line begins"]


def test_shards_by_glob_and_by_list_read_in_order(tmp_path: Path) -> None:
    de, en = toy_corpus(30, seed=3)
    for k, (lo, hi) in enumerate([(0, 10), (10, 25), (25, 30)]):
        gz = ".gz" if k == 1 else ""
        write_lines(tmp_path / f"part-{k}.de{gz}", de[lo:hi])
        write_lines(tmp_path / f"part-{k}.en", en[lo:hi])
    by_glob = load(tmp_path, "text", str(tmp_path / "part-*"))
    assert by_glob["src"][:] == de and by_glob["tgt"][:] == en
    by_list = load(tmp_path, "text", [str(tmp_path / "part-2"), str(tmp_path / "part-[01]")])
    assert by_list["src"][:] == de[25:] + de[:25]


def test_the_cache_is_written_beside_another_nodes_temporary_file_of_the_same_process_id(tmp_path: Path) -> None:
    """Nodes sharing a cache folder can run processes of the same id: one's half-written cache must not be
    overwritten or deleted by another's."""
    de, en = toy_corpus(12, seed=5)
    write_lines(tmp_path / "c.de", de)
    write_lines(tmp_path / "c.en", en)
    cache = tmp_path / "cache"
    cache.mkdir()
    pairs = textfiles.read_text_shards([(str(tmp_path / "c.de"), str(tmp_path / "c.en"))], str(cache))
    final = Path(pairs.cache_files[0]["filename"])
    final.unlink()
    other = final.with_name(f"{final.name}.{os.getpid()}.tmp")  # the other node's file, being written
    other.write_bytes(b"half of another writer's cache")
    again = textfiles.read_text_shards([(str(tmp_path / "c.de"), str(tmp_path / "c.en"))], str(cache))
    assert again["src"][:] == de and again["tgt"][:] == en
    assert other.read_bytes() == b"half of another writer's cache"
    assert sorted(p.name for p in cache.iterdir()) == sorted([final.name, other.name])


@pytest.mark.parametrize("damage", [b"", b"junk"])
def test_a_damaged_cache_is_read_again_from_the_text(tmp_path: Path, caplog, damage: bytes) -> None:
    # A cache file emptied or overwritten since it was written whole stopped nmt train with "ArrowInvalid: Expected to
    # read 1802401130 metadata bytes, but only read 1" and exit 1.
    de, en = toy_corpus(12, seed=5)
    write_lines(tmp_path / "c.de", de)
    write_lines(tmp_path / "c.en", en)
    shards = [(str(tmp_path / "c.de"), str(tmp_path / "c.en"))]
    final = Path(textfiles.read_text_shards(shards, str(tmp_path / "cache")).cache_files[0]["filename"])
    final.write_bytes(damage)
    again = textfiles.read_text_shards(shards, str(tmp_path / "cache"))
    assert again["src"][:] == de and again["tgt"][:] == en
    assert f"{final}: unreadable cache (" in caplog.text and "reading the corpus again" in caplog.text


def test_a_shard_with_different_line_counts_is_named(tmp_path: Path) -> None:
    write_lines(tmp_path / "a.de", ["x", "y"])
    write_lines(tmp_path / "a.en", ["x", "y"])
    write_lines(tmp_path / "b.de", ["x", "y", "z"])
    write_lines(tmp_path / "b.en.gz", ["x"])
    with pytest.raises(DataError, match=r"b\.de has 3 lines but .*b\.en\.gz has 1"):
        load(tmp_path, "text", [str(tmp_path / "a"), str(tmp_path / "b")])


def test_a_glob_that_matches_nothing_says_what_it_looked_for(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no files match .*nothing-\*\.de or .*nothing-\*\.de\.gz"):
        load(tmp_path, "text", str(tmp_path / "nothing-*"))


def test_tsv_and_jsonl_shards(tmp_path: Path) -> None:
    (tmp_path / "a.tsv").write_text("de\ten\nhund\tdog\n", encoding="utf-8")
    (tmp_path / "b.tsv").write_text("en\tde\ncat\tkatze\n", encoding="utf-8")  # each shard has its own header
    assert load(tmp_path, "tsv", str(tmp_path / "*.tsv"))["src"][:] == ["hund", "katze"]
    (tmp_path / "a.jsonl").write_text('{"de": "haus", "en": "house"}\n', encoding="utf-8")
    (tmp_path / "b.jsonl").write_text('{"translation": {"de": "baum", "en": "tree"}}\n', encoding="utf-8")
    ds = load(tmp_path, "jsonl", [str(tmp_path / "b.jsonl"), str(tmp_path / "a.jsonl")])
    assert ds["tgt"][:] == ["tree", "house"]


def test_sharded_input_gets_the_same_cleaning_and_filter_report(tmp_path: Path, tokenizer: Tokenizer) -> None:
    de, en = toy_corpus(60, seed=5)
    de[7], en[40] = "   ", ""  # empty sides, one in each shard
    de[20] = " ".join(["hund"] * 40)  # too long
    write_lines(tmp_path / "whole.de", de)
    write_lines(tmp_path / "whole.en", en)
    write_lines(tmp_path / "s-0.de.gz", de[:30])
    write_lines(tmp_path / "s-0.en", en[:30])
    write_lines(tmp_path / "s-1.de", de[30:])
    write_lines(tmp_path / "s-1.en.gz", en[30:])
    results = []
    for path in (str(tmp_path / "whole"), str(tmp_path / "s-*")):
        spec = CorpusConfig(kind="text", path=path)
        cfg = DataConfig(train=spec, valid=spec, max_len=20)
        ds, report = prepare_split(spec, cfg, tokenizer, cache_dir=tmp_path / "cache", train=True)
        results.append((ds["src_ids"][:], ds["tgt_ids"][:], report))
    assert results[0] == results[1]
    report = results[0][2]
    assert report["pairs"] == 60 and report["empty"] == 2 and report["too_long"] >= 1
    assert report["kept"] == 58 - report["too_long"] - report["ratio"] == len(results[1][0])


def test_reading_makes_no_python_call_per_line(tmp_path: Path) -> None:
    """Lines stay in Arrow: the Python calls grow with blocks, not with lines."""
    def calls_for(n: int) -> int:
        de, en = toy_corpus(n, seed=n)
        write_lines(tmp_path / f"c{n}.de", de)
        write_lines(tmp_path / f"c{n}.en", en)
        read = []
        count = python_calls(lambda: read.append(textfiles.read_text_shards(
            [(str(tmp_path / f"c{n}.de"), str(tmp_path / f"c{n}.en"))], str(tmp_path / "cache"))))
        assert len(read[0]) == n
        return count

    small, large = calls_for(2_000), calls_for(100_000)
    assert large < small + 300, (small, large)


def test_path_list_in_a_config(tmp_path: Path) -> None:
    raw = {"data": {"train": {"kind": "text", "path": ["$HOME/a", "b-*"]}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    cfg = load_config(tmp_path / "c.yaml")
    assert cfg.data.train.paths[1] == "b-*" and not cfg.data.train.paths[0].startswith("$")
    raw["data"]["train"]["path"] = ["a", 3]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"data\.train\.path\[1\]: expected str, got int 3"):
        load_config(tmp_path / "c.yaml")


def test_disk_and_hub_take_one_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="kind disk reads one dataset"):
        load(tmp_path, "disk", [str(tmp_path / "a"), str(tmp_path / "b")])


def test_the_arrow_cache_of_a_text_corpus_has_a_new_files_mode(tmp_path: Path) -> None:
    """It had the 0600 of the temporary file it was written as, where datasets' cache files beside it are
    0644: a cache shared by colleagues (`data.cache_dir`) could not be read by them."""
    (tmp_path / "c.de").write_text("ein hund\n", encoding="utf-8")
    (tmp_path / "c.en").write_text("a dog\n", encoding="utf-8")
    old = os.umask(0o022)
    try:
        ds = textfiles.read_text_shards([(str(tmp_path / "c.de"), str(tmp_path / "c.en"))], str(tmp_path / "cache"))
    finally:
        os.umask(old)
    (arrow,) = {Path(f["filename"]) for f in ds.cache_files}
    assert arrow.stat().st_mode & 0o777 == 0o644
