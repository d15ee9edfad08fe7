"""Small pieces shared by the models: dropout, token embeddings, positional encodings, feed-forward,
and one fused recurrent layer (the RNN encoder's and decoder's).

Shapes follow `nmt.models.contract`: B batch, L sequence length, D model width,
V vocabulary size. Each module initialises its own parameters, so weight tying
done afterwards (the model assigning one `Parameter` to two modules) is never
undone by a later whole-model initialisation pass.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def apply_dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout: each element of x zeroed with probability p, the others scaled by 1 / (1 - p).

    On a CPU the mask is drawn as uniform fp32 numbers, kept where at least p: torch's CPU dropout
    draws Bernoulli numbers, which on a 2-core Xeon took 12.6 ms for the forward and backward pass
    of a 4,096 x 256 activation, against 5.5 ms so. The scaling comes before the mask, in the
    product's own precision, so a bf16 activation is scaled by 1 / (1 - p) and not by its bf16
    rounding. Elsewhere this is torch's fused kernel (`F.dropout`), which on a GPU draws and applies
    the mask in one pass.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, True)
    keep = torch.rand(x.shape, device=x.device).ge_(p)  # 1 with probability 1 - p, to fp32's resolution
    return x.mul(1.0 / (1.0 - p)).mul_(keep if keep.dtype == x.dtype else keep.to(x.dtype))


class Dropout(nn.Dropout):
    """`nn.Dropout` (the same `p`, training-only behaviour and state) through `apply_dropout`."""

    def forward(self, x: Tensor) -> Tensor:
        return apply_dropout(x, self.p, self.training)


class Embedding(nn.Module):
    """Token embedding multiplied by sqrt(D) (Vaswani et al., 2017, §3.4).

    Initialised from N(0, D^-1/2), so the scaled embedding has unit variance per
    dimension and matches the scale of the positional encoding; the padding row
    is zero and receives no gradient through the lookup.

    Args:
        vocab_size: V.
        d_model: D.
        pad_id: id of the padding token.

    Raises:
        ValueError: a size is not positive or `pad_id` is not a valid id.
    """

    def __init__(self, *, vocab_size: int, d_model: int, pad_id: int) -> None:
        super().__init__()
        if vocab_size < 1 or d_model < 1:
            raise ValueError(f"vocab_size ({vocab_size}) and d_model ({d_model}) must be positive")
        if not 0 <= pad_id < vocab_size:
            raise ValueError(f"pad_id ({pad_id}) must be in [0, vocab_size ({vocab_size}))")
        self.vocab_size, self.d_model, self.pad_id = vocab_size, d_model, pad_id
        self.scale = math.sqrt(d_model)
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))  # (V, D)
        with torch.no_grad():
            nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)
            self.weight[pad_id].zero_()

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens (B, L) -> (B, L, D)."""
        return F.embedding(tokens, self.weight, padding_idx=self.pad_id) * self.scale


def _check_range(length: int, offset: int, max_positions: int) -> None:
    if offset < 0 or offset + length > max_positions:
        raise ValueError(
            f"positions {offset}..{offset + length - 1} are outside [0, max_positions ({max_positions}))"
        )


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal positional encoding (Vaswani et al., 2017, §3.5).

        PE(pos, 2i)   = sin(pos / 10000^(2i / D))
        PE(pos, 2i+1) = cos(pos / 10000^(2i / D))

    The table is a non-persistent buffer: it is recomputed, never checkpointed.

    Args:
        d_model: D (even).
        max_positions: number of positions in the table.

    Raises:
        ValueError: `d_model` is odd or a size is not positive.
    """

    def __init__(self, *, d_model: int, max_positions: int) -> None:
        super().__init__()
        if d_model < 2 or d_model % 2:
            raise ValueError(f"d_model ({d_model}) must be even and positive for sinusoidal positions")
        if max_positions < 1:
            raise ValueError(f"max_positions ({max_positions}) must be at least 1")
        self.max_positions = max_positions
        pos = torch.arange(max_positions, dtype=torch.float64).unsqueeze(1)  # (L, 1)
        inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (D/2,)
        table = torch.zeros(max_positions, d_model, dtype=torch.float64)
        table[:, 0::2] = torch.sin(pos * inv_freq)
        table[:, 1::2] = torch.cos(pos * inv_freq)
        self.register_buffer("table", table.float(), persistent=False)  # (L, D)

    def forward(self, length: int, *, offset: int = 0) -> Tensor:
        """Encodings of positions offset .. offset + length - 1: (length, D).

        Raises:
            ValueError: the positions run past `max_positions`.
        """
        _check_range(length, offset, self.max_positions)
        return self.table[offset : offset + length]


class LearnedPositions(nn.Module):
    """One trained vector per position (Gehring et al., 2017), N(0, D^-1/2) at start.

    Args:
        d_model: D.
        max_positions: number of positions that can be encoded.

    Raises:
        ValueError: a size is not positive.
    """

    def __init__(self, *, d_model: int, max_positions: int) -> None:
        super().__init__()
        if d_model < 1 or max_positions < 1:
            raise ValueError(f"d_model ({d_model}) and max_positions ({max_positions}) must be positive")
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.empty(max_positions, d_model))  # (L, D)
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)

    def forward(self, length: int, *, offset: int = 0) -> Tensor:
        """Encodings of positions offset .. offset + length - 1: (length, D).

        Raises:
            ValueError: the positions run past `max_positions`.
        """
        _check_range(length, offset, self.max_positions)
        return self.weight[offset : offset + length]


class FeedForward(nn.Module):
    """Position-wise feed-forward block: W2 act(W1 x + b1) + b2 (Vaswani et al., 2017, eq. 2).

    Args:
        d_model: D, input and output width.
        ff_dim: hidden width.
        activation: "relu" (the paper's) or "gelu" (Hendrycks & Gimpel, 2016).
        activation_dropout: dropout on the hidden activations.

    Raises:
        ValueError: unknown activation, or a size or dropout out of range.
    """

    def __init__(
        self, *, d_model: int, ff_dim: int, activation: str, activation_dropout: float = 0.0
    ) -> None:
        super().__init__()
        if activation not in ("relu", "gelu"):
            raise ValueError(f"activation ({activation!r}) must be 'relu' or 'gelu'")
        if d_model < 1 or ff_dim < 1:
            raise ValueError(f"d_model ({d_model}) and ff_dim ({ff_dim}) must be positive")
        if not 0.0 <= activation_dropout < 1.0:
            raise ValueError(f"activation_dropout ({activation_dropout}) must be in [0, 1)")
        self.up = nn.Linear(d_model, ff_dim)
        self.down = nn.Linear(ff_dim, d_model)
        self.act = nn.ReLU() if activation == "relu" else nn.GELU()
        self.dropout = Dropout(activation_dropout)
        for linear in (self.up, self.down):
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, L, D) -> (B, L, D)."""
        return self.down(self.dropout(self.act(self.up(x))))


def fused_rnn_layer(x: Tensor, weights: list[Tensor], h0: Tensor, c0: Tensor | None, training: bool) -> Tensor:
    """One layer and direction of a GRU, or of an LSTM (with `c0`), as one fused call from the states h0
    (and c0), (1, B, H): x (B, T, I) -> outputs (B, T, H). `weights`: w_ih, w_hh, b_ih, b_hh."""
    # gru/lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    if c0 is not None:
        return torch.lstm(x, (h0, c0), weights, True, 1, 0.0, training, False, True)[0]
    return torch.gru(x, h0, weights, True, 1, 0.0, training, False, True)[0]
