"""Every corpus source read from real files, its errors, and pair safety when cleaning."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path

import datasets
import huggingface_hub.constants
import pytest
from datasets import Dataset, DatasetDict

from nmt.config import CorpusConfig
from nmt.data.cleaning import PY_WHITESPACE, clean_pairs
from nmt.data.corpus import load_pairs
from nmt.data.text import normalize_spaces
from nmt.errors import DataError

DE = ["ein hund", "eine katze", "das haus", "der baum"]
EN = ["a dog", "a cat", "the house", "the tree"]
PAIRS = list(zip(DE, EN))


def load(tmp_path: Path, kind: str, path: Path | str, **fields) -> Dataset:
    spec = CorpusConfig(kind=kind, path=str(path), **fields)
    return load_pairs(spec, src_lang="de", tgt_lang="en", cache_dir=tmp_path / "cache")


def pairs(ds: Dataset) -> list[tuple[str, str]]:
    assert ds.column_names == ["src", "tgt"]
    return list(zip(ds["src"], ds["tgt"]))


def write_lines(path: Path, lines: list[str], *, gz: bool = False, ending: str = "\n") -> None:
    data = "".join(line + ending for line in lines).encode("utf-8")
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


# --------------------------------------------------------------------------- text


def test_text_reads_pairs_in_order_stripping_only_line_endings(tmp_path: Path) -> None:
    write_lines(tmp_path / "train.de", [" ein hund ", *DE[1:]], ending="\r\n")
    write_lines(tmp_path / "train.en", EN)
    ds = load(tmp_path, "text", tmp_path / "train")
    assert pairs(ds) == [(" ein hund ", "a dog"), *PAIRS[1:]]
    assert ds.features["src"].dtype == "string" and ds.cache_files  # Arrow on disk


def test_text_keeps_unicode_line_separators_inside_a_line(tmp_path: Path) -> None:
    write_lines(tmp_path / "t.de", ["a\u2028b", "c\x0bd"])
    write_lines(tmp_path / "t.en", ["x", "y"])
    assert pairs(load(tmp_path, "text", tmp_path / "t")) == [("a\u2028b", "x"), ("c\x0bd", "y")]


def test_text_gz_is_used_when_the_plain_file_is_absent(tmp_path: Path) -> None:
    write_lines(tmp_path / "train.de.gz", DE, gz=True)
    write_lines(tmp_path / "train.en", EN)
    assert pairs(load(tmp_path, "text", tmp_path / "train")) == PAIRS


def test_text_expands_variables_and_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_lines(tmp_path / "train.de", DE)
    write_lines(tmp_path / "train.en", EN)
    monkeypatch.setenv("CORPUS_DIR", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert pairs(load(tmp_path, "text", "$CORPUS_DIR/train")) == PAIRS
    assert pairs(load(tmp_path, "text", "~/train")) == PAIRS


def test_text_cache_is_reused_and_invalidated_by_edits(tmp_path: Path) -> None:
    write_lines(tmp_path / "train.de", DE)
    write_lines(tmp_path / "train.en", EN)
    first = load(tmp_path, "text", tmp_path / "train")
    assert load(tmp_path, "text", tmp_path / "train").cache_files == first.cache_files
    write_lines(tmp_path / "train.en", ["changed"] * 4)
    assert load(tmp_path, "text", tmp_path / "train")["tgt"] == ["changed"] * 4


def test_text_edited_to_the_same_size_is_read_again(tmp_path: Path) -> None:
    """The cache key holds each file's modification time as well as its size: a fixed typo changes no size."""
    write_lines(tmp_path / "train.de", DE)
    write_lines(tmp_path / "train.en", EN)
    assert load(tmp_path, "text", tmp_path / "train")["tgt"] == EN
    before = (tmp_path / "train.en").stat()
    edited = ["a cat", "a dog", "the tree", "the house"]  # the same lines in another order: the same bytes count
    write_lines(tmp_path / "train.en", edited)
    os.utime(tmp_path / "train.en", ns=(before.st_atime_ns, before.st_mtime_ns + 2_000_000_000))  # saved 2 s later
    assert (tmp_path / "train.en").stat().st_size == before.st_size
    assert load(tmp_path, "text", tmp_path / "train")["tgt"] == edited


def test_text_different_line_counts_name_both_files_and_counts(tmp_path: Path) -> None:
    write_lines(tmp_path / "train.de", DE)
    write_lines(tmp_path / "train.en", EN[:3])
    with pytest.raises(DataError, match=r"train\.de has 4 lines but .*train\.en has 3"):
        load(tmp_path, "text", tmp_path / "train")


def test_text_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "train.de").write_bytes(b"ok\nok\nbad \xff byte\nok\n")
    write_lines(tmp_path / "train.en", EN)
    with pytest.raises(DataError, match=r"train\.de:3: invalid UTF-8"):
        load(tmp_path, "text", tmp_path / "train")


def test_text_missing_file_names_the_paths_tried(tmp_path: Path) -> None:
    write_lines(tmp_path / "train.en", EN)
    with pytest.raises(DataError, match=r"train\.de, .*train\.de\.gz") as info:
        load(tmp_path, "text", tmp_path / "train")
    assert "train.en" not in str(info.value)


def test_text_files_of_other_languages_name_the_language_settings(tmp_path: Path) -> None:
    """A mistyped language code (`ge` for `de`) names the files that are there and the settings that pick them."""
    write_lines(tmp_path / "train.de", DE)
    write_lines(tmp_path / "train.en.gz", EN, gz=True)
    write_lines(tmp_path / "train.fr", EN)
    spec = CorpusConfig(kind="text", path=str(tmp_path / "train"))
    with pytest.raises(DataError, match=rf"tried {re.escape(str(tmp_path))}/train\.ge, \S+train\.ge\.gz; found "
                                        rf"{re.escape(str(tmp_path))}/train\.de, \S+/train\.fr: data\.src_lang \(ge\) "
                                        r"and data\.tgt_lang \(en\) name the files' suffixes$"):
        load_pairs(spec, src_lang="ge", tgt_lang="en", cache_dir=tmp_path / "cache")


def test_empty_text_files_give_an_empty_dataset(tmp_path: Path) -> None:
    write_lines(tmp_path / "e.de", [])
    write_lines(tmp_path / "e.en", [])
    assert pairs(load(tmp_path, "text", tmp_path / "e")) == []


# --------------------------------------------------------------------------- tsv, jsonl


def test_tsv_default_and_explicit_columns_without_quoting(tmp_path: Path) -> None:
    lines = ["id\tde\ten", *(f"{i}\t{d}\t{e}" for i, (d, e) in enumerate(PAIRS)), '9\t"quoted\tit\'s']
    write_lines(tmp_path / "c.tsv", lines)
    assert pairs(load(tmp_path, "tsv", tmp_path / "c.tsv")) == [*PAIRS, ('"quoted', "it's")]
    swapped = load(tmp_path, "tsv", tmp_path / "c.tsv", src_field="en", tgt_field="id")
    assert pairs(swapped)[0] == ("a dog", "0")


def test_tsv_missing_column_lists_columns_found(tmp_path: Path) -> None:
    write_lines(tmp_path / "c.tsv", ["german\tenglish", "a\tb"])
    with pytest.raises(DataError, match=r"no src column 'de'.*columns found: 'german', 'english'"):
        load(tmp_path, "tsv", tmp_path / "c.tsv")


@pytest.mark.parametrize("kind", ["tsv", "jsonl"])
def test_source_and_target_reading_the_same_column_is_refused(kind: str, tmp_path: Path) -> None:
    """A config that names one column for both sides would train the model to copy its input."""
    path = tmp_path / f"c.{kind}"
    if kind == "tsv":
        write_lines(path, ["de\ten", *(f"{d}\t{e}" for d, e in PAIRS)])
    else:
        write_lines(path, [json.dumps({"de": d, "en": e}) for d, e in PAIRS])
    with pytest.raises(DataError, match=rf"c\.{kind}: source and target both read column 'en'"):
        load(tmp_path, kind, path, src_field="en", tgt_field="en")


def test_tsv_row_with_wrong_field_count_names_the_line(tmp_path: Path) -> None:
    write_lines(tmp_path / "c.tsv", ["de\ten", "a\tb", "only one"])
    with pytest.raises(DataError, match=r"c\.tsv:3: 1 tab-separated fields, the header has 2"):
        load(tmp_path, "tsv", tmp_path / "c.tsv")


def test_a_blank_tsv_line_is_named_as_one(tmp_path: Path) -> None:
    """A blank line (a file ending in two newlines, say) was "1 tab-separated fields", which left the reader to
    find that the line was empty."""
    (tmp_path / "c.tsv").write_bytes(b"de\ten\r\na\tb\r\n \r\n")
    with pytest.raises(DataError) as info:
        load(tmp_path, "tsv", tmp_path / "c.tsv")
    assert str(info.value) == (f"{tmp_path / 'c.tsv'}:3: a blank line, where the header has 2 tab-separated fields; "
                               "remove it, or give each pair its line")


def test_tsv_lone_carriage_return_is_text_and_shifts_no_pair(tmp_path: Path) -> None:
    (tmp_path / "c.tsv").write_bytes(b"de\ten\nein\rHund\ta\rdog\nKatze\tcat\r\n")
    assert pairs(load(tmp_path, "tsv", tmp_path / "c.tsv")) == [("ein\rHund", "a\rdog"), ("Katze", "cat")]


def test_tsv_without_a_header_reads_columns_by_number_from_the_first_line(tmp_path: Path) -> None:
    write_lines(tmp_path / "c.tsv", [f"{i}\t{e}\t{d}" for i, (d, e) in enumerate(PAIRS)])  # id, en, de
    assert pairs(load(tmp_path, "tsv", tmp_path / "c.tsv", src_field=2, tgt_field=1)) == PAIRS
    # the same file read by name would take its first pair as the header
    with pytest.raises(DataError, match=r"no src column 'de'.*columns found: '0', 'a dog', 'ein hund'"):
        load(tmp_path, "tsv", tmp_path / "c.tsv")


def test_a_header_row_read_by_column_numbers_is_warned_of(tmp_path: Path, caplog) -> None:
    """Column numbers say the file has no header: a first row that names the languages is then a pair, and said."""
    write_lines(tmp_path / "c.tsv", ["de\ten", *(f"{d}\t{e}" for d, e in PAIRS)])
    with caplog.at_level("WARNING", logger="nmt"):
        read = pairs(load(tmp_path, "tsv", tmp_path / "c.tsv", src_field=0, tgt_field=1))
    assert read == [("de", "en"), *PAIRS]
    assert (f"{tmp_path / 'c.tsv'}:1 reads like a header row ('de', 'en'), and is read as a pair: src_field and "
            "tgt_field are column numbers") in caplog.text
    caplog.clear()
    write_lines(tmp_path / "d.tsv", [f"{d}\t{e}" for d, e in PAIRS])
    with caplog.at_level("WARNING", logger="nmt"):
        assert pairs(load(tmp_path, "tsv", tmp_path / "d.tsv", src_field=0, tgt_field=1)) == PAIRS
    assert "header" not in caplog.text


def test_tsv_without_a_header_names_the_line_with_the_wrong_field_count(tmp_path: Path) -> None:
    write_lines(tmp_path / "c.tsv", ["a\tb", "c\td", "e\tf\tg"])
    with pytest.raises(DataError, match=r"c\.tsv:3: 3 tab-separated fields, line 1 has 2"):
        load(tmp_path, "tsv", tmp_path / "c.tsv", src_field=0, tgt_field=1)


def test_tsv_column_number_beyond_the_fields_is_one_clear_error(tmp_path: Path) -> None:
    write_lines(tmp_path / "c.tsv", ["a\tb"])
    with pytest.raises(DataError, match=r"c\.tsv:1: 2 tab-separated fields, so no column 2 \(src_field and "
                                        r"tgt_field count from 0\)"):
        load(tmp_path, "tsv", tmp_path / "c.tsv", src_field=1, tgt_field=2)


@pytest.mark.parametrize(("kind", "fields", "problem"), [
    ("jsonl", {"src_field": 0, "tgt_field": 1}, "column numbers are for kind: tsv, not jsonl"),
    ("tsv", {"src_field": 0, "tgt_field": "en"}, "give both as column numbers"),
    ("tsv", {"src_field": -1, "tgt_field": 1}, "column numbers start at 0, not -1"),
    ("tsv", {"src_field": 1, "tgt_field": 1}, "both read column 1"),
])
def test_column_numbers_are_checked_with_the_config(kind: str, fields: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        CorpusConfig(kind=kind, path="c", **fields)


def test_an_empty_tsv_file_reads_as_no_pairs(tmp_path: Path) -> None:
    (tmp_path / "c.tsv").write_bytes(b"")
    assert pairs(load(tmp_path, "tsv", tmp_path / "c.tsv")) == []
    assert pairs(load(tmp_path, "tsv", tmp_path / "c.tsv", src_field=0, tgt_field=1)) == []


def test_jsonl_flat_nested_and_dotted_fields(tmp_path: Path) -> None:
    write_lines(tmp_path / "flat.jsonl", [json.dumps({"de": d, "en": e, "id": 1}) for d, e in PAIRS])
    nested = [json.dumps({"translation": {"de": d, "en": e}}) for d, e in PAIRS]
    write_lines(tmp_path / "nested.jsonl", [*nested, ""])  # a trailing blank line is skipped
    assert pairs(load(tmp_path, "jsonl", tmp_path / "flat.jsonl")) == PAIRS
    assert pairs(load(tmp_path, "jsonl", tmp_path / "nested.jsonl")) == PAIRS
    explicit = load(tmp_path, "jsonl", tmp_path / "nested.jsonl", src_field="translation.en", tgt_field="translation.de")
    assert pairs(explicit) == [(e, d) for d, e in PAIRS]


def test_jsonl_errors_name_the_line(tmp_path: Path) -> None:
    write_lines(tmp_path / "a.jsonl", ['{"de": "x", "en": "y"}', '{"de": "x"}'])
    with pytest.raises(DataError, match=r"a\.jsonl:2: no field 'en'; fields found: de"):
        load(tmp_path, "jsonl", tmp_path / "a.jsonl")
    write_lines(tmp_path / "b.jsonl", ['{"de": "x", "en": "y"}', '{"de": "x", "en": '])
    with pytest.raises(DataError, match=r"b\.jsonl:2: invalid JSON"):
        load(tmp_path, "jsonl", tmp_path / "b.jsonl")
    write_lines(tmp_path / "c.jsonl", ['{"src": "x", "tgt": "y"}'])
    with pytest.raises(DataError, match=r"columns found: 'src', 'tgt'"):
        load(tmp_path, "jsonl", tmp_path / "c.jsonl")
    # These two stopped nmt train with "ValueError: Exceeds the limit (4300 digits) ..." and "RecursionError", exit 1.
    write_lines(tmp_path / "d.jsonl", ['{"de": "x", "en": "y"}', '{"de": "x", "en": "y", "id": 1' + "0" * 5000 + "}"])
    with pytest.raises(DataError, match=r"d\.jsonl:2: a JSON number too long to read \(Exceeds the limit \(4300 digits\) "
                                        r"for integer string conversion: value has 5001 digits\)$"):
        load(tmp_path, "jsonl", tmp_path / "d.jsonl")
    write_lines(tmp_path / "e.jsonl", ['{"de": "x", "en": "y", "n": ' + "[" * 100_000 + "]" * 100_000 + "}"])
    with pytest.raises(DataError, match=r"e\.jsonl:1: JSON nested too deeply to read$"):
        load(tmp_path, "jsonl", tmp_path / "e.jsonl")


# --------------------------------------------------------------------------- Arrow sources


def flat_dataset() -> Dataset:
    return Dataset.from_dict({"id": list(range(4)), "de": DE, "en": EN})


def nested_dataset() -> Dataset:
    return Dataset.from_dict({"translation": [{"de": d, "en": e} for d, e in PAIRS]})


def test_parquet_flat_and_nested(tmp_path: Path) -> None:
    flat_dataset().to_parquet(tmp_path / "flat.parquet")
    nested_dataset().to_parquet(tmp_path / "nested.parquet")
    assert pairs(load(tmp_path, "parquet", tmp_path / "flat.parquet")) == PAIRS
    assert pairs(load(tmp_path, "parquet", tmp_path / "nested.parquet")) == PAIRS
    with pytest.raises(DataError, match="parquet file not found"):
        load(tmp_path, "parquet", tmp_path / "missing.parquet")
    with pytest.raises(DataError, match=r"missing-\*.parquet: no parquet files match"):
        load(tmp_path, "parquet", tmp_path / "missing-*.parquet")
    (tmp_path / "shards" / "a").mkdir(parents=True)
    flat_dataset().to_parquet(tmp_path / "shards" / "a" / "part.parquet")
    assert pairs(load(tmp_path, "parquet", tmp_path / "shards" / "**" / "*.parquet")) == PAIRS  # ** spans folders


def test_parquet_non_text_column_is_refused(tmp_path: Path) -> None:
    flat_dataset().to_parquet(tmp_path / "flat.parquet")
    with pytest.raises(DataError, match=r"column 'id' holds .*int64.*, not text"):
        load(tmp_path, "parquet", tmp_path / "flat.parquet", src_field="id", tgt_field="en")


def test_disk_dataset_dict_split_and_plain_dataset(tmp_path: Path) -> None:
    DatasetDict({"train": flat_dataset(), "validation": nested_dataset().select([1, 2])}).save_to_disk(tmp_path / "dd")
    flat_dataset().save_to_disk(tmp_path / "plain")
    assert pairs(load(tmp_path, "disk", tmp_path / "dd")) == PAIRS  # split defaults to train
    assert pairs(load(tmp_path, "disk", tmp_path / "dd", split="validation")) == PAIRS[1:3]
    assert pairs(load(tmp_path, "disk", tmp_path / "plain")) == PAIRS
    with pytest.raises(DataError, match=r"no split 'test'; splits found: train, validation"):
        load(tmp_path, "disk", tmp_path / "dd", split="test")
    with pytest.raises(DataError, match=r"plain: a dataset saved without splits, so split 'train' names none of it; "
                                        r"remove split to read it whole$"):
        load(tmp_path, "disk", tmp_path / "plain", split="train")
    with pytest.raises(DataError, match="no such folder"):
        load(tmp_path, "disk", tmp_path / "nowhere")


def test_hf_field_mapping_on_local_folders(tmp_path: Path) -> None:
    """The hub path's mapping, on local folders: multi30k's {de, en} and wmt14's translation layout."""
    (tmp_path / "multi30k").mkdir()
    flat_dataset().to_parquet(tmp_path / "multi30k" / "train.parquet")
    (tmp_path / "wmt").mkdir()
    nested_dataset().to_json(tmp_path / "wmt" / "validation.jsonl")
    (tmp_path / "csv").mkdir()  # CSV, which no other kind reads, through a folder of its files
    flat_dataset().to_csv(tmp_path / "csv" / "train.csv", index=False)
    assert pairs(load(tmp_path, "hf", tmp_path / "multi30k")) == PAIRS
    assert pairs(load(tmp_path, "hf", tmp_path / "wmt", split="validation")) == PAIRS
    assert pairs(load(tmp_path, "hf", tmp_path / "csv")) == PAIRS
    with pytest.raises(DataError) as info:  # a local folder's error says nothing of the hub
        load(tmp_path, "hf", tmp_path / "wmt", split="test")
    assert re.match(re.escape(f"folder {tmp_path / 'wmt'}, split 'test': its data files could not be loaded as a "
                              "dataset: "), str(info.value)) and "hub" not in str(info.value)


@pytest.mark.parametrize("fields, problem", [
    ({}, "no src column 'de' or 'translation.de'; columns found: 'german', 'english', 'number' (set src_field to choose one)"),
    ({"src_field": "german", "tgt_field": "number"}, "column 'number' holds Value('int64'), not text"),
])
def test_a_local_folder_read_as_hf_is_named_as_a_folder_not_a_hub_dataset(tmp_path: Path, fields: dict,
                                                                           problem: str) -> None:
    """A folder of data files whose columns do not fit the config: the error called it "hub dataset '...'",
    which sent a user to look for a download that never happened."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "train.csv").write_text("german,english,number\nein hund,a dog,1\n", encoding="utf-8")
    with pytest.raises(DataError) as info:
        load(tmp_path, "hf", tmp_path / "folder", **fields)
    assert str(info.value) == f"folder {tmp_path / 'folder'}: {problem}"


@pytest.mark.parametrize("name, data", [
    ("train.csv", b'de,en\nein\rhund,a dog\n"eine katze",the cat\n'),
    ("train.csv", b'de,en\r\nein\rhund,a dog\r\n"eine katze","the cat"\r\n'),
    ("train.tsv", b"de\ten\r\nein\rhund\ta dog\neine katze\tthe cat"),
])
def test_hf_csv_files_follow_the_line_rules(tmp_path: Path, name: str, data: bytes) -> None:
    """Only '\\n' ends a line, and a '\\r' before it goes with it, as in text files: pandas, which reads CSV for
    datasets, cut a line at a lone '\\r' and paired its second half with the other column's text."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / name).write_bytes(data)
    assert pairs(load(tmp_path, "hf", tmp_path / "folder")) == [("ein\rhund", "a dog"), ("eine katze", "the cat")]


@pytest.mark.parametrize("name, data, expected", [
    ("train.csv", b"de,en\nKeine,None\nnicht zutreffend,N/A\nNULL,null\nnan,NaN\n,empty\n",
     [("Keine", "None"), ("nicht zutreffend", "N/A"), ("NULL", "null"), ("nan", "NaN"), ("", "empty")]),
    ("train.tsv", b'de\ten\n"Hallo" sagte er.\t"Hello" he said.\nEr sagte "ja"\tHe said "yes"\n',
     [('"Hallo" sagte er.', '"Hello" he said.'), ('Er sagte "ja"', 'He said "yes"')]),
])
def test_hf_csv_files_keep_each_cell_as_its_text(tmp_path: Path, name: str, data: bytes, expected: list) -> None:
    """Pandas, which reads CSV for datasets, read the cells "None", "N/A", "NULL" and "nan" as missing, so the
    cleaner dropped their pairs as empty (a test set's too), and ate the double quotes of TSV, which has no
    quoting. An empty cell is an empty side, for the cleaner to report."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / name).write_bytes(data)
    assert pairs(load(tmp_path, "hf", tmp_path / "folder")) == expected


@pytest.mark.parametrize("data, why", [
    (b"de,en\nein hund,a dog\ndie katze,the,cat\n", "ParserError: Error tokenizing data. C error: Expected 2 fields "
                                                    "in line 3, saw 3"),
    (b"de,en\nein hund,a dog\ndie k\xe4tze,the cat\n", "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe4"),
])
def test_a_bad_csv_file_in_a_folder_is_named_by_what_is_wrong(tmp_path: Path, data: bytes, why: str) -> None:
    """The error of the parser behind datasets is shown: the message said only "An error occurred while
    generating the dataset", nothing of the row with a field too many or the byte that is not UTF-8."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "train.csv").write_bytes(data)
    with pytest.raises(DataError) as info:
        load(tmp_path, "hf", tmp_path / "folder")
    assert str(info.value).startswith(f"folder {tmp_path / 'folder'}, split 'train': its data files could not be "
                                      f"loaded as a dataset: {why}")


def test_hf_unreachable_fails_fast_and_suggests_local_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The libraries read HF_HUB_OFFLINE when imported, so their copies are set too.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    with pytest.raises(DataError) as info:
        load(tmp_path, "hf", "no-such-user/no-such-corpus", hf_config="de-en")
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "hub dataset 'no-such-user/no-such-corpus'" in message and "could not be loaded" in message
    assert "save_to_disk" in message and "kind: disk" in message


@pytest.fixture
def hub_refuses(monkeypatch: pytest.MonkeyPatch) -> str:
    """The hub's address is a local port that nothing listens on, offline mode off and no proxy: what a
    machine without network access sees. Returns that address as `hub_unreachable` names it."""
    with socket.socket() as sock:  # a free port, closed again: connections to it are refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    return f"127.0.0.1:{port}"


def test_an_unreachable_hub_fails_at_once_and_says_so(tmp_path: Path, hub_refuses: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Without network access, huggingface_hub retried each request with growing waits: a `kind: hf` run
    took about 25 s to fail, and the error named only the library's exception. The hub is now asked for a
    connection first; where it takes none, the dataset is looked for in the cache only."""
    start = time.monotonic()
    with pytest.raises(DataError) as info:
        load(tmp_path, "hf", "no-such-user/no-such-corpus")
    assert time.monotonic() - start < 10  # no retries: a refused connection is answered at once
    message = str(info.value)
    assert message.startswith(f"hub dataset 'no-such-user/no-such-corpus', split 'train' could not be loaded: the "
                              f"hub cannot be reached ({hub_refuses}: Connection refused) and the datasets cache "
                              "does not hold it. Without access to the hub, download it on another machine")
    assert "looking for hub dataset 'no-such-user/no-such-corpus' in the datasets cache only" in caplog.text
    assert datasets.config.HF_HUB_OFFLINE is False  # offline mode was on for that load only


def test_an_unreachable_hub_still_loads_a_dataset_from_the_cache(tmp_path: Path, hub_refuses: str) -> None:
    """A hub dataset loaded once, on a machine that later has no network access, loads from the cache,
    as `datasets` loads it in offline mode. The cache is written as a download of `u/corpus` leaves it:
    the prepared Arrow files under CACHE/u___corpus/CONFIG/VERSION/HASH."""
    from datasets.packaged_modules.csv.csv import Csv
    (tmp_path / "train.csv").write_text("de,en\n" + "".join(f"{d},{e}\n" for d, e in PAIRS), encoding="utf-8")
    builder = Csv(cache_dir=str(tmp_path / "build"), dataset_name="corpus", hash="0" * 16,
                  data_files={"train": str(tmp_path / "train.csv")})
    builder.download_and_prepare()
    shutil.copytree(builder.cache_dir, tmp_path / "cache" / "u___corpus" / "default" / "0.0.0" / ("0" * 16))
    assert pairs(load(tmp_path, "hf", "u/corpus")) == PAIRS


# --------------------------------------------------------------------------- cleaning


def test_clean_pairs_drops_whole_pairs_and_keeps_alignment(tmp_path: Path) -> None:
    write_lines(tmp_path / "c.de", ["eins", "", "drei", "  vier ", " \t ", "sechs"])
    write_lines(tmp_path / "c.en", ["one", "two", "   ", "four", "five", "six"])
    cleaned, report = clean_pairs(load(tmp_path, "text", tmp_path / "c"))
    assert pairs(cleaned) == [("eins", "one"), ("vier", "four"), ("sechs", "six")]
    assert report == {"empty": 3}


def test_clean_pairs_treats_nulls_as_empty() -> None:
    ds = Dataset.from_dict({"src": ["a", None, "c"], "tgt": ["A", "B", None]})
    cleaned, report = clean_pairs(ds)
    assert pairs(cleaned) == [("a", "A")] and report == {"empty": 2}


def test_clean_pairs_splits_and_joins_exactly_as_python_does() -> None:
    """Cleaning is `normalize_spaces` (Python's split and join, as translation reads a line), in Arrow."""
    assert PY_WHITESPACE == "".join(c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace())
    texts = ["\x1c a \x1f", "\x85b\u3000", "\u200bc\u200b", "\u2028\t", " d\u00a0e ", "\ufefff", "g\x00",
             "h  i\t\tj \x85 k\r\nl", "".join(f"{c}m" for c in PY_WHITESPACE) + "\u200b n"]
    ds = Dataset.from_dict({"src": texts, "tgt": ["x"] * len(texts)})
    cleaned, report = clean_pairs(ds)
    expected = [normalize_spaces(t) for t in texts if t.split()]
    assert cleaned["src"][:] == expected and report == {"empty": len(texts) - len(expected)}
    assert expected[-2] == "h i j k l"


def test_files_in_a_folder_whose_name_holds_a_bracket_are_read_as_they_are_named(tmp_path: Path) -> None:
    """A path that holds `[` was always taken as a glob: `corpus[v2]/train` matched nothing, so text, jsonl and
    parquet corpora that were there were refused as "no files match". One that names no file is still a glob.
    datasets cannot read such a folder as `kind: hf`, which says so and what to do instead."""
    folder = tmp_path / "corpus[v2]"
    folder.mkdir()
    write_lines(folder / "train.de", DE)
    write_lines(folder / "train.en", EN)
    write_lines(folder / "train.jsonl", [json.dumps({"de": d, "en": e}) for d, e in PAIRS])
    flat_dataset().to_parquet(folder / "train.parquet")
    for kind, path in (("text", "train"), ("jsonl", "train.jsonl"), ("parquet", "train.parquet")):
        assert pairs(load(tmp_path, kind, folder / path)) == PAIRS, kind
    for name, part in (("corpus2", PAIRS[:2]), ("corpusv", PAIRS[2:])):  # what `corpus[v2]` matches as a glob
        (tmp_path / name).mkdir()
        write_lines(tmp_path / name / "part.jsonl", [json.dumps({"de": d, "en": e}) for d, e in part])
    assert pairs(load(tmp_path, "jsonl", folder / "part.jsonl")) == PAIRS
    with pytest.raises(DataError) as info:
        load(tmp_path, "hf", folder)
    assert str(info.value) == (f"folder {folder}: datasets finds no data file in a folder whose path holds '[' "
                               f"({folder}); rename it, or read its files with kind: jsonl, tsv or parquet")
