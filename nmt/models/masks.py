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
