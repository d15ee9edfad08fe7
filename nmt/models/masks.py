"""Masks, with one polarity everywhere: True marks a position that must be ignored.

They are used as `scores.masked_fill(mask, float("-inf"))`. A padding mask comes
from sequence lengths or token ids; a causal mask forbids attending to the future.
"""

from __future__ import annotations

import torch
from torch import Tensor


def pad_mask_from_lengths(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """True at padding: lengths (B,) -> (B, max_len)."""
    max_len = int(lengths.max()) if max_len is None else max_len
    positions = torch.arange(max_len, device=lengths.device)
    return positions.unsqueeze(0) >= lengths.unsqueeze(1)  # (B, L)


def pad_mask_from_tokens(tokens: Tensor, pad_id: int) -> Tensor:
    """True at padding: tokens (B, L) -> (B, L)."""
    return tokens.eq(pad_id)


def causal_mask(length: int, device: torch.device | None = None) -> Tensor:
    """True above the diagonal, where position i would see j > i: (L, L)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).triu(1)


def attention_bias(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """`mask` as the additive bias fused attention kernels take: -inf where True (ignored), 0 elsewhere.

    Given a boolean mask, `F.scaled_dot_product_attention` builds this bias itself
    at every call; a stack whose layers share one mask builds it once instead.
    """
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))


def sentences_per_row(batch: int, length: int, width: int) -> int:
    """How many of a batch's `batch` sentences of `length` positions to lay side by side in one attention row
    of at most `width` positions: the largest divisor of `batch` that fits, so the rows are alike (1: a
    sentence a row, as without packing)."""
    most = max(1, min(batch, width // max(length, 1)))
    return next(k for k in range(most, 0, -1) if batch % k == 0)


def block_bias(
    key_pad: Tensor | None, group: int, queries: int, keys: int, *, causal: bool, dtype: torch.dtype,
    device: torch.device | None = None,
) -> Tensor:
    """The additive bias (`attention_bias`) of attention over rows that hold `group` sentences side by side,
    each with `queries` query and `keys` key positions: a query sees only the keys of its own sentence, and of
    those neither padding nor, where `causal`, later positions.

    Args:
        key_pad: True at padding (B, keys), or None where no key is padding.
        group: sentences per row; B must be a multiple of it.

    Returns:
        (B / group, 1, group * queries, group * keys), or (1, 1, ...) for every row alike where `key_pad` is None.
    """
    q = torch.arange(group * queries, device=device)[:, None]
    k = torch.arange(group * keys, device=device)[None, :]
    hidden = q // queries != k // keys  # another sentence's key
    if causal:
        hidden |= k % keys > q % queries
    rows = hidden[None] if key_pad is None else hidden | key_pad.reshape(-1, 1, group * keys)
    return attention_bias(rows[:, None], dtype)  # (rows, 1, group * queries, group * keys)
