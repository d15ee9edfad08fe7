"""Sampling: filters, reproducibility, and equivalence with greedy at top_k=1."""

from __future__ import annotations

import pytest
import torch

from nmt.decode import Sampling, filter_logits, greedy_search, sample_step, search
from tests.decode.stub import A, B, StubModel, batch, dist, random_table, table

SOURCES = [[7, 1], [8, 1, 1, 1], [9], [10, 1, 1]]
FLAT = table({}, default=dist(a=1 / 3, b=1 / 3, unk=1 / 3, eos=0.01))


def sample(model, sources, sampling, **kwargs):
    kwargs.setdefault("max_len_a", 1.0)
    kwargs.setdefault("max_len_b", 5)
    return [h[0] for h in search(model, *batch(*sources), sampling=sampling, **kwargs)]


def test_filter_top_k():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    out = filter_logits(logits, top_k=2)
    assert torch.isinf(out).tolist() == [[True, False, False, True]]
    assert out[0, 1] == 3.0


def test_filter_top_p_keeps_the_smallest_nucleus():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert torch.isinf(filter_logits(logits, top_p=0.75)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.85)).tolist() == [[False, False, False, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.1)).tolist() == [[False, True, True, True]]
    assert not torch.isinf(filter_logits(logits, top_p=1.0)).any()


def test_filter_top_p_on_unsorted_logits():
    logits = torch.tensor([[0.05, 0.3, 0.15, 0.5]]).log()
    assert torch.isinf(filter_logits(logits, top_p=0.75)).tolist() == [[True, False, True, False]]


@pytest.mark.parametrize("seed", range(3))
def test_top_k_one_equals_greedy(seed):
    kwargs = dict(max_len_a=1.0, max_len_b=4)
    greedy = greedy_search(StubModel(random_table(seed)), *batch(*SOURCES), **kwargs)
    sampled = sample(StubModel(random_table(seed)), SOURCES, Sampling(top_k=1, seed=seed), **kwargs)
    assert [h.tokens for h in sampled] == [h.tokens for h in greedy]
    assert [h.log_prob for h in sampled] == [h.log_prob for h in greedy]


def test_same_seed_same_output_different_seeds_differ():
    first = sample(StubModel(FLAT), SOURCES, Sampling(seed=1), max_len_b=20)
    again = sample(StubModel(FLAT), SOURCES, Sampling(seed=1), max_len_b=20)
    other = sample(StubModel(FLAT), SOURCES, Sampling(seed=2), max_len_b=20)
    assert [h.tokens for h in first] == [h.tokens for h in again]
    assert [h.tokens for h in first] != [h.tokens for h in other]


def test_sample_log_prob_is_the_model_log_prob():
    model = StubModel(FLAT)
    [hyp] = sample(model, [[7]], Sampling(temperature=0.5, seed=0), max_len_b=6)
    prefix = torch.tensor([[2, *hyp.tokens, 3]])
    log_probs = model.decode(prefix[:, :-1], model.encode(*batch([7])))  # (1, T, V)
    expected = log_probs[0].gather(1, prefix[0, 1:].unsqueeze(1)).sum()
    assert hyp.log_prob == pytest.approx(float(expected))


def test_top_p_never_samples_outside_the_nucleus():
    # Nucleus at p=0.8: "a" (0.6) and "b" (0.3); UNK (0.07) and EOS (0.03) are outside.
    model = StubModel(table({}, default=dist(a=0.6, b=0.3, unk=0.07, eos=0.03)))
    sources = [[7]] * 100
    nucleus = sample(model, sources, Sampling(top_p=0.8, seed=0), max_len_a=0.0, max_len_b=5)
    assert all(len(h.tokens) == 5 and set(h.tokens) <= {A, B} for h in nucleus)
    assert {A, B} <= {t for h in nucleus for t in h.tokens}
    # Without the filter the tail does get drawn: the check above can fail.
    full = sample(model, sources, Sampling(seed=0), max_len_a=0.0, max_len_b=5)
    assert 1 in {t for h in full for t in h.tokens}


def test_sampling_needs_beam_one_and_valid_settings():
    with pytest.raises(ValueError, match="beam"):
        sample(StubModel(FLAT), [[7]], Sampling(seed=0), beam=2)
    for bad in (dict(temperature=0.0), dict(temperature=float("inf")), dict(temperature=float("nan")),
                dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Sampling(**bad)


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.7, top_k=5), Sampling(top_p=0.8)])
def test_each_draw_is_torch_multinomials_from_the_same_random_numbers(sampling):
    """`sample_step` draws without `torch.multinomial`, whose checks wait for a GPU; from the same generator
    state it draws what that call draws from the filtered distribution, step after step."""
    log_probs = torch.randn(6, 1, 40, generator=torch.Generator().manual_seed(3)).log_softmax(-1)
    ours, theirs = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    for _ in range(5):
        _, tokens, _ = sample_step(log_probs, torch.zeros(6, 1), sampling=sampling, generator=ours, step=0, prefix=None)
        probs = filter_logits(log_probs / sampling.temperature, top_k=sampling.top_k,
                              top_p=sampling.top_p).softmax(-1).view(6, 40)
        assert torch.equal(tokens.view(6), torch.multinomial(probs, 1, generator=theirs).view(6))


@pytest.mark.parametrize("seed", range(3))
def test_a_vanishing_temperature_draws_the_most_probable_token(seed):
    """At a temperature so small that every log-probability divided by it overflows, sampling is greedy
    search, where the softmax of a row of -inf drew PAD and the line came out empty."""
    kwargs = dict(max_len_a=1.0, max_len_b=4)
    greedy = greedy_search(StubModel(random_table(seed)), *batch(*SOURCES), **kwargs)
    sampled = sample(StubModel(random_table(seed)), SOURCES, Sampling(temperature=1e-45, seed=seed), **kwargs)
    assert [h.tokens for h in sampled] == [h.tokens for h in greedy]
    assert [h.log_prob for h in sampled] == [h.log_prob for h in greedy]
