"""Multi-head attention: the manual and fused paths agree with torch's, heads are views, bad sizes raise."""

import pytest
import torch
import torch.nn.functional as F

from nmt.models.masks import attention_bias, causal_mask
from nmt.models.multihead import MultiHeadAttention, one_query_attention
from tests.op_counts import OpCounter


def test_manual_attention_matches_torch_sdpa_on_the_same_projections():
    torch.manual_seed(0)
    manual = MultiHeadAttention(d_model=16, heads=4, impl="manual").eval()
    fused = MultiHeadAttention(d_model=16, heads=4, impl="sdpa").eval()
    fused.load_state_dict(manual.state_dict())
    x, mem = torch.randn(2, 5, 16), torch.randn(2, 6, 16)
    pad = torch.tensor([[False] * 6, [False] * 3 + [True] * 3])[:, None, None, :]  # (B, 1, 1, S)
    for query, source, mask in [(mem, mem, pad), (x, mem, pad), (x, x, causal_mask(5))]:
        q = manual.project_q(query)  # (B, H, Tq, Dh)
        k, v = manual.project_kv(source)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=~mask)  # True = attend in sdpa
        ref = manual.out_proj(ref.transpose(1, 2).reshape(query.shape))
        out, weights = manual(q, k, v, mask, need_weights=True)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(fused(q, k, v, mask)[0], ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
        assert torch.all(weights.masked_select(mask.squeeze(1)) == 0)  # heads averaged: (B, Tq, Tk)


def test_one_query_attention_matches_torch_sdpa_with_padding():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 1, 8), torch.randn(3, 4, 6, 8), torch.randn(3, 4, 6, 8)
    pad = torch.tensor([[False] * 6, [False] * 2 + [True] * 4, [False] * 5 + [True]])[:, None, None, :]
    for tensor in (q, k, v):
        tensor.requires_grad_(True)
    out = one_query_attention(q, k, v, attention_bias(pad, torch.float32))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=~pad)  # True = attend in sdpa
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    for got, want in zip(grads, torch.autograd.grad(ref.square().sum(), (q, k, v)), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert torch.all(grads[1][1, :, 2:] == 0)  # padded keys get nothing
    torch.testing.assert_close(one_query_attention(q, k, v, None), F.scaled_dot_product_attention(q, k, v))


def test_self_attention_projects_like_torch_multihead_attention_with_one_matrix():
    """`qkv_proj` stacks the query, key and value matrices as nn.MultiheadAttention's `in_proj_weight` does:
    loaded into torch's module, the same weights give the same output, masked and causal."""
    torch.manual_seed(0)
    ours = MultiHeadAttention(d_model=16, heads=4, impl="sdpa", self_attention=True).eval()
    torch.nn.init.normal_(ours.qkv_proj.bias)  # zero at initialisation: make the biases count
    theirs = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    theirs.in_proj_weight.data.copy_(ours.qkv_proj.weight)
    theirs.in_proj_bias.data.copy_(ours.qkv_proj.bias)
    theirs.out_proj.load_state_dict(ours.out_proj.state_dict())
    x = torch.randn(2, 5, 16)
    pad = torch.tensor([[False] * 5, [False] * 2 + [True] * 3])
    q, k, v = ours.project_qkv(x)
    assert q.shape == k.shape == v.shape == (2, 4, 5, 4)
    out, _ = ours(q, k, v, pad[:, None, None, :])
    ref, _ = theirs(x, x, x, key_padding_mask=pad, need_weights=False)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    out, _ = ours(q, k, v, causal_mask(5), causal=True)
    ref, _ = theirs(x, x, x, attn_mask=causal_mask(5), need_weights=False)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("self_attention", [True, False])
def test_joint_projections_split_into_heads_and_back_without_copies(self_attention):
    """The heads of one joint projection (queries, keys and values, or keys and values) are views of its
    output, and their gradients come back through one stack into its layout, no copy more; the same
    gradients as projections split with `chunk`."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(d_model=16, heads=4, impl="sdpa", self_attention=self_attention)
    x = torch.randn(2, 5, 16)
    proj = attn.qkv_proj if self_attention else attn.kv_proj
    n = 3 if self_attention else 2
    out = proj(x).detach().requires_grad_()
    heads = attn._heads(out, n)
    assert all(h.shape == (2, 4, 5, 4) and h._base is out for h in heads)
    q = heads[0] if self_attention else torch.randn(2, 4, 3, 4)
    k, v = heads[-2:]
    grad = torch.randn(q.shape)
    context = F.scaled_dot_product_attention(q, k, v)
    with OpCounter() as ops:
        (context * grad).sum().backward()
    assert ops.counts["stack"] == 1 and not ops.counts["clone"] and not ops.counts["copy_"], ops.counts
    reference = out.detach().requires_grad_()
    parts = [attn.split_heads(part) for part in reference.chunk(n, dim=-1)]
    q_ref = parts[0] if self_attention else q
    (F.scaled_dot_product_attention(q_ref, *parts[-2:]) * grad).sum().backward()
    torch.testing.assert_close(out.grad, reference.grad)


def test_per_head_weights_average_to_the_mean_weights():
    torch.manual_seed(0)
    attn = MultiHeadAttention(d_model=16, heads=4, impl="sdpa", self_attention=True)
    q, k, v = attn.project_qkv(torch.randn(2, 5, 16))
    _, heads = attn(q, k, v, need_weights=True, average_heads=False)
    _, mean = attn(q, k, v, need_weights=True)
    assert heads.shape == (2, 4, 5, 5)
    torch.testing.assert_close(heads.mean(1), mean)
    assert attn(q, k, v)[1] is None


def test_attention_rejects_bad_sizes():
    with pytest.raises(ValueError, match=r"d_model \(10\).*heads \(4\)"):
        MultiHeadAttention(d_model=10, heads=4, impl="sdpa")
    with pytest.raises(ValueError, match="'flash'"):
        MultiHeadAttention(d_model=8, heads=4, impl="flash")


def test_causal_attention_without_a_mask_masks_the_future_on_both_paths():
    torch.manual_seed(3)
    q, k, v = torch.randn(3, 2, 2, 5, 4).unbind(0)  # (B, H, T, Dh) each
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for impl in ("manual", "sdpa"):
        attn = MultiHeadAttention(d_model=8, heads=2, impl=impl).eval()
        out, _ = attn(q, k, v, None, causal=True)
        torch.testing.assert_close(out, attn.out_proj(ref.transpose(1, 2).reshape(2, 5, 8)), atol=1e-5, rtol=0)
