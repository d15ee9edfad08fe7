"""Translator, its file and terminal drivers, and `nmt translate`, on tiny real checkpoints.

The `checkpoints` models are randomly initialised: their translations are
nonsense, but long and varied, which is what batching, ordering, truncation,
n-best, ensembles and attention plots need to be exercised.
"""

from __future__ import annotations

import io
import json
import logging
import math
import shutil
import struct
import sys
import threading
import urllib.request
from itertools import islice
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from nmt.cli import app
from nmt.config import config_from_dict
from nmt.data.text import LINE_BREAKS, one_line
from nmt.data.tokenizer import EOS_ID, Tokenizer
from nmt.decode import Sampling, search
from nmt.errors import CheckpointError, DataError, UserError
from nmt.models.multihead import MultiHeadAttention
from nmt.plot import image_size
from nmt.translate import Translator
from nmt.translate_io import format_nbest, interactive, translate_io, translate_lines
from tests.conftest import tiny_config_dict

runner = CliRunner()
KINDS = ["transformer", "rnn"]


@pytest.fixture(scope="session")
def checkpoints(small_corpus, tmp_path_factory) -> dict[str, Path]:
    """Checkpoints of a seeded, randomly initialised tiny Transformer (max_positions 128) and
    tiny LSTM Luong RNN, with a sentencepiece model trained on `small_corpus`."""
    from nmt.checkpoint import save_checkpoint
    from nmt.config import config_to_dict
    from nmt.data.tokenizer import PAD_ID, train_tokenizer
    from nmt.models import build_model

    root = tmp_path_factory.mktemp("translate_ckpts")
    out = {}
    for kind in KINDS:
        d = tiny_config_dict(small_corpus, root / kind, model_type=kind)
        d["model"]["transformer"]["max_positions"] = 128
        d["model"]["rnn"]["cell"] = "lstm"
        cfg = config_from_dict(d)
        en, de = ((small_corpus / f"train.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "de"))
        tokenizer = train_tokenizer(cfg.tokenizer, en, de)
        torch.manual_seed(0)
        model = build_model(cfg.model, src_vocab_size=tokenizer.src_vocab_size,
                            tgt_vocab_size=tokenizer.tgt_vocab_size, pad_id=PAD_ID)
        out[kind] = root / f"{kind}.pt"
        save_checkpoint({"config": config_to_dict(cfg), "tokenizer": tokenizer.to_state(),
                         "model": model.state_dict()}, out[kind])
    return out


@pytest.fixture(scope="session")
def translators(checkpoints) -> dict[str, Translator]:
    return {kind: Translator.from_checkpoint(path, device="cpu") for kind, path in checkpoints.items()}


@pytest.fixture(scope="session")
def sources(small_corpus) -> list[str]:
    return (small_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:8]


# --------------------------------------------------------------------------- Translator


@pytest.mark.parametrize("kind", KINDS)
def test_batch_equals_one_by_one_and_order_is_kept(translators, sources, kind):
    tr = translators[kind]
    together = tr.translate_nbest(sources, beam=3, nbest=3)
    for line, hyps in zip(sources[:5], together, strict=False):
        alone = tr.translate_nbest([line], beam=3, nbest=3, max_tokens=10_000)[0]
        assert [h.text for h in hyps] == [h.text for h in alone]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-4)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    # each text is its own hypothesis's (the batch is detokenized in one call): its pieces, joined
    assert all(h.text == "".join(h.tokens).replace("\u2581", " ").strip() for hyps in together for h in hyps)
    # a budget that forces one sentence per batch gives the same, in input order
    assert tr.translate(sources, beam=3, max_tokens=1) == [hyps[0].text for hyps in together]


@pytest.mark.parametrize("kind", [*KINDS, "ensemble"])
def test_a_lines_translations_do_not_depend_on_its_batch_its_neighbours_or_their_order(checkpoints, small_corpus,
                                                                                     kind):
    """Each line translated alone is what it is among others: in batches of any budget (length-sorted, then put
    back in input order), in the reverse order, and a few lines at a time from a stream."""
    paths = [checkpoints["transformer"], checkpoints["rnn"]] if kind == "ensemble" else checkpoints[kind]
    tr = Translator.from_checkpoint(paths, device="cpu")
    test = (small_corpus / "test.en").read_text(encoding="utf-8").splitlines()
    lines = [*test[:4], "", test[1], "  ", " ".join(test[:3]), *test[4:9]]  # empty, repeated and long lines too

    def assert_same(got, want, way):
        assert [[h.text for h in nbest] for nbest in got] == [[h.text for h in nbest] for nbest in want], way
        for field in ("score", "log_prob"):
            values = [getattr(h, field) for nbest in got for h in nbest]
            assert values == pytest.approx([getattr(h, field) for nbest in want for h in nbest], abs=1e-4), way
        for h, a in zip((h for nbest in got for h in nbest), (a for nbest in want for a in nbest), strict=True):
            assert (h.attention is None) == (a.attention is None), way
            if a.attention is not None:
                torch.testing.assert_close(h.attention, a.attention, atol=1e-5, rtol=1e-4)

    for options in (dict(beam=1), dict(beam=3, nbest=2, length_penalty=0.6, coverage_penalty=0.2, attention=True)):
        alone = [tr.translate_nbest([line], **options)[0] for line in lines]
        assert len({len(h.tokens) for nbest in alone for h in nbest}) >= 4  # outputs of many lengths
        for budget in (1, 60, 100_000):  # a line a batch, a few lines a batch, one batch
            assert_same(tr.translate_nbest(lines, max_tokens=budget, **options), alone, f"max_tokens {budget}")
        assert_same(tr.translate_nbest(lines[::-1], **options)[::-1], alone, "reversed")
        assert_same(list(tr.translate_stream_nbest(lines, chunk_size=3, **options)), alone, "stream")


def test_batch_budget_is_by_device_unless_set(translators):
    import copy
    import dataclasses

    tr = translators["transformer"]
    assert tr.cfg.decode.max_tokens == 0  # the default: auto
    assert tr.device.type == "cpu" and tr.max_tokens_for() == 8000
    assert tr.max_tokens_for(500) == 500
    on_gpu = copy.copy(tr)
    on_gpu.device = torch.device("cuda")  # only the budget is asked: nothing runs there
    assert on_gpu.max_tokens_for() == 128_000 and on_gpu.max_tokens_for(500) == 500
    on_gpu.cfg = dataclasses.replace(tr.cfg, decode=dataclasses.replace(tr.cfg.decode, max_tokens=3000))
    assert on_gpu.max_tokens_for() == 3000


class SmallGpu:
    """A GPU with room for batches of at most `tokens` padded source tokens, standing in for one (none runs
    here): the model's encoder, replaced by this, raises CUDA's out-of-memory error on a larger batch, as a
    search's first large allocation does, and records the size of every batch it is given."""

    def __init__(self, model: torch.nn.Module, tokens: int) -> None:
        self.encode, self.tokens, self.batches = model.encode, tokens, []

    def __call__(self, src: torch.Tensor, mask: torch.Tensor):
        self.batches.append(src.numel())
        if src.numel() > self.tokens:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                                              "capacity of 7.63 GiB of which 1.10 GiB is free.\nmore detail")
        return self.encode(src, mask)


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_out_of_cuda_memory_is_translated_in_halves_and_later_batches_fit(checkpoints, sources, kind,
                                                                                  monkeypatch, caplog):
    tr = Translator.from_checkpoint(checkpoints[kind], device="cpu")
    expected = tr.translate_nbest(sources, beam=3, nbest=2)
    longest = max(len(s) for s in tr._encode(sources, tr.max_src_len)[0])
    whole = len(sources) * longest  # all 8 in one batch, padded
    gpu = SmallGpu(tr.model, tokens=2 * longest)  # room for the 2 longest sentences
    monkeypatch.setattr(tr.model, "encode", gpu)
    with caplog.at_level(logging.WARNING, logger="nmt.translate"):
        got = tr.translate_nbest(sources, beam=3, nbest=2)
    assert [[h.text for h in n] for n in got] == [[h.text for h in n] for n in expected]
    assert [h.score for n in got for h in n] == pytest.approx([h.score for n in expected for h in n], abs=1e-4)
    assert gpu.batches[0] == whole  # all 8 sentences in one batch first, then halves until they fit
    assert len(gpu.batches) > 2 and sum(b <= gpu.tokens for b in gpu.batches) >= 2
    # 8 sentences fail, then the 4 longest; the budget is then 2 of the longest, and the 4 others, cut before,
    # are cut again under it rather than tried
    assert [b for b in gpu.batches if b > gpu.tokens] == [whole, whole // 2]
    assert caplog.text.count("CUDA out of memory on a batch of 8 sentences") == 1
    assert "translating it in halves" in caplog.text and "--max-tokens (decode.max_tokens)" in caplog.text
    assert "more detail" not in caplog.text
    # the budget stays lowered: the next call cuts batches that fit at once, in any beam
    assert 0 < tr.max_tokens_for() < 8000 and tr.max_tokens_for(100_000) == tr.max_tokens_for()
    gpu.batches.clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nmt.translate"):
        assert tr.translate(sources, beam=3) == [n[0].text for n in expected]
    assert gpu.batches and max(gpu.batches) <= gpu.tokens and "out of memory" not in caplog.text


def test_one_sentence_out_of_cuda_memory_is_a_one_line_error(checkpoints, sources, monkeypatch):
    tr = Translator.from_checkpoint(checkpoints["transformer"], device="cpu")
    gpu = SmallGpu(tr.model, tokens=0)
    monkeypatch.setattr(tr.model, "encode", gpu)
    with pytest.raises(UserError, match=r"CUDA out of memory translating one sentence of \d+ subwords at beam 4 on "
                                        r"cpu: lower --beam, or translate on the CPU with --device cpu \(CUDA out "
                                        r"of memory\. Tried to allocate 2\.00 GiB\. .* is free\.\)$"):
        tr.translate(sources[:2], beam=4)
    assert len(gpu.batches) == 2  # both sentences, then the first alone


@pytest.mark.gpu
def test_on_a_gpu_with_too_little_memory_for_a_batch_its_halves_give_the_same_translations(checkpoints, sources,
                                                                                          caplog):
    tr = Translator.from_checkpoint(checkpoints["transformer"], device="cuda")
    lines = sources * 128  # one batch of 1,024 sentences at beam 5, then a quarter of them
    peaks, outputs = [], []
    for part in (lines, lines[: len(lines) // 4]):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        outputs.append(tr.translate(part, beam=5, max_tokens=10**8))
        peaks.append(torch.cuda.max_memory_reserved())
    assert peaks[0] > peaks[1]
    total = torch.cuda.get_device_properties(tr.device).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction((peaks[0] + peaks[1]) / 2 / total, tr.device)
    try:  # room for a quarter of the lines in one batch, not for all of them
        with caplog.at_level(logging.WARNING, logger="nmt.translate"):
            got = tr.translate(lines, beam=5, max_tokens=10**8)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, tr.device)
    # batches of other sizes may pick other GPU kernels: as the GPU against the CPU, 99% of lines the same
    assert len(got) == len(lines) and sum(map(str.__eq__, got, outputs[0])) >= 0.99 * len(lines)
    assert "CUDA out of memory on a batch of 1024 sentences" in caplog.text


def test_a_model_with_non_finite_outputs_gives_empty_lines_and_a_warning_each(checkpoints, sources, caplog):
    tr = Translator.from_checkpoint(checkpoints["transformer"], device="cpu")
    with torch.no_grad():
        for p in tr.model.parameters():
            p.fill_(float("nan"))  # every log-probability NaN: no hypothesis has a finite score
    with caplog.at_level(logging.WARNING, logger="nmt.translate"):
        nbest = tr.translate_nbest(sources[:3], beam=3, nbest=2)
    assert [[(h.text, h.score) for h in n] for n in nbest] == [[("", -math.inf)] * 2] * 3  # not 0: probability 1
    for line in (1, 2, 3):
        assert f"line {line}: no translation with a finite score" in caplog.text
    assert tr.translate(["", sources[0]], beam=2) == ["", ""]


def test_every_line_holds_nbest_translations_even_where_the_search_found_fewer(checkpoints, sources):
    """A line that the search gives fewer hypotheses than `nbest` is filled up with empty translations at a score
    of -inf, so that `--nbest N` lines always hold N (lines had fewer fields); an empty line has one translation."""
    tr = Translator.from_checkpoint(checkpoints["transformer"], device="cpu")
    pieces = tr.tokenizer.tgt_pieces(range(tr.tokenizer.tgt_vocab_size))
    word = next(i for i, p in enumerate(pieces) if p.startswith("▁") and p[1:].isalpha())  # a whole word
    decode_step = tr.model.decode_step

    def eos_or_one_word(tokens, memory, state, **kwargs):  # the real model's step, two tokens left possible
        log_probs, state, attn = decode_step(tokens, memory, state, **kwargs)
        kept = torch.full_like(log_probs, -math.inf)
        kept[:, [EOS_ID, word]] = log_probs[:, [EOS_ID, word]]
        return kept, state, attn

    tr.model.decode_step = eos_or_one_word
    [found, empty] = tr.translate_nbest([sources[0], ""], beam=4, nbest=4, max_len_a=0.0, max_len_b=1)
    assert sorted(h.text for h in found[:2]) == ["", pieces[word][1:]]
    assert found[0].score >= found[1].score > -math.inf
    assert [(h.text, h.score, h.log_prob) for h in found[2:]] == [("", -math.inf, -math.inf)] * 2
    assert [h.score for h in empty] == [0.0, -math.inf, -math.inf, -math.inf]
    assert format_nbest(found, scores=True).split("\t")[4:] == ["-inf", "", "-inf", ""]


def test_output_lengths_beyond_the_models_positions_are_refused_in_one_line(translators, sources):
    tr = translators["transformer"]  # 128 positions: outputs of at most 127 tokens after BOS
    for a, b in [(0.0, 200), (0.0, 128), (1.0, 126), (63.5, 1)]:  # 2a + b > 127: not even a one-subword source
        with pytest.raises(UserError, match=rf"max_len_a {a:g} and max_len_b {b} allow outputs of more than the 127 "
                                            r"tokens the model's 128 positions hold.*at most 127$"):
            tr.translate(sources[:1], max_len_a=a, max_len_b=b)
    # at the edge: the search may run to the last position, and longer sources are cut to fit
    assert tr.max_source_length(tr.options(max_len_a=1.0, max_len_b=125)) == 2
    assert len(tr.translate(sources[:2], beam=2, max_len_a=0.0, max_len_b=127)) == 2
    assert len(tr.translate(sources[:2], beam=2, max_len_a=1.0, max_len_b=125)) == 2


def test_greedy_needs_no_beam_setting(translators, sources):
    tr = translators["transformer"]
    assert tr.cfg.decode.beam > 1
    assert tr.translate(sources, strategy="greedy") == tr.translate(sources, beam=1)


@pytest.mark.parametrize(("value", "ok"), [(0, True), (1, True), (-1, False)])
def test_decode_max_tokens_is_zero_for_auto_or_positive(small_corpus, tmp_path, value, ok):
    d = tiny_config_dict(small_corpus, tmp_path)
    d["decode"] = {"max_tokens": value}
    if ok:
        assert config_from_dict(d).decode.max_tokens == value
    else:
        with pytest.raises(UserError, match=r"decode\.max_tokens: -1 must be >= 0"):
            config_from_dict(d)


@pytest.mark.parametrize(("a", "b"), [(1.2, 5), (1.1, 0), (1.15, 3), (1.5, 10), (2.0, 0)])
def test_the_longest_source_kept_is_the_longest_whose_longest_output_fits_the_positions(translators, a, b):
    """int((P - 1 - b) / a) fell one short where a * S's fraction crossed an integer: with a 1.2 and b 5 a model of
    128 positions cut sources of 102 positions (EOS included), whose outputs of floor(1.2 x 102 + 5) = 127 tokens
    fit. Checked here against the rule itself, then by a search forced to that output length."""
    tr = translators["transformer"]
    positions = tr.model.max_positions
    kept = tr.max_source_length(tr.options(max_len_a=a, max_len_b=b))
    assert math.floor(a * kept + b + 1e-9) <= positions - 1 < math.floor(a * (kept + 1) + b + 1e-9)
    src = torch.full((1, kept), 5, dtype=torch.long)
    src[0, -1] = EOS_ID
    [[best]] = search(tr.model.eval(), src, src == -1, beam=1, max_len_a=a, max_len_b=b, min_len=10_000)
    assert len(best.tokens) == math.floor(a * kept + b + 1e-9)  # BOS and those fed at positions 0 .. 127


def test_awkward_lines_each_give_exactly_one_output(translators, caplog):
    tr = translators["transformer"]
    long_line = " ".join(["the man sees the dog"] * 60)  # far beyond 128 positions
    lines = ["the dog runs .", "", "   \t ", "a\x00b\x07c\x1b[0m d", "zürich ☃ 東京 ∮", long_line, "\x0c\x0b", "the cat ."]
    with caplog.at_level(logging.WARNING, logger="nmt.translate"):
        out = tr.translate_nbest(lines, beam=2, nbest=2)
    assert len(out) == len(lines)
    assert out[1][0].text == "" and out[2][0].text == "" and out[6][0].text == ""
    assert len(out[1]) == 2  # empty lines fill every n-best column
    assert "line 6 has" in caplog.text and "truncated" in caplog.text
    assert len(out[5][0].src_tokens) == tr.max_src_len  # truncated, EOS included, translated
    assert all("\n" not in format_nbest(h) for h in out)
    assert tr.translate(lines, beam=2) == [h[0].text for h in out]


def test_single_string_in_single_string_out(translators):
    tr = translators["transformer"]
    assert tr.translate("the dog runs .", beam=2) == tr.translate(["the dog runs ."], beam=2)[0]


@pytest.mark.parametrize("kind", KINDS)
def test_stream_equals_translate_and_is_bounded(translators, sources, kind):
    tr = translators[kind]
    lines = [*sources[:4], "", *sources[4:6]]
    consumed = []

    def generator():
        for i, line in enumerate(lines):
            consumed.append(i)
            yield line + "\n"

    stream = tr.translate_stream(generator(), chunk_size=4, beam=2)
    first = next(stream)
    assert len(consumed) == 4  # only the first chunk was read
    assert [first, *stream] == tr.translate(lines, beam=2)


@pytest.mark.parametrize("beam, max_tokens, chunk", [(5, None, 2000), (1, None, 8000), (2, 20_000, 10_000),
                                                     (1, 10**6, 32_000)])
def test_a_stream_reads_as_many_lines_at_a_time_as_a_batch_holds_source_tokens(translators, beam, max_tokens, chunk):
    """From 2,000 (CHUNK_LINES) up to 32,000 (MAX_CHUNK_LINES) lines; the CPU's budget is 8,000 tokens.
    Empty lines cost no search, so the chunks can be counted at full size."""
    tr = translators["transformer"]
    consumed = [0]

    def empty_lines():
        while True:
            consumed[0] += 1
            yield "\n"

    stream = tr.translate_stream(empty_lines(), beam=beam, max_tokens=max_tokens)
    assert next(stream) == "" and consumed[0] == chunk
    assert tr.chunk_lines(tr.options(beam=beam, max_tokens=max_tokens)) == chunk

    class FirstWrite(io.StringIO):  # `nmt translate`'s path: how much input was read before the first line out
        def write(self, text):
            self.at = getattr(self, "at", consumed[0])
            return super().write(text)

    consumed[0], out = 0, FirstWrite()
    translate_lines(tr, islice(empty_lines(), chunk + 1), out, beam=beam, max_tokens=max_tokens)
    assert out.at == chunk and out.getvalue() == "\n" * (chunk + 1)


def test_sampling_is_reproducible_with_a_seed(translators, sources):
    tr = translators["transformer"]
    s = Sampling(temperature=1.5, seed=3)
    a, b = tr.translate(sources, sampling=s), tr.translate(sources, sampling=s)
    assert a == b
    assert a != tr.translate(sources, sampling=Sampling(temperature=1.5, seed=4))
    with pytest.raises(UserError, match="beam"):
        tr.translate(sources, beam=2, sampling=s)
    with pytest.raises(UserError, match="nbest"):
        tr.translate_nbest(sources, beam=2, nbest=3)


@pytest.mark.parametrize("kind", KINDS)
def test_attention_covers_source_and_output(translators, sources, kind):
    hyp = translators[kind].translate_nbest(sources[:2], beam=2, attention=True)[0][0]
    assert hyp.src_tokens[-1] == "</s>"
    assert hyp.attention.shape == (len(hyp.tokens) + 1, len(hyp.src_tokens))
    torch.testing.assert_close(hyp.attention.sum(-1), torch.ones(len(hyp.tokens) + 1), atol=1e-4, rtol=0)


def test_transformer_attention_layer_and_head(translators, sources):
    tr = translators["transformer"]
    try:
        mean = tr.translate_nbest(sources[:1], beam=1, attention=True)[0][0].attention
        tr.set_attention(layer=0, head=1)
        head = tr.translate_nbest(sources[:1], beam=1, attention=True)[0][0].attention
        assert head.shape == mean.shape and not torch.allclose(head, mean)
        with pytest.raises(UserError, match="head"):
            tr.set_attention(head=7)
        with pytest.raises(UserError, match="layer"):
            tr.set_attention(layer=3)
    finally:
        tr.set_attention()


@pytest.mark.parametrize("kind", ["transformer", "rnn"])
def test_bf16_casts_the_weights_and_translates_as_fp32_does(checkpoints, translators, sources, kind):
    tr = Translator.from_checkpoint(checkpoints[kind], device="cpu", precision="bf16")
    assert tr.precision == "bf16"
    assert {p.dtype for p in tr.model.parameters()} == {torch.bfloat16}  # weights, not autocast
    out = tr.translate_nbest(sources, beam=2, attention=True)
    assert out[0][0].attention.dtype == torch.float32 and isinstance(out[0][0].log_prob, float)
    fp32 = translators[kind].translate_nbest(sources, beam=2)
    # an untrained model's near-ties may tip either way in bf16 (a trained Multi30k model: 939/1000 identical)
    same = sum(a[0].text == b[0].text for a, b in zip(out, fp32))
    assert same >= 0.5 * len(sources), f"{same} of {len(sources)} lines as in fp32"
    assert all(abs(a[0].log_prob - b[0].log_prob) < 0.5 for a, b in zip(out, fp32) if a[0].text == b[0].text)
    assert Translator.from_checkpoint(checkpoints["rnn"], device="cpu").precision == "fp32"  # auto on CPU


def test_uncached_gives_the_same_translations(translators, sources):
    tr = translators["transformer"]
    assert tr.translate(sources, beam=3, cached=False) == tr.translate(sources, beam=3)


# --------------------------------------------------------------------------- ensembles


@pytest.mark.parametrize("kind", KINDS)
def test_ensemble_of_one_and_of_two_equal_models_is_the_model(checkpoints, translators, sources, kind):
    single = translators[kind].translate_nbest(sources, beam=3, nbest=2)
    for paths in ([checkpoints[kind]], [checkpoints[kind]] * 2):
        ens = Translator.from_checkpoint(paths, device="cpu").translate_nbest(sources, beam=3, nbest=2)
        assert [[h.text for h in n] for n in ens] == [[h.text for h in n] for n in single]
        assert [h.log_prob for n in ens for h in n] == pytest.approx([h.log_prob for n in single for h in n], abs=1e-4)


def test_mixed_ensemble_runs_with_attention(checkpoints, sources):
    tr = Translator.from_checkpoint([checkpoints["transformer"], checkpoints["rnn"]], device="cpu")
    hyp = tr.translate_nbest(sources[:2], beam=2, attention=True)[0][0]
    assert hyp.attention.shape == (len(hyp.tokens) + 1, len(hyp.src_tokens))
    assert tr.translate(sources[:3], beam=2, cached=False) == tr.translate(sources[:3], beam=2)


def test_ensemble_with_another_vocabulary_is_refused(checkpoints, small_corpus, tmp_path):
    from nmt.checkpoint import load_checkpoint, save_checkpoint
    from nmt.config import TokenizerConfig
    from nmt.data.tokenizer import train_tokenizer

    payload = load_checkpoint(checkpoints["transformer"])
    text = (small_corpus / "train.de").read_text(encoding="utf-8").splitlines()
    other = train_tokenizer(TokenizerConfig(vocab_size=200), text, text[::-1])  # same size, other pieces
    save_checkpoint({**payload, "tokenizer": other.to_state()}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="share one vocabulary"):
        Translator.from_checkpoint([checkpoints["transformer"], tmp_path / "other.pt"], device="cpu")


def test_ensemble_of_the_other_direction_is_refused(checkpoints, tmp_path):
    """A joint vocabulary is the same for en->de and de->en: only the configs tell the directions apart, and
    an ensemble of both averaged two models that write different languages into nonsense."""
    from nmt.checkpoint import load_checkpoint, save_checkpoint

    payload = load_checkpoint(checkpoints["transformer"])
    data = payload["config"]["data"]
    reverse = {**payload["config"], "data": {**data, "src_lang": data["tgt_lang"], "tgt_lang": data["src_lang"]}}
    save_checkpoint({**payload, "config": reverse}, tmp_path / "reverse.pt")
    with pytest.raises(CheckpointError, match=rf"reverse.pt: translates {data['tgt_lang']}->{data['src_lang']}, "
                                              rf"and .* {data['src_lang']}->{data['tgt_lang']} .*one direction"):
        Translator.from_checkpoint([checkpoints["transformer"], tmp_path / "reverse.pt"], device="cpu")
    Translator.from_checkpoint([checkpoints["transformer"], checkpoints["rnn"]], device="cpu")  # one direction


def test_eval_of_several_checkpoints_scores_their_ensemble(checkpoints, sources, tmp_path):
    """`nmt eval -c A -c B` scored B alone (the option kept its last value), where `nmt translate -c A -c B`
    ensembles them: a user published one model's score as the ensemble's."""
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("\n".join(sources[:4]) + "\n", encoding="utf-8")
    ref.write_text("\n".join(sources[4:8]) + "\n", encoding="utf-8")
    pair = [checkpoints["transformer"], checkpoints["rnn"]]
    hyps = tmp_path / "hyps"
    cli("eval", "-c", str(pair[0]), "-c", str(pair[1]), "--src", str(src), "--ref", str(ref),
        "--save-translations", str(hyps))
    ensemble = Translator.from_checkpoint(pair, device="cpu").translate(sources[:4])
    assert (hyps / "src.txt.hyp").read_text(encoding="utf-8").splitlines() == ensemble
    assert ensemble != Translator.from_checkpoint(pair[1], device="cpu").translate(sources[:4])  # not B's alone
    result = runner.invoke(app, ["eval", "-c", str(pair[0]), "-c", str(pair[0]), "--src", str(src), "--ref", str(ref)])
    assert isinstance(result.exception, UserError) and "ensemble" in str(result.exception), result.output


# --------------------------------------------------------------------------- drivers and plots


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk of a PNG."""
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("kind", KINDS)
def test_attention_plots_have_the_expected_size(translators, tmp_path, kind):
    tr = translators[kind]
    lines = ["the man sees the dog .", "", "the woman runs ."]
    out = io.StringIO()
    assert translate_lines(tr, lines, out, plot_dir=tmp_path / "plots", beam=2) == 3
    assert out.getvalue().count("\n") == 3
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["1.png", "3.png"]
    hyp = tr.translate_nbest(lines[:1], beam=2)[0][0]
    expected = image_size(len(hyp.src_tokens), len(hyp.tokens) + 1)
    assert png_size(tmp_path / "plots" / "1.png") == expected


def test_interactive_prompts_on_its_own_stream(translators):
    tr = translators["transformer"]
    out, prompts = io.StringIO(), io.StringIO()
    n = interactive(tr, io.BytesIO("the dog runs .\r\n\nthe cat é .\n".encode()), out, prompts, beam=2)
    assert n == 3
    assert out.getvalue().splitlines() == tr.translate(["the dog runs .", "", "the cat é ."], beam=2)
    assert prompts.getvalue() == "> > > > \n"


def test_interactive_stops_at_a_line_that_is_not_utf8_as_a_pipe_does(translators):
    """A terminal's text stream hands on bytes that are not UTF-8 as surrogates, which the tokenizer
    refused with a TypeError; the typed line is named as a pipe's would be."""
    tr = translators["transformer"]
    out = io.StringIO()
    with pytest.raises(DataError, match=r"^<stdin>:2: invalid UTF-8 at byte 4 of the line \(invalid start byte\)"):
        interactive(tr, io.BytesIO(b"the dog runs .\nbad \xff x\n"), out, io.StringIO(), beam=2)
    assert out.getvalue().splitlines() == tr.translate(["the dog runs ."], beam=2)


# --------------------------------------------------------------------------- CLI


def cli(*args: str, input: str | None = None):
    result = runner.invoke(app, list(args), input=input)
    assert result.exit_code == 0, result.output
    return result


def test_cli_scores_and_nbest(checkpoints, sources):
    ckpt = str(checkpoints["transformer"])
    text = "\n".join([sources[0], "", sources[1]]) + "\n"
    out = cli("translate", "-c", ckpt, "--beam", "3", "--nbest", "2", "--scores", input=text).stdout
    rows = out.split("\n")
    assert len(rows) == 4 and rows[-1] == ""
    fields = rows[0].split("\t")
    assert len(fields) == 4 and float(fields[0]) < 0 and float(fields[2]) < 0
    assert float(fields[0]) >= float(fields[2])  # printed in the order they are ranked by
    assert rows[1] == "0.0000\t\t-inf\t"  # an empty line has one translation
    plain = cli("translate", "-c", ckpt, "--beam", "3", input=text).stdout.split("\n")
    assert plain[0] == fields[1]  # the best hypothesis, without scores


def test_cli_attention_plot_progress_and_ensemble(checkpoints, sources, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("\n".join(sources[:3]) + "\n", encoding="utf-8")
    ckpt, copy = str(checkpoints["rnn"]), tmp_path / "rnn_copy.pt"
    shutil.copyfile(ckpt, copy)  # the same file twice is refused
    result = cli("translate", "-c", ckpt, "-c", str(copy), "-i", str(src), "--attention-plot", str(tmp_path / "att"),
                 "--progress")
    assert len(result.stdout.splitlines()) == 3
    assert "3/3" in result.stderr and "3/3" not in result.stdout
    assert sorted(p.name for p in (tmp_path / "att").iterdir()) == ["1.png", "2.png", "3.png"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_seeded_sample_of_a_line_follows_its_number_not_its_batch_chunk_or_neighbours(translators, small_corpus,
                                                                                       kind):
    """A line's sample depends on the seed, the line's number in the input and its text: not on the batches
    (--max-tokens), the chunks, the lines beside it or where a call starts (`first_line`, as a resumed run gives
    it). A line is its number: equal lines draw samples of their own, and a text moved elsewhere draws another."""
    tr = translators[kind]
    test = (small_corpus / "test.en").read_text(encoding="utf-8").splitlines()
    lines = [*test[:10], test[3], test[3], "", *test[10:20]]
    opts = dict(sampling=Sampling(temperature=1.3, top_p=0.95, seed=7), max_len_a=0.5, max_len_b=4)
    together = tr.translate(lines, max_tokens=100_000, **opts)
    assert len(set(together)) > len(lines) // 2 and together[10] != together[11]  # samples; copies too
    assert tr.translate(lines, max_tokens=1, **opts) == together  # one line per batch
    assert list(tr.translate_stream(lines, chunk_size=3, max_tokens=40, **opts)) == together
    tail = [nbest[0].text for nbest in tr.translate_chunks([lines[12:15], lines[15:]], first_line=13, **opts)]
    assert tail == together[12:]
    swapped = [lines[1], lines[0], *lines[2:]]
    assert tr.translate(swapped, **opts)[2:] == together[2:]
    assert tr.translate(lines[1:], **opts) != together[1:]


def test_cli_sampling_with_a_seed_is_reproducible(checkpoints, sources):
    ckpt, text = str(checkpoints["transformer"]), "\n".join(sources) + "\n"
    args = ["translate", "-c", ckpt, "--sample", "--temperature", "1.5", "--top-p", "0.95"]
    a = cli(*args, "--seed", "1", input=text).stdout
    assert a == cli(*args, "--seed", "1", input=text).stdout
    assert a != cli(*args, "--seed", "2", input=text).stdout
    bad = runner.invoke(app, ["translate", "-c", ckpt, "--top-k", "5"], input=text)
    assert bad.exit_code != 0 and "need --sample" in str(bad.exception)


def test_cli_names_the_line_of_invalid_utf8(checkpoints):
    result = runner.invoke(app, ["translate", "-c", str(checkpoints["rnn"])], input=b"the dog .\n\xff\xfe\n")
    assert isinstance(result.exception, UserError) and "<stdin>:2: invalid UTF-8" in str(result.exception)


def test_a_terminal_is_answered_line_by_line_and_told_of_bytes_that_are_not_utf8(checkpoints, translators):
    """`nmt translate` on a real terminal: a typed line is answered before the next is typed, and a line that
    is not UTF-8 ends the session with the one line a pipe gets and exit status 2 (it was a TypeError)."""
    import os
    import select
    import subprocess
    import sys

    controller, terminal = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "nmt", "translate", "-c", str(checkpoints["rnn"]), "--beam", "1"],
                            stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.close(terminal)
    try:
        os.write(controller, b"the dog runs .\n")
        # the answer before the next line is typed: a wait of its own, so that none fails the test, not hangs it
        assert select.select([proc.stdout], [], [], 120)[0], "no answer to the typed line"
        answer = proc.stdout.readline().decode()
        os.write(controller, b"bad \xff x\n")
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
        os.close(controller)
    assert answer.rstrip("\n") == translators["rnn"].translate("the dog runs .", beam=1)
    assert proc.returncode == 2 and out == b""
    assert err.decode().count("\n") == 1 and "<stdin>:2: invalid UTF-8 at byte 4 of the line" in err.decode()


def test_import_nmt_is_light_and_exports_the_api():
    import subprocess
    import sys

    code = ("import sys, nmt; assert 'torch' not in sys.modules, 'torch imported'; "
            "from nmt import Sampling, Translation, Translator; print(Translator.__module__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "nmt.translate"


def test_cli_missing_input_file_is_a_user_error(checkpoints, tmp_path):
    result = runner.invoke(app, ["translate", "-c", str(checkpoints["rnn"]), "-i", str(tmp_path / "no.txt"),
                                 "-o", str(tmp_path / "out.txt")])
    assert isinstance(result.exception, UserError) and "input file not found" in str(result.exception)
    assert not (tmp_path / "out.txt").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gpu_search_never_runs_cudnn_attention(checkpoints, sources, precision):
    # cuDNN's attention plans every new shape anew, and a search step's keys grow by one position.
    tr = Translator.from_checkpoint(checkpoints["transformer"], device="cuda", precision=precision)
    seen = []
    for module in tr.model.modules():
        if isinstance(module, MultiHeadAttention):
            module.register_forward_pre_hook(lambda *_: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    assert tr.translate(sources, beam=3)
    assert seen and not any(seen)


def test_a_checkpoint_without_attention_but_with_a_coverage_penalty_translates_without_it(
        translators, sources, caplog):
    """`nmt train` refuses that config now; a checkpoint trained with it before still translates, the
    penalty left out with a warning, while a penalty asked for on the command line is still refused."""
    import dataclasses

    from nmt.data.tokenizer import PAD_ID
    from nmt.models import build_model

    given = translators["rnn"]
    cfg = dataclasses.replace(given.cfg, model=dataclasses.replace(
        given.cfg.model, rnn=dataclasses.replace(given.cfg.model.rnn, decoder="none")),
        decode=dataclasses.replace(given.cfg.decode, coverage_penalty=0.2))
    torch.manual_seed(0)
    model = build_model(cfg.model, src_vocab_size=given.tokenizer.src_vocab_size,
                        tgt_vocab_size=given.tokenizer.tgt_vocab_size, pad_id=PAD_ID)
    with caplog.at_level(logging.WARNING, logger="nmt"):
        translator = Translator(model, given.tokenizer, cfg, torch.device("cpu"))
    assert "rnn/none has no attention: its decode.coverage_penalty (0.2) is left out" in caplog.text
    assert translator.options().coverage_penalty == 0
    assert translator.translate(sources, beam=2) == translator.translate(sources, beam=2, coverage_penalty=0)
    with pytest.raises(UserError, match=r"the coverage penalty \(0.3\) needs a model with attention"):
        translator.translate(sources, beam=2, coverage_penalty=0.3)
    with pytest.raises(UserError, match="has no attention: attention plots need a model with attention$"):
        translator.translate_nbest(sources, beam=2, attention=True)


def test_a_model_already_in_place_is_not_moved_so_recorded_updates_keep_its_weights(checkpoints, monkeypatch):
    """Validation builds a `Translator` on the training model. `Module.to` made an `nn.LSTM` flatten its weights,
    which on a GPU with cuDNN puts them in a new buffer: recorded updates (`train.cuda_graphs`) went on with the
    old addresses. A model on its device and in its precision is now left as it is; one that is not, is moved."""
    flattened = []
    real = torch.nn.LSTM.flatten_parameters
    monkeypatch.setattr(torch.nn.LSTM, "flatten_parameters", lambda self: (flattened.append(self), real(self))[1])
    first = Translator.from_checkpoint(checkpoints["rnn"], device="cpu", precision="fp32")
    model = first.model.train()
    addresses = [p.data_ptr() for p in model.parameters()]
    flattened.clear()
    again = Translator(model, first.tokenizer, first.cfg, torch.device("cpu"))
    assert again.model is model and not flattened
    assert [p.data_ptr() for p in model.parameters()] == addresses
    assert again.translate(["the dog"], beam=1) == first.translate(["the dog"], beam=1)
    half = Translator(model, first.tokenizer, first.cfg, torch.device("cpu"), precision="bf16")
    assert flattened and all(p.dtype == torch.bfloat16 for p in half.model.parameters())  # cast, as asked


# --------------------------------------------------------------------------- line breaks in a translation

SEPARATORS = "\x0b\x0c\r\x1c\x1d\x1e\x85\u2028\u2029"
"""The characters besides '\\n' that `str.splitlines` breaks a line at."""


def test_line_breaks_are_what_python_splits_lines_at():
    breaks = [c for c in map(chr, range(sys.maxunicode + 1)) if len(f"a{c}b".splitlines()) == 2]
    assert "".join(breaks) == "\n" + SEPARATORS == LINE_BREAKS
    assert one_line(f"a{LINE_BREAKS}b\r\n") == "a" + " " * len(LINE_BREAKS) + "b  "


@pytest.fixture(scope="module")
def separator_tokenizer(small_corpus) -> Tokenizer:
    """A sentencepiece model brought by a user (`tokenizer.model`) that keeps text as it is (no
    normalization), learnt from text that holds every separator: each is one of its pieces."""
    import sentencepiece as spm

    from nmt.data.tokenizer import BOS_ID, PAD_ID, UNK_ID

    lines = (small_corpus / "train.en").read_text(encoding="utf-8").splitlines()
    lines += [f"{line} {SEPARATORS} {line}" for line in lines[:100]]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=200,
                                   normalization_rule_name="identity", character_coverage=1.0, pad_id=PAD_ID,
                                   unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, minloglevel=2)
    return Tokenizer(src_model=model.getvalue())


def always_saying(piece: str, tokenizer: Tokenizer, small_corpus: Path, path: Path) -> Path:
    """A checkpoint of a tiny Transformer whose every output token is `piece`: its decoder's last
    LayerNorm gives one state whatever the input, and of the output rows only `piece`'s is not zero."""
    from nmt.checkpoint import save_checkpoint
    from nmt.config import config_to_dict
    from nmt.data.tokenizer import PAD_ID
    from nmt.models import build_model

    d = tiny_config_dict(small_corpus, path.parent / "run")
    d["model"]["tie_embeddings"] = "none"
    d["decode"]["beam"] = 1
    cfg = config_from_dict(d)
    torch.manual_seed(0)
    model = build_model(cfg.model, src_vocab_size=tokenizer.src_vocab_size, tgt_vocab_size=tokenizer.tgt_vocab_size,
                        pad_id=PAD_ID)
    state = torch.randn(cfg.model.transformer.d_model)
    with torch.no_grad():
        model.decoder.norm.weight.zero_()
        model.decoder.norm.bias.copy_(state)
        model.output.weight.zero_()
        model.output.weight[tokenizer.tgt.piece_to_id(piece)] = 4 * state
    save_checkpoint({"config": config_to_dict(cfg), "tokenizer": tokenizer.to_state(), "model": model.state_dict()},
                    path)
    return path


@pytest.mark.parametrize("separator", SEPARATORS, ids=[f"U+{ord(c):04X}" for c in SEPARATORS])
def test_a_translation_is_one_line_wherever_it_goes(separator, separator_tokenizer, small_corpus, tmp_path):
    """Every output holds one line per input line when read by `str.splitlines`, though the model says
    nothing but a line break: the Python API, `nmt translate` from a file and from standard input,
    `nmt serve` and `nmt eval --save-translations`."""
    from nmt.evaluate import evaluate_checkpoint
    from nmt.serve import make_server

    ckpt = always_saying(separator, separator_tokenizer, small_corpus, tmp_path / "model.pt")
    lines = ["the man sees the dog .", "a cat ."]
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    ref.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")

    tr = Translator.from_checkpoint(ckpt, device="cpu")
    [[best], _] = tr.translate_nbest(lines)
    assert set(best.tokens) == {separator} and len(best.tokens) > 1  # what the model said
    texts = tr.translate(lines)
    assert texts[0] == " " * len(best.tokens) and all(t.splitlines() == [t] for t in texts)

    translate_io(tr, tr.options(), input=str(src), output=str(tmp_path / "out.txt"))
    assert len((tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()) == len(lines)
    out = cli("translate", "-c", str(ckpt), "--device", "cpu", input=src.read_text(encoding="utf-8")).stdout
    assert len(out.splitlines()) == len(lines)

    server = make_server(ckpt, host="127.0.0.1", port=0, device="cpu")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        req = urllib.request.Request(f"{server.url}/translate", data=json.dumps({"text": lines}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            served = json.loads(resp.read().decode("utf-8"))["translations"]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert served == texts

    evaluate_checkpoint(ckpt, src=src, ref=ref, device="cpu", save_dir=tmp_path / "hyps")
    assert (tmp_path / "hyps" / "src.txt.hyp").read_text(encoding="utf-8").splitlines() == texts
