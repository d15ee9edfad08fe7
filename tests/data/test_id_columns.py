"""IdColumns gathers batch rows straight from Arrow: the same batches as `collate(dataset[indices])`, on
memory-mapped, chunked, concatenated, filtered and shuffled splits."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from datasets import Dataset, Features, Value, concatenate_datasets, load_from_disk

from nmt.data.collate import Padding, collate, collate_flat
from nmt.data.dataset import ID_FEATURES, IdColumns
from nmt.data.tokenizer import EOS_ID


def _split(rng: np.random.Generator, n: int, first_id: int) -> Dataset:
    src = [list(rng.integers(4, 100, rng.integers(0, 12))) + [EOS_ID] for _ in range(n)]
    tgt = [list(rng.integers(4, 100, rng.integers(0, 12))) for _ in range(n)]  # some targets empty
    return Dataset.from_dict({"src_ids": src, "tgt_ids": tgt, "src_len": [len(s) for s in src],
                              "tgt_len": [len(t) + 1 for t in tgt], "id": list(range(first_id, first_id + n))},
                             features=Features({**ID_FEATURES, "id": Value("int32")}))


@pytest.fixture(scope="module")
def splits(tmp_path_factory) -> dict[str, Dataset]:
    rng = np.random.default_rng(0)
    folder = tmp_path_factory.mktemp("split")
    # many files of about 56 rows, each its own chunk: a few rows come from as many chunks (a view per row),
    # hundreds from few (a gather per chunk); IdColumns takes both ways
    _split(rng, 500, 0).save_to_disk(str(folder), max_shard_size="4KB")
    mapped = load_from_disk(str(folder))
    assert mapped.data.column("src_ids").num_chunks > 3
    joined = concatenate_datasets([mapped, _split(rng, 50, 500), mapped.select(range(100, 140))])
    return {
        "memory-mapped": mapped,
        "concatenated": joined,
        "filtered": joined.filter(lambda r: r["src_len"] > 3),  # an indices mapping over the table
        "shuffled": mapped.shuffle(seed=1),
        "sliced": mapped.select(range(37, 300)),
    }


FIELDS = ("src", "src_pad_mask", "tgt_in", "tgt_out", "indices")


@pytest.mark.parametrize("name", ["memory-mapped", "concatenated", "filtered", "shuffled", "sliced"])
@pytest.mark.parametrize("padding", [Padding(), Padding(multiple=8), Padding(multiple=4, fill_tokens=256)])
def test_gathered_batches_are_those_of_the_dataset_rows(splits, name, padding):
    ds = splits[name]
    ids = IdColumns(ds)
    rng = np.random.default_rng(1)
    for size in (1, 7, 20, len(ds)):
        indices = [int(i) for i in rng.choice(len(ds), size, replace=False)]
        fast = collate_flat(*ids.gather(indices), indices, padding=padding)
        slow = collate(ds[indices], indices, padding=padding)
        assert all(torch.equal(getattr(fast, f), getattr(slow, f)) for f in FIELDS), (name, size)
        assert fast.ntokens == slow.ntokens and fast.src.dtype == torch.long


def test_no_rows_make_an_empty_batch(splits):
    src, src_lens, tgt, tgt_lens = IdColumns(splits["filtered"]).gather([])
    assert len(src) == len(src_lens) == len(tgt) == len(tgt_lens) == 0
    assert collate_flat(src, src_lens, tgt, tgt_lens, []).src.shape == (0, 0)


def test_pickled_it_carries_the_file_paths_not_the_ids(splits):
    ds = splits["memory-mapped"]
    ids = IdColumns(ds)
    copy = pickle.loads(pickle.dumps(ids))
    rows = [3, 400, 17]
    assert all(np.array_equal(a, b) for a, b in zip(copy.gather(rows), ids.gather(rows), strict=True))
    ids_bytes = sum(v.nbytes for column in ids.columns for v in column.values)
    assert len(pickle.dumps(ids)) < ids_bytes / 2
