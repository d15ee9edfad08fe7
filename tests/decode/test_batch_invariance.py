"""A sentence's translation does not depend on the sentences beside it in its batch.

Each sentence is searched alone (unpadded, a batch of one) and in a batch of ten
sentences of lengths 1 to 9: as given, in another order, and with every source padded
further. Tokens must agree exactly, scores and attention up to rounding. The models are
tiny and real: trained for a few seconds to reverse their source, so that hypotheses
end by EOS at lengths of their own (finished beams, per-sentence limits and length
penalties all come into play), or seeded and untrained, whose outputs run to each
sentence's own length limit.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from nmt.decode import search
from nmt.models.attention import ATTENTION_KINDS
from nmt.models.ensemble import Ensemble
from tests.models.tiny import padded_batch, tiny_model

VOCAB = 20

TRAINED = {
    "transformer": ("transformer", {}),
    "transformer-manual": ("transformer", dict(transformer=dict(attention_impl="manual"))),
    # 64 positions a row: the encoder lays up to 7 sentences of the batch side by side, one alone by itself
    "transformer-packed": ("transformer", dict(transformer=dict(attention_pack=64))),
    "rnn-luong-local": ("rnn", dict(rnn=dict(attention="multihead", attention_heads=2, local_window=1))),
    "rnn-bahdanau-local": ("rnn", dict(rnn=dict(decoder="bahdanau", attention="additive", local_window=2,
                                                cell="lstm"))),
}

SEARCHES = {
    "greedy": dict(beam=1),
    "beam": dict(beam=4, nbest=4, length_penalty=1.0),
    "penalties": dict(beam=3, nbest=2, length_penalty=0.6, coverage_penalty=0.3, attention=True, min_len=2),
    "uncached": dict(beam=3, nbest=3, cached=False),
    "short-limits": dict(beam=5, nbest=5, length_penalty=0.0, max_len_a=0.5, max_len_b=1),
}
LIMITS = dict(max_len_a=1.0, max_len_b=2)


def reversal_batch(g: torch.Generator, n: int = 32) -> tuple[torch.Tensor, ...]:
    """Sources of 1 to 9 random tokens, right-padded, and their reversals with BOS / EOS as teacher-forced
    targets: (src, pad, tgt_in, tgt_out)."""
    lengths = torch.randint(1, 10, (n,), generator=g).tolist()
    src, pad = padded_batch(lengths, vocab=VOCAB, seed=int(torch.randint(1 << 30, (1,), generator=g)))
    tgt = torch.full((n, max(lengths) + 2), PAD_ID)
    for i, length in enumerate(lengths):
        tgt[i, 0], tgt[i, length + 1] = BOS_ID, EOS_ID
        tgt[i, 1 : length + 1] = src[i, :length].flip(0)
    return src, pad, tgt[:, :-1], tgt[:, 1:]


@functools.cache
def trained(name: str) -> torch.nn.Module:
    """The tiny model `TRAINED[name]` after 120 Adam steps on reversal: enough to end its outputs by EOS."""
    kind, config = TRAINED[name]
    model = tiny_model(kind, vocab=VOCAB, **config).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(120):
        src, pad, tgt_in, tgt_out = reversal_batch(g)
        logits = model(src, pad, tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def mixed_batch():
    """Ten sources of lengths 1 to 9 (two of length 1), with their teacher-forced targets."""
    return reversal_batch(torch.Generator().manual_seed(11), n=10)


def assert_as_if_alone(model, src, pad, options) -> list[list]:
    """Search each sentence alone and in three batches (as given, permuted, padded further) and compare.

    Returns the batch's hypotheses as given.
    """
    B = src.size(0)
    perm = torch.randperm(B, generator=torch.Generator().manual_seed(5)).tolist()
    wider = torch.cat([src, torch.full((B, 3), PAD_ID)], dim=1)
    wider_pad = torch.cat([pad, torch.ones(B, 3, dtype=torch.bool)], dim=1)
    together = search(model, src, pad, **options)
    permuted = search(model, src[perm], pad[perm], **options)
    padded = search(model, wider, wider_pad, **options)
    for i, n in enumerate((~pad).sum(dim=1).tolist()):
        alone = search(model, src[i : i + 1, :n], pad[i : i + 1, :n], **options)[0]
        assert alone
        for way, hyps in (("batch", together[i]), ("permuted", permuted[perm.index(i)]), ("padded", padded[i])):
            assert [h.tokens for h in hyps] == [h.tokens for h in alone], f"sentence {i}, {way}"
            assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-4), f"sentence {i}, {way}"
            assert [h.log_prob for h in hyps] == pytest.approx([h.log_prob for h in alone], abs=1e-4)
            for h, a in zip(hyps, alone, strict=True):
                if options.get("attention"):
                    assert h.attention.shape == a.attention.shape == (len(h.tokens) + 1, n)
                    torch.testing.assert_close(h.attention, a.attention, atol=1e-5, rtol=1e-4)
    return together


@pytest.mark.parametrize("search_name", SEARCHES)
@pytest.mark.parametrize("model_name", TRAINED)
def test_a_trained_model_searches_each_sentence_as_if_alone(model_name, search_name):
    src, pad, _, _ = mixed_batch()
    hyps = assert_as_if_alone(trained(model_name), src, pad, LIMITS | SEARCHES[search_name])
    # The outputs end where each sentence's own model says, not all at one limit.
    assert len({len(h.tokens) for sentence in hyps for h in sentence}) >= 4


@pytest.mark.parametrize("model_name", ["transformer", "rnn-bahdanau-local"])
def test_the_gpus_ways_run_on_a_cpu_search_each_sentence_as_if_alone(model_name):
    """A GPU's search looks at done sentences every 8 steps (so done sentences stay in the batch), and its
    RNN encoder reads the padded source unpacked: each sentence still gets what it gets alone."""
    model = trained(model_name)
    src, pad, _, _ = mixed_batch()
    rnn = hasattr(model.encoder, "pack_off_cuda")
    try:
        if rnn:
            model.encoder.pack_off_cuda = False
        for options in SEARCHES.values():
            assert_as_if_alone(model, src, pad, LIMITS | options | dict(sync_every=8))
    finally:
        if rnn:
            model.encoder.pack_off_cuda = True


def test_an_ensemble_searches_each_sentence_as_if_alone():
    ensemble = Ensemble(members=[trained("transformer"), trained("rnn-bahdanau-local")]).eval()
    src, pad, _, _ = mixed_batch()
    for name in ("greedy", "penalties", "short-limits"):
        assert_as_if_alone(ensemble, src, pad, LIMITS | SEARCHES[name])


@pytest.mark.parametrize("model_name", TRAINED)
def test_teacher_forced_log_probs_of_a_pair_do_not_depend_on_the_batch(model_name):
    """Scoring a given target: each pair's log-probabilities at its real positions are those it has alone."""
    model = trained(model_name)
    src, pad, tgt_in, tgt_out = mixed_batch()
    with torch.inference_mode():
        together = model(src, pad, tgt_in).log_softmax(dim=-1)  # (B, T, V)
        for i in range(src.size(0)):
            n, t = int((~pad[i]).sum()), int(tgt_out[i].ne(PAD_ID).sum())
            alone = model(src[i : i + 1, :n], pad[i : i + 1, :n], tgt_in[i : i + 1, :t]).log_softmax(dim=-1)
            # rtol: a log-probability of -11 computed in a batch of other shapes differs in float32's last bits (1.1e-5
            # on a 2-core AMD EPYC); a padded position that leaked in would move it by orders of magnitude more
            torch.testing.assert_close(together[i, :t], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [0, 2])
@pytest.mark.parametrize("attention", ATTENTION_KINDS)
@pytest.mark.parametrize("decoder", ["luong", "bahdanau"])
def test_every_rnn_attention_searches_each_sentence_as_if_alone(decoder, attention, window):
    """Seeded untrained models, EOS forbidden before each sentence's own limit (min_len above every limit):
    every output runs to floor(a * src_len + b), attending at every step (local-p windows centred by each
    sentence's own length)."""
    model = tiny_model("rnn", vocab=VOCAB, rnn=dict(decoder=decoder, attention=attention, local_window=window,
                                                    attention_heads=2))
    src, pad = padded_batch([7, 2, 5, 1, 9, 3], vocab=VOCAB, seed=3)
    hyps = assert_as_if_alone(model, src, pad, LIMITS | SEARCHES["penalties"] | dict(min_len=20))
    assert [len(sentence[0].tokens) for sentence in hyps] == [9, 4, 7, 3, 11, 5]
