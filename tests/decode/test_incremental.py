"""Incremental decoding (`decode_step` with caches) equals full recomputation (`decode` on the
whole prefix) at every step of the search, on real tiny models of every decoder type; and the
search stops as soon as every sentence is done."""

from __future__ import annotations

import math

import pytest
import torch

from nmt.decode import beam_step, search
from nmt.models.ensemble import Ensemble
from tests.decode.stub import StubModel, batch, dist, table
from tests.models.tiny import padded_batch, tiny_model

VOCAB = 24

MODELS = {  # keyword arguments of `tiny_model`
    "transformer-post": dict(kind="transformer", transformer=dict(encoder_layers=2, decoder_layers=2, norm="post")),
    "transformer-pre-learned": dict(kind="transformer", transformer=dict(
        heads=4, encoder_layers=1, decoder_layers=2, norm="pre", positions="learned", attention_impl="manual")),
    "rnn-none-gru": dict(kind="rnn", rnn=dict(decoder="none")),
    "rnn-bahdanau-lstm": dict(kind="rnn", rnn=dict(decoder="bahdanau", attention="additive", cell="lstm",
                                                   decoder_layers=2)),
    "rnn-luong-feeding-gru": dict(kind="rnn", rnn=dict(decoder="luong", input_feeding=True)),
    "rnn-luong-lstm-local": dict(kind="rnn", rnn=dict(decoder="luong", input_feeding=False, cell="lstm",
                                                      local_window=2, bridge="zeros")),
}


def tiny(name: str, seed: int = 0) -> torch.nn.Module:
    return tiny_model(**MODELS[name], seed=seed, vocab=VOCAB)


def sources() -> tuple[torch.Tensor, torch.Tensor]:
    return padded_batch([7, 3, 5, 1], vocab=VOCAB, seed=1)


def recorded_search(model, cached: bool, beam: int):
    """The search's hypotheses and the log-probabilities it was given at each step."""
    steps = []

    def step(log_probs, scores, *, step, prefix, lines):
        steps.append(log_probs.clone())
        return beam_step(log_probs, scores)

    src, pad = sources()
    hyps = search(model, src, pad, beam=beam, nbest=beam, max_len_a=1.0, max_len_b=3, cached=cached,
                  strategy=step)
    return hyps, steps


def assert_steps_equal(cached, uncached):
    assert len(cached) == len(uncached) > 3
    for t, (c, u) in enumerate(zip(cached, uncached)):
        assert c.shape == u.shape, t
        assert torch.equal(c.isneginf(), u.isneginf()), t
        finite = c.isfinite()
        assert (c[finite] - u[finite]).abs().max() <= 1e-5, f"step {t}"


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("beam", [1, 3])
def test_incremental_equals_full_recomputation_at_every_step(name, beam):
    model = tiny(name)
    hyps_c, steps_c = recorded_search(model, cached=True, beam=beam)
    hyps_u, steps_u = recorded_search(model, cached=False, beam=beam)
    assert_steps_equal(steps_c, steps_u)
    assert [[h.tokens for h in s] for s in hyps_c] == [[h.tokens for h in s] for s in hyps_u]


def test_ensemble_incremental_equals_full_recomputation():
    model = Ensemble(members=[tiny("transformer-post", 0), tiny("rnn-luong-feeding-gru", 1)]).eval()
    _, steps_c = recorded_search(model, cached=True, beam=3)
    _, steps_u = recorded_search(model, cached=False, beam=3)
    assert_steps_equal(steps_c, steps_u)


def test_search_stops_as_soon_as_every_sentence_is_done():
    # Every hypothesis ends after 2 tokens, far below the 20-token limit.
    model = StubModel(table({(): dist(a=0.5, b=0.5), (4,): dist(eos=1.0), (5,): dist(eos=1.0)}))
    hyps = search(model, *batch([7, 1], [8, 1, 1]), beam=2, nbest=2, max_len_a=0.0, max_len_b=20)
    assert [len(h.tokens) for s in hyps for h in s] == [1, 1, 1, 1]
    assert len(model.calls) == 2  # the first token, then EOS: no step after the last sentence ends


def test_max_length_is_a_times_source_length_plus_b():
    model = StubModel(table({}, default=dist(a=1.0, eos=1e-12)))
    hyps = search(model, *batch([7] * 4, [7] * 9), beam=1, max_len_a=1.5, max_len_b=2)
    assert [len(s[0].tokens) for s in hyps] == [math.floor(1.5 * 4 + 2), math.floor(1.5 * 9 + 2)]
