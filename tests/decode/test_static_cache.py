"""Preallocated (static-shape) Transformer caches give the growing caches' results to the bit."""

from __future__ import annotations

import pytest
import torch

from tests.models.tiny import padded_batch, tiny_model

VOCAB = 24


def tiny(norm: str, impl: str) -> torch.nn.Module:
    return tiny_model(transformer=dict(heads=4, decoder_layers=2, norm=norm, attention_impl=impl), vocab=VOCAB)


def inputs():
    return padded_batch([6, 2, 4], vocab=VOCAB, seed=2, tgt_len=7)


def run(model, max_len: int | None, reorder_at: int = 3):
    """Log-probabilities and attention of every step; hypotheses reordered once, as beam search does."""
    src, pad, tgt = inputs()
    order = torch.tensor([2, 0, 0])
    outputs = []
    with torch.inference_mode():
        memory = model.encode(src, pad)
        state = model.init_state(memory, max_len=max_len)
        for t in range(tgt.size(1)):
            if t == reorder_at:
                state, memory, tgt = state.index_select(order), memory.index_select(order), tgt[order]
            log_probs, state, attn = model.decode_step(tgt[:, t], memory, state, need_attn=True)
            outputs += [log_probs, attn]
    return outputs, state


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("impl", ["manual", "sdpa"])
@pytest.mark.parametrize("max_len", [7, 12, 4])  # exact, roomy, too short (grows past it)
def test_preallocated_cache_equals_growing_cache_bit_for_bit(norm, impl, max_len):
    model = tiny(norm, impl)
    grown, grown_state = run(model, max_len=None)
    static, static_state = run(model, max_len=max_len)
    for g, s in zip(grown, static, strict=True):
        assert torch.equal(g, s)
    assert static_state.step == grown_state.step == 7
    assert grown_state.self_kv[0][0].shape == (3, 4, 7, 4)  # (B, H, t, Dh)
    assert static_state.self_kv[0][0].shape == (3, 4, max(max_len, 7), 4)


def test_steps_write_the_preallocated_buffers_in_place():
    model = tiny("pre", "sdpa")
    src, pad, tgt = inputs()
    with torch.inference_mode():
        memory = model.encode(src, pad)
        state = model.init_state(memory, max_len=5)
        buffers = [(k.data_ptr(), v.data_ptr()) for k, v in state.self_kv]
        for t in range(5):
            _, state, _ = model.decode_step(tgt[:, t], memory, state)
            assert [(k.data_ptr(), v.data_ptr()) for k, v in state.self_kv] == buffers
            assert state.self_kv[1][0].shape == (3, 4, 5, 4)


def test_preallocated_buffers_take_the_autocast_dtype():
    model = tiny("pre", "sdpa")
    src, pad, tgt = inputs()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        memory = model.encode(src, pad)
        state = model.init_state(memory, max_len=4)
        _, state, _ = model.decode_step(tgt[:, 0], memory, state)
    assert all(k.dtype == v.dtype == torch.bfloat16 for k, v in state.self_kv)
