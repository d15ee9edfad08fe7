"""Multi-head attention (Vaswani et al., 2017, "Attention Is All You Need", §3.2).

Read top to bottom: scaled dot-product attention (and its one-query form for search
steps), `MultiHeadAttention` with its joint projections and the older parameter layouts
they load from, and the rows of sentences side by side that the fused kernels take.
The Transformer's layers (`nmt.models.transformer_layers`) are built from it.

Shapes: B batch, H heads, L a sequence length, Tq/Tk query/key lengths, D model width,
Dh = D / H. Masks are boolean with True = ignore (`nmt.models.masks`), broadcastable
to the scores (B, H, Tq, Tk).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.models.layers import apply_dropout
from nmt.models.masks import causal_mask

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
