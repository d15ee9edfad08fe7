"""The attention family: shapes, masking, equivariance, local-p, gradients, builder errors."""

from __future__ import annotations

import math

import pytest
import torch

from nmt.models.attention import (
    ATTENTION_KINDS,
    AdditiveScore,
    CosineScore,
    DotScore,
    GeneralScore,
    ScaledDotScore,
    build_attention,
)
from nmt.models.masks import pad_mask_from_lengths

B, TQ, S, D, HEADS = 2, 3, 5, 8, 2
LENGTHS = torch.tensor([5, 3])


def make(kind: str, window: int = 0, dim: int = D, dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    attention = build_attention(kind, query_dim=dim, key_dim=dim, heads=HEADS, local_window=window)
    return attention.to(dtype).eval()


def inputs(batch=B, tq=TQ, s=S, dim=D, lengths=LENGTHS, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    query = torch.randn(batch, tq, dim, generator=g, dtype=dtype)
    keys = torch.randn(batch, s, dim, generator=g, dtype=dtype)
    values = torch.randn(batch, s, dim, generator=g, dtype=dtype)
    return query, keys, values, pad_mask_from_lengths(lengths, s)


@pytest.mark.parametrize("window", [0, 1])
@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_shapes(kind, window):
    attention = make(kind, window)
    context, weights = attention(*inputs())
    assert context.shape == (B, TQ, attention.context_dim) == (B, TQ, D)
    assert weights.shape == (B, TQ, S)
    assert torch.isfinite(context).all() and torch.isfinite(weights).all()


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_global_weights_sum_to_one_and_are_zero_at_padding(kind):
    _, weights = make(kind)(*inputs())
    mask = inputs()[3]
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, TQ))
    assert (weights.masked_select(mask.unsqueeze(1).expand_as(weights)) == 0).all()
    assert (weights.masked_select(~mask.unsqueeze(1).expand_as(weights)) > 0).all()


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_global_attention_is_permutation_equivariant(kind):
    """Permuting real keys and values permutes the weights alike; the context stays."""
    attention = make(kind)
    query, keys, values, mask = inputs()
    perm = torch.stack(
        [torch.tensor([3, 0, 4, 1, 2]), torch.tensor([2, 0, 1, 3, 4])]
    )  # pads stay put
    gather = perm.unsqueeze(-1).expand(-1, -1, D)
    context, weights = attention(query, keys, values, mask)
    context_p, weights_p = attention(query, keys.gather(1, gather), values.gather(1, gather), mask)
    torch.testing.assert_close(context_p, context)
    torch.testing.assert_close(weights_p, weights.gather(2, perm.unsqueeze(1).expand(-1, TQ, -1)))


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_local_p_window(kind):
    """Luong eq. 9-10: zero at pads and outside [p_t - D, p_t + D]; softmax * Gaussian.

    Local-p is position-based, so it is not permutation-equivariant (not tested).
    """
    window = 1
    attention = make(kind, window)
    query, keys, values, mask = inputs()
    _, weights = attention(query, keys, values, mask)
    centres = attention.local.centres(query, mask)  # (B, TQ)
    assert (centres >= 0).all() and (centres <= LENGTHS.unsqueeze(1)).all()
    distance = torch.arange(S) - centres.unsqueeze(-1)  # (B, TQ, S)
    ignored = mask.unsqueeze(1) | (distance.abs() > window)
    assert (weights[ignored] == 0).all()
    assert (weights[~ignored] > 0).all()
    # Not renormalised (as in the paper): dividing out the Gaussian leaves a softmax.
    gaussian = torch.exp(-(distance**2) / (2 * (window / 2) ** 2))
    assert (weights.sum(-1) <= 1 + 1e-6).all()
    torch.testing.assert_close((weights / gaussian).sum(-1), torch.ones(B, TQ))


@pytest.mark.parametrize("window", [0, 2])
@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_extra_padding_changes_nothing(kind, window):
    """The local-p centre uses the true length, so more padding changes no weight."""
    attention = make(kind, window)
    query, keys, values, mask = inputs()
    padded = [torch.cat([x, torch.randn(B, 3, D)], dim=1) for x in (keys, values)]
    context, weights = attention(query, keys, values, mask)
    context_p, weights_p = attention(query, *padded, pad_mask_from_lengths(LENGTHS, S + 3))
    torch.testing.assert_close(context_p, context)
    torch.testing.assert_close(weights_p[..., :S], weights)
    assert (weights_p[..., S:] == 0).all()


@pytest.mark.parametrize("window", [0, 1])
@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_gradcheck(kind, window):
    attention = make(kind, window, dim=4, dtype=torch.float64)
    query, keys, values, mask = inputs(
        tq=2, s=3, dim=4, lengths=torch.tensor([3, 2]), dtype=torch.float64
    )
    for x in (query, keys, values):
        x.requires_grad_(True)

    def fn(q, k, v):
        return attention(q, k, v, mask)

    # Fast mode checks random projections of the Jacobian (about 20x quicker); one
    # case, the most composite, gets the full check.
    fast = (kind, window) != ("multihead", 1)
    assert torch.autograd.gradcheck(fn, (query, keys, values), fast_mode=fast)


def test_prepare_then_attend_equals_forward():
    attention = make("additive", 2)
    query, keys, values, mask = inputs()
    prepared_keys, prepared_values = attention.prepare(keys, values)
    assert prepared_keys.shape[:3] == (B, 1, S)  # batch-first: fits Memory.extra
    for got, want in zip(
        attention.attend(query, prepared_keys, prepared_values, mask),
        attention(query, keys, values, mask),
    ):
        torch.testing.assert_close(got, want)


def test_multihead_weights_are_the_mean_over_heads():
    attention = make("multihead")
    query, keys, values, mask = inputs()
    _, weights = attention(query, keys, values, mask)
    q = attention.query_proj(query).view(B, TQ, HEADS, D // HEADS).transpose(1, 2)  # (B, H, TQ, Dh)
    k = attention.key_proj(keys).view(B, S, HEADS, D // HEADS).transpose(1, 2)  # (B, H, S, Dh)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(D // HEADS)
    per_head = scores.masked_fill(mask[:, None, None, :], float("-inf")).softmax(-1)
    assert not torch.allclose(per_head[:, 0], per_head[:, 1])
    torch.testing.assert_close(weights, per_head.mean(1))


# --------------------------------------------------------------------------- known answers


def test_score_formulas():
    torch.manual_seed(0)
    query, keys = torch.randn(B, TQ, D), torch.randn(B, S, D)

    def raw(score, q=query, k=keys):
        return score(q, score.prepare_keys(k))

    dot = torch.einsum("btd,bsd->bts", query, keys)
    torch.testing.assert_close(raw(DotScore()), dot)
    torch.testing.assert_close(raw(ScaledDotScore(dim=D)), dot / math.sqrt(D))

    general = GeneralScore(query_dim=6, key_dim=D)
    q6 = torch.randn(B, TQ, 6)
    torch.testing.assert_close(
        raw(general, q=q6), torch.einsum("bti,ij,bsj->bts", q6, general.W_a.weight, keys)
    )

    additive = AdditiveScore(query_dim=D, key_dim=D, hidden_dim=3)
    W, U, b, v = additive.W_a.weight, additive.U_a.weight, additive.U_a.bias, additive.v_a.weight[0]
    expected = torch.stack(
        [
            torch.stack([v @ torch.tanh(W @ query[0, t] + U @ keys[0, s] + b) for s in range(S)])
            for t in range(TQ)
        ]
    )
    torch.testing.assert_close(raw(additive)[0], expected)

    cosine = CosineScore(init_scale=3.0)
    expected = 3.0 * torch.nn.functional.cosine_similarity(
        query.unsqueeze(2), keys.unsqueeze(1), dim=-1
    )
    torch.testing.assert_close(raw(cosine), expected)


def test_scores_have_the_shared_interface():
    scores = [
        DotScore(),
        ScaledDotScore(dim=D),
        GeneralScore(query_dim=D, key_dim=D),
        AdditiveScore(query_dim=D, key_dim=D, hidden_dim=4),
        CosineScore(),
    ]
    query, keys = torch.randn(B, TQ, D), torch.randn(B, S, D)
    for score in scores:
        assert score(query, score.prepare_keys(keys)).shape == (B, TQ, S)
        # Any leading dims (heads): (B, H, Tq, D) x (B, H, S, D) -> (B, H, Tq, S).
        assert score(query.unsqueeze(1), score.prepare_keys(keys.unsqueeze(1))).shape == (
            B,
            1,
            TQ,
            S,
        )


# --------------------------------------------------------------------------- builder


def test_builder_rejects_bad_arguments():
    for kind in ("dot", "scaled_dot", "cosine"):
        with pytest.raises(ValueError, match=r"query_dim \(6\) == key_dim \(8\)"):
            build_attention(kind, query_dim=6, key_dim=8)
    with pytest.raises(ValueError, match=r"key_dim \(8\) must be divisible by heads \(3\)"):
        build_attention("multihead", query_dim=8, key_dim=8, heads=3)
    with pytest.raises(ValueError, match="unknown attention 'luong'"):
        build_attention("luong", query_dim=8, key_dim=8)
    with pytest.raises(ValueError, match=r"local_window \(-1\)"):
        build_attention("dot", query_dim=8, key_dim=8, local_window=-1)


@pytest.mark.parametrize("kind", ["general", "additive", "qkv", "multihead"])
def test_learned_scores_accept_different_query_and_value_widths(kind):
    attention = build_attention(kind, query_dim=6, key_dim=8, value_dim=10, heads=2)
    query = torch.randn(B, TQ, 6)
    keys, values = torch.randn(B, S, 8), torch.randn(B, S, 10)
    context, weights = attention(query, keys, values, pad_mask_from_lengths(LENGTHS, S))
    expected_width = 8 if kind in ("qkv", "multihead") else 10
    assert attention.context_dim == expected_width
    assert context.shape == (B, TQ, expected_width) and weights.shape == (B, TQ, S)


# --------------------------------------------------------------------------- by hand


def local_p_centres_by_hand(attention, query: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Luong et al. (2015), eq. 9 with the module's W_p and v_p: p_t = S * sigmoid(v_p^T tanh(W_p h_t)),
    S each sentence's true length; (B, Tq)."""
    W_p, v_p = attention.local.W_p.weight, attention.local.v_p.weight[0]  # (Dq, Dq), (Dq,)
    fraction = torch.sigmoid(torch.tanh(query @ W_p.T) @ v_p)  # (B, Tq)
    return lengths.to(query.dtype)[:, None] * fraction


def test_local_p_centres_and_weights_follow_eq_9_and_10_from_the_modules_weights():
    """The centre p_t of eq. 9 computed from the module's own W_p and v_p, not read from it; then the dot
    weights of eq. 10 from that centre: the softmax of h_t . h_s over the real positions within D of p_t,
    times exp(-(s - p_t)^2 / (2 (D/2)^2)), not renormalised."""
    window = 1
    attention = make("dot", window)
    query, keys, values, mask = inputs()
    centres = local_p_centres_by_hand(attention, query, LENGTHS)
    torch.testing.assert_close(attention.local.centres(query, mask), centres)
    distance = torch.arange(S) - centres.unsqueeze(-1)  # (B, TQ, S)
    ignored = mask.unsqueeze(1) | (distance.abs() > window)
    scores = torch.einsum("btd,bsd->bts", query, keys).masked_fill(ignored, float("-inf"))
    expected = scores.softmax(-1) * torch.exp(-(distance**2) / (2 * (window / 2) ** 2))
    context, weights = attention(query, keys, values, mask)
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(context, expected @ values)


def test_multihead_context_is_each_heads_context_concatenated_in_order_then_projected():
    """Vaswani et al. (2017), sec. 3.2.2 with the module's W^Q, W^K, W^V, W^O: head i attends with its own
    slice of the projected queries, keys and values, softmax(q_i k_i^T / sqrt(Dh)) v_i, and the output is
    W^O [head_1; ...; head_H] for every one of several queries (with one query any interleaving of heads
    and queries looks the same)."""
    attention = make("multihead")
    query, keys, values, mask = inputs()
    assert TQ > 1
    dh = D // HEADS
    q = query @ attention.query_proj.weight.T  # (B, TQ, D)
    k = keys @ attention.key_proj.weight.T  # (B, S, D)
    v = values @ attention.value_proj.weight.T  # (B, S, D)
    heads = []
    for i in range(HEADS):
        part = slice(i * dh, (i + 1) * dh)
        scores = (q[..., part] @ k[..., part].transpose(1, 2)) / math.sqrt(dh)  # (B, TQ, S)
        weights = scores.masked_fill(mask[:, None, :], float("-inf")).softmax(-1)
        heads.append(weights @ v[..., part])  # (B, TQ, Dh)
    expected = torch.cat(heads, dim=-1) @ attention.out_proj.weight.T  # (B, TQ, D)
    context, _ = attention(query, keys, values, mask)
    torch.testing.assert_close(context, expected)
    assert not torch.allclose(heads[0], heads[1])  # the heads differ: their order matters
