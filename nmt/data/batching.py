"""Token-budget batching: a bucketed, DDP-aware batch sampler and the collate function.

Shapes: B sentences, S source length (EOS included), T target length (ids + 1).

A batch costs `B * max(S, T)` tokens, padding included: that is what memory
and compute scale with. Sentences of similar length are batched together so
little of the budget is padding; the order of the batches is then shuffled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Sampler

from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


@dataclass
class Batch:
    """One padded batch of sentence pairs.

    Attributes:
        src: source ids followed by EOS, PAD after, (B, S) long.
        src_pad_mask: True at source padding, (B, S) bool.
        tgt_in: decoder input: BOS then target ids, PAD after, (B, T) long.
        tgt_out: decoder output: target ids then EOS, PAD after, (B, T) long.
        indices: dataset row of each sentence, (B,) long.
        ntokens: non-pad target tokens (a plain int, so reading it never waits on a GPU).
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

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch with every tensor on `device`."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """The same batch in page-locked memory (a DataLoader with pin_memory=True calls it)."""
        return self._map(Tensor.pin_memory)

    def _map(self, fn: Any) -> Batch:
        changes = {f.name: fn(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "ntokens"}
        return dataclasses.replace(self, **changes)


def collate(
    rows: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]],
    indices: Sequence[int] | None = None,
    pad_id: int = PAD_ID,
    pad_to_multiple: int = 1,
) -> Batch:
    """Pad tokenized pairs into a `Batch`, adding BOS and EOS to the targets.

    Args:
        rows: a list of rows with `src_ids` (EOS included) and `tgt_ids` (no
            specials), or the column dict `dataset[indices]` returns.
        indices: the rows' dataset indices; None reads an `index` key of each row.
        pad_id: the padding id.
        pad_to_multiple: round S and T up to a multiple of this, so that GPU
            kernels (and compiled graphs) meet a few shapes again and again
            instead of a new one at almost every step.

    Returns:
        The `Batch`, with S = longest src_ids and T = longest tgt_ids + 1, each
        rounded up to `pad_to_multiple`.
    """
    if isinstance(rows, Mapping):
        src_ids, tgt_ids = list(rows["src_ids"]), list(rows["tgt_ids"])
    else:
        src_ids, tgt_ids = [r["src_ids"] for r in rows], [r["tgt_ids"] for r in rows]
    if indices is None:
        indices = [r["index"] for r in rows]  # type: ignore[index]
    n = len(src_ids)
    src_lens = np.fromiter((len(s) for s in src_ids), dtype=np.int64, count=n)
    tgt_lens = np.fromiter((len(t) + 1 for t in tgt_ids), dtype=np.int64, count=n)
    src = np.full((n, _round_up(int(src_lens.max(initial=0)), pad_to_multiple)), pad_id, dtype=np.int64)  # (B, S)
    tgt_in = np.full((n, _round_up(int(tgt_lens.max(initial=0)), pad_to_multiple)), pad_id, dtype=np.int64)  # (B, T)
    tgt_out = tgt_in.copy()  # (B, T)
    for i, (s, t) in enumerate(zip(src_ids, tgt_ids)):
        m = len(t)
        src[i, : len(s)] = s
        tgt_in[i, 0] = BOS_ID
        tgt_in[i, 1 : m + 1] = t
        tgt_out[i, :m] = t
        tgt_out[i, m] = EOS_ID
    src_pad_mask = np.arange(src.shape[1])[None, :] >= src_lens[:, None]  # (B, S)
    return Batch(
        src=torch.from_numpy(src),
        src_pad_mask=torch.from_numpy(src_pad_mask),
        tgt_in=torch.from_numpy(tgt_in),
        tgt_out=torch.from_numpy(tgt_out),
        indices=torch.as_tensor(np.asarray(indices, dtype=np.int64)),
        ntokens=int(tgt_lens.sum()),
    )


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple if multiple > 1 else n


class TokenBatchSampler(Sampler[list[int]]):
    """Batches of row indices under a token budget, bucketed by length, sharded over ranks.

    Each epoch: shuffle the rows (seeded by seed and epoch, so equal lengths mix
    differently each epoch), stable-sort them by length, longest first, cut the
    sorted list greedily into batches of at most `max_tokens` tokens counted as
    `len(batch) * max(src_len, tgt_len)` (a sentence longer than the budget is a
    batch of its own), then shuffle the order of the batches.

    Sharding: every rank computes the same list; rank r takes batches r, r+W, ...
    So that every rank gets the same number of batches (DDP steps in lockstep)
    while each pair is still seen exactly once per epoch, the largest batches are
    split in two until the count divides by W; halves stay under the budget. Only
    with fewer pairs than ranks are batches repeated (from the start of the list).

    Args:
        src_lens, tgt_lens: (N,) lengths of each row (`src_len`, `tgt_len` columns).
        max_tokens: token budget of one batch.
        shuffle: shuffle rows and batches; False gives the sorted, longest-first order.
        seed: base seed; with the epoch it fixes the batches.
        rank, world_size: this process's shard.

    Raises:
        ValueError: lengths of different shapes, max_tokens < 1, or a bad rank.
    """

    def __init__(
        self,
        *,
        src_lens: Any,
        tgt_lens: Any,
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        src, tgt = np.asarray(src_lens, dtype=np.int64), np.asarray(tgt_lens, dtype=np.int64)
        if src.ndim != 1 or src.shape != tgt.shape:
            raise ValueError(f"src_lens {src.shape} and tgt_lens {tgt.shape} must be 1-D of the same length")
        if max_tokens < 1:
            raise ValueError(f"max_tokens ({max_tokens}) must be at least 1")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank ({rank}) must be in [0, world_size) with world_size ({world_size}) >= 1")
        self.lengths = np.maximum(src, tgt)  # (N,)
        self.max_tokens, self.shuffle, self.seed = max_tokens, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self._cached: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose batches `__iter__` yields."""
        self.epoch = epoch

    def batch_list(self, epoch: int) -> list[list[int]]:
        """This rank's batches of row indices for `epoch`, in order (skip k to resume)."""
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, self._shard(self._all_batches(epoch)))
        return self._cached[1]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batch_list(self.epoch))

    def __len__(self) -> int:
        return len(self.batch_list(self.epoch))

    def _all_batches(self, epoch: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, epoch])
        n = len(self.lengths)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        order = order[np.argsort(-self.lengths[order], kind="stable")]  # longest first
        bounds = _chunk_bounds(self.lengths[order], self.max_tokens)
        batches = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _shard(self, batches: list[np.ndarray]) -> list[list[int]]:
        w = self.world_size
        if w > 1:
            sizes = [len(b) for b in batches]
            while len(batches) % w:
                j = int(np.argmax(sizes))
                if sizes[j] < 2:  # fewer pairs than ranks: repeat batches
                    batches += [batches[k % len(batches)] for k in range(-len(batches) % w)]
                    break
                half = sizes[j] // 2
                batches[j : j + 1] = [batches[j][:half], batches[j][half:]]
                sizes[j : j + 1] = [half, sizes[j] - half]
        return [b.tolist() for b in batches[self.rank :: w]]


def inference_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Batches for translation: indices sorted longest first, cut under the token budget.

    Args:
        lengths: (N,) source length of each sentence.
        max_tokens: budget of one batch, `len(batch) * longest`; divide by the beam
            size first when each sentence is expanded into beam hypotheses.

    Returns:
        Lists of indices into `lengths`, each index once; the caller restores input order.
    """
    lens = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lens, kind="stable")
    bounds = _chunk_bounds(lens[order], max(1, max_tokens))
    return [order[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:])]


def _chunk_bounds(lengths_desc: np.ndarray, max_tokens: int) -> list[int]:
    """Greedy cut points of a longest-first length list: each batch's first row is its
    longest, so it takes `max_tokens // that length` rows (at least one)."""
    bounds, i, n = [0], 0, len(lengths_desc)
    while i < n:
        i = min(n, i + max(1, max_tokens // max(1, int(lengths_desc[i]))))
        bounds.append(i)
    return bounds
