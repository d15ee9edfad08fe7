"""The text a tokenizer trains on, drawn from a cleaned corpus, in a child process for a large one.

Drawing rows from all over a memory-mapped corpus touches its pages; in a child process
they, and every buffer the drawing allocates, go away with it instead of staying
resident in the training process. This module imports no torch, so the child takes about
a second (reading the corpus needs `datasets`), where importing torch took three.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nmt.errors import DataError

if TYPE_CHECKING:
    from datasets import Dataset

T = TypeVar("T")

SAMPLE_CHUNK = 100_000
"""Sentences joined into one write of the tokenizer's sample."""

SAMPLE_IN_PROCESS_BYTES = 32 << 20
"""Largest corpus (Arrow bytes of both sides) whose sample is drawn in the calling process. Below it a child
costs more than it saves: starting one took 1.9 s (mostly importing `datasets`), where drawing in the
training process left 4.9 MiB more resident for Multi30k (4 MiB of text) and 25 MiB for eight times it."""


def draw_tokenizer_sample(ds: Dataset, k: int, *, seed: int, folder: Path) -> tuple[Path, Path]:
    """`write_tokenizer_sample`, in a child process (`in_child_process`) for a corpus of over
    `SAMPLE_IN_PROCESS_BYTES`, whose pages would otherwise stay resident in this one."""
    if ds.data.nbytes <= SAMPLE_IN_PROCESS_BYTES:
        return write_tokenizer_sample(ds, k, seed=seed, folder=folder)
    return in_child_process(write_tokenizer_sample, ds, k, seed=seed, folder=folder)


def write_tokenizer_sample(ds: Dataset, k: int, *, seed: int, folder: Path) -> tuple[Path, Path]:
    """Write the text the tokenizer trains on: every pair, or k pairs drawn at random.

    The rows are drawn as one NumPy array of row numbers (seeded, sorted to corpus
    order), taken from the memory-mapped Arrow table in one call, and written out by
    Arrow in chunks: not one sentence becomes a Python string, however large the corpus
    or the sample.

    Args:
        ds: cleaned pairs (`src`, `tgt`).
        k: most pairs to use (`tokenizer.max_sentences`).
        seed: fixes the sample.
        folder: where `src.txt` and `tgt.txt` are written, one sentence per line
            (a line break inside a sentence becomes a space).

    Returns:
        The paths of the source and the target file.
    """
    n = len(ds)
    table = ds.data.table.select(["src", "tgt"])
    if n > k or ds._indices is not None:
        rows = np.arange(n) if n <= k else np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))
        if ds._indices is not None:  # rows of a select/filter result, as rows of the table behind it
            rows = ds._indices.column(0).to_numpy()[rows]
        table = table.take(pa.array(rows))
    paths = (Path(folder) / "src.txt", Path(folder) / "tgt.txt")
    for name, path in zip(("src", "tgt"), paths):
        with open(path, "wb") as f:
            for start in range(0, len(table), SAMPLE_CHUNK):
                text = pc.replace_substring(table.column(name).slice(start, SAMPLE_CHUNK).combine_chunks(), "\n", " ")
                lines = pa.ListArray.from_arrays(pa.array([0, len(text)], pa.int32()), text)
                f.write(pc.binary_join(lines, "\n")[0].as_buffer())
                f.write(b"\n")
    return paths


def in_child_process(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`, run in a fresh Python process; arguments and result travel pickled.

    For one-off passes over a memory-mapped corpus: every page the child touches, and
    every buffer it allocates, goes away with it instead of staying resident in the
    training process. A `Dataset` whose tables live in files pickles as their paths, so
    the child maps the same files. A fresh interpreter rather than a fork: forking a
    process that runs threads (torch, Arrow, a process group) can leave the child
    waiting forever on a lock some thread held.

    Args:
        fn: a module-level function (pickled by reference).

    Raises:
        Whatever `fn` raises; DataError when the child dies without a result.
    """
    with tempfile.TemporaryDirectory(prefix="nmt-child-") as folder:
        call, result = Path(folder) / "call.pkl", Path(folder) / "result.pkl"
        call.write_bytes(pickle.dumps((fn, args, kwargs)))
        package_root = str(Path(__file__).resolve().parents[2])  # where `nmt` is importable from
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
        job = subprocess.run([sys.executable, "-c", _RUN_CALL, str(call), str(result)], env=env,
                             capture_output=True, text=True)
        if job.returncode != 0 or not result.is_file():
            detail = job.stderr.strip().splitlines()[-1] if job.stderr.strip() else f"exit status {job.returncode}"
            raise DataError(f"the process running {fn.__name__} ended without a result ({detail}); "
                            "if it was killed for memory, lower tokenizer.max_sentences")
        ok, value = pickle.loads(result.read_bytes())
    if not ok:
        raise value
    return value


_RUN_CALL = """
import pickle, sys
fn, args, kwargs = pickle.load(open(sys.argv[1], 'rb'))
try:
    out = (True, fn(*args, **kwargs))
except Exception as err:
    out = (False, err)
pickle.dump(out, open(sys.argv[2], 'wb'))
"""
