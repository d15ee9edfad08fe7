"""Token-budget batching: budgets, coverage, determinism, sharding and inference batches."""

from __future__ import annotations

import numpy as np
import pytest
from datasets import Dataset, Features, Value

from nmt.data.batching import TokenBatchSampler, inference_batches
from nmt.data.collate import Padding, Rounding, collate
from nmt.data.dataset import length_arrays

MAX_TOKENS = 400
ORDERS = ["lengths", "longer"]  # train.batch_order


@pytest.fixture(scope="module")
def lengths() -> tuple[np.ndarray, np.ndarray]:
    """3000 pairs of lengths 1..60, plus one pair longer than the budget."""
    rng = np.random.default_rng(0)
    src = rng.integers(1, 61, size=3000)
    tgt = np.clip(src + rng.integers(-5, 6, size=3000), 1, None)
    src[17] = MAX_TOKENS + 50
    return src, tgt


def sampler(lengths: tuple[np.ndarray, np.ndarray], **kwargs) -> TokenBatchSampler:
    return TokenBatchSampler(src_lens=lengths[0], tgt_lens=lengths[1], max_tokens=MAX_TOKENS, **kwargs)


def cost(batch: list[int], lengths: tuple[np.ndarray, np.ndarray]) -> int:
    src, tgt = lengths
    return len(batch) * int(max(src[batch].max(), tgt[batch].max()))


def test_budget_counts_padding_and_long_sentences_stand_alone(lengths) -> None:
    batches = sampler(lengths).batch_list(0)
    for batch in batches:
        assert cost(batch, lengths) <= MAX_TOKENS or len(batch) == 1
    assert [17] in batches
    # Bucketing: little of the budget goes to padding.
    real = sum(int(np.maximum(*lengths)[b].sum()) for b in batches)
    assert sum(cost(b, lengths) for b in batches) < 1.1 * real


@pytest.mark.parametrize("order", ORDERS)
def test_every_pair_once_per_epoch(lengths, order: str) -> None:
    s = sampler(lengths, order=order)
    for epoch in (0, 1):
        s.set_epoch(epoch)
        seen = sorted(i for batch in s for i in batch)
        assert seen == list(range(len(lengths[0])))
        assert len(s) == len(s.batch_list(epoch))


@pytest.mark.parametrize("order", ORDERS)
def test_same_seed_and_epoch_same_batches_otherwise_different(lengths, order: str) -> None:
    a, b = sampler(lengths, seed=3, order=order), sampler(lengths, seed=3, order=order)
    assert a.batch_list(0) == b.batch_list(0)
    assert a.batch_list(1) == b.batch_list(1)
    assert a.batch_list(0) != a.batch_list(1)
    assert sampler(lengths, seed=4, order=order).batch_list(1) != a.batch_list(1)
    b.set_epoch(1)
    assert list(b) == a.batch_list(1)


def test_without_shuffle_batches_go_longest_first(lengths) -> None:
    batches = sampler(lengths, shuffle=False).batch_list(5)
    longest = np.maximum(*lengths)
    flat = [i for batch in batches for i in batch]
    assert list(longest[flat]) == sorted(longest, reverse=True)
    assert batches == sampler(lengths, shuffle=False).batch_list(0)


def greedy_longest_first(longer: np.ndarray, max_tokens: int) -> list[list[int]]:
    """The rows sorted longest first (ties by index), cut greedily: each batch takes as many rows as its first,
    longest, row's length fits in `max_tokens` (at least one)."""
    order = sorted(range(len(longer)), key=lambda i: (-int(longer[i]), i))
    batches = []
    while order:
        take = max(1, max_tokens // int(longer[order[0]]))
        batches.append(order[:take])
        order = order[take:]
    return batches


def test_shuffling_reorders_the_same_batches_each_epoch_and_seed_and_off_keeps_them_longest_first() -> None:
    """Rows of distinct lengths cut into the same batches whatever the row shuffle: shuffling then changes the
    order of the batches only, differently for each epoch and seed (so an epoch does not start with its
    longest sentences every time); without shuffling they come longest first, the documented order."""
    rng = np.random.default_rng(5)
    longer = rng.permutation(np.arange(1, 61))  # 60 distinct lengths, in no order
    src, tgt = longer.copy(), np.maximum(longer - rng.integers(0, 3, size=60), 1)  # max(src, tgt) == longer
    expected = greedy_longest_first(longer, 120)
    assert len(expected) > 10

    def batches(epoch: int = 0, **kwargs) -> list[list[int]]:
        return list(TokenBatchSampler(src_lens=src, tgt_lens=tgt, max_tokens=120, **kwargs).batch_list(epoch))

    assert batches(shuffle=False) == expected
    assert batches(shuffle=False, seed=9) == expected
    orders = [batches(shuffle=True, seed=seed, epoch=epoch) for seed in (0, 1) for epoch in (0, 1, 2)]
    for order in orders:
        assert sorted(order) == sorted(expected)  # the same batches, row for row
        assert order != expected
    assert len({tuple(map(tuple, order)) for order in orders}) == len(orders)  # each epoch and seed its own order


def epoch_order(s: TokenBatchSampler, epoch: int) -> np.ndarray:
    """The rows of an epoch in the sorted order its batches were cut from, before the batches were shuffled."""
    return s.batch_list(epoch).order


@pytest.mark.parametrize("rounding", [Rounding(), Rounding(8), Rounding(8, relative=True)],
                         ids=["as-is", "multiple", "relative"])
def test_lengths_order_sorts_by_the_longer_side_then_source_then_target_each_rounded(lengths, rounding) -> None:
    src, tgt = lengths
    for epoch in (0, 1):
        order = epoch_order(sampler(lengths, rounding=rounding, order="lengths"), epoch)
        assert sorted(order.tolist()) == list(range(len(src)))
        keys = list(zip(-rounding(np.maximum(src, tgt))[order], rounding(src)[order], rounding(tgt)[order]))
        assert keys == sorted(keys)
    # pairs of equal keys come in a shuffled order, drawn afresh each epoch
    first, second = (epoch_order(sampler(lengths, rounding=rounding, order="lengths"), e).tolist() for e in (0, 1))
    assert first != second


def test_longer_order_sorts_by_the_longer_side_alone(lengths) -> None:
    src, tgt = lengths
    order = epoch_order(sampler(lengths, order="longer"), 0)
    longer = np.maximum(src, tgt)[order]
    assert (np.diff(longer) <= 0).all()
    assert (np.diff(src[order])[np.diff(longer) == 0] < 0).any()  # within a length the sources are not sorted


@pytest.mark.parametrize("rounding", [Rounding(), Rounding(8)], ids=["as-is", "multiple"])
def test_lengths_order_pads_free_batches_less_with_the_same_batch_sizes(lengths, rounding) -> None:
    """Each batch padded to its longest source and its longest target, as free shapes are: the lengths order
    computes fewer padding positions on both sides, while an epoch keeps its number of batches and their sizes
    (the same steps per epoch), since both cut the same sorted run of longer lengths."""
    src, tgt = lengths
    padded = {}
    for order in ORDERS:
        batches = sampler(lengths, rounding=rounding, order=order).batch_list(0)
        padded[order] = (sum(len(b) * rounding(int(src[b].max())) for b in batches),
                         sum(len(b) * rounding(int(tgt[b].max())) for b in batches),
                         sorted(len(b) for b in batches))
    assert padded["lengths"][0] < padded["longer"][0] and padded["lengths"][1] < padded["longer"][1]
    assert padded["lengths"][2] == padded["longer"][2]


def test_an_unknown_order_is_refused(lengths) -> None:
    with pytest.raises(ValueError, match="order .'source'. must be 'lengths' or 'longer'"):
        sampler(lengths, order="source")


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_rank_shards_are_disjoint_equal_and_cover_everything(lengths, world_size: int, order: str) -> None:
    n_single = len(sampler(lengths, order=order).batch_list(0))
    shards = [sampler(lengths, rank=r, world_size=world_size, order=order).batch_list(2) for r in range(world_size)]
    assert len({len(shard) for shard in shards}) == 1  # every rank steps the same number of times
    assert len(shards[0]) * world_size >= n_single
    seen = [i for shard in shards for batch in shard for i in batch]
    assert sorted(seen) == list(range(len(lengths[0])))  # disjoint and complete
    assert all(cost(b, lengths) <= MAX_TOKENS or len(b) == 1 for shard in shards for b in shard)


def test_split_to_divide_by_ranks_happens(lengths) -> None:
    """The fixture's batch count is not a multiple of 3, so the test above exercises splitting."""
    assert len(sampler(lengths).batch_list(2)) % 3 != 0


def test_fewer_pairs_than_ranks_repeat_batches() -> None:
    shards = [
        TokenBatchSampler(src_lens=[3, 4], tgt_lens=[3, 4], max_tokens=100, rank=r, world_size=3).batch_list(0)
        for r in range(3)
    ]
    assert [len(shard) for shard in shards] == [1, 1, 1]
    assert {i for shard in shards for batch in shard for i in batch} == {0, 1}


def test_weighted_corpora_take_each_row_weight_times_per_epoch(lengths) -> None:
    # rows 0..999 are one corpus taken 3 times, 1000..2999 another taken a fresh quarter of each epoch
    s = sampler(lengths, parts=[(1000, 3.0), (2000, 0.25)])
    shares = []
    for epoch in (0, 1):
        counts = np.bincount([i for batch in s.batch_list(epoch) for i in batch], minlength=3000)
        assert (counts[:1000] == 3).all()
        assert set(counts[1000:].tolist()) == {0, 1} and counts[1000:].sum() == 500
        shares.append(set(np.flatnonzero(counts[1000:]).tolist()))
        for batch in s.batch_list(epoch):
            assert cost(batch, lengths) <= MAX_TOKENS or len(batch) == 1
    assert shares[0] != shares[1]  # a different quarter each epoch
    again = sampler(lengths, parts=[(1000, 3.0), (2000, 0.25)])
    assert again.batch_list(1) == s.batch_list(1)  # and the same one for the same seed and epoch


def test_weights_of_one_are_the_unweighted_epoch(lengths) -> None:
    assert sampler(lengths, parts=[(1000, 1.0), (2000, 1.0)]).batch_list(1) == sampler(lengths).batch_list(1)


@pytest.mark.parametrize("world_size", [2, 3])
def test_weighted_shards_are_equal_and_cover_the_epoch(lengths, world_size: int) -> None:
    parts = [(2500, 0.5), (500, 2.0)]
    whole = sampler(lengths, parts=parts).batch_list(0)
    shards = [sampler(lengths, parts=parts, rank=r, world_size=world_size).batch_list(0) for r in range(world_size)]
    assert len({len(shard) for shard in shards}) == 1
    assert sorted(i for shard in shards for b in shard for i in b) == sorted(i for b in whole for i in b)


def test_a_tiny_weight_still_takes_a_pair_and_bad_parts_are_refused(lengths) -> None:
    counts = np.bincount([i for b in sampler(lengths, parts=[(2999, 1e-9), (1, 1.0)]).batch_list(0) for i in b])
    assert counts.sum() == 2 and counts[2999] == 1
    with pytest.raises(ValueError, match="adding up to the 3000 rows"):
        sampler(lengths, parts=[(1000, 1.0)])
    with pytest.raises(ValueError, match="finite number above 0"):
        sampler(lengths, parts=[(1000, 0.0), (2000, 1.0)])


def test_empty_dataset_and_bad_arguments() -> None:
    assert TokenBatchSampler(src_lens=[], tgt_lens=[], max_tokens=10).batch_list(0) == []
    with pytest.raises(ValueError, match=r"max_tokens \(0\)"):
        TokenBatchSampler(src_lens=[1], tgt_lens=[1], max_tokens=0)
    with pytest.raises(ValueError, match=r"rank \(2\)"):
        TokenBatchSampler(src_lens=[1], tgt_lens=[1], max_tokens=10, rank=2, world_size=2)
    with pytest.raises(ValueError, match="same length"):
        TokenBatchSampler(src_lens=[1, 2], tgt_lens=[1], max_tokens=10)


def test_lengths_straight_from_a_dataset() -> None:
    ds = Dataset.from_dict({"src_len": [3, 5, 2], "tgt_len": [4, 1, 2]}, features=Features(
        {"src_len": Value("int32"), "tgt_len": Value("int32")}))
    src_lens, tgt_lens = length_arrays(ds)
    s = TokenBatchSampler(src_lens=src_lens, tgt_lens=tgt_lens, max_tokens=10, shuffle=False)
    assert s.batch_list(0) == [[1, 0], [2]]  # 2 * 5 and 1 * 2 tokens


def test_a_lazy_dataset_column_is_refused_with_the_way_out() -> None:
    """`datasets` 5 columns are lazy: converting one walks every row through Python."""
    ds = Dataset.from_dict({"src_len": [3, 5, 2], "tgt_len": [4, 1, 2]}).with_format("numpy")
    with pytest.raises(TypeError, match="length_arrays"):
        TokenBatchSampler(src_lens=ds["src_len"], tgt_lens=ds["tgt_len"], max_tokens=10)


@pytest.mark.parametrize("rounding", [Rounding(8), Rounding(8, relative=True)], ids=["multiple", "relative"])
@pytest.mark.parametrize("world_size", [1, 3])
def test_rounded_lengths_keep_the_padded_budget_and_fill_one_shape_per_bucket(lengths, world_size, rounding) -> None:
    padding = Padding(multiple=8, fill_tokens=MAX_TOKENS, relative=rounding.relative)
    assert padding.sampler_rounding == rounding
    shards = [sampler(lengths, rounding=rounding, rank=r, world_size=world_size).batch_list(1)
              for r in range(world_size)]
    assert sorted(i for shard in shards for b in shard for i in b) == list(range(len(lengths[0])))
    src, tgt = lengths
    shapes = set()
    for batch in (b for shard in shards for b in shard):
        padded = rounding(max(int(src[batch].max()), int(tgt[batch].max())))
        assert len(batch) * padded <= MAX_TOKENS or len(batch) == 1  # the budget holds for padded tensors
        rows = [{"src_ids": [5] * int(src[i]), "tgt_ids": [6] * (int(tgt[i]) - 1)} for i in batch]
        b = collate(rows, batch, padding=padding)
        assert b.src.shape[1] == b.tgt_in.shape[1] == padded and b.ntokens == int(tgt[batch].sum())
        assert b.size == max(len(batch), MAX_TOKENS // padded)
        assert b.indices.tolist() == batch + [-1] * (b.size - len(batch))
        shapes.add(tuple(b.src.shape))
    # one shape per length bucket, however many batches (a bucket of a few short pairs may have none of its own:
    # they end the batch of a longer bucket)
    assert len(shapes) == len({length for _, length in shapes})
    assert {length for _, length in shapes} <= {rounding(int(n)) for n in np.maximum(src, tgt)}


# --------------------------------------------------------------------------- inference


def test_inference_batches_cover_all_indices_once_under_budget() -> None:
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 80, size=1000).tolist()
    lengths[5] = 500
    batches = inference_batches(lengths, 300)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    assert batches[0] == [5]
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 300 or len(b) == 1
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(lengths, reverse=True)
    assert inference_batches([], 100) == []
