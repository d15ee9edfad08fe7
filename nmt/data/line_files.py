"""Line-based corpus files: the files that a text, tsv or jsonl `path` names (prefixes, globs, shards),
and the tsv and jsonl readers, which write their pairs to an Arrow file under the cache folder (text
pairs themselves are read by `nmt.data.textfiles`). Lines are decoded by the line rules
(`nmt.data.text.decode_lines`), and an error names the file, and the line where there is one."""

from __future__ import annotations

import contextlib
import glob
import itertools
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from datasets import Dataset
from datasets.exceptions import DatasetGenerationError

from nmt.config import CorpusConfig
from nmt.data.fields import PAIR_FEATURES, resolve_fields
from nmt.data.text import READ_ERRORS, decode_lines, open_binary, read_problem
from nmt.data.textfiles import file_stamp, is_glob
from nmt.data.textfiles import path_hint as _path_hint
from nmt.errors import DataError
from nmt.fileio import not_a_file

log = logging.getLogger(__name__)


def load_tsv(path: str, spec: CorpusConfig, *, src_lang: str, tgt_lang: str, cache: str | None) -> Dataset:
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
        cells = [first.split("\t")[c] for c in columns]
        if {cell.strip().lower() for cell in cells} & {src_lang, tgt_lang, "src", "tgt", "source", "target"}:
            log.warning("%s:1 reads like a header row (%r, %r), and is read as a pair: src_field and tgt_field are "
                        "column numbers, for a file without one; give them as the column names if it is one",
                        path, *cells)
    # a tuple: `from_generator` would shard a list over processes
    kwargs = dict(path=path, columns=columns, header=header, stamp=file_stamp(path))
    return _from_generator(_read_tsv, kwargs, cache)


def load_jsonl(path: str, spec: CorpusConfig, *, src_lang: str, tgt_lang: str, cache: str | None) -> Dataset:
    """One JSON-lines file, its fields found in its first object."""
    with contextlib.closing(_json_objects(path)) as objects:
        first = next(objects, None)
    if first is None:
        return _empty_pairs()
    fields = resolve_fields(list(first[1]), spec, src_lang=src_lang, tgt_lang=tgt_lang, where=path)
    return _from_generator(_read_jsonl, dict(path=path, fields=fields, stamp=file_stamp(path)), cache)


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
            flat = _flatten(obj) if isinstance(obj, dict) else None
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{lineno}: invalid JSON: {err.msg} (column {err.colno})") from None
        except ValueError as err:  # Python's limit on the digits of an integer it converts
            raise DataError(f"{path}:{lineno}: a JSON number too long to read ({str(err).split(';')[0]})") from None
        except RecursionError:  # `json` and `_flatten` descend by recursion
            raise DataError(f"{path}:{lineno}: JSON nested too deeply to read") from None
        if flat is None:
            raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        yield lineno, flat


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
        raise DataError(read_problem(path, err, lines)) from None


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


def text_files(prefix: str, langs: tuple[str, str]) -> tuple[str, str]:
    found, tried = [], []
    for lang in langs:
        candidates = [f"{prefix}.{lang}", f"{prefix}.{lang}.gz"]
        hit = next((c for c in candidates if Path(c).is_file()), None)
        found.append(hit)
        tried += [] if hit else candidates
    if odd := next(((c, kind) for c in tried if (kind := not_a_file(c))), None):
        raise DataError(f"{odd[0]}: {odd[1]}, not a text file")
    if tried:
        raise DataError(f"text corpus not found: tried {', '.join(tried)}{_suffix_hint(prefix, langs)}"
                        f"{_path_hint(prefix)}")
    return found[0], found[1]


def _require_file(path: str) -> None:
    if kind := not_a_file(path):
        raise DataError(f"{path}: {kind}, not a file")
    if not Path(path).is_file():
        raise DataError(f"{path}: file not found{_path_hint(path)}")


def shard_files(entries: Sequence[str], kind: str) -> list[str]:
    """The files that `entries` (paths or globs, a glob's matches sorted; a path that exists as written is
    no glob, `is_glob`) name, in order; each must exist."""
    files: list[str] = []
    for entry in entries:
        found = sorted(glob.glob(entry)) if is_glob(entry) else [entry]
        if not found:
            raise DataError(f"{entry}: no {kind} files match{_path_hint(entry)}")
        files += found
    for path in files:
        _require_file(path)
    return files
