"""Raw parallel text: every corpus source becomes one Arrow `Dataset` with columns `src`, `tgt`.

Sources (`CorpusConfig.kind`):
    text     PATH.SRC and PATH.TGT, one sentence per line (either may be `.gz`).
    tsv      one tab-separated file with a header row, or none when the fields are column
             numbers (no quoting: tabs split fields).
    jsonl    one JSON object per line, flat or with a nested `translation` object.
    parquet  one parquet file (or glob).
    disk     a `Dataset` or `DatasetDict` written with `save_to_disk`.
    hf       a Hugging Face hub dataset (or a local folder `load_dataset` understands).

For text, tsv, jsonl and parquet, `path` may also be a glob or a list: the shards are
read one after another into one `Dataset` (for text, globs match prefixes).

Line-based files are read into Arrow files under `cache_dir` (text files by Arrow
compute in blocks, `nmt.data.textfiles`; tsv and jsonl by a generator), so a corpus
larger than memory works and a second run reuses the cache; the cache key
includes each file's size and modification time, so an edited file is read again.
Column-based sources share one rule to find the two text columns (`resolve_fields`).
Rows stay in corpus order; nothing is dropped here except by `clean_pairs`, which
drops whole pairs only, so a sentence never moves next to another one's translation.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import datasets
from datasets import Dataset

from nmt.config import CorpusConfig
from nmt.data.fields import select_fields
from nmt.data.hf_sources import hf_source, load_disk, load_hub, load_parquet, writable_copy
from nmt.data.line_files import load_jsonl, load_tsv, shard_files, text_files
from nmt.data.textfiles import read_text_shards, text_prefixes
from nmt.errors import DataError


def load_pairs(
    spec: CorpusConfig, *, src_lang: str, tgt_lang: str, cache_dir: str | Path | None = None
) -> Dataset:
    """Read one split of a parallel corpus.

    Args:
        spec: where the split comes from.
        src_lang, tgt_lang: language codes: text-file suffixes and default column names.
        cache_dir: where Arrow files of line-based sources and hub downloads go
            (None: the `datasets` default cache).

    Returns:
        A `Dataset` with exactly the string columns `src` and `tgt`, in corpus order.
        Text is as read, without its line ending; nothing is stripped or dropped.

    Raises:
        DataError: a missing or unreadable file, invalid UTF-8 (file and line),
            text files of different lengths, a missing column (with the columns
            found), or a hub dataset that cannot be loaded.
    """
    entries = [os.path.expanduser(os.path.expandvars(p)) for p in spec.paths]
    path = entries[0]
    cache = None if cache_dir is None else str(cache_dir)
    if len(entries) > 1 and spec.kind in ("disk", "hf"):
        raise DataError(f"kind {spec.kind} reads one dataset: give path as one string, not a list of {len(entries)}")
    langs = {"src_lang": src_lang, "tgt_lang": tgt_lang}
    match spec.kind:
        case "text":
            shards = [text_files(prefix, (src_lang, tgt_lang)) for prefix in text_prefixes(entries, src_lang)]
            return read_text_shards(shards, cache)
        case "tsv" | "jsonl":
            files = shard_files(entries, spec.kind)
            if len(files) > 1:
                return _concat([load_pairs(_one(spec, f), **langs, cache_dir=cache_dir) for f in files])
            read = load_tsv if spec.kind == "tsv" else load_jsonl
            return read(files[0], spec, **langs, cache=cache)
        case "parquet":
            return load_parquet(entries, spec, **langs, cache=cache)
        case "disk":
            ds = select_fields(load_disk(path, spec.split), spec, **langs, where=path)
            return writable_copy(ds, path, cache)
        case "hf":
            return select_fields(load_hub(path, spec, cache), spec, **langs, where=hf_source(path))
    raise DataError(f"{spec.path}: unknown corpus kind {spec.kind!r}")


def _one(spec: CorpusConfig, path: str) -> CorpusConfig:
    """`spec` reading the single file `path`."""
    return dataclasses.replace(spec, path=path)


def _concat(parts: list[Dataset]) -> Dataset:
    """Shards one after another (memory-mapped tables are chained, not copied)."""
    return datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]
