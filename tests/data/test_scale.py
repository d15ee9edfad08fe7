"""Scale: lengths come out of Arrow as arrays and batches are built without per-row Python work.

With `datasets` 5 a formatted column is a lazy `Column`; turning it into an array walks
every row through the formatter in Python, which took minutes at a million pairs. These
tests count the Python function calls of the whole path from a `Dataset` to an epoch of
batches: a per-row step shows up as calls that grow with the row count.
"""

from __future__ import annotations

import pickle
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset, Features, Value
from datasets.table import InMemoryTable

import nmt.data.cleaning as cleaning_module
import nmt.data.sample as sample_module
from nmt.config import CorpusConfig, DataConfig, config_from_dict
from nmt.data.batching import TokenBatchSampler, _chunk_bounds
from nmt.data.dataset import length_arrays, prepare_split
from nmt.data.sample import draw_tokenizer_sample, in_child_process, write_tokenizer_sample
from nmt.errors import DataError
from nmt.train.data import build_sampler, prepare_run
from tests.conftest import tiny_config_dict
from tests.data.child_calls import allocate_and_sum, fail

LEN_FEATURES = Features({"src_len": Value("int32"), "tgt_len": Value("int32")})


def length_dataset(n: int, seed: int = 0) -> Dataset:
    """`n` rows of lengths 1..100, kept by a filter-like `select` so the rows go through an indices mapping."""
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 101, size=n + n // 4, dtype=np.int32)
    tgt = np.clip(src + rng.integers(-5, 6, size=len(src)), 1, None).astype(np.int32)
    ds = Dataset.from_dict({"src_len": src, "tgt_len": tgt}, features=LEN_FEATURES)
    keep = np.sort(rng.choice(len(src), size=n, replace=False))
    return ds.select(keep)


def python_calls(fn: Callable[[], object]) -> int:
    """Python-level function calls made while `fn` runs (C calls are not counted)."""
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        calls += event == "call"

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def epoch_from_dataset(ds: Dataset) -> None:
    sampler = build_sampler(ds, max_tokens=4096, shuffle=True, seed=1, rank=1, world_size=3)
    sampler.batch_list(0)


def test_lengths_are_int32_arrays_straight_from_arrow_in_row_order() -> None:
    ds = length_dataset(5_000)
    src, tgt = length_arrays(ds)
    assert isinstance(src, np.ndarray) and src.dtype == np.int32 and src.shape == (len(ds),)
    assert tgt.dtype == np.int32 and src.flags.c_contiguous
    assert src.tolist() == ds["src_len"][:] and tgt.tolist() == ds["tgt_len"][:]  # the selected rows, in order


def test_an_epoch_of_200000_rows_costs_no_per_row_python_calls() -> None:
    small_ds, large_ds = length_dataset(20_000), length_dataset(200_000)
    small = python_calls(lambda: epoch_from_dataset(small_ds))
    large = python_calls(lambda: epoch_from_dataset(large_ds))
    # Ten times the rows, about the same calls (a few per distinct length): nothing runs once per row.
    assert large < small + 200, (small, large)
    assert large < 2_000, large


def test_the_call_count_sees_per_row_work() -> None:
    """The counter of the test above catches the old path: `np.asarray` of a lazy formatted column."""
    ds = length_dataset(2_000).with_format("numpy")
    calls = python_calls(lambda: np.asarray(ds["src_len"]))
    assert calls > 2_000


def test_the_sampler_is_handed_the_arrow_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}
    original = TokenBatchSampler.__init__

    def spy(self, **kwargs):
        seen.update(kwargs)
        original(self, **kwargs)

    monkeypatch.setattr(TokenBatchSampler, "__init__", spy)
    ds = length_dataset(1_000)
    build_sampler(ds, max_tokens=100, shuffle=False, seed=0)
    assert isinstance(seen["src_lens"], np.ndarray) and seen["src_lens"].dtype == np.int32
    assert isinstance(seen["tgt_lens"], np.ndarray) and seen["tgt_lens"].dtype == np.int32


def reference_bounds(lengths_desc: np.ndarray, max_tokens: int) -> list[int]:
    """The greedy cut, one row at a time: each batch takes `max_tokens // its first length` rows."""
    bounds, i = [0], 0
    while i < len(lengths_desc):
        i = min(len(lengths_desc), i + max(1, max_tokens // max(1, int(lengths_desc[i]))))
        bounds.append(i)
    return bounds


@pytest.mark.parametrize("seed", range(6))
def test_vectorised_cut_points_equal_the_greedy_cut(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 3_000))
    high = int(rng.choice([3, 60, 500]))  # few distinct lengths, many, and some above the budget
    lengths = np.sort(rng.integers(0, high, size=n))[::-1]
    max_tokens = int(rng.choice([1, 7, 100, 400]))
    assert _chunk_bounds(lengths, max_tokens).tolist() == reference_bounds(lengths, max_tokens)


def test_resuming_mid_epoch_slices_the_epoch_without_building_it_again() -> None:
    src, tgt = length_arrays(length_dataset(3_000))
    sampler = TokenBatchSampler(src_lens=src, tgt_lens=tgt, max_tokens=400, seed=5)
    epoch = sampler.batch_list(2)
    rest = sampler.batch_list(2)[7:]
    assert rest.order is epoch.order  # a view of the same int32 order, not a copy
    assert epoch.order.dtype == np.int32
    assert list(rest) == list(epoch)[7:]
    # A new sampler (a new process resuming) computes the same epoch and the same rest.
    again = TokenBatchSampler(src_lens=src, tgt_lens=tgt, max_tokens=400, seed=5).batch_list(2)[7:]
    assert list(again) == list(rest)


def text_dataset(n: int) -> Dataset:
    src = [f"quelle {i}" for i in range(n)]
    tgt = [f"ziel {i}" for i in range(n)]
    return Dataset.from_dict({"src": src, "tgt": tgt})


def test_tokenizer_sample_is_bounded_reproducible_aligned_and_in_corpus_order(tmp_path) -> None:
    ds = text_dataset(5_000).select(range(0, 5_000, 2))  # rows through an indices mapping, like a filter's
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir(), (tmp_path / "c").mkdir()
    src, tgt = write_tokenizer_sample(ds, 300, seed=4, folder=tmp_path / "a")
    lines = src.read_text(encoding="utf-8").splitlines()
    numbers = [int(line.split()[1]) for line in lines]
    assert len(lines) == 300 and numbers == sorted(numbers) and all(k % 2 == 0 for k in numbers)
    assert [f"ziel {k}" for k in numbers] == tgt.read_text(encoding="utf-8").splitlines()  # same pairs
    again, _ = write_tokenizer_sample(ds, 300, seed=4, folder=tmp_path / "b")
    other, _ = write_tokenizer_sample(ds, 300, seed=5, folder=tmp_path / "c")
    assert again.read_bytes() == src.read_bytes() != other.read_bytes()


def test_tokenizer_sample_of_a_small_corpus_is_all_of_it_one_sentence_per_line(tmp_path) -> None:
    ds = Dataset.from_dict({"src": ["a b", "two\nlines", "c"], "tgt": ["x", "y", "z"]})
    src, tgt = write_tokenizer_sample(ds, 10, seed=0, folder=tmp_path)
    assert src.read_text(encoding="utf-8") == "a b\ntwo lines\nc\n"
    assert tgt.read_text(encoding="utf-8") == "x\ny\nz\n"


def test_tokenizer_sample_makes_no_python_call_per_sentence(tmp_path) -> None:
    small_ds, large_ds = text_dataset(2_000), text_dataset(150_000)
    (tmp_path / "s").mkdir(), (tmp_path / "l").mkdir()
    small = python_calls(lambda: write_tokenizer_sample(small_ds, 100_000, seed=0, folder=tmp_path / "s"))
    large = python_calls(lambda: write_tokenizer_sample(large_ds, 100_000, seed=0, folder=tmp_path / "l"))
    assert large < small + 300, (small, large)


def test_a_large_corpus_is_sampled_in_a_child_process_and_a_small_one_in_this_one(tmp_path, monkeypatch) -> None:
    """The same sample either way; a child process (a second or two to start) only for a corpus of over
    `SAMPLE_IN_PROCESS_BYTES`, whose pages it keeps out of this process."""
    def children_cpu() -> float:
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        return used.ru_utime + used.ru_stime

    ds = text_dataset(5_000)
    (tmp_path / "here").mkdir(), (tmp_path / "child").mkdir()
    before = children_cpu()
    here, _ = draw_tokenizer_sample(ds, 300, seed=1, folder=tmp_path / "here")
    assert children_cpu() == before
    monkeypatch.setattr(sample_module, "SAMPLE_IN_PROCESS_BYTES", ds.data.nbytes - 1)
    child, _ = draw_tokenizer_sample(ds, 300, seed=1, folder=tmp_path / "child")
    assert children_cpu() > before  # a Python process ran and ended
    assert child.read_bytes() == here.read_bytes() and len(here.read_text(encoding="utf-8").splitlines()) == 300


def test_the_prepared_training_split_is_memory_mapped_so_batch_workers_share_it(small_corpus, tmp_path) -> None:
    """Workers get the split by fork or by pickle: either way they map the same files, never a copy."""
    raw = tiny_config_dict(small_corpus, tmp_path / "run")
    raw["data"]["max_len"] = 12  # drops some pairs: the split then reads through an indices mapping
    cfg = config_from_dict(raw)
    train = prepare_run(cfg, tmp_path / "run").train
    assert train.cache_files and all(Path(f["filename"]).is_relative_to(tmp_path / "run") for f in train.cache_files)
    assert not any(isinstance(t, InMemoryTable) for t in _leaf_tables(train.data))
    payload = pickle.dumps(train)
    assert len(payload) < 20_000 < train.data.nbytes  # file names, not rows
    again = pickle.loads(payload)
    assert again[:5] == train[:5] and length_arrays(again)[0].tolist() == length_arrays(train)[0].tolist()
    sampler = build_sampler(train, max_tokens=400, shuffle=True, seed=0)
    assert len(pickle.dumps(sampler.batch_list(0))) < 8 * len(train) + 10_000  # int32 order and bounds


def _leaf_tables(table):
    blocks = getattr(table, "blocks", None)
    return [t for row in blocks for t in row] if blocks else [table]


def test_a_child_process_returns_its_result_and_keeps_its_memory_out_of_this_process() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert in_child_process(allocate_and_sum, 300) == 300 << 20
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < (100 << 10)  # KiB: not the child's 300 MB
    with pytest.raises(DataError, match="a clear message"):
        in_child_process(fail, "a clear message")


def test_the_tokenizer_sample_is_drawn_without_importing_torch(tmp_path) -> None:
    """The child that draws the sample imports `nmt.data.sample` alone: importing torch there cost every training
    start about 2 s."""
    script = ("import sys\nfrom pathlib import Path\nfrom datasets import Dataset\n"
              "from nmt.data.sample import write_tokenizer_sample\n"
              "ds = Dataset.from_dict({'src': ['a b', 'c'], 'tgt': ['d', 'e f']})\n"
              "src, tgt = write_tokenizer_sample(ds, 10, seed=0, folder=Path(sys.argv[1]))\n"
              "print(src.read_text() + tgt.read_text(), end='')\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout == "a b\nc\nd\ne f\n[]\n"


def test_cleaning_and_tokenizing_in_several_processes_give_the_same_split(tmp_path, tokenizer, corpus,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cleaning_module, "MIN_ROWS_PER_PROCESS", 50)  # 400 pairs: several processes
    de, en = corpus
    de, en = [*de[:100], "  ", *de[100:]], [*en[:100], "x", *en[100:]]  # one pair to clean away
    (tmp_path / "c.de").write_text("\n".join(de) + "\n", encoding="utf-8")
    (tmp_path / "c.en").write_text("\n".join(en) + "\n", encoding="utf-8")
    spec = CorpusConfig(kind="text", path=str(tmp_path / "c"))
    cfg = DataConfig(train=spec, valid=spec, max_len=12)
    one, one_report = prepare_split(spec, cfg, tokenizer, cache_dir=tmp_path / "one", train=True, num_proc=1)
    two, two_report = prepare_split(spec, cfg, tokenizer, cache_dir=tmp_path / "two", train=True, num_proc=2)
    assert len(two.cache_files) > len(one.cache_files)  # the maps did run in two processes
    assert one_report == two_report and one_report["empty"] == 1 and one_report["too_long"] > 0
    assert one[:] == two[:]
