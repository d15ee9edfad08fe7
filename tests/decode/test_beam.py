"""Beam search: hand-computed hypotheses and scores, exhaustive and reference equivalence."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from nmt.decode import (
    beam_search,
    beam_step,
    coverage_penalty,
    greedy_search,
    length_penalty,
    search,
)
from tests.decode.stub import A, B, StubModel, V, batch, dist, log, random_table, table
from tests.models.tiny import padded_batch, tiny_model

NEG = -math.inf


def lp(length: int, alpha: float) -> float:
    return ((5 + length) / 6) ** alpha


# The greedy trap: "a" is locally best, but "b EOS" (0.4 * 0.9) beats "a a EOS" (0.6 * 0.4).
TRAP = table({
    (): dist(a=0.6, b=0.4),
    (A,): dist(a=0.4, b=0.3, eos=0.3),
    (B,): dist(eos=0.9, a=0.05, b=0.05),
})


def run(model, *sources, **kwargs):
    kwargs.setdefault("max_len_a", 0.0)
    kwargs.setdefault("max_len_b", 10)
    return search(model, *batch(*sources), **kwargs)


def test_beam_step_topk_over_all_rows():
    log_probs = torch.tensor([[[-1.0, -2.0, -3.0], [-0.5, -4.0, -0.1]]]).log_softmax(-1)  # (1, 2, 3)
    scores = torch.tensor([[-1.0, -2.0]])
    new_scores, tokens, origins = beam_step(log_probs, scores)
    flat = (scores.unsqueeze(-1) + log_probs).view(-1)
    best = flat.topk(2).indices
    assert tokens.tolist() == [[int(i % 3) for i in best]]
    assert origins.tolist() == [[int(i // 3) for i in best]]
    assert torch.equal(new_scores[0], flat[best])


@pytest.mark.parametrize("beam, vocab", [(5, 50), (4, 3), (1, 7)])
def test_beam_step_chooses_the_k_best_sums_of_all_rows_and_tokens(beam, vocab):
    """Against the sums formed in full: every row's score plus each of its tokens' log-probabilities, the
    top K of the K x V of them (random values, so no two are equal and the choice is unique)."""
    gen = torch.Generator().manual_seed(beam * vocab)
    log_probs = torch.randn(6, beam, vocab, generator=gen).log_softmax(-1)  # (B, K, V)
    scores = torch.randn(6, beam, generator=gen) * 3
    scores[1, 1:] = NEG  # a first step: only row 0 expands
    scores[2, 0] = NEG  # a finished row among live ones
    log_probs[3, :, 2] = NEG  # a banned token
    new_scores, tokens, origins = beam_step(log_probs, scores)
    sums = (scores.unsqueeze(-1) + log_probs).view(6, beam * vocab)
    expected_scores, expected = sums.topk(beam, dim=1)
    assert torch.equal(new_scores, expected_scores)
    live = expected_scores.isfinite()  # which of several -inf sums is taken does not matter (nor is it defined)
    assert torch.equal(tokens[live], (expected % vocab)[live]) and torch.equal(origins[live], (expected // vocab)[live])
    assert not tokens[3][live[3]].eq(2).any()


def test_beam_step_first_step_expands_row_zero_only():
    log_probs = torch.full((1, 3, 4), -0.1)
    log_probs[0, 0] = torch.tensor([-1.0, -2.0, -3.0, -4.0])  # rows 1, 2 would win, but start at -inf
    scores = torch.tensor([[0.0, NEG, NEG]])
    new_scores, tokens, origins = beam_step(log_probs, scores)
    assert origins.tolist() == [[0, 0, 0]]
    assert tokens.tolist() == [[0, 1, 2]]
    assert new_scores.tolist() == [[-1.0, -2.0, -3.0]]


def test_beam_two_beats_the_greedy_trap():
    model = StubModel(TRAP)
    assert run(model, [7], beam=1)[0][0].tokens == [A, A]
    hyps = run(model, [7], beam=2, nbest=2, length_penalty=0.0)[0]
    assert [h.tokens for h in hyps] == [[B], [A, A]]
    assert hyps[0].log_prob == pytest.approx(log(0.4 * 0.9))
    assert hyps[1].log_prob == pytest.approx(log(0.6 * 0.4 * 1.0))
    assert [h.score for h in hyps] == pytest.approx([h.log_prob for h in hyps])


def test_length_penalty_counts_eos():
    hyps = run(StubModel(TRAP), [7], beam=2, nbest=2, length_penalty=1.0)[0]
    assert [h.tokens for h in hyps] == [[B], [A, A]]
    # |Y| counts EOS: "b EOS" has length 2, "a a EOS" length 3.
    assert hyps[0].score == pytest.approx(log(0.36) / (7 / 6))
    assert hyps[1].score == pytest.approx(log(0.24) / (8 / 6))
    assert length_penalty(2, 1.0) == pytest.approx(7 / 6)
    assert length_penalty(torch.tensor([2, 3]), 0.0).tolist() == [1.0, 1.0]


def test_length_penalty_changes_ranking():
    # "b EOS": 0.30 (length 2); "a a a EOS": 0.7 * 0.4 = 0.28 (length 4); the rest less.
    model = StubModel(table({
        (): dist(b=0.3, a=0.7),
        (A,): dist(a=0.4, b=0.35, unk=0.25),
        (A, A): dist(a=1.0),
    }))
    best0 = run(model, [7], beam=3, nbest=3, length_penalty=0.0)[0]
    best1 = run(model, [7], beam=3, nbest=3, length_penalty=1.0)[0]
    assert best0[0].tokens == [B] and best0[0].score == pytest.approx(log(0.3))
    assert best1[0].tokens == [A, A, A] and best1[0].score == pytest.approx(log(0.28) / (9 / 6))
    assert [h.tokens for h in best1].index([B]) > 0


def exhaustive(probs, cond: int, max_len: int, alpha: float, tokens=(1, A, B)):
    """Every output up to max_len (EOS forced there) with its (score, log_prob), best first."""
    out = []
    for n in range(max_len + 1):
        for seq in itertools.product(tokens, repeat=n):
            total = 0.0
            for t, tok in enumerate(seq + (EOS_ID,)):
                p = probs(cond, seq[:t])
                total += math.log(p[tok] / sum(p))
            out.append((total / lp(n + 1, alpha), total, list(seq)))
    return sorted(out, key=lambda x: -x[0])


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_wide_beam_equals_exhaustive_search(alpha):
    probs = random_table(seed=3)
    # Max length 3 over 3 non-EOS tokens: at most 9 * 4 = 36 candidates at a step.
    hyps = run(StubModel(probs), [7], beam=36, nbest=20, length_penalty=alpha, max_len_b=3)[0]
    expected = exhaustive(probs, 7, 3, alpha)[:20]
    assert [h.tokens for h in hyps] == [e[2] for e in expected]
    assert [h.score for h in hyps] == pytest.approx([e[0] for e in expected], rel=1e-5)
    assert [h.log_prob for h in hyps] == pytest.approx([e[1] for e in expected], rel=1e-5)


def reference_beam(probs, cond: int, beam: int, max_len: int, alpha: float):
    """The documented semantics in plain Python, one sentence at a time."""
    live, finished = [((), 0.0)], []
    for t in range(max_len + 1):
        candidates = []
        for prefix, total in live:
            p = probs(cond, prefix)
            for tok in range(V):
                allowed = tok not in (PAD_ID, BOS_ID) and (t < max_len or tok == EOS_ID)
                if allowed and p[tok] > 0:
                    candidates.append((total + math.log(p[tok] / sum(p)), prefix, tok))
        live = []
        for total, prefix, tok in sorted(candidates, key=lambda c: -c[0])[:beam]:
            if tok == EOS_ID:
                finished.append((total / lp(len(prefix) + 1, alpha), total, list(prefix)))
            else:
                live.append((prefix + (tok,), total))
        if len(finished) >= beam or not live:
            break
    return sorted(finished, key=lambda x: -x[0])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("beam", [2, 3, 5])
def test_beam_equals_reference_on_random_tables(seed, beam):
    probs = random_table(seed=seed)
    hyps = run(StubModel(probs), [7], beam=beam, nbest=beam, length_penalty=0.6, max_len_b=6)[0]
    expected = reference_beam(probs, 7, beam, 6, 0.6)[:beam]
    assert [h.tokens for h in hyps] == [e[2] for e in expected]
    assert [h.score for h in hyps] == pytest.approx([e[0] for e in expected], rel=1e-5)


@pytest.mark.parametrize("nbest", [1, 2, 4])
def test_nbest_sorted_and_sized(nbest):
    hyps = run(StubModel(random_table(seed=1)), [7], [8, 8], beam=4, nbest=nbest, length_penalty=1.0)
    for sentence in hyps:
        assert len(sentence) == nbest
        scores = [h.score for h in sentence]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in sentence}) == nbest


@pytest.mark.parametrize("seed", [0, 1, 4])  # seeds where sentences finish at different steps
def test_batch_equals_one_by_one_and_work_shrinks(seed):
    sources = [[7, 1, 1], [8, 1], [9, 1, 1, 1, 1], [10, 2, 2, 2]]
    attention = torch.rand(V, 5, generator=torch.Generator().manual_seed(0)) + 0.1
    kwargs = dict(beam=3, nbest=3, length_penalty=1.0, coverage_penalty=0.3, attention=True,
                  max_len_a=1.0, max_len_b=1)
    model = StubModel(random_table(seed), attention=attention)
    together = run(model, *sources, **kwargs)
    assert model.calls[-1] < model.calls[0] == 3 * len(sources)
    assert model.calls == sorted(model.calls, reverse=True)
    for src, hyps in zip(sources, together, strict=True):
        alone = run(StubModel(random_table(seed), attention=attention), src, **kwargs)[0]
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in alone])
        for h, a in zip(hyps, alone, strict=True):
            assert h.attention.shape == (len(h.tokens) + 1, len(src))
            torch.testing.assert_close(h.attention, a.attention)


@pytest.mark.parametrize("beam", [1, 4])
def test_cached_equals_uncached(beam):
    sources = [[7, 1, 1], [8, 1], [9, 1, 1, 1]]
    kwargs = dict(beam=beam, nbest=beam, length_penalty=1.0, max_len_a=1.0, max_len_b=2)
    cached = run(StubModel(random_table(seed=2)), *sources, **kwargs)
    uncached = run(StubModel(random_table(seed=2)), *sources, cached=False, **kwargs)
    for c, u in zip(cached, uncached, strict=True):
        assert [h.tokens for h in c] == [h.tokens for h in u]
        assert [h.score for h in c] == pytest.approx([h.score for h in u], abs=1e-6)


@pytest.mark.parametrize("beam", [2, 3])
def test_a_nan_row_loses_its_slots_to_finite_hypotheses(beam):
    """A row whose log-probabilities are NaN (an fp16 overflow) is out of the search: `topk` ranks NaN
    first, so its candidates took every slot and the sentence got no hypothesis."""
    nan = [math.nan] * V
    model = StubModel(table({(): dist(a=0.6, b=0.4), (A,): nan, (B,): dist(eos=0.9, a=0.1)}))
    hyps = run(model, [7], beam=beam, nbest=1, length_penalty=0.0, max_len_b=5)[0]
    assert [h.tokens for h in hyps] == [[B]]
    assert hyps[0].log_prob == pytest.approx(log(0.4 * 0.9))


@pytest.mark.parametrize(("a", "b", "src_len", "longest"), [(1.15, 0, 100, 115), (0.7, 5, 170, 124), (0.29, 0, 100, 29)])
def test_max_len_is_the_floor_of_the_decimal_expression(a, b, src_len, longest):
    """1.15 * 100 is 114.99999999999999 in binary; the limit a user wrote is 115 tokens."""
    model = StubModel(table({}, default=dist(a=1.0, eos=1e-9)))  # ends only where it must
    [[hyp]] = run(model, [7] * src_len, beam=1, max_len_a=a, max_len_b=b)
    assert len(hyp.tokens) == longest


@pytest.mark.parametrize("beam", [1, 2])
def test_max_len_forces_eos(beam):
    model = StubModel(table({}, default=dist(a=0.6, b=0.4, eos=1e-9)))
    # floor(0.5 * 2 + 2) = 3 and floor(0.5 * 5 + 2) = 4 tokens at most.
    hyps = run(model, [7, 7], [7, 7, 7, 7, 7], beam=beam, nbest=beam, max_len_a=0.5, max_len_b=2)
    for sentence, max_len in zip(hyps, [3, 4], strict=True):
        assert sentence[0].tokens == [A] * max_len
        assert all(len(h.tokens) == max_len for h in sentence)
        assert sentence[0].log_prob == pytest.approx(max_len * log(0.6) + log(1e-9), rel=1e-4)


@pytest.mark.parametrize("beam", [1, 3])
def test_min_len_forbids_early_eos(beam):
    model = StubModel(table({}, default=dist(eos=0.9, a=0.1)))
    assert run(model, [7], beam=beam)[0][0].tokens == []
    hyps = run(model, [7], beam=beam, nbest=beam, min_len=2)[0]
    assert hyps[0].tokens == [A, A]
    assert all(len(h.tokens) >= 2 for h in hyps)
    # The maximum length wins over min_len where a source's limit is below it (a one-token source here),
    assert run(model, [7], beam=beam, min_len=5, max_len_a=1.0, max_len_b=0)[0][0].tokens == [A]
    # and a min_len above every source's limit is refused.
    with pytest.raises(ValueError, match=r"min_len \(5\) is above the longest output that max_len_a 0 and "):
        run(model, [7], beam=beam, min_len=5, max_len_b=1)


# BOS and "b" attend to source position 0, "a" to position 1 (positions 2, 3 for padding tests).
COVERAGE_ATTN = torch.tensor([[0.5, 0.5, 0.5, 0.5]] * V)
COVERAGE_ATTN[BOS_ID, :2] = COVERAGE_ATTN[B, :2] = torch.tensor([0.9, 0.1])
COVERAGE_ATTN[A, :2] = torch.tensor([0.1, 0.9])
COVERAGE = table({(): dist(b=0.5, a=0.45, eos=0.05)})


def test_coverage_penalty_changes_ranking():
    model = StubModel(COVERAGE, attention=COVERAGE_ATTN)
    plain = run(model, [7, 8], beam=3, nbest=3, length_penalty=0.0)[0]
    assert [h.tokens for h in plain] == [[B], [A], []]
    hyps = run(model, [7, 8], beam=3, nbest=3, length_penalty=0.0, coverage_penalty=1.0, attention=True)[0]
    assert [h.tokens for h in hyps] == [[A], [B], []]
    assert hyps[0].score == pytest.approx(log(0.45))  # coverage (1.0, 1.0): no penalty
    assert hyps[1].score == pytest.approx(log(0.5) + log(0.2))  # coverage (1.8, 0.2)
    assert hyps[2].score == pytest.approx(log(0.05) + log(0.9) + log(0.1))  # one step: (0.9, 0.1)
    assert hyps[1].log_prob == pytest.approx(log(0.5))
    torch.testing.assert_close(hyps[0].attention, torch.tensor([[0.9, 0.1], [0.1, 0.9]]))


def test_coverage_ignores_source_padding():
    model = StubModel(COVERAGE, attention=COVERAGE_ATTN)
    kwargs = dict(beam=3, nbest=3, coverage_penalty=1.0)
    padded = run(model, [7, 8], [9, 9, 9, 9], **kwargs)[0]
    alone = run(model, [7, 8], **kwargs)[0]
    assert [h.score for h in padded] == pytest.approx([h.score for h in alone])
    attn = torch.tensor([[[0.5, 0.5, 0.0], [0.5, 0.0, 0.0]]])
    penalty = coverage_penalty(attn, torch.tensor([[False, False, True]]), 1.0)
    assert penalty.tolist() == pytest.approx([log(1.0) + log(0.5)])


def test_attention_required_but_missing_raises():
    with pytest.raises(ValueError, match="no attention"):
        run(StubModel(COVERAGE), [7, 8], beam=2, coverage_penalty=0.5)
    with pytest.raises(ValueError, match="no attention"):
        run(StubModel(COVERAGE), [7, 8], attention=True)
    with pytest.raises(ValueError, match="cached=False"):
        run(StubModel(COVERAGE, attention=COVERAGE_ATTN), [7, 8], attention=True, cached=False)


@pytest.mark.parametrize("kwargs, message", [
    (dict(beam=0), "beam"),
    (dict(beam=2, nbest=3), "nbest"),
    (dict(max_len_b=-1), "max_len_b"),
    (dict(coverage_penalty=-0.1), "coverage_penalty"),
])
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        run(StubModel(TRAP), [7], **kwargs)


def test_beam_one_equals_greedy_on_random_tables():
    sources = [[7, 1], [8, 1, 1, 1], [9]]
    for seed in range(3):
        kwargs = dict(length_penalty=1.0, max_len_a=1.0, max_len_b=3)
        greedy = greedy_search(StubModel(random_table(seed)), *batch(*sources), **kwargs)
        beam = beam_search(StubModel(random_table(seed)), *batch(*sources), beam=1, **kwargs)
        assert [h.tokens for h in greedy] == [hyps[0].tokens for hyps in beam]
        assert [h.log_prob for h in greedy] == [hyps[0].log_prob for hyps in beam]


# --- a real, randomly initialised model -----------------------------------------------

def tiny(kind: str):
    return tiny_model(kind, transformer=dict(encoder_layers=2, decoder_layers=2))


def random_batch():
    return padded_batch([6, 3, 5], vocab=20, seed=1)


@pytest.mark.parametrize("kind", ["transformer", "rnn"])
def test_real_model_beam_one_equals_greedy_and_cached_equals_uncached(kind):
    model = tiny(kind)
    src, pad = random_batch()
    kwargs = dict(max_len_a=1.0, max_len_b=4)
    greedy = greedy_search(model, src, pad, **kwargs)
    beam1 = beam_search(model, src, pad, beam=1, **kwargs)
    assert [h.tokens for h in greedy] == [hyps[0].tokens for hyps in beam1]
    assert [h.log_prob for h in greedy] == pytest.approx([hyps[0].log_prob for hyps in beam1])
    for beam in (1, 4):
        cached = search(model, src, pad, beam=beam, nbest=beam, **kwargs)
        uncached = search(model, src, pad, beam=beam, nbest=beam, cached=False, **kwargs)
        for c, u in zip(cached, uncached, strict=True):
            assert [h.tokens for h in c] == [h.tokens for h in u]
            assert [h.score for h in c] == pytest.approx([h.score for h in u], abs=1e-4)


@pytest.mark.parametrize("kind", ["transformer", "rnn"])
def test_real_model_batch_equals_one_by_one(kind):
    model = tiny(kind)
    src, pad = random_batch()
    kwargs = dict(beam=4, nbest=2, length_penalty=1.0, coverage_penalty=0.2, attention=True,
                  max_len_a=1.0, max_len_b=4)
    together = search(model, src, pad, **kwargs)
    for i, hyps in enumerate(together):
        n = int((~pad[i]).sum())
        alone = search(model, src[i : i + 1, :n], pad[i : i + 1, :n], **kwargs)[0]
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-4)
        for h, a in zip(hyps, alone, strict=True):
            assert h.attention.shape == (len(h.tokens) + 1, n)
            torch.testing.assert_close(h.attention, a.attention, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind, dtype", [("transformer", torch.bfloat16), ("transformer", torch.float16),
                                         ("rnn", torch.bfloat16)])
def test_half_weights_rank_by_an_fp32_coverage_penalty_and_return_fp32_attention(kind, dtype):
    """Scores stay fp32 whatever the weights are: each returned score is its log-probability over the length
    penalty plus the coverage penalty of its returned attention, recomputed in fp64 here."""
    model = tiny_model(kind, seed=2, vocab=30).to(dtype)
    src, pad = padded_batch([6, 3, 9], vocab=30, seed=4)
    alpha, beta = 0.6, 0.4
    hyps = search(model, src, pad, beam=4, nbest=4, max_len_a=1.0, max_len_b=3, length_penalty=alpha,
                  coverage_penalty=beta, attention=True)
    for sentence in hyps:
        assert sentence
        for h in sentence:
            assert h.attention.dtype == torch.float32 and h.attention.device.type == "cpu"
            covered = h.attention.double().sum(dim=0).clamp(max=1.0)  # (S,) every position is real here
            expected = h.log_prob / lp(len(h.tokens) + 1, alpha) + beta * covered.log().sum().item()
            assert h.score == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("kind, options", [
    ("transformer", {}),
    ("rnn", {"decoder": "luong", "attention": "general", "local_window": 2}),
    ("rnn", {"decoder": "bahdanau", "attention": "additive", "cell": "lstm"}),
])
def test_real_model_hypotheses_are_their_teacher_forced_log_probabilities_within_the_length_limits(kind, options):
    """Every hypothesis of a real model, recomputed apart from the search: its log_prob is the sum of the
    teacher-forced log-probabilities of its tokens and EOS for its sentence alone, unpadded; its score that over
    GNMT's ((5 + |Y|) / 6) ** alpha with EOS in |Y|, plus beta * sum_i log(min(sum_j a_ij, 1)) of its returned
    attention (floored at 1e-10, where a local window leaves a position unseen); its length within
    [min_len, floor(a * S + b)]; the n-best list best first and without repeats. A bias towards EOS gives
    outputs of many lengths, so the limits and the penalty matter."""
    model = tiny_model(kind, rnn=options, seed=3, vocab=20)
    eos_bias = torch.zeros(20)
    eos_bias[EOS_ID] = 0.5
    model.output.register_forward_hook(lambda module, inputs, logits: logits + eos_bias)
    src, pad = padded_batch([7, 2, 5, 3], vocab=20, seed=5)
    alpha, beta, min_len, a, b = 0.6, 0.3, 1, 1.0, 3
    hyps = search(model, src, pad, beam=4, nbest=4, max_len_a=a, max_len_b=b, length_penalty=alpha,
                  coverage_penalty=beta, min_len=min_len, attention=True)
    lengths = set()
    for i, sentence in enumerate(hyps):
        n = int((~pad[i]).sum())
        assert len(sentence) == 4
        assert [h.score for h in sentence] == sorted((h.score for h in sentence), reverse=True)
        assert len({tuple(h.tokens) for h in sentence}) == 4
        for h in sentence:
            assert min_len <= len(h.tokens) <= math.floor(a * n + b)
            lengths.add(len(h.tokens))
            out = torch.tensor(h.tokens + [EOS_ID])
            with torch.no_grad():
                log_probs = model(src[i : i + 1, :n], pad[i : i + 1, :n], torch.tensor([[BOS_ID] + h.tokens]))
            log_prob = log_probs[0].double().log_softmax(-1).gather(1, out[:, None]).sum().item()
            assert h.log_prob == pytest.approx(log_prob, abs=1e-4)
            coverage = h.attention.double().sum(dim=0).clamp(1e-10, 1.0).log().sum().item()  # (S,) all real
            assert h.score == pytest.approx(log_prob / lp(len(out), alpha) + beta * coverage, abs=1e-4)
    assert len(lengths) >= 3, lengths  # outputs of several lengths, some ended by EOS before the limit
