"""A batch of sentence pairs and how it is padded: `Batch`, the `Rounding` of its lengths, its `Padding`,
and `collate`, which pads tokenized pairs into one.

Shapes: B sentences, S source length (EOS included), T target length (ids + 1).

Which pairs go into a batch is decided in `nmt.data.batching`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import torch
from torch import Tensor

from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


@dataclass
class Batch:
    """One padded batch of sentence pairs.

    Attributes:
        src: source ids followed by EOS, PAD after, (B, S) long.
        src_pad_mask: True at source padding, (B, S) bool.
        tgt_in: decoder input: BOS then target ids, PAD after, (B, T) long.
        tgt_out: decoder output: target ids then EOS, PAD after, (B, T) long.
        indices: dataset row of each sentence, -1 for the empty pairs that fill a batch
            to a fixed shape (`Padding.fill_tokens`), (B,) long.
        ntokens: non-pad target tokens (a plain int, so reading it never waits on a GPU).

    `collate_flat` puts the five tensors in one buffer (views of one storage), and
    `to` and `pin_memory` keep it so: a batch from a loader worker then crosses into
    the training process as one shared-memory segment, is pinned as one block, and
    reaches the GPU in one copy instead of five (on a 2-core CPU, taking a worker's
    Multi30k batch of 4,096 tokens cost the training process 2.2-2.5 ms as five
    segments, 1.3-1.4 ms as one: `bench/batch_speed.py`).
    """

    src: Tensor
    src_pad_mask: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    indices: Tensor
    ntokens: int

    @property
    def size(self) -> int:
        """Sentences in the batch (B)."""
        return self.src.shape[0]

    @property
    def shape(self) -> tuple[int, int, int]:
        """(B, S, T): sentences, source and target positions."""
        return (*self.src.shape, self.tgt_in.shape[1])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch with every tensor on `device`."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """The same batch in page-locked memory (a DataLoader with pin_memory=True calls it)."""
        return self._map(Tensor.pin_memory)

    def clone(self) -> Batch:
        """A copy of the batch in memory of its own, on the same device."""
        return self._map(Tensor.clone)

    def copy_(self, other: Batch) -> None:
        """Write the values of `other`, a batch of the same shapes on any device, into this batch's tensors."""
        mine, theirs = self._buffer(), other._buffer()
        if mine is not None and theirs is not None and mine.shape == theirs.shape:
            mine.copy_(theirs, non_blocking=True)  # one copy for the five tensors
            return
        for name in self._tensors():
            getattr(self, name).copy_(getattr(other, name), non_blocking=True)

    def _tensors(self) -> dict[str, Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "ntokens"}

    def _buffer(self) -> Tensor | None:
        """The one storage all five tensors are views of, as bytes; None where they are not (not built by
        `collate_flat`)."""
        storage = self.src.untyped_storage()
        if any(t.untyped_storage().data_ptr() != storage.data_ptr() for t in self._tensors().values()):
            return None
        return torch.empty(0, dtype=torch.uint8, device=self.src.device).set_(storage)

    def _map(self, fn: Any) -> Batch:
        tensors, buffer = self._tensors(), self._buffer()
        if buffer is None:
            return dataclasses.replace(self, **{name: fn(t) for name, t in tensors.items()})
        whole = fn(buffer)  # the buffer, moved once
        return dataclasses.replace(self, **{name: _on_storage(t, whole.untyped_storage()) for name, t in tensors.items()})


def _on_storage(t: Tensor, storage: torch.UntypedStorage) -> Tensor:
    """`t`'s dtype, shape and place in its storage, on another storage of the same layout."""
    return torch.empty(0, dtype=t.dtype, device=storage.device).set_(storage, t.storage_offset(), t.shape, t.stride())


@dataclass(frozen=True)
class Rounding:
    """How batch lengths are rounded up, so that batches meet a few shapes again and again.

    Plain: up to a multiple of `multiple`. Relative: up to a multiple of a step that grows with the
    length, the largest power of two not above n / 8, at least 1 and at most `multiple` (the largest
    power of two not above it): lengths below 16 stay as they are, then steps of 2, 4 and 8
    (16, 18, ..., 32, 36, ..., 64, 72, ...). Rounding then adds under an eighth to any length, where
    a plain multiple of 8 nearly doubles a length of 9, and the lengths up to L fall in about 8 x
    log2(L / 8) buckets, where a plain multiple m makes L / m. Either way rounding never lowers a
    length and rounds a rounded length to itself.
    """

    multiple: int = 1
    relative: bool = False

    def __post_init__(self) -> None:
        if self.multiple < 1:
            raise ValueError(f"multiple ({self.multiple}) must be at least 1")

    @property
    def largest_step(self) -> int:
        """The relative steps' largest: the largest power of two not above `multiple`."""
        return 1 << (self.multiple.bit_length() - 1)

    def __str__(self) -> str:
        if self.multiple == 1:
            return "lengths as they are"
        if self.relative:
            return f"lengths rounded up in steps of at most {self.largest_step}, an eighth of the length"
        return f"lengths padded to a multiple of {self.multiple}"

    @overload
    def __call__(self, n: int) -> int: ...

    @overload
    def __call__(self, n: np.ndarray) -> np.ndarray: ...

    def __call__(self, n: int | np.ndarray) -> int | np.ndarray:
        """Length n (or an array of lengths) rounded up."""
        if self.multiple == 1:
            return n
        step = self.multiple
        if self.relative:  # the largest power of two not above n / 8 (exact: float64 holds each such n and 2^k)
            eighth = np.maximum(np.asarray(n) >> 3, 1)
            step = np.minimum(np.left_shift(1, np.floor(np.log2(eighth)).astype(np.int64)), self.largest_step)
        rounded = -(-n // step) * step
        return int(rounded) if isinstance(n, int) else rounded.astype(np.asarray(n).dtype, copy=False)


@dataclass(frozen=True)
class Padding:
    """How `collate` shapes a batch.

    Attributes:
        multiple: round S and T up to a multiple of this, so that GPU kernels meet
            a few shapes again and again instead of a new one at almost every step
            (tensor cores want multiples of 8).
        relative: round to steps that grow with the length, at most `multiple` (`Rounding`).
        fill_tokens: 0 leaves the shape to the batch. Above 0, every batch whose
            longer side rounds up to L is given exactly the shape (fill_tokens // L,
            L, L): both sides padded to L, and empty pairs (a source of EOS alone,
            no target token, so no loss) appended up to that many rows. A token-budget
            sampler with the same budget and rounding never cuts a batch
            larger than that, so the step sees one shape per length bucket: what
            CUDA graphs need, which are recorded once per shape and replayed.
        pack: with `fill_tokens`, the rows of a filled batch are rounded up to a multiple of
            max(1, pack // L), the sentences of L positions that one attention row of `pack`
            positions holds (the model's `attention_pack`), so that every row is full
            (`nmt.models.masks.sentences_per_row`); at most that many empty pairs more.
    """

    multiple: int = 1
    fill_tokens: int = 0
    relative: bool = False
    pack: int = 0

    def __post_init__(self) -> None:
        if self.multiple < 1 or self.fill_tokens < 0 or self.pack < 0:
            raise ValueError(f"multiple ({self.multiple}) must be at least 1, fill_tokens "
                             f"({self.fill_tokens}) and pack ({self.pack}) at least 0")

    @property
    def rounding(self) -> Rounding:
        """How these batches round their lengths up."""
        return Rounding(self.multiple, self.relative)

    @property
    def sampler_rounding(self) -> Rounding:
        """How a token-budget sampler must round lengths up for these batches
        (`TokenBatchSampler(rounding=...)`): as the batches do when filling, so that
        every batch of a bucket takes the same rows; otherwise not at all, the budget
        counting lengths as they are, so that rounding short sentences up does not shrink
        their batches (Multi30k at 4,096 tokens and a multiple of 8: 119 batches an epoch
        instead of 143, each carrying more real tokens for the same launches)."""
        return self.rounding if self.fill_tokens else Rounding()

    def shape(self, rows: int, src_len: int, tgt_len: int) -> tuple[int, int, int]:
        """(B, S, T) of a batch of `rows` pairs whose longest source and target are `src_len`, `tgt_len`."""
        rounding = self.rounding
        src_len, tgt_len = rounding(src_len), rounding(tgt_len)
        if not self.fill_tokens:
            return rows, src_len, tgt_len
        longest = max(src_len, tgt_len)
        per_row = max(1, self.pack // longest)
        filled = -(-(self.fill_tokens // longest) // per_row) * per_row
        return max(rows, filled), longest, longest


def collate(
    rows: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]],
    indices: Sequence[int] | None = None,
    pad_id: int = PAD_ID,
    padding: Padding = Padding(),
) -> Batch:
    """Pad tokenized pairs into a `Batch`, adding BOS and EOS to the targets.

    Args:
        rows: a list of rows with `src_ids` (EOS included) and `tgt_ids` (no
            specials), or the column dict `dataset[indices]` returns.
        indices: the rows' dataset indices; None reads an `index` key of each row.
        pad_id: the padding id.
        padding: how lengths are rounded and whether empty pairs fill the batch (`Padding`).

    Returns:
        The `Batch`, with S = longest src_ids and T = longest tgt_ids + 1, shaped
        as `padding` says; empty pairs come after the real ones, with index -1.
    """
    if isinstance(rows, Mapping):
        src_ids, tgt_ids = list(rows["src_ids"]), list(rows["tgt_ids"])
    else:
        src_ids, tgt_ids = [r["src_ids"] for r in rows], [r["tgt_ids"] for r in rows]
    if indices is None:
        indices = [r["index"] for r in rows]  # type: ignore[index]
    src, src_lens = _flat(src_ids)
    tgt, tgt_lens = _flat(tgt_ids)
    return collate_flat(src, src_lens, tgt, tgt_lens, indices, pad_id=pad_id, padding=padding)


def collate_flat(src: np.ndarray, src_lens: np.ndarray, tgt: np.ndarray, tgt_lens: np.ndarray,
                 indices: Sequence[int] | np.ndarray, *, pad_id: int = PAD_ID, padding: Padding = Padding()) -> Batch:
    """`collate` of pairs given flat: pair i's source ids are the next `src_lens[i]` values of `src`
    (EOS included), its target ids the next `tgt_lens[i]` of `tgt` (no specials). What
    `nmt.data.dataset.IdColumns.gather` returns; no Python loop runs over the pairs."""
    n = len(src_lens)
    B, S, T = padding.shape(n, int(src_lens.max(initial=0)), int(tgt_lens.max(initial=-1)) + 1)
    # one buffer (`Batch`): the int64 source, decoder input, decoder output and indices, then the bool mask,
    # each starting on a 16-byte boundary (compiled kernels copy inputs that are not aligned so)
    sizes = [B * S, B * T, B * T, B]
    spans = [n + n % 2 for n in sizes]
    longs = sum(spans)
    whole = torch.empty(8 * longs + B * S, dtype=torch.uint8)
    parts = whole[: 8 * longs].view(torch.int64).split(spans)
    src_t, tgt_in_t, tgt_out_t, indices_t = (part[:n] for part, n in zip(parts, sizes, strict=True))
    src_t, tgt_in_t, tgt_out_t = src_t.view(B, S), tgt_in_t.view(B, T), tgt_out_t.view(B, T)
    mask_t = whole[8 * longs :].view(torch.bool).view(B, S)
    out_src, tgt_in, tgt_out = src_t.numpy(), tgt_in_t.numpy(), tgt_out_t.numpy()  # (B, S), (B, T), (B, T)
    out_src.fill(pad_id)
    tgt_in.fill(pad_id)
    tgt_out.fill(pad_id)
    _fill(out_src, src, src_lens)
    tgt_in[:, :1] = BOS_ID
    _fill(tgt_in, tgt, tgt_lens, first=1)
    _fill(tgt_out, tgt, tgt_lens)
    tgt_out[np.arange(n), tgt_lens] = EOS_ID
    # Empty pairs: EOS alone as source (an all-padding row would have no key to attend to) and
    # BOS as decoder input with nothing to predict, so they add no loss and no gradient.
    out_src[n:, :1] = EOS_ID
    lens = np.r_[src_lens, np.ones(B - n, dtype=np.int64)]
    np.greater_equal(np.arange(S)[None, :], lens[:, None], out=mask_t.numpy())  # (B, S)
    indices_np = indices_t.numpy()
    indices_np[:n] = np.asarray(indices, dtype=np.int64)
    indices_np[n:] = -1
    return Batch(src=src_t, src_pad_mask=mask_t, tgt_in=tgt_in_t, tgt_out=tgt_out_t, indices=indices_t,
                 ntokens=int(tgt_lens.sum()) + n)


def _flat(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Sequences of ids as one flat int64 array and their lengths."""
    lens = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    return np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(lens.sum())), lens


def ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The positions starts[0], ..., starts[0] + lens[0] - 1, then those of the next range, and so on."""
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lens)
    return np.arange(total, dtype=np.int64) + np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lens), lens)


def _fill(out: np.ndarray, values: np.ndarray, lens: np.ndarray, first: int = 0) -> None:
    """Write flat sequences into the rows of `out`: row i gets its `lens[i]` values from column `first` on."""
    rows = np.repeat(np.arange(len(lens)), lens)
    out[rows, ranges(np.full(len(lens), first), lens)] = values
