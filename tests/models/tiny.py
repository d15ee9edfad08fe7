"""Tiny real models and the padded source batches fed to them, shared by the model, decode and train tests.

Every model is built through `build_model`, seeded, so a test gets the same weights each run; the
sizes are small enough that a forward pass costs microseconds on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from nmt.config import ModelConfig, RNNConfig, TransformerConfig
from nmt.data.tokenizer import PAD_ID
from nmt.models import build_model

TRANSFORMER: dict[str, Any] = dict(d_model=16, heads=2, encoder_layers=1, decoder_layers=1, ff_dim=32, dropout=0.0)
"""The tiny Transformer section; `tiny_config(transformer=...)` overrides single keys."""
RNN: dict[str, Any] = dict(embed_dim=8, hidden_size=16, dropout=0.0)
"""The tiny RNN section; `tiny_config(rnn=...)` overrides single keys."""


def tiny_config(
    kind: str = "transformer",
    *,
    transformer: dict[str, Any] | None = None,
    rnn: dict[str, Any] | None = None,
    tie_embeddings: str | None = None,
) -> ModelConfig:
    """A model config of type `kind` with tiny sizes and no dropout.

    Args:
        kind: `transformer` or `rnn`.
        transformer: keys that replace those of `TRANSFORMER`.
        rnn: keys that replace those of `RNN`.
        tie_embeddings: the config's tying; None keeps the config default.
    """
    tying = {} if tie_embeddings is None else {"tie_embeddings": tie_embeddings}
    return ModelConfig(type=kind, transformer=TransformerConfig(**(TRANSFORMER | (transformer or {}))),
                       rnn=RNNConfig(**(RNN | (rnn or {}))), **tying)


def tiny_model(kind: str = "transformer", *, seed: int = 0, vocab: int = 20, **config: Any) -> nn.Module:
    """A randomly initialised tiny model (`tiny_config(kind, **config)`), seeded, in eval mode.

    Args:
        kind: `transformer` or `rnn`.
        seed: torch's global seed just before the weights are drawn.
        vocab: source and target vocabulary size (padding is `PAD_ID`).
        **config: keyword arguments of `tiny_config`.
    """
    cfg = tiny_config(kind, **config)
    torch.manual_seed(seed)
    return build_model(cfg, src_vocab_size=vocab, tgt_vocab_size=vocab, pad_id=PAD_ID).eval()


def padded_batch(
    lengths: Sequence[int],
    *,
    vocab: int,
    seed: int,
    tgt_len: int | None = None,
    low: int = 4,
    pad_id: int = PAD_ID,
) -> tuple[Tensor, ...]:
    """Random right-padded sources, and optionally random target prefixes, from a seeded generator.

    Token ids are drawn from [low, vocab), so none is a special id (with the default `low`) and the
    padding is exactly where the mask says.

    Args:
        lengths: the length of each source; the batch is as wide as the longest.
        vocab: one past the largest token id.
        seed: seed of the batch's own generator (the global one is left alone).
        tgt_len: length of the target prefixes, drawn after the sources; None draws none.
        low: the smallest token id.
        pad_id: the id written at padded positions.

    Returns:
        `(src, pad)`, or `(src, pad, tgt)` with `tgt_len`: src (B, S) with `pad_id` where pad (B, S)
        is True, tgt (B, tgt_len) without padding.
    """
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)  # from the Python list: the sync tests count every read of a tensor's value
    src = torch.randint(low, vocab, (len(lengths), width), generator=g)
    pad = torch.arange(width).unsqueeze(0) >= torch.tensor(lengths).unsqueeze(1)  # (B, S), True = padding
    src = src.masked_fill(pad, pad_id)
    if tgt_len is None:
        return src, pad
    return src, pad, torch.randint(low, vocab, (len(lengths), tgt_len), generator=g)
