"""The Transformer's encoder and decoder (Vaswani et al., 2017, "Attention Is All You Need", §3.1).

Read top to bottom: the residual block (post-norm as in the paper, or pre-norm after
Xiong et al., 2020, "On Layer Normalization in the Transformer Architecture"), the
encoder layer, the decoder layer with its self-attention key/value cache, then the
encoder and decoder stacks. Their attention is `nmt.models.multihead.MultiHeadAttention`;
the model that assembles them is `nmt.models.transformer.Transformer`.

Shapes: B batch, S source length, T target length, D model width, H heads,
Dh = D / H. Masks are boolean with True = ignore (`nmt.models.masks`), broadcastable
to the scores (B, H, Tq, Tk).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from nmt.models.layers import Dropout, Embedding, FeedForward
from nmt.models.masks import attention_bias, block_bias, causal_mask, sentences_per_row
from nmt.models.multihead import KV, MultiHeadAttention


def _shared_bias(mask: Tensor, dtype: torch.dtype, attn: MultiHeadAttention) -> Tensor | None:
    """The additive form of the source padding, built once for the fused kernels of the encoder's layers and
    of the decoder's cross-attention (which takes it from `Memory.extra["bias"]`).

    `F.scaled_dot_product_attention` would convert a boolean mask at each of the
    layers' calls, three operations each; a search step would repeat them per layer.
    The manual path masks with the boolean mask itself and needs none.
    """
    return attention_bias(mask, dtype) if attn.impl == "sdpa" else None


def _group(pack: int, batch: int, length: int, attn: MultiHeadAttention) -> int:
    """Sentences side by side in each row of a stack's attention calls (`MultiHeadAttention.forward`): as
    many as rows of `pack` positions hold on the fused path, else 1."""
    return sentences_per_row(batch, length, pack) if pack and attn.impl == "sdpa" else 1


class Residual(nn.Module):
    """Residual connection around a sub-layer, with its LayerNorm and output dropout.

        post-norm (Vaswani et al., 2017, §5.4): x <- LN(x + Dropout(f(x)))
        pre-norm (Xiong et al., 2020):          x <- x + Dropout(f(LN(x)))

    Used as `x = res.add(x, f(res.normed(x)))`, so f may also return extras.
    """

    def __init__(self, *, d_model: int, dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def normed(self, x: Tensor) -> Tensor:
        """The sub-layer's input: LN(x) with pre-norm, x with post-norm."""
        return self.norm(x) if self.pre_norm else x

    def add(self, x: Tensor, y: Tensor) -> Tensor:
        """Add the sub-layer output y to the residual stream x, both (B, L, D)."""
        x = x + self.dropout(y)
        return x if self.pre_norm else self.norm(x)


class EncoderLayer(nn.Module):
    """Self-attention, then feed-forward, each in a `Residual` (Vaswani et al., 2017, §3.1)."""

    def __init__(
        self, *, self_attn: MultiHeadAttention, feed_forward: FeedForward, dropout: float, pre_norm: bool
    ) -> None:
        super().__init__()
        self.self_attn, self.feed_forward = self_attn, feed_forward
        d = self_attn.d_model
        self.attn_res, self.ff_res = (Residual(d_model=d, dropout=dropout, pre_norm=pre_norm) for _ in range(2))

    def forward(self, x: Tensor, pad_mask: Tensor, bias: Tensor | None = None, group: int = 1) -> Tensor:
        """x (B, S, D), pad_mask (B, 1, 1, S) and maybe its `attention_bias`, or with `group` sentences a row
        their `block_bias` -> (B, S, D)."""
        h = self.attn_res.normed(x)
        y, _ = self.self_attn(*self.self_attn.project_qkv(h), pad_mask, bias=bias, group=group)
        x = self.attn_res.add(x, y)
        return self.ff_res.add(x, self.feed_forward(self.ff_res.normed(x)))


def _records_grad(*tensors: Tensor) -> bool:
    """Whether autograd records an operation on `tensors`: then an `out=` copy, which it cannot record, is no way."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _grown(cache: Tensor, new: Tensor, order: Tensor | None) -> Tensor:
    """Rows `order` (B,) of a grown cache (B0, H, t, Dh) (all of them where None), then the new positions
    (B, H, T, Dh): (B, H, t + T, Dh), written in one copy."""
    if order is None:
        return torch.cat([cache, new], dim=2)
    if _records_grad(cache, new):
        return torch.cat([cache.index_select(0, order), new], dim=2)
    t = cache.size(2)
    out = cache.new_empty(order.numel(), cache.size(1), t + new.size(2), cache.size(3))  # (B, H, t + T, Dh)
    torch.index_select(cache, 0, order, out=out[:, :, :t])
    out[:, :, t:] = new
    return out


def _take_filled(cache: Tensor, order: Tensor, filled: int) -> Tensor:
    """Rows `order` of a cache (B, H, L, Dh) whose first `filled` positions hold keys or values: (B', H, L, Dh)."""
    if cache.size(2) <= filled or _records_grad(cache):
        return cache.index_select(0, order)
    taken = cache.new_empty(order.numel(), *cache.shape[1:])
    torch.index_select(cache[:, :, :filled], 0, order, out=taken[:, :, :filled])
    return taken


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the source, feed-forward (Vaswani et al., 2017, §3.1)."""

    def __init__(
        self, *, self_attn: MultiHeadAttention, cross_attn: MultiHeadAttention, feed_forward: FeedForward,
        dropout: float, pre_norm: bool,
    ) -> None:
        super().__init__()
        self.self_attn, self.cross_attn, self.feed_forward = self_attn, cross_attn, feed_forward
        d = self_attn.d_model
        self.self_res, self.cross_res, self.ff_res = (
            Residual(d_model=d, dropout=dropout, pre_norm=pre_norm) for _ in range(3)
        )

    def forward(
        self, x: Tensor, self_mask: Tensor | None, past: KV | None, memory_kv: KV, memory_mask: Tensor, *,
        need_attn: bool = False, start: int = 0, memory_bias: Tensor | None = None, group: int = 1,
        self_bias: Tensor | None = None, order: Tensor | None = None,
    ) -> tuple[Tensor, KV, Tensor | None]:
        """Run T new target positions that follow the `past` ones.

        Args:
            x: (B, T, D).
            self_mask: causal mask (T, t + T), True = future; None for a single new token
                (T = 1), which sees every earlier position, and for a whole prefix (no `past`)
                attended by the fused kernels, which take `is_causal` instead.
            past: cached self-attention keys and values of the t = `start` earlier
                positions, or None (t = 0). Either exactly (B0, H, t, Dh), grown by
                concatenation, or preallocated buffers (B0, H, L, Dh) with L >= t + T
                (`Transformer.init_state` with `max_len`), written in place at t .. t + T - 1.
            order: the rows (B,) of `past` that the B hypotheses continue (a search's reorder,
                `TransformerState.index_select`), taken here as the cache is extended, or None:
                B0 = B rows in order.
            memory_kv: cross-attention keys and values of the source (B, H, S, Dh).
            memory_mask: source padding (B, 1, 1, S).
            need_attn: return cross-attention weights per head (B, H, T, S).
            start: t, the position of the first of the T new tokens.
            memory_bias: `memory_mask` as `attention_bias`, or None.
            group: sentences side by side in each row of the fused kernels' calls (no `past`
                only); `self_bias` and `memory_bias` are then their `block_bias`, causal and not.

        Returns:
            x (B, T, D); the cache to carry on: the grown keys and values (B, H, t + T, Dh),
            or the very `past` buffers (B, H, L, Dh) now filled up to t + T; weights or None.
        """
        h = self.self_res.normed(x)
        q, k, v = self.self_attn.project_qkv(h)  # (B, H, T, Dh)
        end = start + x.size(1)
        if past is None:
            cache = (k, v)
        elif past[0].size(2) >= end:
            # Preallocated: no reallocation, and the buffers keep one shape for the whole search.
            # Attend over the filled prefix only, so the result is the growing cache's to the bit.
            if order is not None:
                past = (_take_filled(past[0], order, start), _take_filled(past[1], order, start))
            past[0][:, :, start:end] = k
            past[1][:, :, start:end] = v
            cache = past
            k, v = past[0][:, :, :end], past[1][:, :, :end]  # (B, H, t + T, Dh) views
        else:  # grown (also past a full buffer's capacity, so a short max_len is never an error)
            k, v = _grown(past[0], k, order), _grown(past[1], v, order)  # (B, H, t + T, Dh)
            cache = (k, v)
        # no past: a whole prefix, causally masked
        y, _ = self.self_attn(q, k, v, self_mask, causal=past is None, bias=self_bias, group=group)
        x = self.self_res.add(x, y)
        h = self.cross_res.normed(x)
        y, attn = self.cross_attn(self.cross_attn.project_q(h), *memory_kv, memory_mask, need_weights=need_attn,
                                  average_heads=False, bias=memory_bias, group=group)
        x = self.cross_res.add(x, y)
        return self.ff_res.add(x, self.feed_forward(self.ff_res.normed(x))), cache, attn


class Encoder(nn.Module):
    """Embeddings plus positions, a stack of `EncoderLayer`s, and a final LayerNorm with pre-norm.

    With `pack` > 0 and fused attention, each attention call lays sentences side by side in rows of up to
    `pack` positions (`sentences_per_row`), kept apart by their `block_bias`.
    """

    def __init__(
        self, *, embed: Embedding, positions: nn.Module, layers: list[EncoderLayer], dropout: float, pre_norm: bool,
        pack: int = 0,
    ) -> None:
        super().__init__()
        self.embed, self.positions, self.layers, self.pack = embed, positions, nn.ModuleList(layers), pack
        self.dropout = Dropout(dropout)
        self.norm = nn.LayerNorm(embed.d_model) if pre_norm else nn.Identity()

    def forward(self, src: Tensor, pad_mask: Tensor) -> tuple[Tensor, Tensor | None]:
        """src (B, S), pad_mask (B, S) -> states (B, S, D), and the padding's `attention_bias` (B, 1, 1, S) the
        layers attended with (None on the manual path), which the decoder's cross-attention reuses."""
        x = self.dropout(self.embed(src) + self.positions(src.size(1)))  # (B, S, D)
        mask = pad_mask[:, None, None, :]  # (B, 1, 1, S)
        bias = _shared_bias(mask, x.dtype, self.layers[0].self_attn)  # (B, 1, 1, S)
        B, S = pad_mask.shape
        group = _group(self.pack, B, S, self.layers[0].self_attn)
        rows = bias if group == 1 else block_bias(pad_mask, group, S, S, causal=False, dtype=x.dtype, device=x.device)
        for layer in self.layers:
            x = layer(x, mask, rows, group)
        return self.norm(x), bias


class Decoder(nn.Module):
    """Embeddings plus positions, a stack of `DecoderLayer`s, and a final LayerNorm with pre-norm.

    Target padding needs no mask of its own: targets are right-padded, so the
    causal mask already hides every pad from the real positions before it. A whole
    prefix (no `past`) is attended in rows of sentences side by side as in `Encoder`.
    """

    def __init__(
        self, *, embed: Embedding, positions: nn.Module, layers: list[DecoderLayer], dropout: float, pre_norm: bool,
        pack: int = 0,
    ) -> None:
        super().__init__()
        self.embed, self.positions, self.layers, self.pack = embed, positions, nn.ModuleList(layers), pack
        self.dropout = Dropout(dropout)
        self.norm = nn.LayerNorm(embed.d_model) if pre_norm else nn.Identity()

    def project_memory(self, states: Tensor) -> list[KV]:
        """Cross-attention keys and values of every layer: states (B, S, D) -> [(B, H, S, Dh)] * layers."""
        return [layer.cross_attn.project_kv(states) for layer in self.layers]

    def forward(
        self, tokens: Tensor, memory_kv: list[KV], memory_pad_mask: Tensor, *, past: list[KV] | None = None,
        start: int = 0, attn_layer: int | None = None, memory_bias: Tensor | None = None,
        order: Tensor | None = None,
    ) -> tuple[Tensor, list[KV], Tensor | None]:
        """Decode tokens (B, T) at positions start .. start + T - 1.

        Args:
            tokens: (B, T).
            memory_kv: from `project_memory`.
            memory_pad_mask: source padding (B, S).
            past: per-layer cached keys and values of the `start` earlier positions, or None;
                grown or preallocated, see `DecoderLayer.forward`.
            start: position of the first token.
            attn_layer: index of the layer whose cross-attention weights to return.
            memory_bias: `memory_pad_mask` as the encoder built its `attention_bias` (B, 1, 1, S), which the
                fused kernels take instead of converting the mask at every layer; None on the manual path.
            order: the rows of `past` that the B tokens continue, or None (`DecoderLayer.forward`).

        Returns:
            States (B, T, D), per-layer caches (`DecoderLayer.forward`) holding start + T positions,
            cross-attention weights (B, H, T, S) of `attn_layer` or None.
        """
        T = tokens.size(1)
        x = self.dropout(self.embed(tokens) + self.positions(T, offset=start))  # (B, T, D)
        # One new token (a search step) sees every position before it: no mask, so the fused
        # attention kernels take their unmasked path and no mask is built per step. A whole
        # prefix (training, scoring) needs none either where the fused kernels mask it themselves.
        fused_causal = past is None and self.layers[0].self_attn.impl == "sdpa"
        self_mask = None if T == 1 or fused_causal else causal_mask(start + T, device=tokens.device)[start:]
        memory_mask = memory_pad_mask[:, None, None, :]  # (B, 1, 1, S)
        group = 1 if past is not None else _group(self.pack, tokens.size(0), T, self.layers[0].self_attn)
        self_bias = None
        if group > 1:
            S, like_x = memory_pad_mask.size(1), {"dtype": x.dtype, "device": x.device}
            self_bias = block_bias(None, group, T, T, causal=True, **like_x)
            memory_bias = block_bias(memory_pad_mask, group, T, S, causal=False, **like_x)
        wanted = None if attn_layer is None else range(len(self.layers))[attn_layer]
        present, attn = [], None
        for i, layer in enumerate(self.layers):
            layer_past = None if past is None else past[i]
            x, kv, weights = layer(x, self_mask, layer_past, memory_kv[i], memory_mask, need_attn=i == wanted,
                                   start=start, memory_bias=memory_bias, group=group, self_bias=self_bias,
                                   order=order)
            present.append(kv)
            attn = weights if i == wanted else attn
        return self.norm(x), present, attn
