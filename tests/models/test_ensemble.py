"""Ensembles: the mean of the members' probabilities, behind the same model contract."""

from __future__ import annotations

import math

import pytest
import torch

from nmt.models.contract import Seq2Seq
from nmt.models.ensemble import Ensemble
from tests.models.tiny import padded_batch, tiny_model


def tiny(kind: str, seed: int, vocab: int = 20) -> torch.nn.Module:
    return tiny_model(kind, seed=seed, vocab=vocab)


def inputs():
    return padded_batch([5, 3], vocab=20, seed=0, tgt_len=4)


def steps(model, src, pad, tgt):
    """Log-probabilities and attention of each decode_step over tgt."""
    memory = model.encode(src, pad)
    state = model.init_state(memory)
    out = []
    for t in range(tgt.size(1)):
        log_probs, state, attn = model.decode_step(tgt[:, t], memory, state, need_attn=True)
        out.append((log_probs, attn))
    return out


def test_ensemble_is_a_model():
    assert isinstance(Ensemble(members=[tiny("transformer", 0)]), Seq2Seq)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_ensemble_of_copies_equals_the_model(n):
    model = tiny("transformer", 0)
    ens = Ensemble(members=[model] * n)
    src, pad, tgt = inputs()
    for (lp, attn), (elp, eattn) in zip(steps(model, src, pad, tgt), steps(ens, src, pad, tgt)):
        torch.testing.assert_close(elp, lp, atol=1e-5, rtol=0)
        torch.testing.assert_close(eattn, attn)
    torch.testing.assert_close(ens(src, pad, tgt), model(src, pad, tgt).log_softmax(-1), atol=1e-5, rtol=0)


def test_ensemble_averages_probabilities():
    a, b = tiny("transformer", 0), tiny("rnn", 1)
    src, pad, tgt = inputs()
    for (la, aa), (lb, ab), (le, ae) in zip(steps(a, src, pad, tgt), steps(b, src, pad, tgt),
                                            steps(Ensemble(members=[a, b]), src, pad, tgt)):
        torch.testing.assert_close(le.exp(), (la.exp() + lb.exp()) / 2, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(le.logsumexp(-1), torch.zeros(2), atol=1e-5, rtol=0)
        torch.testing.assert_close(ae, (aa + ab) / 2)
    full = Ensemble(members=[a, b])(src, pad, tgt)
    expected = torch.logsumexp(torch.stack([a(src, pad, tgt).log_softmax(-1), b(src, pad, tgt).log_softmax(-1)]), 0)
    torch.testing.assert_close(full, expected - math.log(2), atol=1e-5, rtol=0)


def test_reordering_reorders_every_member():
    ens = Ensemble(members=[tiny("transformer", 0), tiny("rnn", 1)])
    src, pad, tgt = inputs()
    memory = ens.encode(src, pad)
    state = ens.init_state(memory)
    _, state, _ = ens.decode_step(tgt[:, 0], memory, state)
    order = torch.tensor([1, 0])
    swapped, _, _ = ens.decode_step(tgt[[1, 0], 1], memory.index_select(order), state.index_select(order))
    straight, _, _ = ens.decode_step(tgt[:, 1], memory, state)
    torch.testing.assert_close(swapped, straight[[1, 0]])


def test_members_must_share_the_vocabulary():
    with pytest.raises(ValueError, match=r"share one vocabulary; \(src, tgt\) sizes are \[\(20, 20\), \(30, 30\)\]"):
        Ensemble(members=[tiny("transformer", 0), tiny("transformer", 0, vocab=30)])
    with pytest.raises(ValueError, match="at least one"):
        Ensemble(members=[])
