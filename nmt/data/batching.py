"""Token-budget batching: which pairs go into each batch. A bucketed, DDP-aware batch sampler for
training, and longest-first batches for translation; `nmt.data.collate` pads each batch into tensors.

A batch costs `B * max(S, T)` tokens (B sentences, S source and T target positions), padding included:
that is what memory and compute scale with. Sentences of similar length are batched together so
little of the budget is padding; the order of the batches is then shuffled.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, Literal, overload

import numpy as np
from torch.utils.data import Sampler

from nmt.data.collate import Rounding


class EpochBatches(Sequence[list[int]]):
    """One epoch's batches as slices of a single row order, so an epoch of millions of
    pairs costs one int32 array, not millions of Python ints.

    Batch i is `order[starts[i]:ends[i]]`; it is handed out as a list of ints, as
    `Dataset.__getitem__` and `collate` take it. Slicing returns another
    `EpochBatches` over the same order (no copy), which is how a resumed run skips
    the batches it has already trained on without building them again.

    Args:
        order: (N,) row indices, int32.
        starts, ends: (B,) int32 bounds of each batch in `order`, in the order batches are yielded.
    """

    def __init__(self, *, order: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        self.order, self.starts, self.ends = order, starts, ends

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, i: int) -> list[int]: ...
    @overload
    def __getitem__(self, i: slice) -> EpochBatches: ...
    def __getitem__(self, i: int | slice) -> list[int] | EpochBatches:
        if isinstance(i, slice):
            return EpochBatches(order=self.order, starts=self.starts[i], ends=self.ends[i])
        return self.order[self.starts[i] : self.ends[i]].tolist()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(list(a) == list(b) for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # mutable arrays inside, like a list

    def __repr__(self) -> str:
        return f"EpochBatches({len(self)} batches of {len(self.order)} rows)"


class TokenBatchSampler(Sampler[list[int]]):
    """Batches of row indices under a token budget, bucketed by length, sharded over ranks.

    Each epoch: shuffle the rows (seeded by seed and epoch, so equal lengths mix
    differently each epoch), stable-sort them by their longer side, longest first (with
    `order="lengths"`, then by source length, then by target length, so that a batch's
    pairs share both lengths and one padded to its longest source and longest target
    pads little), cut the sorted list greedily into batches of at most `max_tokens` tokens
    counted as `len(batch) * max(src_len, tgt_len)` (a sentence longer than the budget is
    a batch of its own), then shuffle the order of the batches. The cut depends on the
    longer sides alone, so both orders give an epoch the same number of batches, of the
    same sizes. With a `rounding`, lengths
    count as rounded up by it, as `collate` pads them, so that every batch starting in
    one length bucket takes the same number of rows (what batches of static shapes
    need: `Padding.sampler_rounding`).

    Every step is a NumPy operation over all rows (or a loop over batches or
    distinct lengths, never over rows), and an epoch is held as one int32 row
    order plus batch bounds (`EpochBatches`): building an epoch of millions of
    pairs takes a fraction of a second and a few bytes per pair.

    Weighted corpora: when the rows are several corpora one after another (`parts`),
    an epoch takes each corpus's rows `weight` times: whole copies for the integer
    part, and for the fraction a share of its rows drawn afresh each epoch (seeded by
    seed, epoch and corpus). Without `parts`, or with every weight 1, an epoch is
    each row once and the random draws are exactly those of an unweighted sampler.

    Sharding: every rank computes the same list; rank r takes batches r, r+W, ...
    So that every rank gets the same number of batches (DDP steps in lockstep)
    while each drawn row is still seen exactly once per epoch, the largest batches are
    split in two until the count divides by W; halves stay under the budget. Only
    where no batch has two pairs left to split (fewer pairs than ranks, or a budget under
    twice every pair's length) are batches repeated, from the start of the list: up to
    W - 1 pairs come twice in such an epoch.

    Args:
        src_lens, tgt_lens: (N,) lengths of each row (`src_len`, `tgt_len` columns),
            ideally int32 NumPy arrays straight from Arrow (`nmt.train.data.length_arrays`).
        max_tokens: token budget of one batch.
        shuffle: shuffle rows and batches; False gives the sorted, longest-first order.
        seed: base seed; with the epoch it fixes the batches.
        rank, world_size: this process's shard.
        parts: (rows, weight) of each corpus, in row order; the rows must add up to N.
        rounding: count each length as rounded up by this.
        order: "lengths" sorts by the longer side, then the source and target lengths (each rounded);
            "longer" by the longer side alone (`train.batch_order`).

    Raises:
        ValueError: lengths that are not 1-D arrays of the same length, max_tokens < 1, a bad
            rank, parts that do not cover the rows or have a weight that is not above 0, or an
            unknown order.
    """

    def __init__(
        self,
        *,
        src_lens: np.ndarray | Sequence[int],
        tgt_lens: np.ndarray | Sequence[int],
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        parts: Sequence[tuple[int, float]] | None = None,
        rounding: Rounding = Rounding(),
        order: Literal["longer", "lengths"] = "longer",
    ) -> None:
        src, tgt = _lengths(src_lens, "src_lens"), _lengths(tgt_lens, "tgt_lens")
        if src.ndim != 1 or src.shape != tgt.shape:
            raise ValueError(f"src_lens {src.shape} and tgt_lens {tgt.shape} must be 1-D of the same length")
        if max_tokens < 1:
            raise ValueError(f"max_tokens ({max_tokens}) must be at least 1")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank ({rank}) must be in [0, world_size) with world_size ({world_size}) >= 1")
        if parts is not None:
            if sum(rows for rows, _ in parts) != len(src) or any(rows < 0 for rows, _ in parts):
                raise ValueError(f"parts {list(parts)} must be row counts adding up to the {len(src)} rows")
            if not all(math.isfinite(w) and w > 0 for _, w in parts):
                raise ValueError(f"parts {list(parts)}: every weight must be a finite number above 0")
        self.parts = None if parts is None or all(w == 1 for _, w in parts) else [(int(r), float(w)) for r, w in parts]
        if order not in ("longer", "lengths"):
            raise ValueError(f"order ({order!r}) must be 'lengths' or 'longer'")
        longer = np.maximum(src, tgt).astype(np.int32, copy=False)  # (N,)
        self.lengths = rounding(longer)
        # (-longer, source, target), rounded, as one int64 for one stable sort (exact below 2 million positions)
        self.sort_key: np.ndarray | None = None
        if order == "lengths" and len(src):
            s, t = (rounding(a.astype(np.int64, copy=False)) for a in (src, tgt))
            m = int(max(s.max(), t.max())) + 1
            self.sort_key = (-self.lengths.astype(np.int64) * m + s) * m + t
        self.max_tokens, self.shuffle, self.seed = max_tokens, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self._cached: tuple[int, EpochBatches] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose batches `__iter__` yields."""
        self.epoch = epoch

    def batch_list(self, epoch: int) -> EpochBatches:
        """This rank's batches of row indices for `epoch`, in order (slice off k to resume after k)."""
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, self._shard(*self._all_batches(epoch)))
        return self._cached[1]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batch_list(self.epoch))

    def __len__(self) -> int:
        return len(self.batch_list(self.epoch))

    def _all_batches(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The row order and the (starts, ends) of every batch in it, in the order they are yielded."""
        # The random draws (row permutation, then batch permutation) are those the published runs made.
        rng = np.random.default_rng([self.seed, epoch])
        rows = np.arange(len(self.lengths)) if self.parts is None else self._weighted_rows(self.parts, epoch)
        order = rows[rng.permutation(len(rows))] if self.shuffle else rows
        key = -self.lengths[order] if self.sort_key is None else self.sort_key[order]
        order = order[np.argsort(key, kind="stable")].astype(np.int32)  # longest first
        bounds = _chunk_bounds(self.lengths[order], self.max_tokens).astype(np.int32)
        starts, ends = bounds[:-1], bounds[1:]
        if self.shuffle:
            perm = rng.permutation(len(starts))
            starts, ends = starts[perm], ends[perm]
        return order, starts, ends

    def _weighted_rows(self, parts: list[tuple[int, float]], epoch: int) -> np.ndarray:
        """The rows `epoch` takes from weighted corpora, in corpus order: each corpus's rows
        floor(weight) times, then round(fraction x rows) of them drawn without replacement."""
        taken, start = [], 0
        for part, (rows, weight) in enumerate(parts):
            whole, fraction = divmod(weight, 1.0)
            span = np.arange(start, start + rows, dtype=np.int64)
            taken += [span] * int(whole)
            share = min(rows, max(1, round(fraction * rows))) if fraction else 0  # a weight above 0 takes a pair
            if share:
                draw = np.random.default_rng([self.seed, epoch, 1, part]).choice(rows, size=share, replace=False)
                taken.append(start + np.sort(draw))
            start += rows
        return np.concatenate(taken) if taken else np.zeros(0, dtype=np.int64)

    def _shard(self, order: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> EpochBatches:
        w = self.world_size
        if w > 1:
            while len(starts) % w:
                sizes = ends - starts
                j = int(np.argmax(sizes))
                if sizes[j] < 2:  # every batch a single pair: repeat batches
                    again = np.arange(-len(starts) % w) % len(starts)
                    starts, ends = np.concatenate([starts, starts[again]]), np.concatenate([ends, ends[again]])
                    break
                middle = starts[j] + sizes[j] // 2  # split the largest batch in two halves, in place
                starts, ends = np.insert(starts, j + 1, middle), np.insert(ends, j, middle)
        return EpochBatches(order=order, starts=starts[self.rank :: w], ends=ends[self.rank :: w])


def _lengths(values: Any, name: str) -> np.ndarray:
    """`values` as an integer array; lists and arrays convert at C speed, anything else is refused
    (a lazy column would be walked row by row through Python: see `nmt.train.data.length_arrays`)."""
    if not isinstance(values, (np.ndarray, list, tuple, range)):
        raise TypeError(f"{name} must be a NumPy array or a list, not {type(values).__name__}: "
                        "read lengths with nmt.train.data.length_arrays")
    array = np.asarray(values)
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, not {array.dtype}")
    return array


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


def _chunk_bounds(lengths_desc: np.ndarray, max_tokens: int) -> np.ndarray:
    """Greedy cut points of a longest-first length list: each batch's first row is its
    longest, so it takes `max_tokens // that length` rows (at least one).

    Within a run of equal lengths the batches starting there all take the same number
    of rows, so the cut points are one `arange` per distinct length: the loop runs over
    lengths (at most `data.max_len` or so of them), never over rows.

    Returns:
        (B + 1,) int64 bounds: batch b is rows `bounds[b]:bounds[b + 1]`.
    """
    n = len(lengths_desc)
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    run_starts = np.flatnonzero(np.r_[True, lengths_desc[1:] != lengths_desc[:-1]])
    run_ends = np.r_[run_starts[1:], n]
    takes = np.maximum(1, max_tokens // np.maximum(1, lengths_desc[run_starts].astype(np.int64)))
    cuts, i = [], 0
    for end, take in zip(run_ends.tolist(), takes.tolist()):
        if i >= end:  # the previous run's last batch reached past this run
            continue
        here = np.arange(i, end, take, dtype=np.int64)
        cuts.append(here)
        i = int(here[-1]) + take
    cuts.append(np.array([min(i, n)], dtype=np.int64))
    return np.concatenate(cuts)
