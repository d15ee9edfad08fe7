"""The RNN attention family: score functions behind one interface, and one `Attention`.

Shapes: B batch, Tq queries, S source positions, Dq/Dk/Dv query/key/value widths,
H heads, Dh = Dk / H head width, A additive hidden width, `...` any leading dims.

Every score module has the same two methods:

    prepare_keys(keys (..., S, Dk)) -> keys' (..., S, Dk')   # depends on the keys only
    forward(query (..., Tq, Dq), keys' (..., S, Dk')) -> scores (..., Tq, S)

so the raw score is `score(query, score.prepare_keys(keys))`. The split exists
because an RNN decoder attends to the same source at every step: what depends on
the keys alone (Luong's W_a h̄_s, Bahdanau's U_a h_j, unit-norm keys) is computed
once per sentence and carried in `Memory.extra`, not recomputed T times.

`Attention` turns scores into weights and a context, the same way for every score:

    a = softmax(masked_fill(score(W^Q q, W^K K), pad | outside window, -inf))
    a = a * gaussian                                   (local-p only)
    c = W^O concat_heads(a W^V V)

where the projections are identities except for "qkv" and "multihead", which are
Vaswani et al.'s scaled dot-product attention with learned projections, one head
or several. The score is picked once in `build_attention`; no module branches on
a name.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ATTENTION_KINDS = ("dot", "scaled_dot", "general", "additive", "cosine", "qkv", "multihead")

# --------------------------------------------------------------------------- scores


class DotScore(nn.Module):
    """Luong et al. (2015), eq. 8 "dot": score(h_t, h̄_s) = h_t^T h̄_s."""

    def prepare_keys(self, keys: Tensor) -> Tensor:
        return keys

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        return query @ keys.transpose(-2, -1)  # (..., Tq, S)


class ScaledDotScore(nn.Module):
    """Vaswani et al. (2017), eq. 1: q^T k / sqrt(d_k), so score variance does not grow with d_k.

    Args:
        dim: the key width d_k.
    """

    def __init__(self, *, dim: int) -> None:
        super().__init__()
        self.scale = dim**-0.5

    def prepare_keys(self, keys: Tensor) -> Tensor:
        return keys

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        return (query @ keys.transpose(-2, -1)) * self.scale  # (..., Tq, S)


class GeneralScore(nn.Module):
    """Luong et al. (2015), eq. 8 "general" (bilinear): h_t^T W_a h̄_s.

    `prepare_keys` returns W_a h̄_s (..., S, Dq), so each step is one dot product.
    """

    def __init__(self, *, query_dim: int, key_dim: int) -> None:
        super().__init__()
        self.W_a = nn.Linear(key_dim, query_dim, bias=False)

    def prepare_keys(self, keys: Tensor) -> Tensor:
        return self.W_a(keys)  # (..., S, Dq)

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        return query @ keys.transpose(-2, -1)  # (..., Tq, S)


class AdditiveScore(nn.Module):
    """Bahdanau et al. (2015), eq. 6 with appendix A.1.2 (Luong's "concat", eq. 8).

    e_ts = v_a^T tanh(W_a q_t + U_a k_s): a one-hidden-layer MLP over the pair.
    `prepare_keys` returns U_a k_s + b (..., S, A).
    """

    def __init__(self, *, query_dim: int, key_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.W_a = nn.Linear(query_dim, hidden_dim, bias=False)
        self.U_a = nn.Linear(key_dim, hidden_dim)
        self.v_a = nn.Linear(hidden_dim, 1, bias=False)

    def prepare_keys(self, keys: Tensor) -> Tensor:
        return self.U_a(keys)  # (..., S, A)

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        hidden = torch.tanh(self.W_a(query).unsqueeze(-2) + keys.unsqueeze(-3))  # (..., Tq, S, A)
        return self.v_a(hidden).squeeze(-1)  # (..., Tq, S)


class CosineScore(nn.Module):
    """Content-based addressing (Graves et al., 2014, Neural Turing Machines, eq. 5-6).

    score = beta * cos(q, k). Cosines lie in [-1, 1], which would keep the softmax
    nearly uniform, so the sharpness beta is a learned scalar (kept positive as
    exp(log_beta)), initialised to `init_scale`. NTM emits beta per step; one
    scalar per model is the usual simplification.
    """

    def __init__(self, *, init_scale: float = 10.0) -> None:
        super().__init__()
        self.log_beta = nn.Parameter(torch.tensor(math.log(init_scale)))

    def prepare_keys(self, keys: Tensor) -> Tensor:
        return F.normalize(keys, dim=-1)  # (..., S, Dk), unit norm

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        cosine = F.normalize(query, dim=-1) @ keys.transpose(-2, -1)  # (..., Tq, S)
        return self.log_beta.exp() * cosine


# --------------------------------------------------------------------------- local-p window


class LocalWindow(nn.Module):
    """Luong et al. (2015), local-p attention, eq. 9-10.

    The decoder predicts an aligned source position from its own state,
        p_t = S_len * sigmoid(v_p^T tanh(W_p h_t))                        (9)
    with S_len the true (unpadded) source length, so p_t is in [0, S_len]. Only
    positions in [p_t - D, p_t + D] are attended to, and the softmax weights are
    multiplied by a Gaussian centred on p_t with sigma = D / 2:
        a_t(s) = align(h_t, h̄_s) * exp(-(s - p_t)^2 / (2 sigma^2))          (10)
    As in the paper, the weights are not renormalised afterwards: they sum to at
    most 1, and the Gaussian factor is what lets gradients reach p_t.

    Sources are assumed right-padded (position s is the s-th token). The window
    always holds a real token: p_t < S_len, and the nearest real position is at
    most 1 <= D away.

    Args:
        query_dim: width of h_t.
        half_width: D, at least 1.
    """

    def __init__(self, *, query_dim: int, half_width: int) -> None:
        super().__init__()
        if half_width < 1:
            raise ValueError(f"local window half-width ({half_width}) must be at least 1")
        self.half_width = half_width
        self.W_p = nn.Linear(query_dim, query_dim, bias=False)
        self.v_p = nn.Linear(query_dim, 1, bias=False)

    def centres(self, query: Tensor, key_pad_mask: Tensor) -> Tensor:
        """p_t of eq. 9: query (B, Tq, Dq), key_pad_mask (B, S) -> (B, Tq).

        Positions are compared in at least float32: bf16 cannot count past 256.
        """
        dtype = torch.promote_types(query.dtype, torch.float32)
        lengths = (~key_pad_mask).sum(-1, keepdim=True).to(dtype)  # (B, 1)
        fraction = torch.sigmoid(self.v_p(torch.tanh(self.W_p(query)))).squeeze(-1)  # (B, Tq)
        return lengths * fraction.to(dtype)

    def forward(self, query: Tensor, key_pad_mask: Tensor) -> tuple[Tensor, Tensor]:
        """Window mask and Gaussian factor.

        Returns:
            outside: True where |s - p_t| > D, (B, Tq, S).
            gaussian: exp(-(s - p_t)^2 / (2 (D/2)^2)), (B, Tq, S).
        """
        centres = self.centres(query, key_pad_mask)  # (B, Tq)
        positions = torch.arange(key_pad_mask.size(-1), device=query.device, dtype=centres.dtype)
        distance = positions - centres.unsqueeze(-1)  # (B, Tq, S)
        sigma = self.half_width / 2
        return distance.abs() > self.half_width, torch.exp(-(distance**2) / (2 * sigma**2))


# --------------------------------------------------------------------------- attention


class Attention(nn.Module):
    """Masked softmax attention around any score module.

    Args:
        score: a score module (see the module docstring); with heads > 1 it sees
            one head's width.
        context_dim: width of the returned context.
        heads: H; queries, keys and values are split into H heads of equal width
            after their projections, and the heads' contexts concatenated.
        query_proj, key_proj, value_proj, out_proj: W^Q, W^K, W^V, W^O
            (Vaswani et al., 2017, sec. 3.2.2); identity when None.
        local: Luong's local-p window, or None for global attention.
    """

    def __init__(
        self,
        *,
        score: nn.Module,
        context_dim: int,
        heads: int = 1,
        query_proj: nn.Module | None = None,
        key_proj: nn.Module | None = None,
        value_proj: nn.Module | None = None,
        out_proj: nn.Module | None = None,
        local: LocalWindow | None = None,
    ) -> None:
        super().__init__()
        self.score = score
        self.context_dim = context_dim
        self.heads = heads
        self.query_proj = query_proj or nn.Identity()
        self.key_proj = key_proj or nn.Identity()
        self.value_proj = value_proj or nn.Identity()
        self.out_proj = out_proj or nn.Identity()
        self.local = local

    def _split_heads(self, x: Tensor) -> Tensor:
        B, L, D = x.shape
        return x.view(B, L, self.heads, D // self.heads).transpose(1, 2)  # (B, H, L, D/H)

    def prepare(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Everything that depends on the source only, computed once per sentence.

        Args:
            keys: (B, S, Dk).
            values: (B, S, Dv).

        Returns:
            Prepared keys (B, H, S, Dk') and values (B, H, S, Dh), batch-first.
        """
        keys = self.score.prepare_keys(self._split_heads(self.key_proj(keys)))
        return keys, self._split_heads(self.value_proj(values))

    def attend(
        self, query: Tensor, keys: Tensor, values: Tensor, key_pad_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Attend with keys and values from `prepare`.

        Args:
            query: (B, Tq, Dq).
            keys: prepared keys (B, H, S, Dk').
            values: prepared values (B, H, S, Dh).
            key_pad_mask: True at padding, (B, S); every row needs a real key.

        Returns:
            context (B, Tq, context_dim) and weights (B, Tq, S), averaged over heads.
        """
        scores = self.score(self._split_heads(self.query_proj(query)), keys)  # (B, H, Tq, S)
        ignore = key_pad_mask[:, None, None, :]  # (B, 1, 1, S)
        if self.local is not None:
            outside, gaussian = self.local(query, key_pad_mask)  # (B, Tq, S) each
            ignore = ignore | outside.unsqueeze(1)  # (B, 1, Tq, S)
        weights = scores.masked_fill(ignore, float("-inf")).softmax(dim=-1)  # (B, H, Tq, S)
        if self.local is not None:
            weights = weights * gaussian.unsqueeze(1).to(weights.dtype)
        context = weights @ values  # (B, H, Tq, Dh)
        B, H, Tq, Dh = context.shape
        context = context.transpose(1, 2).reshape(B, Tq, H * Dh)  # (B, Tq, H * Dh)
        return self.out_proj(context), weights.mean(dim=1)

    def forward(
        self, query: Tensor, keys: Tensor, values: Tensor, key_pad_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """query (B, Tq, Dq), keys (B, S, Dk), values (B, S, Dv), key_pad_mask (B, S)
        -> context (B, Tq, context_dim), weights (B, Tq, S)."""
        return self.attend(query, *self.prepare(keys, values), key_pad_mask)


def build_attention(
    kind: str,
    *,
    query_dim: int,
    key_dim: int,
    value_dim: int | None = None,
    heads: int = 1,
    local_window: int = 0,
) -> Attention:
    """Build an `Attention` by name.

    Args:
        kind: one of `ATTENTION_KINDS`.
        query_dim, key_dim: Dq, Dk. "dot", "scaled_dot" and "cosine" compare
            query and key directly, so they need Dq == Dk; "general" and
            "additive" learn the mapping; "qkv" and "multihead" project both to Dk.
        value_dim: Dv (default Dk). The context has width Dv, except for "qkv" and
            "multihead", which project values to Dk.
        heads: H, used by "multihead" only; must divide Dk.
        local_window: D > 0 adds Luong's local-p window; 0 is global attention.

    Raises:
        ValueError: unknown kind, mismatched widths, or heads not dividing Dk.
    """
    value_dim = key_dim if value_dim is None else value_dim
    context_dim, n_heads = value_dim, 1
    projections: dict[str, nn.Module] = {}
    match kind:
        case "dot" | "scaled_dot" | "cosine" if query_dim != key_dim:
            raise ValueError(
                f"{kind} attention needs query_dim ({query_dim}) == key_dim ({key_dim}); "
                "use general, additive or qkv"
            )
        case "dot":
            score: nn.Module = DotScore()
        case "scaled_dot":
            score = ScaledDotScore(dim=key_dim)
        case "cosine":
            score = CosineScore()
        case "general":
            score = GeneralScore(query_dim=query_dim, key_dim=key_dim)
        case "additive":
            score = AdditiveScore(query_dim=query_dim, key_dim=key_dim, hidden_dim=key_dim)
        case "qkv":
            score = ScaledDotScore(dim=key_dim)
            context_dim, projections = key_dim, _qkv_projections(query_dim, key_dim, value_dim)
        case "multihead":
            if heads < 1 or key_dim % heads:
                raise ValueError(f"key_dim ({key_dim}) must be divisible by heads ({heads})")
            score, n_heads = ScaledDotScore(dim=key_dim // heads), heads
            context_dim, projections = key_dim, _qkv_projections(query_dim, key_dim, value_dim)
            projections["out_proj"] = nn.Linear(key_dim, key_dim, bias=False)
        case _:
            raise ValueError(
                f"unknown attention {kind!r}; expected one of {', '.join(ATTENTION_KINDS)}"
            )
    if local_window < 0:
        raise ValueError(f"local_window ({local_window}) must be >= 0")
    local = LocalWindow(query_dim=query_dim, half_width=local_window) if local_window else None
    return Attention(
        score=score, context_dim=context_dim, heads=n_heads, local=local, **projections
    )


def _qkv_projections(query_dim: int, key_dim: int, value_dim: int) -> dict[str, nn.Module]:
    """W^Q, W^K, W^V of Vaswani et al. (2017), sec. 3.2.2, all onto width Dk."""
    return {
        "query_proj": nn.Linear(query_dim, key_dim, bias=False),
        "key_proj": nn.Linear(key_dim, key_dim, bias=False),
        "value_proj": nn.Linear(value_dim, key_dim, bias=False),
    }
