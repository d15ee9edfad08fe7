"""Greedy search: hand-computed outputs, a plain-Python reference, beam 1 equivalence."""

from __future__ import annotations

import math

import pytest
import torch

from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from nmt.decode import beam_search, beam_step, greedy_search, greedy_step, search
from tests.decode.stub import A, B, StubModel, V, batch, dist, log, random_table, table


def reference_greedy(probs, cond: int, max_len: int) -> tuple[list[int], float]:
    """Argmax token by token in plain Python; EOS forced at max_len."""
    prefix: list[int] = []
    total = 0.0
    while True:
        p = probs(cond, tuple(prefix))
        allowed = [t for t in range(V) if t not in (PAD_ID, BOS_ID)]
        tok = EOS_ID if len(prefix) == max_len else max(allowed, key=lambda t: p[t])
        total += math.log(p[tok] / sum(p))
        if tok == EOS_ID:
            return prefix, total
        prefix.append(tok)


def test_greedy_step_takes_argmax():
    log_probs = torch.tensor([[[-2.0, -0.5, -1.0]], [[-0.1, -3.0, -2.5]]])  # (2, 1, 3)
    scores, tokens, origins = greedy_step(log_probs, torch.tensor([[-1.0], [0.0]]))
    assert tokens.tolist() == [[1], [0]]
    assert origins.tolist() == [[0], [0]]
    assert scores.flatten().tolist() == pytest.approx([-1.5, -0.1])


def test_greedy_step_equals_beam_step_at_beam_one():
    log_probs = torch.randn(5, 1, 7, generator=torch.Generator().manual_seed(0)).log_softmax(-1)
    scores = torch.randn(5, 1, generator=torch.Generator().manual_seed(1))
    for got, expected in zip(greedy_step(log_probs, scores), beam_step(log_probs, scores), strict=True):
        assert torch.equal(got, expected)


def test_greedy_takes_the_locally_best_token():
    model = StubModel(table({
        (): dist(a=0.6, b=0.4),
        (A,): dist(a=0.4, b=0.3, eos=0.3),
        (B,): dist(eos=0.9, a=0.1),
    }))
    [hyp] = greedy_search(model, *batch([7]), max_len_a=0.0, max_len_b=10, length_penalty=1.0)
    assert hyp.tokens == [A, A]
    assert hyp.log_prob == pytest.approx(log(0.6) + log(0.4) + log(1.0))
    assert hyp.score == pytest.approx(hyp.log_prob / (8 / 6))
    assert hyp.attention is None


@pytest.mark.parametrize("seed", range(3))
def test_greedy_equals_reference(seed):
    sources = [[7, 1], [8, 1, 1, 1], [9], [10, 1, 1]]
    probs = random_table(seed)
    hyps = greedy_search(StubModel(probs), *batch(*sources), max_len_a=1.0, max_len_b=3)
    for src, hyp in zip(sources, hyps, strict=True):
        tokens, total = reference_greedy(probs, src[0], len(src) + 3)
        assert hyp.tokens == tokens
        assert hyp.log_prob == pytest.approx(total, rel=1e-5)


def test_search_beam_one_is_greedy():
    sources = [[7, 1], [8, 1, 1, 1], [9]]
    kwargs = dict(max_len_a=1.0, max_len_b=3, length_penalty=0.6)
    by_search = search(StubModel(random_table(4)), *batch(*sources), **kwargs)
    by_greedy = greedy_search(StubModel(random_table(4)), *batch(*sources), **kwargs)
    by_beam = beam_search(StubModel(random_table(4)), *batch(*sources), beam=1, **kwargs)
    assert [h[0] for h in by_search] == by_greedy == [h[0] for h in by_beam]


def test_greedy_never_emits_pad_or_bos():
    model = StubModel(table({}, default=[0.3, 0.1, 0.5, 0.02, 0.04, 0.04]))  # PAD, BOS most likely
    [hyp] = greedy_search(model, *batch([7]), max_len_a=0.0, max_len_b=4)
    assert hyp.tokens == [1, 1, 1, 1]  # UNK, the best allowed token, until the length limit


def test_empty_batch():
    src = torch.zeros(0, 3, dtype=torch.long)
    assert search(StubModel(random_table(0)), src, src.eq(0), max_len_a=1.0, max_len_b=2) == []
