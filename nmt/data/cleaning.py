"""Cleaning a corpus in Arrow compute: whitespace folded as translation folds it, and each pair with an
empty side dropped whole (`clean_pairs`); and the settings every map over a split shares
(`WRITER_BATCH_ROWS`, `processes_for`)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset

from nmt.data.fields import PAIR_FEATURES

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
