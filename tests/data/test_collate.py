"""Batches and their padding: rounded lengths, filled shapes, collate, and one buffer per batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from datasets import Dataset

from nmt.data.collate import Batch, Padding, Rounding, collate
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


def test_relative_rounding_adds_under_an_eighth_in_steps_of_powers_of_two_up_to_the_multiple() -> None:
    n = np.arange(1, 2000)
    for multiple in (1, 2, 8, 12, 16):
        rounded = Rounding(multiple, relative=True)(n)
        assert [Rounding(multiple, relative=True)(int(k)) for k in n] == rounded.tolist()  # ints as arrays
        assert (rounded >= n).all() and (np.diff(rounded) >= 0).all()  # never lower, never out of order
        assert (Rounding(multiple, relative=True)(rounded) == rounded).all()  # a rounded length stays
        step = 1 << (multiple.bit_length() - 1)  # 12 rounds in steps of at most 8
        assert (rounded - n < step).all() and (rounded % np.minimum(step, 2 ** np.floor(np.log2(np.maximum(n // 8, 1)))) == 0).all()
        assert ((rounded - n) * 8 < n).all()  # under an eighth of the length
    relative = Rounding(8, relative=True)
    assert [relative(k) for k in (9, 15, 16, 17, 31, 33, 63, 65, 100)] == [9, 15, 16, 18, 32, 36, 64, 72, 104]
    assert len(np.unique(relative(n[:256]))) == 16 + 8 + 8 + 24  # 1 to 16, 8 buckets an octave to 64, then steps of 8
    plain = Rounding(8)
    assert [plain(k) for k in (1, 8, 9, 17)] == [8, 8, 16, 24] and (plain(n) == -(-n // 8) * 8).all()
    assert Rounding(1)(n) is n and Rounding(1, relative=True)(7) == 7
    assert str(relative) == "lengths rounded up in steps of at most 8, an eighth of the length"
    with pytest.raises(ValueError, match="multiple"):
        Rounding(0)


def test_filled_pairs_are_eos_alone_with_nothing_to_predict() -> None:
    b = collate([{"index": 4, "src_ids": [10, EOS_ID], "tgt_ids": [20]}], padding=Padding(multiple=4, fill_tokens=12))
    assert b.src.tolist() == [[10, EOS_ID, PAD_ID, PAD_ID]] + [[EOS_ID, PAD_ID, PAD_ID, PAD_ID]] * 2
    assert b.src_pad_mask.tolist() == [[False, False, True, True]] + [[False, True, True, True]] * 2
    assert b.tgt_in.tolist() == [[BOS_ID, 20, PAD_ID, PAD_ID]] + [[BOS_ID, PAD_ID, PAD_ID, PAD_ID]] * 2
    assert b.tgt_out.tolist() == [[20, EOS_ID, PAD_ID, PAD_ID]] + [[PAD_ID] * 4] * 2
    assert b.indices.tolist() == [4, -1, -1] and b.ntokens == 2 and b.shape == (3, 4, 4)
    with pytest.raises(ValueError, match="multiple"):
        Padding(multiple=0)
    assert Padding(multiple=8).sampler_rounding == Rounding() and Padding(multiple=8, fill_tokens=64).sampler_rounding == Rounding(8)


def test_filled_batches_fill_whole_attention_rows_when_sentences_share_them() -> None:
    """`pack`: the rows of a filled batch are a multiple of the sentences one attention row holds, so that
    `sentences_per_row` lays as many side by side as fit; the sampler's batches never exceed them."""
    from nmt.models.masks import sentences_per_row

    for length in range(1, 80):
        plain = Padding(fill_tokens=4096).shape(1, length, length)
        packed = Padding(fill_tokens=4096, pack=128).shape(1, length, length)
        per_row = max(1, 128 // length)
        assert packed[1:] == plain[1:] and plain[0] <= packed[0] < plain[0] + per_row and packed[0] % per_row == 0
        assert sentences_per_row(packed[0], length, 128) == min(per_row, packed[0])
    assert Padding(fill_tokens=4096, pack=128).shape(1, 18, 9)[0] == 231  # 227 sentences of 18 -> 33 rows of 7
    assert Padding(pack=128).shape(5, 18, 9) == (5, 18, 9)  # shapes left to the batch: nothing filled
    with pytest.raises(ValueError, match=r"pack \(-1\) at least 0"):
        Padding(pack=-1)


# --------------------------------------------------------------------------- collate


def test_collate_places_bos_eos_and_padding() -> None:
    rows = [
        {"index": 7, "src_ids": [10, 11, EOS_ID], "tgt_ids": [20]},
        {"index": 2, "src_ids": [12, EOS_ID], "tgt_ids": [21, 22, 23]},
    ]
    b = collate(rows)
    assert b.src.tolist() == [[10, 11, EOS_ID], [12, EOS_ID, PAD_ID]]
    assert b.src_pad_mask.tolist() == [[False, False, False], [False, False, True]]  # True = pad
    assert b.tgt_in.tolist() == [[BOS_ID, 20, PAD_ID, PAD_ID], [BOS_ID, 21, 22, 23]]
    assert b.tgt_out.tolist() == [[20, EOS_ID, PAD_ID, PAD_ID], [21, 22, 23, EOS_ID]]
    assert b.indices.tolist() == [7, 2]
    assert b.src.dtype == b.tgt_in.dtype == b.indices.dtype == torch.long
    assert b.src_pad_mask.dtype == torch.bool
    assert (b.size, b.ntokens) == (2, 6)


def test_collate_takes_dataset_columns_with_indices() -> None:
    ds = Dataset.from_dict({"src_ids": [[5, EOS_ID], [6, 7, EOS_ID]], "tgt_ids": [[8, 9], []], "src": ["a", "b"]})
    b = collate(ds[[1, 0]], [1, 0])
    assert b.src.tolist() == [[6, 7, EOS_ID], [5, EOS_ID, PAD_ID]]
    assert b.tgt_in.tolist() == [[BOS_ID, PAD_ID, PAD_ID], [BOS_ID, 8, 9]]
    assert b.tgt_out.tolist() == [[EOS_ID, PAD_ID, PAD_ID], [8, 9, EOS_ID]]
    assert b.indices.tolist() == [1, 0] and b.ntokens == 4
    moved = b.to("cpu")
    assert isinstance(moved, Batch) and torch.equal(moved.tgt_out, b.tgt_out) and moved.ntokens == 4


def _one_storage(b: Batch) -> bool:
    tensors = (b.src, b.src_pad_mask, b.tgt_in, b.tgt_out, b.indices)
    return len({t.untyped_storage().data_ptr() for t in tensors}) == 1


@pytest.mark.parametrize("rows", [1, 2, 3, 5])
def test_each_tensor_of_a_batch_starts_on_a_16_byte_boundary_of_its_buffer(rows: int) -> None:
    """Compiled kernels copy inputs that are not 16-byte aligned; odd sizes must not shift the later tensors."""
    b = collate([{"index": i, "src_ids": [5] * (i % 3) + [EOS_ID], "tgt_ids": [6] * i} for i in range(rows)])
    assert _one_storage(b)
    assert all(t.data_ptr() % 16 == 0 for t in (b.src, b.src_pad_mask, b.tgt_in, b.tgt_out, b.indices))


def test_a_batch_crosses_from_a_loader_worker_as_one_buffer_and_unchanged() -> None:
    """A batch's tensors are views of one buffer, so a worker sends one shared-memory segment, not five."""
    from nmt.train.data import batch_loader

    rng = np.random.default_rng(3)
    ds = Dataset.from_dict({"src_ids": [rng.integers(4, 50, size=rng.integers(1, 9)).tolist() + [EOS_ID]
                                        for _ in range(40)],
                            "tgt_ids": [rng.integers(4, 50, size=rng.integers(0, 9)).tolist() for _ in range(40)]})
    lists = [list(range(i, i + 8)) for i in range(0, 40, 8)]
    padding = Padding(multiple=8, fill_tokens=256)
    here = list(batch_loader(ds, lists, num_workers=0, padding=padding))
    there = list(batch_loader(ds, lists, num_workers=1, padding=padding))  # built in another process
    assert len(here) == len(there) == 5
    for a, b in zip(here, there, strict=True):
        assert _one_storage(a) and _one_storage(b)
        for name in ("src", "src_pad_mask", "tgt_in", "tgt_out", "indices"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert a.src_pad_mask.dtype == torch.bool and a.ntokens == b.ntokens
        assert torch.equal(a.src_pad_mask, a.src.eq(PAD_ID))  # padding exactly where the mask says
        rows, length = a.src.shape  # filled with empty pairs to the static shape
        assert rows * length == 256 and rows > 8 and a.indices[8:].eq(-1).all()


def test_a_clone_has_a_buffer_of_its_own_which_copy_rewrites_in_place() -> None:
    """What a recorded update (`train.cuda_graphs`) reads its batches from: a clone, rewritten by each batch."""
    padding = Padding(multiple=8, fill_tokens=64)
    first = collate([{"index": i, "src_ids": [5 + i] * i + [EOS_ID], "tgt_ids": [6] * i} for i in range(3)],
                    padding=padding)
    second = collate([{"index": i, "src_ids": [9] * (i + 2) + [EOS_ID], "tgt_ids": [7, 8]} for i in range(5)],
                     padding=padding)
    names = ("src", "src_pad_mask", "tgt_in", "tgt_out", "indices")
    assert all(getattr(first, n).shape == getattr(second, n).shape for n in names)  # one static shape
    kept = first.clone()
    assert _one_storage(kept) and kept.src.untyped_storage().data_ptr() != first.src.untyped_storage().data_ptr()
    pointers = [getattr(kept, n).data_ptr() for n in names]
    kept.copy_(second)
    assert [getattr(kept, n).data_ptr() for n in names] == pointers  # in place
    assert all(torch.equal(getattr(kept, n), getattr(second, n)) for n in names)
    assert not torch.equal(first.src, second.src)  # the clone's source is untouched
    separate = Batch(**{n: getattr(first, n).clone() for n in names}, ntokens=first.ntokens)  # five storages
    separate.copy_(second)
    assert all(torch.equal(getattr(separate, n), getattr(second, n)) for n in names)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pin_memory_and_transfer() -> None:
    b = collate([{"index": 0, "src_ids": [5, EOS_ID], "tgt_ids": [6]}]).pin_memory()
    assert b.src.is_pinned() and b.src_pad_mask.is_pinned() and b.indices.is_pinned() and _one_storage(b)
    on_gpu = b.to("cuda", non_blocking=True)
    assert on_gpu.tgt_in.is_cuda and on_gpu.tgt_in.cpu().tolist() == [[BOS_ID, 6]] and _one_storage(on_gpu)
    assert on_gpu.src_pad_mask.cpu().tolist() == [[False, False]] and on_gpu.indices.cpu().tolist() == [0]
