"""The search waits for the device only every `sync_every` steps, and the hypotheses do not depend on it."""

from __future__ import annotations

import pytest
import torch

from nmt.decode import Sampling, search
from tests.decode.stub import StubModel, V, batch, dist, random_table
from tests.decode.test_incremental import sources, tiny

SOURCES = [[7, 1, 1], [8, 1], [9, 1, 1, 1, 1], [10, 2, 2, 2]]


def same(a, b) -> None:
    """Equal hypotheses: tokens, scores, log-probabilities and attention, exactly."""
    assert [[h.tokens for h in s] for s in a] == [[h.tokens for h in s] for s in b]
    assert [[h.score for h in s] for s in a] == [[h.score for h in s] for s in b]
    assert [[h.log_prob for h in s] for s in a] == [[h.log_prob for h in s] for s in b]
    for sa, sb in zip(a, b, strict=True):
        for ha, hb in zip(sa, sb, strict=True):
            assert (ha.attention is None) == (hb.attention is None)
            if ha.attention is not None:
                assert torch.equal(ha.attention, hb.attention)


@pytest.mark.parametrize("seed", [0, 1, 4])
@pytest.mark.parametrize("options", [
    dict(beam=3, nbest=3, length_penalty=1.0, coverage_penalty=0.3, attention=True),
    dict(beam=4, nbest=2, length_penalty=0.6, min_len=2),
    dict(beam=1, cached=False),
    dict(beam=1, sampling=Sampling(top_k=1, seed=3)),
    dict(beam=1, sampling=Sampling(temperature=1.5, seed=3)),  # a row's draws are its line's, kept rows or not
])
@pytest.mark.parametrize("sync_every", [2, 3, 100])
def test_stub_hypotheses_do_not_depend_on_the_sync_interval(seed, options, sync_every):
    attention = torch.rand(V, 5, generator=torch.Generator().manual_seed(0)) + 0.1

    def run(every):
        model = StubModel(random_table(seed), attention=attention)
        return search(model, *batch(*SOURCES), max_len_a=1.0, max_len_b=2, sync_every=every, **options), model

    (every_step, model1), (interval, model_k) = run(1), run(sync_every)
    same(every_step, interval)
    assert len(model_k.calls) >= len(model1.calls)  # done sentences are kept until the next check


def _search_on(device: str, seed: int, options: dict, attention: torch.Tensor):
    model = StubModel(random_table(seed), attention=attention.to(device))
    src, pad_mask = batch(*SOURCES)
    return search(model, src.to(device), pad_mask.to(device), max_len_a=1.0, max_len_b=2, **options)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [0, 1, 4])
@pytest.mark.parametrize("options", [
    dict(beam=3, nbest=3, length_penalty=1.0, coverage_penalty=0.3, attention=True),
    dict(beam=4, nbest=2, length_penalty=0.6, min_len=2),
    dict(beam=4, nbest=4, min_len=5),  # min_len beyond some sentences' maximum: EOS there all the same
    dict(beam=1, cached=False),
    dict(beam=1, sampling=Sampling(temperature=1.5, seed=3)),  # the same draws: integer hashes, float64 sums
])
def test_the_search_on_a_gpu_finds_the_cpus_hypotheses(seed, options):
    """The same hand-written probabilities on either device: the same hypotheses, the GPU's searched with its
    constraints, choices and bookkeeping on the device and a look at the done sentences every 8 steps."""
    attention = torch.rand(V, 5, generator=torch.Generator().manual_seed(0)) + 0.1
    cpu, gpu = (_search_on(device, seed, options, attention) for device in ("cpu", "cuda"))
    assert [[h.tokens for h in s] for s in gpu] == [[h.tokens for h in s] for s in cpu]
    for s_cpu, s_gpu in zip(cpu, gpu, strict=True):
        assert [h.score for h in s_gpu] == pytest.approx([h.score for h in s_cpu], rel=1e-5)
        assert [h.log_prob for h in s_gpu] == pytest.approx([h.log_prob for h in s_cpu], rel=1e-5)
        for h_cpu, h_gpu in zip(s_cpu, s_gpu, strict=True):
            if h_cpu.attention is not None:
                torch.testing.assert_close(h_gpu.attention.cpu(), h_cpu.attention)


@pytest.mark.parametrize("name", ["transformer-post", "transformer-pre-learned", "rnn-luong-feeding-gru"])
@pytest.mark.parametrize("beam", [1, 4])
def test_real_model_hypotheses_do_not_depend_on_the_sync_interval(name, beam):
    model = tiny(name)
    kwargs = dict(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=3, length_penalty=1.0)
    every_step = search(model, *sources(), sync_every=1, **kwargs)
    for every in (3, 8):
        interval = search(model, *sources(), sync_every=every, **kwargs)
        assert [[h.tokens for h in s] for s in interval] == [[h.tokens for h in s] for s in every_step]
        for s1, s2 in zip(every_step, interval):
            assert [h.score for h in s2] == pytest.approx([h.score for h in s1], abs=1e-5)


def test_done_sentences_are_dropped_and_the_search_ends_at_the_checks_only():
    def probs(cond, prefix):  # sentence 7 ends after 1 token, sentence 8 after 4
        return dist(eos=1.0) if len(prefix) >= (1 if cond == 7 else 4) else dist(a=0.5, b=0.5)

    model = StubModel(probs)
    hyps = search(model, *batch([7, 1], [8, 1, 1]), beam=2, nbest=2, max_len_a=0.0, max_len_b=20, sync_every=3)
    assert [[len(h.tokens) for h in s] for s in hyps] == [[1, 1], [4, 4]]
    # 4 rows until the check after step 2 drops sentence 7; sentence 8 ends at step 4, seen at step 5.
    assert model.calls == [4, 4, 4, 2, 2, 2]


def test_the_loop_reads_the_device_only_at_the_checks(monkeypatch):
    model = tiny("transformer-post")
    steps = []
    decode_step = model.decode_step
    monkeypatch.setattr(model, "decode_step", lambda *a, **k: steps.append(1) or decode_step(*a, **k))
    reads = {"nonzero": 0, "item": 0, "__bool__": 0, "__int__": 0, "__float__": 0}
    for method in reads:
        original = getattr(torch.Tensor, method)

        def counted(self, *args, _name=method, _original=original, **kwargs):
            reads[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, method, counted)
    search(model, *sources(), beam=3, max_len_a=1.0, max_len_b=3, sync_every=4)
    monkeypatch.undo()
    assert len(steps) > 4
    # Before the loop, two: the longest and the shortest output allowed (cache size, first step that can force EOS).
    assert reads == {"nonzero": len(steps) // 4, "item": 0, "__bool__": 0, "__int__": 2, "__float__": 0}


@pytest.mark.parametrize("options", [dict(beam=3), dict(beam=1), dict(beam=1, sampling=Sampling(seed=1))],
                         ids=["beam", "greedy", "sampling"])
def test_no_operation_inside_the_loop_reads_the_device_between_the_checks(options, monkeypatch):
    """Reads from C++ as well as from Python, as the profiler sees them: each `item` (a scalar to the host) and
    `nonzero` (a size the host needs) waits for a GPU. torch.multinomial made two such reads a step inside."""
    model = tiny("transformer-post")
    steps = []
    decode_step = model.decode_step
    monkeypatch.setattr(model, "decode_step", lambda *a, **k: steps.append(1) or decode_step(*a, **k))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        search(model, *sources(), max_len_a=1.0, max_len_b=3, sync_every=4, **options)
    names = [event.name for event in prof.events()]
    assert len(steps) > 4
    # before the loop, the longest and the shortest output allowed; in it, one nonzero every 4 steps
    assert names.count("aten::_local_scalar_dense") == 2
    assert names.count("aten::nonzero") == len(steps) // 4


def test_sync_every_must_be_positive():
    with pytest.raises(ValueError, match=r"sync_every \(0\)"):
        search(StubModel(random_table(0)), *batch([7]), max_len_a=1.0, max_len_b=2, sync_every=0)
