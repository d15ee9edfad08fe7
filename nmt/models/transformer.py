"""Transformer encoder-decoder written out (Vaswani et al., 2017, "Attention Is All You Need").

Read top to bottom: scaled dot-product attention and multi-head attention, the
residual block (post-norm as in the paper, or pre-norm after Xiong et al., 2020,
"On Layer Normalization in the Transformer Architecture"), the encoder and
decoder layers and stacks, then the model with its incremental decoding state.

Shapes: B batch, S source length, T target length, D model width, H heads,
Dh = D / H, V vocabulary size. Masks are boolean with True = ignore
(`nmt.models.masks`), broadcastable to the scores (B, H, Tq, Tk).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.models.contract import Memory, check_attention_choice
from nmt.models.layers import (
    Dropout,
    Embedding,
    FeedForward,
    LearnedPositions,
    SinusoidalPositions,
    apply_dropout,
)
from nmt.models.masks import attention_bias, block_bias, causal_mask, sentences_per_row

KV = tuple[Tensor, Tensor]  # keys and values, each (B, H, L, Dh)


def attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(Dh)) V (Vaswani et al., 2017, eq. 1).

    Args:
        q: queries (B, H, Tq, Dh).
        k, v: keys and values (B, H, Tk, Dh).
        mask: True where a key must be ignored, broadcastable to (B, H, Tq, Tk).
        dropout_p: dropout on the attention weights (pass 0 in eval mode).

    Returns:
        The context (B, H, Tq, Dh) and the weights before dropout (B, H, Tq, Tk).
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return apply_dropout(weights, dropout_p) @ v, weights


def one_query_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    """`attention` of a single query position (a search step), with the padding as an additive bias:
    q (B, H, 1, Dh), k and v (B, H, Tk, Dh), bias broadcastable to (B, H, 1, Tk) or None -> (B, H, 1, Dh).

    Two batched matrix products and a softmax, the scaling and bias added in place: on a CPU in fp32
    1.5-2x faster than torch's fused kernel for one query row over contiguous keys (`MultiHeadAttention.forward`).
    """
    scores = q @ k.transpose(-2, -1)  # (B, H, 1, Tk)
    scores.mul_(1.0 / math.sqrt(q.size(-1)))
    if bias is not None:
        scores.add_(bias)
    return scores.softmax(dim=-1) @ v


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al., 2017, §3.2.2) over projected queries, keys and values.

    The projections are separate from `forward`, so a decoder can cache keys and
    values: self-attention appends one step at a time, and cross-attention projects
    the encoder output once per sentence. Self-attention projects its one input into
    queries, keys and values with one (3D, D) matrix (`qkv_proj`: queries in rows
    0..D-1, keys in D..2D-1, values in 2D..3D-1), `project_qkv`; cross-attention
    projects queries with `q_proj` (`project_q`) and the source into keys and values
    with one (2D, D) matrix (`kv_proj`), `project_kv`. One matrix product where there
    would be three or two: fewer, larger kernels, in the backward pass as well.

    Args:
        d_model: D.
        heads: H, must divide D.
        impl: "manual" (`attention` above) or "sdpa" (torch's fused kernel, same maths).
        attention_dropout: dropout on the attention weights.
        self_attention: queries, keys and values come from one input (`qkv_proj`),
            else queries from one and keys and values from another (`q_proj`, `kv_proj`).

    Raises:
        ValueError: D not divisible by H, unknown `impl`, dropout out of range.
    """

    def __init__(
        self, *, d_model: int, heads: int, impl: str, attention_dropout: float = 0.0, self_attention: bool = False,
    ) -> None:  # fmt: skip
        super().__init__()
        if heads < 1 or d_model % heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by heads ({heads})")
        if impl not in ("manual", "sdpa"):
            raise ValueError(f"attention impl ({impl!r}) must be 'manual' or 'sdpa'")
        if not 0.0 <= attention_dropout < 1.0:
            raise ValueError(f"attention_dropout ({attention_dropout}) must be in [0, 1)")
        self.d_model, self.heads, self.head_dim = d_model, heads, d_model // heads
        self.attention_dropout, self.impl, self.self_attention = attention_dropout, impl, self_attention
        if self_attention:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)
            projections = [self.qkv_proj]
        else:
            self.q_proj, self.kv_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, 2 * d_model)
            projections = [self.q_proj, self.kv_proj]
        self.out_proj = nn.Linear(d_model, d_model)
        # Each (D, D) block initialised as its own layer would be: queries, keys and values alike.
        for linear in (*projections, self.out_proj):
            for block in linear.weight.split(d_model):
                nn.init.xavier_uniform_(block)
            nn.init.zeros_(linear.bias)

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, L, D) -> (B, H, L, Dh), a view whose backward is a view too (`_heads` of one projection
        would unbind, whose backward stacks: a kernel more per layer and update)."""
        B, L, _ = x.shape
        return x.view(B, L, self.heads, self.head_dim).transpose(1, 2)  # (B, H, L, Dh)

    def _heads(self, x: Tensor, n: int) -> tuple[Tensor, ...]:
        """(B, L, n * D), n projections side by side -> n tensors (B, H, L, Dh), views of x.

        Unbound along the projections' own axis of (B, L, n, H, Dh), each then transposed: the
        backward stacks the n gradients straight into x's layout. Unbound after a permute to
        (n, B, H, L, Dh), the stacked gradient would need a copy more to get back to (B, L, n * D),
        a kernel per projection and update over its whole output.
        """
        B, L, _ = x.shape
        return tuple(part.transpose(1, 2) for part in x.view(B, L, n, self.heads, self.head_dim).unbind(2))

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's queries, keys and values of x (B, L, D), each (B, H, L, Dh)."""
        q, k, v = self._heads(self.qkv_proj(x), 3)
        return q, k, v

    def project_q(self, x: Tensor) -> Tensor:
        """Cross-attention's queries of x (B, L, D): (B, H, L, Dh)."""
        return self.split_heads(self.q_proj(x))

    def project_kv(self, x: Tensor) -> KV:
        """Cross-attention's keys and values of x (B, L, D), each (B, H, L, Dh)."""
        k, v = self._heads(self.kv_proj(x), 2)
        return k, v

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # Older checkpoints hold a merged projection as its parts (`older_parameter_names`).
        merged = ("qkv_proj",) if self.self_attention else ("kv_proj",)
        for name in (f"{prefix}{proj}.{kind}" for proj in merged for kind in ("weight", "bias")):
            if name in state_dict:
                continue
            for parts in older_parameter_names(name):
                if all(part in state_dict for part in parts):
                    state_dict[name] = torch.cat([state_dict.pop(part) for part in parts])
                    break
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, need_weights: bool = False,
        average_heads: bool = True, causal: bool = False, bias: Tensor | None = None, group: int = 1,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from queries to keys and values, all from the `project_*` methods.

        Args:
            q: queries (B, H, Tq, Dh).
            k, v: (B, H, Tk, Dh).
            mask: True = ignore, broadcastable to (B, H, Tq, Tk).
            need_weights: also return the attention weights (computed by the
                manual path, whatever `impl` is).
            average_heads: weights averaged over heads (B, Tq, Tk), else (B, H, Tq, Tk).
            causal: each of Tq == Tk positions sees itself and those before it, and
                `mask` is that causal mask or None; the fused path passes `is_causal`
                instead of a mask, which lets torch use flash attention (it takes no
                explicit mask), the manual one builds the mask where it is None.
            bias: `mask` as `masks.attention_bias`, built once by a caller whose layers
                share the mask; the fused path takes it instead of converting `mask`.
            group: the fused path lays this many sentences side by side in each row of one
                call (`side_by_side`), and `bias` is then their `masks.block_bias`, which
                keeps each sentence to itself (causally where `causal`): the same attention
                in fewer, longer rows, which fused kernels tile better on short sentences.
                The manual path attends sentence by sentence with `mask` whatever it is.

        A single fp32 query position on a CPU (each search step) takes `one_query_attention` on the fused
        path: torch's CPU kernel, made for many query rows, is slower there (`bench/decode_speed.py`:
        beam 5 6-12% faster on a Multi30k-sized model). In bf16 the CPU's products gained nothing on the
        kernel and kept 42% more peak memory in beam search (oneDNN caches a plan for every key length), so bf16
        keeps the kernel, as GPUs do.

        Returns:
            The output (B, Tq, D) and the weights or None.
        """
        B, _, Tq, _ = q.shape
        p = self.attention_dropout if self.training else 0.0
        weights = None
        if self.impl == "manual" or need_weights:
            if causal and mask is None:
                mask = causal_mask(Tq, device=q.device)
            context, weights = attention(q, k, v, mask, p)
        elif group > 1:
            rows = (side_by_side(t, group) for t in (q, k, v))
            context = F.scaled_dot_product_attention(*rows, attn_mask=bias, dropout_p=p)  # (B / group, H, ., Dh)
        else:
            if mask is None or causal:  # causal with one query: one key (Tq = Tk), nothing to mask
                attn_mask = None
            elif bias is not None:
                attn_mask = bias
            else:  # sdpa's boolean mask means True = attend: the one place our polarity is inverted.
                attn_mask = ~mask
            additive = attn_mask is None or attn_mask.is_floating_point()
            if Tq == 1 and p == 0.0 and additive and q.device.type == "cpu" and q.dtype == torch.float32:
                context = one_query_attention(q, k, v, attn_mask)
            else:
                context = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=causal)
        context = context.transpose(1, 2).reshape(B, Tq, self.d_model)  # (B, Tq, D)
        if weights is not None and average_heads:
            weights = weights.mean(dim=1)  # (B, Tq, Tk)
        return self.out_proj(context), weights if need_weights else None


def side_by_side(x: Tensor, group: int) -> Tensor:
    """Heads (B, H, L, Dh) as rows of `group` sentences one after another (B / group, H, group * L, Dh); a view
    where x is a head split of (B, L, ..., H, Dh), as the projections make them. The output of attention over
    such rows, transposed to (B / group, group * L, H, Dh), reshapes to (B, L, H * Dh) sentence by sentence."""
    B, H, L, Dh = x.shape
    return x.transpose(1, 2).reshape(B // group, group * L, H, Dh).transpose(1, 2)


def older_parameter_names(name: str) -> list[tuple[str, ...]]:
    """The parameters an older layout held in place of parameter `name`, which joins them along dim 0.

    Self-attention's `qkv_proj` was `q_proj` and `kv_proj`, and before that `q_proj`,
    `k_proj` and `v_proj`; cross-attention's `kv_proj` was `k_proj` and `v_proj`. Each
    layout is a tuple of full names, newest first; [] for a parameter no layout split.
    Checkpoints of those layouts load (`MultiHeadAttention._load_from_state_dict`), and
    runs saved in them resume with their optimizer state (`nmt.train.optim.load_optimizer_state`).
    """
    module, _, kind = name.rpartition(".")
    prefix, _, proj = module.rpartition(".")
    at = f"{prefix}." if prefix else ""
    q, k, v, kv = (f"{at}{part}.{kind}" for part in ("q_proj", "k_proj", "v_proj", "kv_proj"))
    if proj == "qkv_proj":
        return [(q, kv), (q, k, v)]
    if proj == "kv_proj":
        return [(k, v)]
    return []


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


@dataclass
class TransformerState:
    """Incremental decoding state, every tensor batch-first.

    Attributes:
        self_kv: per decoder layer, self-attention keys and values: either exactly the
            t positions so far (B0, H, t, Dh), or buffers (B0, H, L, Dh) preallocated for
            L positions of which the first t are filled (see `Transformer.init_state`).
            (The cross-attention keys and values live in `Memory.extra`, see `encode`.)
        step: t, the number of tokens decoded so far (the next token's position).
        order: the rows (B,) of `self_kv` that the state's B hypotheses continue, or None
            (B = B0, in order): a reorder not yet taken, see `index_select`.
    """

    self_kv: list[KV]
    step: int
    order: Tensor | None = None

    def index_select(self, order: Tensor) -> TransformerState:
        """Keep (and repeat) hypotheses `order` (B',): caches are reordered, not recomputed.

        The caches are not copied here but by the next `decode_step`, which takes the rows as it
        extends them (`_grown`: one copy of a grown cache a step, where a reorder and then a
        concatenation made two); of preallocated buffers it takes only the t filled positions, into
        new buffers of the same length whose later positions are left unwritten (each step writes
        its position before it reads it). Reorders in a row compose into one.
        """
        rows = order if self.order is None else self.order.index_select(0, order)
        return TransformerState(self_kv=self.self_kv, step=self.step, order=rows)


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


class Transformer(nn.Module):
    """Transformer encoder-decoder (Vaswani et al., 2017) implementing `nmt.models.contract.Seq2Seq`.

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes.
        pad_id: padding id (its embedding row is zero).
        d_model, heads, encoder_layers, decoder_layers, ff_dim: sizes.
        dropout: on embeddings plus positions and on each sub-layer output.
        attention_dropout: on attention weights.
        activation_dropout: inside the feed-forward block.
        activation: "relu" or "gelu".
        norm: "post" (the paper's) or "pre" (Xiong et al., 2020; adds a final LayerNorm to each stack).
        positions: "sinusoidal" or "learned".
        max_positions: longest source or target sequence.
        attention_impl: "manual" or "sdpa".
        attention_pack: with "sdpa", attend in rows of up to this many positions that hold
            several sentences side by side, kept apart by a block-diagonal bias (0: a sentence a
            row). Search steps attend sentence by sentence either way.
        tie_embeddings: "none"; "decoder" shares the target embedding with the
            output projection (Press & Wolf, 2017); "all" also shares it with the
            source embedding (one Parameter; needs one vocabulary).

    Attributes:
        attn_layer, attn_head: whose cross-attention `decode_step` returns: a
            decoder layer index (default -1, the last) and a head (None: the mean over heads).

    Raises:
        ValueError: an invalid size, option or combination; the message shows the values.
    """

    graph_safe = True  # its training forward never waits for the device: `train.cuda_graphs` can record it

    def __init__(
        self,
        *,
        src_vocab_size: int, tgt_vocab_size: int, pad_id: int,
        d_model: int, heads: int, encoder_layers: int, decoder_layers: int, ff_dim: int,
        dropout: float, attention_dropout: float, activation_dropout: float,
        activation: str, norm: str, positions: str, max_positions: int,
        attention_impl: str, tie_embeddings: str, attention_pack: int = 0,
    ) -> None:
        super().__init__()
        for name, value, choices in (
            ("norm", norm, ("pre", "post")),
            ("positions", positions, ("sinusoidal", "learned")),
            ("tie_embeddings", tie_embeddings, ("none", "decoder", "all")),
        ):
            if value not in choices:
                raise ValueError(f"{name} ({value!r}) must be one of {choices}")
        if tie_embeddings == "all" and src_vocab_size != tgt_vocab_size:
            raise ValueError(
                f"tie_embeddings 'all' needs one vocabulary: src_vocab_size ({src_vocab_size}) "
                f"!= tgt_vocab_size ({tgt_vocab_size})"
            )
        if attention_pack < 0:
            raise ValueError(f"attention_pack ({attention_pack}) must be >= 0")
        if encoder_layers < 1 or decoder_layers < 1:
            raise ValueError(f"encoder_layers ({encoder_layers}), decoder_layers ({decoder_layers}) must be >= 1")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout ({dropout}) must be in [0, 1)")
        self.src_vocab_size, self.tgt_vocab_size, self.pad_id = src_vocab_size, tgt_vocab_size, pad_id
        self.attn_layer: int = -1
        self.attn_head: int | None = None
        self.name, self.max_positions, self.has_attention = "transformer", max_positions, True
        self._heads = heads
        pre_norm = norm == "pre"
        Positions = SinusoidalPositions if positions == "sinusoidal" else LearnedPositions

        def mha(*, self_attention: bool) -> MultiHeadAttention:
            return MultiHeadAttention(d_model=d_model, heads=heads, impl=attention_impl,
                                      attention_dropout=attention_dropout, self_attention=self_attention)

        def ffn() -> FeedForward:
            return FeedForward(d_model=d_model, ff_dim=ff_dim, activation=activation, activation_dropout=activation_dropout)

        common = {"dropout": dropout, "pre_norm": pre_norm}
        src_embed = Embedding(vocab_size=src_vocab_size, d_model=d_model, pad_id=pad_id)
        tgt_embed = Embedding(vocab_size=tgt_vocab_size, d_model=d_model, pad_id=pad_id)
        self.encoder = Encoder(
            embed=src_embed,
            positions=Positions(d_model=d_model, max_positions=max_positions),
            layers=[
                EncoderLayer(self_attn=mha(self_attention=True), feed_forward=ffn(), **common)
                for _ in range(encoder_layers)
            ],
            pack=attention_pack,
            **common,
        )
        self.decoder = Decoder(
            embed=tgt_embed,
            positions=Positions(d_model=d_model, max_positions=max_positions),
            layers=[
                DecoderLayer(self_attn=mha(self_attention=True), cross_attn=mha(self_attention=False),
                             feed_forward=ffn(), **common)
                for _ in range(decoder_layers)
            ],
            pack=attention_pack,
            **common,
        )
        self.output = nn.Linear(d_model, tgt_vocab_size, bias=False)
        # Untied, the output matrix is initialised like an embedding (as in fairseq).
        nn.init.normal_(self.output.weight, mean=0.0, std=d_model**-0.5)
        if tie_embeddings in ("decoder", "all"):
            self.output.weight = tgt_embed.weight
        if tie_embeddings == "all":
            src_embed.weight = tgt_embed.weight

    def forward(self, src: Tensor, src_pad_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits: src (B, S), src_pad_mask (B, S), tgt_in (B, T) -> (B, T, V)."""
        return self.decode(tgt_in, self.encode(src, src_pad_mask))

    def select_attention(self, *, layer: int = -1, head: int | None = None) -> None:
        """Return the cross-attention of decoder layer `layer` and head `head` (None: the mean over heads).

        Raises:
            ValueError: a layer or head outside the model.
        """
        check_attention_choice(layer, head, layers=len(self.decoder.layers), heads=self._heads)
        self.attn_layer, self.attn_head = layer, head

    def encode(self, src: Tensor, src_pad_mask: Tensor) -> Memory:
        """src (B, S), src_pad_mask (B, S) True at padding -> Memory with states (B, S, D).

        extra["cross_kv"] holds every decoder layer's cross-attention keys and values
        (B, H, S, Dh): they depend on the source alone, so they are computed once per
        sentence and travel with the memory, which search reorders only when sentences
        finish, never when hypotheses of one sentence change places. extra["bias"] is the
        source padding as the encoder's layers attended with it (`attention_bias`, or None on
        the manual path); the cross-attention of every decoder step reuses it.
        """
        states, bias = self.encoder(src, src_pad_mask)
        return Memory(states=states, pad_mask=src_pad_mask,
                      extra={"cross_kv": self.decoder.project_memory(states), "bias": bias})

    def decode(self, tgt_in: Tensor, memory: Memory) -> Tensor:
        """Logits of a whole target prefix, causally masked, no cache: tgt_in (B, T) -> (B, T, V)."""
        states, _, _ = self.decoder(tgt_in, memory.extra["cross_kv"], memory.pad_mask,
                                    memory_bias=memory.extra["bias"])
        return self.output(states)

    def init_state(self, memory: Memory, *, max_len: int | None = None) -> TransformerState:
        """Empty self-attention caches, one per decoder layer.

        Args:
            memory: from `encode`.
            max_len: the most positions `decode_step` will be called for. Given, each
                layer's keys and values are preallocated (B, H, max_len, Dh) and every
                step writes its position in place: one shape for the whole search, no
                reallocation. None: the caches grow by one position per step
                (concatenation; for callers that do not know the length). Either way
                the results are the same, and steps beyond max_len still work (they grow).
        """
        k, _ = memory.extra["cross_kv"][0]
        B, H, _, Dh = k.shape
        L = 0 if max_len is None else max_len
        # new_zeros takes the projections' dtype: bf16 buffers under bf16 autocast, as project_kv writes.
        return TransformerState(self_kv=[(k.new_zeros(B, H, L, Dh), k.new_zeros(B, H, L, Dh))  # (B, H, L, Dh)
                                         for _ in self.decoder.layers], step=0)

    def decode_step(
        self, tokens: Tensor, memory: Memory, state: TransformerState, *, need_attn: bool = False
    ) -> tuple[Tensor, TransformerState, Tensor | None]:
        """One new token per hypothesis at position `state.step`.

        Args:
            tokens: the previous output token of each hypothesis (B,).
            memory: from `encode`, reordered like `state`.
            state: from `init_state` or the previous step. Grown caches are not modified.
                Preallocated buffers are shared with the new state and written at position
                `state.step` only, which `state` itself never reads, so `state` stays valid;
                but two steps from one state share that position: `index_select` before
                branching (a step after it writes into copies), as search does.
            need_attn: also return cross-attention weights (see `attn_layer`, `attn_head`).

        Returns:
            Log-probabilities (B, V) in float32, the new state, and the weights (B, S) or None.
        """
        attn_layer = self.attn_layer if need_attn else None
        states, self_kv, attn = self.decoder(  # states (B, 1, D)
            tokens[:, None], memory.extra["cross_kv"], memory.pad_mask, past=state.self_kv, start=state.step,
            attn_layer=attn_layer, memory_bias=memory.extra["bias"], order=state.order,
        )
        log_probs = self.output(states[:, -1]).float().log_softmax(dim=-1)  # (B, V)
        if attn is not None:
            attn = attn[:, :, -1]  # (B, H, S)
            attn = attn.mean(dim=1) if self.attn_head is None else attn[:, self.attn_head]  # (B, S)
        new_state = TransformerState(self_kv=self_kv, step=state.step + 1)
        return log_probs, new_state, attn
