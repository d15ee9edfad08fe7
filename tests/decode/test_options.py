"""SearchOptions: one object picks the strategy, checks the settings, and hands the step function its context."""

from __future__ import annotations

import pytest
import torch

from nmt.decode import Sampling, SearchOptions, beam_step, greedy_step, search
from tests.models.tiny import padded_batch, tiny_model

LIMITS = dict(max_len_a=1.0, max_len_b=4)


@pytest.mark.parametrize(("fields", "expected"), [
    (dict(), greedy_step),
    (dict(beam=3), beam_step),
    (dict(beam=1, strategy="beam"), beam_step),
    (dict(beam=1, strategy="greedy"), greedy_step),
])
def test_the_strategy_is_picked_in_one_place(fields, expected):
    assert SearchOptions(**LIMITS, **fields).step_fn(torch.device("cpu")) is expected


def test_sampling_gets_a_step_whose_draws_are_keyed_by_seed_line_and_step():
    """A seeded step draws the same for the same (line, step) however often it is made or called; an unseeded
    one draws its seed from torch's global generator when it is made."""
    opts = SearchOptions(**LIMITS, sampling=Sampling(seed=3))
    step = opts.step_fn(torch.device("cpu"))
    log_probs, scores, lines = torch.randn(40, 1, 50).log_softmax(-1), torch.zeros(40, 1), torch.arange(40)
    first = step(log_probs, scores, step=0, prefix=None, lines=lines)[1]
    assert torch.equal(first, step(log_probs, scores, step=0, prefix=None, lines=lines)[1])
    assert not torch.equal(first, step(log_probs, scores, step=1, prefix=None, lines=lines)[1])
    assert not torch.equal(first, step(log_probs, scores, step=0, prefix=None, lines=lines + 40)[1])
    fresh = opts.step_fn(torch.device("cpu"))(log_probs, scores, step=0, prefix=None, lines=lines)[1]
    assert torch.equal(first, fresh)
    unseeded = SearchOptions(**LIMITS, sampling=Sampling())
    torch.manual_seed(0)
    a, b = (unseeded.step_fn(torch.device("cpu"))(log_probs, scores, step=0, prefix=None, lines=lines)[1]
            for _ in range(2))
    torch.manual_seed(0)
    again = unseeded.step_fn(torch.device("cpu"))(log_probs, scores, step=0, prefix=None, lines=lines)[1]
    assert torch.equal(a, again) and not torch.equal(a, b)


@pytest.mark.parametrize(("fields", "message"), [
    (dict(sampling=Sampling(), nbest=2, beam=2), r"sampling draws one translation per line; nbest \(2\) must be 1"),
    (dict(sampling=Sampling(), beam=3), r"sampling draws one translation per line; beam \(3\) must be 1"),
    (dict(beam=2, nbest=3), r"nbest \(3\) cannot exceed beam \(2\)"),
    (dict(beam=3, strategy="greedy"), r"greedy search keeps one hypothesis; beam \(3\) must be 1"),
    (dict(strategy="diverse"), r"strategy \('diverse'\) must be one of"),
    (dict(cached=False, attention=True), "cached=False gives no attention"),
    (dict(min_len=-1), r"^min_len: -1 must be in \[0, 65536\]$"),
    (dict(beam=0), r"^beam: 0 must be in \[1, 1000\]$"),
    (dict(max_len_a=float("nan")), r"^max_len_a: nan is not a finite number$"),
    (dict(length_penalty=float("nan")), r"^length_penalty: nan is not a finite number$"),
    (dict(length_penalty=1e308), r"^length_penalty: 1e\+308 must be in \[-5, 5\]$"),
    (dict(coverage_penalty=float("inf")), r"^coverage_penalty: inf is not a finite number$"),
    (dict(max_tokens=10**23), r"^max_tokens: 100000000000000000000000 does not fit in a 64-bit integer$"),
    (dict(max_len_a=0.0, max_len_b=0), "max_len_a and max_len_b are both 0: no output could be produced"),
    (dict(sampling=Sampling(seed=1), strategy="greedy"), "sampling settings need strategy 'sample' or 'auto', not 'greedy'"),
    (dict(sampling=Sampling(seed=1), strategy="beam"), "sampling settings need strategy 'sample' or 'auto', not 'beam'"),
])
def test_inconsistent_settings_are_refused_with_their_values(fields, message):
    with pytest.raises(ValueError, match=message):
        SearchOptions(**{**LIMITS, **fields})


def test_a_custom_step_sees_the_step_index_the_prefixes_and_the_lines():
    """A step function that blocks repeating the previous token: built without touching the loop."""
    seen = []

    def no_repeat(log_probs, scores, *, step, prefix, lines):
        seen.append((step, tuple(prefix.shape)))
        assert lines.tolist() == [0, 1]
        last = prefix[:, :, -1:]  # (B, K, 1)
        blocked = log_probs.scatter(-1, last, float("-inf")) if step > 0 else log_probs
        return beam_step(blocked, scores)

    model = tiny_model("transformer", seed=2, vocab=12)
    src, pad = padded_batch([6, 4], vocab=12, seed=0)
    hyps = search(model, src, pad, beam=2, nbest=2, strategy=no_repeat, max_len_a=0.0, max_len_b=8)
    assert [s for s, _ in seen] == list(range(len(seen))) and len(seen) > 2
    assert all(shape == (2, 2, step + 1) for step, shape in seen)
    for sentence in hyps:
        for h in sentence:
            assert all(a != b for a, b in zip(h.tokens, h.tokens[1:])), h.tokens


def test_options_object_and_keywords_give_the_same_search():
    model = tiny_model("rnn", seed=1, vocab=12)
    src, pad = padded_batch([5, 3, 6], vocab=12, seed=4)
    opts = SearchOptions(beam=3, nbest=2, length_penalty=0.6, **LIMITS)
    by_object = search(model, src, pad, opts)
    by_keywords = search(model, src, pad, beam=3, nbest=2, length_penalty=0.6, **LIMITS)
    assert [[(h.tokens, h.score) for h in s] for s in by_object] == [[(h.tokens, h.score) for h in s] for s in by_keywords]
