"""Corpus sources that the Hugging Face `datasets` library reads: parquet files (`kind: parquet`), a
folder written by `save_to_disk` (`disk`), and a hub dataset or a local folder of data files (`hf`).
Their failures, which `datasets` raises in many kinds, become one-line `DataError`s that say what to
give instead."""

from __future__ import annotations

import contextlib
import csv as csv_module
import glob
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import datasets
import huggingface_hub.constants
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from datasets import Dataset, DatasetDict, Value
from datasets.exceptions import DatasetGenerationError

from nmt.config import CorpusConfig
from nmt.data.fields import TEXT_TYPES, select_fields
from nmt.data.textfiles import is_glob
from nmt.data.textfiles import path_hint as _path_hint
from nmt.errors import DataError

log = logging.getLogger(__name__)

# How long the hub's address may take to answer a connection before it counts as unreachable. Offline,
# huggingface_hub retries each request with a growing wait: about 25 s before a dataset's load fails.
HUB_PROBE_SECONDS = 5.0


def load_parquet(entries: list[str], spec: CorpusConfig, *, src_lang: str, tgt_lang: str,
                 cache: str | None) -> Dataset:
    """Parquet files (or globs of them) as one split."""
    for p in entries:
        if not is_glob(p) and not Path(p).is_file():
            raise DataError(f"{p}: parquet file not found{_path_hint(p)}")
        if is_glob(p) and not glob.glob(p, recursive=True):  # as datasets reads it: ** spans folders
            raise DataError(f"{p}: no parquet files match{_path_hint(p)}")
        if not is_glob(p) and _parquet_rows(p) == 0:  # datasets fails on it with an error of its batch size
            raise DataError(f"{p}: empty, a parquet file of no rows; give one that holds sentence pairs")
    where = entries[0] if len(entries) == 1 else f"{entries[0]} and {len(entries) - 1} more"
    try:
        with _quiet("datasets"):  # its log line of the failure would come before ours
            # datasets takes every path as a pattern: a file's own name is escaped (`corpus[v2]/train.parquet`)
            files = [p if is_glob(p) else glob.escape(p) for p in entries]
            ds = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=cache)
    except Exception as err:  # pyarrow and datasets raise many kinds
        raise DataError(f"{where}: cannot read as parquet: {_short(err)}") from None
    return select_fields(ds, spec, src_lang=src_lang, tgt_lang=tgt_lang, where=where)


def _parquet_rows(path: str) -> int | None:
    """The rows a parquet file's footer counts, or None where it has none (not a parquet file)."""
    try:
        return pq.read_metadata(path).num_rows
    except Exception:  # the load that follows names what is wrong
        return None


def load_disk(path: str, split: str | None) -> Dataset:
    if not Path(path).is_dir():
        raise DataError(f"{path}: no such folder (kind: disk wants a folder written by save_to_disk){_path_hint(path)}")
    try:
        loaded = datasets.load_from_disk(path)
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: not a dataset written by save_to_disk: {_short(err)}") from None
    if isinstance(loaded, DatasetDict):
        name = split or "train"
        if name not in loaded:
            raise DataError(f"{path}: no split {name!r}; splits found: {', '.join(loaded)} (set split)")
        return loaded[name]
    if split is not None:  # it would be read whole all the same, whatever the config meant
        raise DataError(f"{path}: a dataset saved without splits, so split {split!r} names none of it; remove split "
                        "to read it whole")
    return loaded


def writable_copy(ds: Dataset, path: str, cache_dir: str | None) -> Dataset:
    """`ds` itself, or when its folder is read-only, a copy of its two columns under
    `cache_dir` (or the `datasets` cache): later maps write their cache files next to
    their source's."""
    if os.access(path, os.W_OK):
        return ds
    folder = Path(cache_dir or datasets.config.HF_DATASETS_CACHE)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"pairs-{ds._fingerprint}.arrow"  # the fingerprint names its content
    return ds.flatten_indices(cache_file_name=str(folder / name))


_KINDS_BY_SUFFIX = {".json": "jsonl (one JSON object a line)", ".jsonl": "jsonl", ".tsv": "tsv", ".parquet": "parquet"}
try:  # the names datasets takes as file formats before any hub dataset (json, csv, parquet, ...)
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES as _PACKAGED
    _BUILDERS = frozenset(_PACKAGED)
except ImportError:  # a datasets that moved them
    _BUILDERS = frozenset(("arrow", "csv", "json", "pandas", "parquet", "text", "xml"))


def load_hub(path: str, spec: CorpusConfig, cache_dir: str | None) -> Dataset:
    split = spec.split or "train"
    if Path(path).is_file():  # datasets would say that it finds no data file there
        kind = _KINDS_BY_SUFFIX.get(Path(path.removesuffix(".gz")).suffix)
        instead = f"use kind: {kind}" if kind else "use kind: text, tsv, jsonl or parquet, as its format is"
        raise DataError(f"{path}: a file, and kind hf reads a hub dataset or a folder of data files; {instead}")
    if path in _BUILDERS and not Path(path).is_dir():  # without data files it reads the working directory
        raise DataError(f"kind hf, path {path!r}: a file format of datasets, not a dataset; read such files with "
                        "kind: jsonl, tsv or parquet, or give kind hf the folder that holds them")
    if Path(path).is_dir() and "[" in os.path.abspath(path):  # datasets takes its whole path as a glob
        raise DataError(f"folder {path}: datasets finds no data file in a folder whose path holds '[' "
                        f"({os.path.abspath(path)}); rename it, or read its files with kind: jsonl, tsv or parquet")
    csv = _csv_options(path, spec.hf_config, cache_dir) if Path(path).is_dir() else None
    unreachable = None if Path(path).is_dir() else hub_unreachable()
    if unreachable:
        log.warning("the hub cannot be reached (%s): looking for %s in the datasets cache only", unreachable,
                    hf_source(path))
    try:
        with _offline(bool(unreachable)):
            ds = datasets.load_dataset(path, spec.hf_config, split=split, cache_dir=cache_dir, **(csv or {}))
    except Exception as err:  # network, auth, format and split errors all end here
        config = f", config {spec.hf_config!r}" if spec.hf_config else ""
        if Path(path).is_dir():  # a local folder: the hub was never asked
            raise DataError(f"{hf_source(path)}{config}, split {split!r}: its data files could not be loaded as a "
                            f"dataset: {_short(err)}") from None
        why = (f"the hub cannot be reached ({unreachable}) and the datasets cache does not hold it" if unreachable
               else _short(err))
        raise DataError(
            f"{hf_source(path)}{config}, split {split!r} could not be loaded: {why}. "
            "Without access to the hub, download it on another machine "
            "(datasets.load_dataset(...).save_to_disk(DIR), or to_parquet/to_json), copy it here "
            "and use kind: disk (or parquet, jsonl) with path: DIR"
        ) from None
    return _without_cr_endings(ds) if csv is not None else ds


def hub_unreachable() -> str | None:
    """Why the hub's address (`HF_ENDPOINT`) takes no connection within `HUB_PROBE_SECONDS` in all, or None where
    it does, where offline mode is on already (`HF_HUB_OFFLINE`), or where a proxy is set, which the hub's
    requests go through and this probe does not. Each address the name resolves to is tried in turn, within
    that one budget: a firewall that drops packets costs 5 seconds, not 5 per address."""
    proxies = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
    if huggingface_hub.constants.HF_HUB_OFFLINE or any(os.environ.get(name) for name in proxies):
        return None
    url = urlsplit(huggingface_hub.constants.ENDPOINT)
    if not url.hostname:
        return None
    port = url.port or (80 if url.scheme == "http" else 443)
    deadline = time.monotonic() + HUB_PROBE_SECONDS
    try:
        addresses = socket.getaddrinfo(url.hostname, port, type=socket.SOCK_STREAM)
    except OSError as err:  # the name does not resolve
        return f"{url.hostname}:{port}: {err.strerror or err}"
    why = "timed out"
    for family, kind, proto, _, address in addresses:
        if (left := deadline - time.monotonic()) <= 0:
            break
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(left)
            try:
                sock.connect(address)
                return None
            except OSError as err:  # no route, refused, timed out
                why = err.strerror or str(err) or type(err).__name__
    return f"{url.hostname}:{port}: {why}"


@contextlib.contextmanager
def _offline(on: bool) -> Iterator[None]:
    """Offline mode for the block where `on`: `datasets` looks in its cache only, without asking the hub.
    Both libraries read `HF_HUB_OFFLINE` once, on import, so their copies are set."""
    if not on:
        yield
        return
    saved = datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved


def hf_source(path: str) -> str:
    """What `kind: hf` reads at `path`, for messages: "folder PATH" of data files where a local folder is
    there (`datasets.load_dataset` reads it, never the hub), else "hub dataset 'PATH'"."""
    return f"folder {path}" if Path(path).is_dir() else f"hub dataset {path!r}"


def _csv_options(folder: str, config: str | None, cache_dir: str | None) -> dict[str, object] | None:
    """Where `datasets` reads the files of a local folder as CSV (or TSV, by their suffix), the options that
    make pandas, which reads them, keep each cell's text as written; else None. Pandas' defaults:
    - end a line at a lone '\r' too, cutting a sentence that holds one in two, its second half paired with
      the next column's text;
    - read a cell "None", "N/A", "NULL", "nan" (a sentence of a user interface's corpus) as missing, so that
      its pair was dropped as empty;
    - take double quotes as quoting in TSV, which has none (`kind: tsv` keeps them): '"Hello" he said.'
      became 'Hello he said.'."""
    try:
        builder = datasets.load_dataset_builder(folder, config, cache_dir=cache_dir)
    except Exception:  # the load that follows says what is wrong
        return None
    if builder.name != "csv":
        return None
    tsv = "\t" in (builder.config.sep, builder.config.delimiter)
    return {"lineterminator": "\n", "keep_default_na": False, **({"quoting": csv_module.QUOTE_NONE} if tsv else {})}


def _without_cr_endings(ds: Dataset) -> Dataset:
    """A CSV dataset read with only '\\n' ending a line, less the '\\r' of its '\\r\\n' endings, which
    pandas leaves at the end of each line's last field, the header's too (the line rules drop it)."""
    last = ds.column_names[-1]
    if last.endswith("\r"):
        ds = ds.rename_column(last, last[:-1])
        last = last[:-1]
    feature = ds.features[last]
    if not isinstance(feature, Value) or feature.dtype not in TEXT_TYPES:
        return ds
    return ds.with_format("arrow").map(_drop_final_cr, batched=True, fn_kwargs={"column": last},
                                       desc="Dropping CR line endings").with_format(None)


def _drop_final_cr(batch: pa.Table, column: str) -> pa.Table:
    values = pc.replace_substring_regex(batch[column], pattern="\r$", replacement="")
    return batch.set_column(batch.column_names.index(column), column, values)


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """No log records below CRITICAL from logger `name` and its children inside the block."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _short(err: BaseException) -> str:
    """The first line of `err`, or of the error behind it where `datasets` says only that generating failed."""
    if isinstance(err, DatasetGenerationError) and err.__cause__ is not None:
        err = err.__cause__
    text = str(err).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(err).__name__}: {first[:200]}"
