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

import contextlib
import dataclasses
import glob
import itertools
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from datasets import Dataset, DatasetDict, Features, Value
from datasets.exceptions import DatasetGenerationError

from nmt.config import CorpusConfig
from nmt.data.text import READ_ERRORS, decode_lines, open_binary
from nmt.data.textfiles import file_stamp, is_glob, read_text_shards, text_prefixes
from nmt.data.textfiles import path_hint as _path_hint
from nmt.errors import DataError

PAIR_FEATURES = Features({"src": Value("string"), "tgt": Value("string")})
_TEXT_TYPES = ("string", "large_string")
MIN_ROWS_PER_PROCESS = 20_000
"""Maps over fewer rows per process run in the calling process."""
PY_WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
"""The characters `str.split()` splits at (those for which `str.isspace()` holds). Cleaning folds
runs of exactly these, as translation does (`nmt.data.text.normalize_spaces`); Arrow's own
whitespace set lacks U+001C to U+001F."""
_WHITESPACE_RUN = "[" + "".join(f"\\x{{{ord(c):x}}}" for c in PY_WHITESPACE) + "]+"
"""A run of `PY_WHITESPACE`, as an RE2 pattern."""
WRITER_BATCH_ROWS = 20_000
"""Rows per map batch, and so per Arrow record batch of the maps' cache files. `datasets`
uses 1,000; opening a file reads every batch's header, and the kernel maps the pages
around each one it touches: at millions of rows, hundreds of MB of resident file pages
for nothing."""


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
            shards = [_text_files(prefix, (src_lang, tgt_lang)) for prefix in text_prefixes(entries, src_lang)]
            return read_text_shards(shards, cache)
        case "tsv" | "jsonl":
            files = _shard_files(entries, spec.kind)
            if len(files) > 1:
                return _concat([load_pairs(_one(spec, f), **langs, cache_dir=cache_dir) for f in files])
            read = _load_tsv if spec.kind == "tsv" else _load_jsonl
            return read(files[0], spec, **langs, cache=cache)
        case "parquet":
            return _load_parquet(entries, spec, **langs, cache=cache)
        case "disk":
            ds = select_fields(_load_disk(path, spec.split), spec, **langs, where=path)
            return _writable_copy(ds, path, cache)
        case "hf":
            return select_fields(_load_hub(path, spec, cache), spec, **langs, where=_hf_source(path))
    raise DataError(f"{spec.path}: unknown corpus kind {spec.kind!r}")


def _load_tsv(path: str, spec: CorpusConfig, *, src_lang: str, tgt_lang: str, cache: str | None) -> Dataset:
    """One TSV file: its columns named by a header row, or numbered (`src_field: 0`) in a file without one."""
    with contextlib.closing(_lines(path)) as lines:
        first = next(lines, None)
    if first is None:
        return _empty_pairs()
    header = not isinstance(spec.src_field, int)  # column numbers: a file without a header row
    if header:
        names = first.split("\t")
        columns = tuple(names.index(f) for f in resolve_fields(names, spec, src_lang=src_lang,
                                                                tgt_lang=tgt_lang, where=path))
    else:
        columns = (int(spec.src_field), int(spec.tgt_field))  # type: ignore[arg-type]
        width = len(first.split("\t"))
        if max(columns) >= width:
            raise DataError(f"{path}:1: {width} tab-separated fields, so no column {max(columns)} "
                            f"(src_field and tgt_field count from 0)")
    # a tuple: `from_generator` would shard a list over processes
    kwargs = dict(path=path, columns=columns, header=header, stamp=file_stamp(path))
    return _from_generator(_read_tsv, kwargs, cache)


def _load_jsonl(path: str, spec: CorpusConfig, *, src_lang: str, tgt_lang: str, cache: str | None) -> Dataset:
    """One JSON-lines file, its fields found in its first object."""
    with contextlib.closing(_json_objects(path)) as objects:
        first = next(objects, None)
    if first is None:
        return _empty_pairs()
    fields = resolve_fields(list(first[1]), spec, src_lang=src_lang, tgt_lang=tgt_lang, where=path)
    return _from_generator(_read_jsonl, dict(path=path, fields=fields, stamp=file_stamp(path)), cache)


def _load_parquet(entries: list[str], spec: CorpusConfig, *, src_lang: str, tgt_lang: str,
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
            ds = datasets.load_dataset("parquet", data_files=entries, split="train", cache_dir=cache)
    except Exception as err:  # pyarrow and datasets raise many kinds
        raise DataError(f"{where}: cannot read as parquet: {_short(err)}") from None
    return select_fields(ds, spec, src_lang=src_lang, tgt_lang=tgt_lang, where=where)


def clean_pairs(ds: Dataset, *, num_proc: int = 1) -> tuple[Dataset, dict[str, int]]:
    """Fold each run of whitespace to one space, strip it at both ends, and drop pairs with an empty side.

    A sentence is then what translation makes of a line (`nmt.data.text.normalize_spaces`), so the
    model learns from the subwords it will be given: the tokenizer keeps some whitespace, a tab or
    NEL, that translation folds, and a tokenizer without normalization keeps every run.

    A pair is kept or dropped as a whole, so later pairs stay aligned.

    Args:
        ds: a `Dataset` with `src` and `tgt` (nulls count as empty).
        num_proc: processes to clean in (small datasets use this one).

    Returns:
        The cleaned `Dataset` (columns `src`, `tgt`) and the counts `{"empty": n}`.
    """
    if not len(ds):  # `map` over no rows would leave no columns either
        return ds.select_columns(["src", "tgt"]), {"empty": 0}
    cleaned = ds.with_format("arrow").map(
        _strip_and_drop_empty,
        batched=True,
        remove_columns=ds.column_names,
        features=PAIR_FEATURES,
        num_proc=processes_for(len(ds), num_proc),
        batch_size=WRITER_BATCH_ROWS,
        writer_batch_size=WRITER_BATCH_ROWS,
        desc="Cleaning pairs",
    ).with_format(None)
    return cleaned, {"empty": len(ds) - len(cleaned)}


def processes_for(rows: int, num_proc: int) -> int | None:
    """The `num_proc` to give `Dataset.map` for `rows` rows: None (this process) for small maps,
    where starting workers costs more than it saves."""
    n = min(num_proc, rows // MIN_ROWS_PER_PROCESS)
    return n if n > 1 else None


def _strip_and_drop_empty(batch: pa.Table) -> pa.Table:
    """`normalize_spaces` of both sides, keeping pairs with text on both, in Arrow compute (no Python per pair)."""
    src, tgt = (pc.utf8_trim(pc.replace_substring_regex(pc.fill_null(batch[name], ""), pattern=_WHITESPACE_RUN,
                                                        replacement=" "), characters=" ")
                for name in ("src", "tgt"))
    keep = pc.and_(pc.greater(pc.utf8_length(src), 0), pc.greater(pc.utf8_length(tgt), 0))
    return pa.table({"src": src.filter(keep), "tgt": tgt.filter(keep)})


# --------------------------------------------------------------------------- fields


def resolve_fields(
    columns: Sequence[str], spec: CorpusConfig, *, src_lang: str, tgt_lang: str, where: str
) -> tuple[str, str]:
    """Pick the source and target columns among `columns` (nested names flattened as `a.b`).

    An explicit `src_field`/`tgt_field` is used as given (`translation.de` names a
    nested field); otherwise the language code, then `translation.<lang>` (the
    layout of wmt and many hub datasets).

    Raises:
        DataError: a column is missing; the message lists the columns found.
    """
    chosen = []
    for side, field, lang in (("src", spec.src_field, src_lang), ("tgt", spec.tgt_field, tgt_lang)):
        candidates = [field] if field is not None else [lang, f"translation.{lang}"]
        found = next((c for c in candidates if c in columns), None)
        if found is None:
            tried = " or ".join(repr(c) for c in candidates)
            listed = ", ".join(repr(c) for c in columns) or "none"
            hint = "" if field is not None else f" (set {side}_field to choose one)"
            raise DataError(f"{where}: no {side} column {tried}; columns found: {listed}{hint}")
        chosen.append(found)
    if chosen[0] == chosen[1]:
        raise DataError(f"{where}: source and target both read column {chosen[0]!r}")
    return chosen[0], chosen[1]


def select_fields(ds: Dataset, spec: CorpusConfig, *, src_lang: str, tgt_lang: str, where: str) -> Dataset:
    """Reduce a column-based `Dataset` to string columns `src`, `tgt` (see `resolve_fields`).

    Raises:
        DataError: a missing column (columns found listed) or one that does not hold text.
    """
    if any(not isinstance(f, Value) for f in ds.features.values()):
        ds = ds.flatten()  # struct columns become `translation.de`, `translation.en`
    src_col, tgt_col = resolve_fields(ds.column_names, spec, src_lang=src_lang, tgt_lang=tgt_lang, where=where)
    for col in (src_col, tgt_col):
        feature = ds.features[col]
        if not isinstance(feature, Value) or feature.dtype not in _TEXT_TYPES:
            raise DataError(f"{where}: column {col!r} holds {feature}, not text")
    ds = ds.select_columns([src_col, tgt_col]).rename_columns({src_col: "src", tgt_col: "tgt"})
    return ds.cast(PAIR_FEATURES) if ds.features != PAIR_FEATURES else ds


# --------------------------------------------------------------------------- line-based files


def _from_generator(generator: Any, gen_kwargs: dict[str, Any], cache_dir: str | None) -> Dataset:
    """Write the generator's pairs to Arrow under `cache_dir` (reused when `gen_kwargs` match)."""
    try:
        return Dataset.from_generator(generator, features=PAIR_FEATURES, gen_kwargs=gen_kwargs, cache_dir=cache_dir)
    except DatasetGenerationError as err:
        if isinstance(err.__cause__, DataError):
            raise err.__cause__ from None
        raise
    except ValueError as err:
        if "corresponds to no data" not in str(err):
            raise
        return _empty_pairs()  # an empty file


def _empty_pairs() -> Dataset:
    return Dataset.from_dict({"src": [], "tgt": []}, features=PAIR_FEATURES)


# The generators' `stamp` argument is unused: it only makes the Arrow cache key depend on the files.


def _read_tsv(path: str, columns: tuple[int, int], header: bool, stamp: object) -> Iterator[dict[str, str]]:
    """Rows of a TSV file; every line has as many fields as the first (the header, where there is one)."""
    lines = _lines(path)
    first = next(lines)
    width = len(first.split("\t"))
    which = "the header has" if header else "line 1 has"
    # Tabs alone split fields: no quoting, and a lone '\r' inside a field is text, as in text files
    # (the csv module would refuse it as a line break inside an unquoted field).
    for lineno, line in enumerate(lines if header else itertools.chain([first], lines), 2 if header else 1):
        row = line.split("\t")
        if len(row) != width:
            if not line.strip():  # most often a blank line at the end of the file
                raise DataError(f"{path}:{lineno}: a blank line, where {which} {width} tab-separated fields; remove "
                                "it, or give each pair its line")
            raise DataError(f"{path}:{lineno}: {len(row)} tab-separated fields, {which} {width}")
        yield {"src": row[columns[0]], "tgt": row[columns[1]]}


def _read_jsonl(path: str, fields: tuple[str, str], stamp: object) -> Iterator[dict[str, str | None]]:
    for lineno, obj in _json_objects(path):
        pair = {}
        for side, field in zip(("src", "tgt"), fields):
            if field not in obj:
                raise DataError(f"{path}:{lineno}: no field {field!r}; fields found: {', '.join(obj)}")
            value = obj[field]
            if value is not None and not isinstance(value, str):
                raise DataError(f"{path}:{lineno}: field {field!r} holds {value!r}, not text")
            pair[side] = value
        yield pair


def _json_objects(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object with nested keys flattened to `a.b`) for each non-blank line."""
    for lineno, line in enumerate(_lines(path), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{lineno}: invalid JSON: {err.msg} (column {err.colno})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        yield lineno, _flatten(obj)


def _flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in obj.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _lines(path: str) -> Iterator[str]:
    """The decoded lines of a file by the line rules (`nmt.data.text.decode_lines`)."""
    lines = 0
    try:
        with open_binary(path) as f:
            for line in decode_lines(f, path):
                lines += 1
                yield line
    except READ_ERRORS as err:
        raise DataError(f"{path}: cannot read after line {lines}: {err}") from None


def _suffix_hint(prefix: str, langs: tuple[str, str]) -> str:
    """Files beside the prefix with other language suffixes: a mistyped `data.src_lang` (`ge` for `de`) is found
    here, not by a look at the folder."""
    folder, stem = os.path.split(prefix)
    try:
        names = sorted(os.listdir(folder or "."))
    except OSError:
        return ""
    others = sorted({n[len(stem) + 1:].removesuffix(".gz") for n in names if n.startswith(f"{stem}.")} - set(langs))
    others = [o for o in others if o and "." not in o][:6]
    if not others:
        return ""
    found = ", ".join(f"{prefix}.{o}" for o in others)
    return (f"; found {found}: data.src_lang ({langs[0]}) and data.tgt_lang ({langs[1]}) name the files' "
            "suffixes")


def _text_files(prefix: str, langs: tuple[str, str]) -> tuple[str, str]:
    found, tried = [], []
    for lang in langs:
        candidates = [f"{prefix}.{lang}", f"{prefix}.{lang}.gz"]
        hit = next((c for c in candidates if Path(c).is_file()), None)
        found.append(hit)
        tried += [] if hit else candidates
    if tried:
        raise DataError(f"text corpus not found: tried {', '.join(tried)}{_suffix_hint(prefix, langs)}"
                        f"{_path_hint(prefix)}")
    return found[0], found[1]


def _require_file(path: str) -> None:
    if not Path(path).is_file():
        raise DataError(f"{path}: file not found{_path_hint(path)}")


def _shard_files(entries: Sequence[str], kind: str) -> list[str]:
    """The files that `entries` (paths or globs, a glob's matches sorted) name, in order; each must exist."""
    files: list[str] = []
    for entry in entries:
        found = sorted(glob.glob(entry)) if is_glob(entry) else [entry]
        if not found:
            raise DataError(f"{entry}: no {kind} files match{_path_hint(entry)}")
        files += found
    for path in files:
        _require_file(path)
    return files


def _one(spec: CorpusConfig, path: str) -> CorpusConfig:
    """`spec` reading the single file `path`."""
    return dataclasses.replace(spec, path=path)


def _concat(parts: list[Dataset]) -> Dataset:
    """Shards one after another (memory-mapped tables are chained, not copied)."""
    return datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]


# --------------------------------------------------------------------------- Arrow datasets


def _load_disk(path: str, split: str | None) -> Dataset:
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


def _writable_copy(ds: Dataset, path: str, cache_dir: str | None) -> Dataset:
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


def _load_hub(path: str, spec: CorpusConfig, cache_dir: str | None) -> Dataset:
    split = spec.split or "train"
    if Path(path).is_file():  # datasets would say that it finds no data file there
        kind = _KINDS_BY_SUFFIX.get(Path(path.removesuffix(".gz")).suffix)
        instead = f"use kind: {kind}" if kind else "use kind: text, tsv, jsonl or parquet, as its format is"
        raise DataError(f"{path}: a file, and kind hf reads a hub dataset or a folder of data files; {instead}")
    if path in _BUILDERS and not Path(path).is_dir():  # without data files it reads the working directory
        raise DataError(f"kind hf, path {path!r}: a file format of datasets, not a dataset; read such files with "
                        "kind: jsonl, tsv or parquet, or give kind hf the folder that holds them")
    csv = Path(path).is_dir() and _read_as_csv(path, spec.hf_config, cache_dir)
    try:
        # pandas, which reads CSV for datasets, ends a line at a lone '\r' too: a sentence holding one
        # would be cut in two, its second half paired with the next column's text
        ds = datasets.load_dataset(path, spec.hf_config, split=split, cache_dir=cache_dir,
                                   **({"lineterminator": "\n"} if csv else {}))
    except Exception as err:  # network, auth, format and split errors all end here
        config = f", config {spec.hf_config!r}" if spec.hf_config else ""
        if Path(path).is_dir():  # a local folder: the hub was never asked
            raise DataError(f"{_hf_source(path)}{config}, split {split!r}: its data files could not be loaded as a "
                            f"dataset: {_short(err)}") from None
        raise DataError(
            f"{_hf_source(path)}{config}, split {split!r} could not be loaded: {_short(err)}. "
            "Without access to the hub, download it on another machine "
            "(datasets.load_dataset(...).save_to_disk(DIR), or to_parquet/to_json), copy it here "
            "and use kind: disk (or parquet, jsonl) with path: DIR"
        ) from None
    return _without_cr_endings(ds) if csv else ds


def _hf_source(path: str) -> str:
    """What `kind: hf` reads at `path`, for messages: "folder PATH" of data files where a local folder is
    there (`datasets.load_dataset` reads it, never the hub), else "hub dataset 'PATH'"."""
    return f"folder {path}" if Path(path).is_dir() else f"hub dataset {path!r}"


def _read_as_csv(folder: str, config: str | None, cache_dir: str | None) -> bool:
    """Whether `datasets` reads the files of a local folder as CSV (or TSV)."""
    try:
        return datasets.load_dataset_builder(folder, config, cache_dir=cache_dir).name == "csv"
    except Exception:  # the load that follows says what is wrong
        return False


def _without_cr_endings(ds: Dataset) -> Dataset:
    """A CSV dataset read with only '\\n' ending a line, less the '\\r' of its '\\r\\n' endings, which
    pandas leaves at the end of each line's last field, the header's too (the line rules drop it)."""
    last = ds.column_names[-1]
    if last.endswith("\r"):
        ds = ds.rename_column(last, last[:-1])
        last = last[:-1]
    feature = ds.features[last]
    if not isinstance(feature, Value) or feature.dtype not in _TEXT_TYPES:
        return ds
    return ds.with_format("arrow").map(_drop_final_cr, batched=True, fn_kwargs={"column": last},
                                       desc="Dropping CR line endings").with_format(None)


def _drop_final_cr(batch: pa.Table, column: str) -> pa.Table:
    values = pc.replace_substring_regex(batch[column], pattern="\r$", replacement="")
    return batch.set_column(batch.column_names.index(column), column, values)


def _parquet_rows(path: str) -> int | None:
    """The rows a parquet file's footer counts, or None where it has none (not a parquet file)."""
    try:
        return pq.read_metadata(path).num_rows
    except Exception:  # the load that follows names what is wrong
        return None


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
