"""The columns of a parallel corpus: the two string columns every source yields (`PAIR_FEATURES`), and
the one rule that finds them among the columns of a tsv, jsonl, parquet, disk or hf source
(`resolve_fields`, `select_fields`)."""

from __future__ import annotations

from collections.abc import Sequence

from datasets import Dataset, Features, Value

from nmt.config import CorpusConfig
from nmt.errors import DataError

PAIR_FEATURES = Features({"src": Value("string"), "tgt": Value("string")})
TEXT_TYPES = ("string", "large_string")


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
        if not isinstance(feature, Value) or feature.dtype not in TEXT_TYPES:
            raise DataError(f"{where}: column {col!r} holds {feature}, not text")
    ds = ds.select_columns([src_col, tgt_col]).rename_columns({src_col: "src", tgt_col: "tgt"})
    return ds.cast(PAIR_FEATURES) if ds.features != PAIR_FEATURES else ds
