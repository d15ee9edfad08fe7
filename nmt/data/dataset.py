"""Tokenized splits: subword ids and lengths next to the text, with length and ratio filters.

A split is an Arrow `Dataset` with the columns
    src, tgt          the cleaned text (targets are the BLEU references); validation and
                      test splits only: nothing reads a training split's text after the
                      tokenizer is trained, and on a large corpus it is most of the cache,
    src_ids           source ids followed by EOS (int32),
    tgt_ids           target ids without specials: `collate` adds BOS and EOS,
    src_len, tgt_len  len(src_ids) and len(tgt_ids) + 1: the lengths the model sees
                      (decoder input BOS + ids, output ids + EOS).

Tokenizing is a `datasets` map, cached next to the source's Arrow files (in memory
for in-memory datasets) and keyed by the sentencepiece models, so a second run with
the same corpus and tokenizer reads the ids back instead of encoding again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, Features, List, Value

from nmt.config import CorpusConfig, DataConfig
from nmt.data.cleaning import WRITER_BATCH_ROWS, clean_pairs, processes_for
from nmt.data.collate import ranges
from nmt.data.corpus import load_pairs
from nmt.data.tokenizer import EOS_ID, Tokenizer
from nmt.errors import DataError

log = logging.getLogger(__name__)

ID_LISTS = pa.list_(pa.int32())
ID_FEATURES = {
    "src_ids": List(Value("int32")),
    "tgt_ids": List(Value("int32")),
    "src_len": Value("int32"),
    "tgt_len": Value("int32"),
}


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which containers and `taskset` narrow)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS and Windows have no affinity mask
        return max(1, os.cpu_count() or 1)


def table_rows(ds: Dataset) -> np.ndarray | None:
    """Which rows of the Arrow table behind `ds` (`ds.data`) it holds, in its order, as int64; None: all of them.

    `datasets` keeps the result of `select`, `filter` or `shuffle` as row numbers into the
    unchanged table (an indices mapping) instead of copying the rows.
    """
    return ds._indices.column(0).to_numpy().astype(np.int64) if ds._indices is not None else None


def length_arrays(ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """The `src_len` and `tgt_len` columns of a tokenized split as two (N,) int32 arrays.

    They come straight out of Arrow: the columns of the table behind `ds` (memory-mapped
    when the split lives in cache files) turn into NumPy at C speed, and rows chosen by
    `select` or `filter` (an indices mapping over that table) are taken with one fancy
    index. `ds.with_format("numpy")["src_len"]` would instead be a lazy `Column` of
    `datasets` 5, which `np.asarray` walks row by row through the formatter: minutes for
    a few million pairs.

    Args:
        ds: a `Dataset` with int32 columns `src_len` and `tgt_len`.

    Returns:
        (src_len, tgt_len), each (N,) int32 in the row order of `ds`.
    """
    table = ds.data  # the whole Arrow table, before any indices mapping
    columns = [table.column(name).to_numpy() for name in ("src_len", "tgt_len")]
    rows = table_rows(ds)
    if rows is not None:
        columns = [c[rows] for c in columns]
    src, tgt = (np.ascontiguousarray(c, dtype=np.int32) for c in columns)
    return src, tgt


class IdColumns:
    """The `src_ids` and `tgt_ids` of a tokenized split, gathered for a batch straight from Arrow.

    `dataset[indices]` builds a Python list of Python ints for every id of every row, and
    `datasets` finds each row with a search and a slice of its own: with `collate`, 44 ms
    for one batch of 1,812 Multi30k pairs (32,768 tokens) on a 2-core CPU, on the training
    process's critical path when `train.num_workers` is 0. Here each Arrow chunk's flat ids
    are NumPy views of the table (memory-mapped when the split lives in cache files, so
    nothing is read into memory ahead) and all chunks' offsets one array; a batch's rows
    are gathered with one vectorised gather per chunk when they come from few chunks, and
    with a view per row when from many (`collate_flat` then pads them without a Python
    loop): 2.2 ms for that batch, 6 to 9 ms for batches of 1M- and 4.5M-pair corpora
    (`bench/batch_speed.py`).

    Pickled (for spawned DataLoader workers), it carries the dataset, whose memory-mapped
    table pickles as its file paths, and finds the views again.
    """

    def __init__(self, ds: Dataset) -> None:
        self.ds = ds
        self.rows = table_rows(ds)
        self.columns = [_ListChunks(ds.data.column(name)) for name in ("src_ids", "tgt_ids")]

    def __reduce__(self):
        return IdColumns, (self.ds,)

    def gather(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(src, src_lens, tgt, tgt_lens) of the rows `indices` of the split, in that order: flat ids
        (int64) and per-row counts, as `nmt.data.collate.collate_flat` takes them."""
        rows = np.asarray(indices, dtype=np.int64)
        if self.rows is not None:
            rows = self.rows[rows]
        (src, src_lens), (tgt, tgt_lens) = (column.gather(rows) for column in self.columns)
        return src, src_lens, tgt, tgt_lens


class _ListChunks:
    """One list<int32> column of a chunked Arrow table: NumPy views of each chunk's ids, and every chunk's
    offsets into them one after another (a copy, 4 bytes a row: the ids themselves stay in the table)."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        chunks = [c for c in column.chunks if len(c)]
        self.first = np.cumsum([0] + [len(c) for c in chunks])[:-1]  # the table row each chunk starts at
        self.values = [c.values.to_numpy(zero_copy_only=True) for c in chunks]
        # chunk c's len + 1 offsets (slices included) follow those of the chunks before it
        self.offsets = np.concatenate([c.offsets.to_numpy(zero_copy_only=True) for c in chunks] or [np.zeros(0, np.int32)])

    def gather(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ids of table rows `rows`, flat (int64, in the order of `rows`), and each row's count."""
        chunk = np.searchsorted(self.first, rows, side="right") - 1
        at = rows + chunk  # row r's first offset: every chunk before r's adds one end offset
        begin, end = self.offsets[at], self.offsets[at + 1]
        lens = (end - begin).astype(np.int64)
        values = self.values
        order = np.argsort(chunk, kind="stable")
        starts = np.flatnonzero(np.diff(chunk[order])) + 1  # where each chunk's rows start in `order`
        if (len(starts) + 1) * 8 > len(rows):  # rows from many chunks (millions of pairs): a view per row
            parts = [values[c][a:b] for c, a, b in zip(chunk.tolist(), begin.tolist(), end.tolist(), strict=True)]
            return (np.concatenate(parts, dtype=np.int64) if parts else np.zeros(0, dtype=np.int64)), lens
        ids = np.empty(int(lens.sum()), dtype=np.int64)  # few chunks: one gather per chunk
        ids_begin = np.cumsum(lens) - lens
        for sel in np.split(order, starts):
            ids[ranges(ids_begin[sel], lens[sel])] = values[chunk[sel[0]]][ranges(begin[sel], lens[sel])]
        return ids, lens


def tokenize_pairs(
    ds: Dataset, tokenizer: Tokenizer, *, max_len: int | None, max_ratio: float, num_proc: int = 1,
    keep_text: bool = True,
) -> tuple[Dataset, dict[str, int]]:
    """Encode `src` and `tgt`, then drop pairs that are too long or too unbalanced.

    Lengths are those of the sequences the model sees (see the module docstring),
    so `max_len` bounds every position the model needs.

    Args:
        ds: a `Dataset` with string columns `src` and `tgt`.
        tokenizer: the sentencepiece models.
        max_len: drop pairs with `src_len` or `tgt_len` above it (None: keep all).
        max_ratio: drop pairs with max(src_len, tgt_len) / min(src_len, tgt_len)
            above it (0: keep all). Pairs already too long count only as too long.
        num_proc: processes for encoding.
        keep_text: keep the `src` and `tgt` columns next to the ids.

    Returns:
        The tokenized `Dataset` (columns of the module docstring) and the counts
        `{"too_long": n, "ratio": n}` of dropped pairs.
    """
    features = Features({**(ds.features if keep_text else {}), **ID_FEATURES})
    if len(ds) == 0:  # `map` leaves an empty dataset as it is, without the new columns
        return Dataset.from_dict({name: [] for name in features}, features=features), {"too_long": 0, "ratio": 0}
    encoded = ds.with_format("arrow").map(
        _Encoder(tokenizer, keep_text=keep_text),
        batched=True,
        features=features,
        remove_columns=ds.column_names,  # the output is what the encoder returns
        num_proc=processes_for(len(ds), num_proc),
        batch_size=WRITER_BATCH_ROWS,
        writer_batch_size=WRITER_BATCH_ROWS,
        desc="Tokenizing",
    )
    src_len, tgt_len = length_arrays(encoded)
    too_long, ratio = _filter_masks(src_len, tgt_len, max_len=max_len, max_ratio=max_ratio)
    report = {"too_long": int(too_long.sum()), "ratio": int(ratio.sum())}
    if report["too_long"] or report["ratio"]:
        encoded = encoded.filter(
            _keep,
            batched=True,
            batch_size=WRITER_BATCH_ROWS,
            writer_batch_size=WRITER_BATCH_ROWS,
            input_columns=["src_len", "tgt_len"],
            fn_kwargs={"max_len": max_len, "max_ratio": max_ratio},
            desc="Filtering by length",
        )
    return encoded.with_format(None), report


def prepare_split(
    spec: CorpusConfig,
    data_cfg: DataConfig,
    tokenizer: Tokenizer,
    *,
    cache_dir: str | Path | None,
    train: bool,
    num_proc: int = 1,
) -> tuple[Dataset, dict[str, int]]:
    """Load, clean and tokenize one split; training splits are also length-filtered, and keep ids only.

    Validation and test splits keep every cleaned pair, so their scores compare
    across runs whatever `max_len` and `max_ratio` are.

    Args:
        spec: the split's corpus (one of `data_cfg.train`, `valid` or `test` values).
        data_cfg: languages and filter settings.
        tokenizer: the sentencepiece models.
        cache_dir: Arrow cache of line-based corpora (see `load_pairs`).
        train: apply `data_cfg.max_len` and `data_cfg.max_ratio`.
        num_proc: processes for cleaning and encoding (small splits use this one).

    Returns:
        The tokenized split and the report `{"pairs", "empty", "too_long", "ratio",
        "kept"}` (pairs read, dropped by each step, kept).

    Raises:
        DataError: as `load_pairs`, or no pair is left; the message names the split,
            its path and what each step dropped.
    """
    name = _split_name(spec, data_cfg)
    raw = load_split(spec, data_cfg, cache_dir=cache_dir)
    cleaned, clean_report = clean_pairs(raw, num_proc=num_proc)
    tokenized, filter_report = tokenize_pairs(
        cleaned,
        tokenizer,
        max_len=data_cfg.max_len if train else None,
        max_ratio=data_cfg.max_ratio if train else 0.0,
        num_proc=num_proc,
        keep_text=not train,
    )
    report = {"pairs": len(raw), **clean_report, **filter_report, "kept": len(tokenized)}
    dropped = f"{report['empty']} with an empty side"
    if train:
        dropped += (
            f", {report['too_long']} longer than data.max_len={data_cfg.max_len} tokens"
            f", {report['ratio']} with a length ratio above data.max_ratio={data_cfg.max_ratio}"
        )
    where = f"{name} ({spec.path})"
    if report["pairs"] == 0:
        raise DataError(f"{where}: empty, no pairs to read; give a corpus that holds sentence pairs")
    if report["kept"] == 0:
        settings = [key for key, n in (("data.max_len", report["too_long"]), ("data.max_ratio", report["ratio"])) if n]
        hint = f"; raise {' or '.join(settings)}" if settings else ""
        raise DataError(f"{where}: no pairs left of {report['pairs']} read: dropped {dropped}{hint}")
    log.info("%s: %d pairs read, %d kept; dropped %s", where, report["pairs"], report["kept"], dropped)
    return tokenized, report


class _Encoder:
    """The batched map function. It pickles as the sentencepiece model bytes, so the
    `datasets` cache key depends on the models and worker processes rebuild it cheaply.
    """

    def __init__(self, tokenizer: Tokenizer, *, keep_text: bool) -> None:
        self.state, self.keep_text = tokenizer.to_state(), keep_text
        self.tokenizer: Tokenizer | None = tokenizer

    def __getstate__(self) -> dict[str, Any]:
        return {"state": self.state, "keep_text": self.keep_text}

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.state, self.keep_text, self.tokenizer = d["state"], d["keep_text"], None

    def __call__(self, batch: pa.Table) -> pa.Table:
        if self.tokenizer is None:
            self.tokenizer = Tokenizer.from_state(self.state)
        # sentencepiece encodes the batch; Arrow takes its lists in one conversion, and EOS and
        # the lengths are array operations, not a Python step per pair
        src_ids = _append(pa.array(self.tokenizer.encode_src(batch["src"].to_pylist()), ID_LISTS), EOS_ID)
        tgt_ids = pa.array(self.tokenizer.encode_tgt(batch["tgt"].to_pylist()), ID_LISTS)
        ids = {
            "src_ids": src_ids,
            "tgt_ids": tgt_ids,
            "src_len": pc.list_value_length(src_ids),
            "tgt_len": pc.add(pc.list_value_length(tgt_ids), np.int32(1)),
        }
        text = {name: batch[name] for name in ("src", "tgt")} if self.keep_text else {}
        return pa.table({**text, **ids})


def _append(lists: pa.ListArray, value: int) -> pa.ListArray:
    """`lists` with `value` appended to every list (lists built from Python: no offset, no nulls)."""
    offsets = lists.offsets.to_numpy()  # (N + 1,) int32
    values = np.insert(lists.values.to_numpy(zero_copy_only=False), offsets[1:], value).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets + np.arange(len(offsets), dtype=np.int32)), pa.array(values))


def _filter_masks(
    src_len: np.ndarray, tgt_len: np.ndarray, *, max_len: int | None, max_ratio: float
) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks (N,): too long, and (only among the rest) too unbalanced."""
    too_long = np.zeros(len(src_len), dtype=bool)
    if max_len is not None:
        too_long = (src_len > max_len) | (tgt_len > max_len)
    ratio = np.zeros_like(too_long)
    if max_ratio > 0:
        longer, shorter = np.maximum(src_len, tgt_len), np.maximum(np.minimum(src_len, tgt_len), 1)
        ratio = ~too_long & (longer > max_ratio * shorter)
    return too_long, ratio


def _keep(src_len: list[int], tgt_len: list[int], *, max_len: int | None, max_ratio: float) -> list[bool]:
    too_long, ratio = _filter_masks(np.asarray(src_len), np.asarray(tgt_len), max_len=max_len, max_ratio=max_ratio)
    return (~(too_long | ratio)).tolist()


def load_split(spec: CorpusConfig, data_cfg: DataConfig, *, cache_dir: str | Path | None) -> Any:
    """`load_pairs` of one of the config's splits, whose errors begin with its key (`data.train: text corpus not
    found: ...`, `data.train[1]: ...`), so that the line says which section to mend.

    Raises:
        DataError: as `load_pairs`.
    """
    try:
        return load_pairs(spec, src_lang=data_cfg.src_lang, tgt_lang=data_cfg.tgt_lang, cache_dir=cache_dir)
    except DataError as err:
        raise DataError(f"{_split_name(spec, data_cfg)}: {err}") from None


def _split_name(spec: CorpusConfig, data_cfg: DataConfig) -> str:
    """`data.train` (`data.train[i]` in a list), `data.valid` or `data.test.NAME`: how the config names this split."""
    corpora = data_cfg.train_corpora
    named = {"data.train" if len(corpora) == 1 else f"data.train[{i}]": spec for i, spec in enumerate(corpora)}
    named["data.valid"] = data_cfg.valid
    named.update({f"data.test.{k}": v for k, v in data_cfg.test.items()})
    for name, candidate in named.items():
        if candidate is spec:
            return name
    return next((name for name, candidate in named.items() if candidate == spec), "data")
