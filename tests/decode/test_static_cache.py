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


@pytest.mark.parametrize("device", [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_reorder_takes_the_filled_positions_of_preallocated_buffers_into_new_ones(device):
    """Steps after the reorder read only positions written since, or taken: their results are the grown
    caches' (on a GPU within the rounding of other attention kernels for strided keys)."""
    model = tiny("pre", "sdpa").to(device)
    src, pad, tgt = (x.to(device) for x in inputs())
    order = torch.tensor([2, 0, 0], device=device)
    with torch.inference_mode():
        memory = model.encode(src, pad)
        states = {"grown": model.init_state(memory), "static": model.init_state(memory, max_len=7)}
        for t in range(3):
            states = {name: model.decode_step(tgt[:, t], memory, s)[1] for name, s in states.items()}
        for k, v in states["static"].self_kv:  # what a reorder has no need to copy
            k[:, :, 3:], v[:, :, 3:] = float("nan"), float("nan")
        taken = {name: s.index_select(order) for name, s in states.items()}
        memory, tgt = memory.index_select(order), tgt[order]
        for t in range(3, 7):
            out = {name: model.decode_step(tgt[:, t], memory, s) for name, s in taken.items()}
            taken = {name: o[1] for name, o in out.items()}
            if t == 3:  # the step after the reorder took the filled positions into new buffers
                for (k, v), (k2, v2) in zip(states["static"].self_kv, taken["static"].self_kv, strict=True):
                    assert k2.shape == v2.shape == (3, 4, 7, 4) and k2.data_ptr() != k.data_ptr()
                    assert torch.equal(k2[:, :, :3], k[order, :, :3]) and torch.equal(v2[:, :, :3], v[order, :, :3])
            grown, static = out["grown"][0], out["static"][0]
            assert torch.isfinite(static).all()
            assert torch.equal(grown, static) if device == "cpu" else torch.allclose(grown, static, atol=1e-5)
