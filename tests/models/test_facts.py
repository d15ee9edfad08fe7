"""What a model tells its users through the contract: name, position limit, attention."""

from __future__ import annotations

import pytest

from nmt.models.ensemble import Ensemble
from tests.models.tiny import tiny_model


def test_transformer_facts_and_attention_choice():
    model = tiny_model("transformer", transformer={"max_positions": 40})
    assert (model.name, model.max_positions, model.has_attention) == ("transformer", 40, True)
    model.select_attention(layer=0, head=1)
    assert (model.attn_layer, model.attn_head) == (0, 1)
    with pytest.raises(ValueError, match=r"attention layer \(1\) must be in \[-1, 0\]"):
        model.select_attention(layer=1)
    with pytest.raises(ValueError, match=r"attention head \(2\) must be in \[0, 1\] or None"):
        model.select_attention(head=2)


@pytest.mark.parametrize(("rnn", "name", "attention"), [
    ({"decoder": "none"}, "rnn/none", False),
    ({"decoder": "bahdanau", "attention": "additive"}, "rnn/bahdanau/additive", True),
    ({"decoder": "luong", "attention": "general"}, "rnn/luong/general", True),
])
def test_rnn_facts(rnn, name, attention):
    model = tiny_model("rnn", rnn=rnn)
    assert (model.name, model.max_positions, model.has_attention) == (name, None, attention)
    model.select_attention(layer=3, head=5)  # one distribution: any choice returns it


def test_an_ensemble_takes_the_strictest_limit_and_passes_the_choice_on():
    a = tiny_model("transformer", transformer={"max_positions": 40})
    b = tiny_model("transformer", transformer={"max_positions": 30}, seed=1)
    c = tiny_model("rnn", rnn={"decoder": "none"})
    ensemble = Ensemble(members=[a, b, c])
    assert ensemble.max_positions == 30 and ensemble.has_attention
    assert ensemble.name == "ensemble of 3 (transformer, transformer, rnn/none)"
    ensemble.select_attention(layer=-1, head=0)
    assert a.attn_head == b.attn_head == 0
    assert not Ensemble(members=[c]).has_attention and Ensemble(members=[c]).max_positions is None
