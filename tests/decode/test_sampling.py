"""Sampling: filters, reproducibility, exactness, draws keyed by line, and equivalence with greedy at top_k=1."""

from __future__ import annotations

import pytest
import torch

from nmt.decode import Sampling, filter_logits, greedy_search, sample_step, search
from tests.decode.stub import A, B, StubModel, batch, dist, random_table, table

SOURCES = [[7, 1], [8, 1, 1, 1], [9], [10, 1, 1]]
FLAT = table({}, default=dist(a=1 / 3, b=1 / 3, unk=1 / 3, eos=0.01))
ENDING = table({}, default=dist(a=0.3, b=0.3, unk=0.25, eos=0.15))  # outputs of many lengths


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


SETTINGS = [Sampling(), Sampling(temperature=0.7, top_k=5), Sampling(top_p=0.8), Sampling(temperature=1.6, top_k=9,
                                                                                            top_p=0.9)]


def target_probs(log_probs: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """softmax(filtered log-probabilities / temperature): what a draw must follow, (V,)."""
    return filter_logits(log_probs / sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p).softmax(-1)


@pytest.mark.parametrize("sampling", SETTINGS)
@pytest.mark.parametrize("grid", ["lines", "steps"])
def test_draws_follow_the_filtered_distribution_exactly(sampling, grid):
    """200,000 draws from one distribution of 12 tokens, over 200,000 lines at one step or 1,000 lines at 200
    steps: each token's frequency is its probability within 5 standard errors, a filtered-out token never comes,
    and a chi-square over the kept tokens stays within 6 of its standard deviations."""
    vocab, n = 12, 200_000
    log_probs = torch.randn(vocab, generator=torch.Generator().manual_seed(3)).mul(1.5).log_softmax(-1)
    p = target_probs(log_probs, sampling).double()  # (V,)
    if grid == "lines":
        draws = [sample_step(log_probs.expand(n, 1, vocab), torch.zeros(n, 1), sampling=sampling, seed=7, step=4,
                             lines=torch.arange(n))[1]]
    else:
        lines = torch.arange(1000) * 7919  # far apart: not only neighbours
        draws = [sample_step(log_probs.expand(1000, 1, vocab), torch.zeros(1000, 1), sampling=sampling, seed=7,
                             step=step, lines=lines)[1] for step in range(200)]
    counts = torch.bincount(torch.cat(draws).flatten(), minlength=vocab).double()
    assert counts.sum() == n
    assert counts[p == 0].sum() == 0
    freq, se = counts / n, (p * (1 - p) / n).sqrt()
    assert ((freq - p).abs() <= 5 * se + 1e-12).all(), (freq.tolist(), p.tolist())
    kept = p > 0
    df = int(kept.sum()) - 1
    chi2 = float(((counts[kept] - n * p[kept]) ** 2 / (n * p[kept])).sum())
    assert chi2 < df + 6 * (2 * df) ** 0.5, (chi2, df)


def test_the_draws_of_neighbouring_lines_and_steps_are_independent():
    """Two equally likely tokens, 400 lines x 250 steps: a token agrees with the one drawn for the next line, the
    next step or the next seed half the time, and tokens of a line are no runs."""
    log_probs = torch.tensor([0.5, 0.5]).log().expand(400, 1, 2)

    def draws(seed: int) -> torch.Tensor:  # (steps, lines)
        return torch.stack([sample_step(log_probs, torch.zeros(400, 1), sampling=Sampling(), seed=seed, step=step,
                                        lines=torch.arange(400))[1].view(400) for step in range(250)]).double()

    grid, other = draws(11), draws(12)
    for a, b in [(grid[:, 1:], grid[:, :-1]), (grid[1:], grid[:-1]), (grid, other)]:
        agree = float((a == b).double().mean())
        assert abs(agree - 0.5) < 5 * (0.25 / a.numel()) ** 0.5, agree
    assert abs(float(grid.mean()) - 0.5) < 5 * (0.25 / grid.numel()) ** 0.5


def test_a_rows_draw_follows_its_line_not_its_row():
    """The same rows in another order, with their lines: the same tokens, in that order."""
    log_probs = torch.randn(64, 1, 30, generator=torch.Generator().manual_seed(1)).log_softmax(-1)
    lines = torch.arange(100, 164)
    _, tokens, _ = sample_step(log_probs, torch.zeros(64, 1), sampling=Sampling(top_p=0.9), seed=5, step=2, lines=lines)
    order = torch.randperm(64, generator=torch.Generator().manual_seed(2))
    _, shuffled, _ = sample_step(log_probs[order], torch.zeros(64, 1), sampling=Sampling(top_p=0.9), seed=5, step=2,
                                 lines=lines[order])
    assert torch.equal(shuffled, tokens[order])
    _, alone, _ = sample_step(log_probs[5:6], torch.zeros(1, 1), sampling=Sampling(top_p=0.9), seed=5, step=2,
                              lines=lines[5:6])
    assert alone.item() == tokens[5].item()


LINES = [[7, 1], [8, 1, 1, 1], [9], [10, 1, 1], [11, 1, 1, 1, 1], [12], [13, 1], [14, 1, 1]]


@pytest.mark.parametrize("sampling", [Sampling(seed=4), Sampling(temperature=1.3, top_p=0.9, seed=8)])
def test_a_lines_sample_does_not_depend_on_its_batch_its_row_or_when_done_rows_are_dropped(sampling):
    """Each line sampled alone, among all the others, in another order, a few at a time, and with the done
    sentences kept for 5 steps: the same tokens, since its draws are keyed by its line and the output position."""
    model = StubModel(ENDING)
    kwargs = dict(max_len_a=0.0, max_len_b=12)
    together = sample(model, LINES, sampling, lines=list(range(100, 108)), **kwargs)
    assert len({tuple(h.tokens) for h in together}) == len(LINES)  # samples, of lengths of their own
    assert len({len(h.tokens) for h in together}) > 2
    alone = [sample(model, [src], sampling, lines=[100 + i], **kwargs)[0] for i, src in enumerate(LINES)]
    assert [h.tokens for h in alone] == [h.tokens for h in together]
    order = [5, 2, 7, 0, 3, 1, 6, 4]
    shuffled = sample(model, [LINES[i] for i in order], sampling, lines=[100 + i for i in order], **kwargs)
    assert [h.tokens for h in shuffled] == [together[i].tokens for i in order]
    in_threes = [h for first in range(0, 8, 3)
                 for h in sample(model, LINES[first:first + 3], sampling, lines=range(100 + first, min(103 + first, 108)), **kwargs)]
    assert [h.tokens for h in in_threes] == [h.tokens for h in together]
    rarely = sample(model, LINES, sampling, lines=list(range(100, 108)), sync_every=5, **kwargs)
    assert [(h.tokens, h.log_prob) for h in rarely] == [(h.tokens, h.log_prob) for h in together]


def test_equal_lines_draw_their_own_samples_and_other_line_numbers_others():
    """Twenty copies of one source are twenty lines: not one sample twenty times (back-translation wants them)."""
    copies = sample(StubModel(FLAT), [[7, 1]] * 20, Sampling(seed=1), max_len_a=0.0, max_len_b=12)
    assert len({tuple(h.tokens) for h in copies}) > 15
    moved = sample(StubModel(FLAT), [[7, 1]] * 20, Sampling(seed=1), max_len_a=0.0, max_len_b=12,
                   lines=range(20, 40))
    assert [h.tokens for h in moved] != [h.tokens for h in copies]


def test_search_refuses_lines_that_do_not_number_its_sentences():
    with pytest.raises(ValueError, match=r"lines \(3\) must number the 4 sentences"):
        sample(StubModel(FLAT), SOURCES, Sampling(seed=1), lines=[0, 1, 2])


def test_unseeded_sampling_follows_torchs_global_seed():
    """Without a seed, each search draws one from torch's global generator: `torch.manual_seed` repeats it."""
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        runs.append([h.tokens for h in sample(StubModel(FLAT), SOURCES, Sampling(), max_len_b=20)])
        runs.append([h.tokens for h in sample(StubModel(FLAT), SOURCES, Sampling(), max_len_b=20)])
    assert runs[0] == runs[2] and runs[1] == runs[3] and runs[0] != runs[1]


@pytest.mark.parametrize("seed", range(3))
def test_a_vanishing_temperature_draws_the_most_probable_token(seed):
    """At a temperature so small that every log-probability divided by it overflows, sampling is greedy
    search, where the softmax of a row of -inf drew PAD and the line came out empty."""
    kwargs = dict(max_len_a=1.0, max_len_b=4)
    greedy = greedy_search(StubModel(random_table(seed)), *batch(*SOURCES), **kwargs)
    sampled = sample(StubModel(random_table(seed)), SOURCES, Sampling(temperature=1e-45, seed=seed), **kwargs)
    assert [h.tokens for h in sampled] == [h.tokens for h in greedy]
    assert [h.log_prob for h in sampled] == [h.log_prob for h in greedy]
