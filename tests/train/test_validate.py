"""Validation during training (`nmt.train.validate`) against sums taken one sentence at a time, straight from the
validation files, and BLEU scored by sacreBLEU itself; and what a resumed run refuses to change."""

from __future__ import annotations

import logging
import math
import re
import shutil

import pytest
import torch
import torch.nn.functional as F
from sacrebleu.metrics import BLEU, CHRF

from nmt.checkpoint import load_checkpoint, model_from_checkpoint
from nmt.config import config_from_dict
from nmt.data.tokenizer import BOS_ID, EOS_ID
from nmt.errors import UserError
from nmt.train.data import prepare_run
from nmt.train.loop import train
from nmt.train.validate import validate
from nmt.translate import Translator
from tests.train.helpers import tiny_cfg, tiny_raw


@pytest.fixture(scope="module")
def trained(small_corpus, tmp_path_factory):
    """A run directory after 4 updates: its sentencepiece model, cache and checkpoint."""
    run = tmp_path_factory.mktemp("validate") / "run"
    train(tiny_cfg(small_corpus, run, max_steps=4))
    return run


def reference_sums(model, tokenizer, src: list[str], tgt: list[str], smoothing: float) -> tuple[float, float, int]:
    """(smoothed loss, NLL, tokens) summed over the pairs, each pair alone (no batch, no padding), with torch's own
    cross-entropy: its label smoothing spreads eps over the whole vocabulary, as `nmt.train.loss` documents."""
    loss = nll = 0.0
    n = 0
    model.eval()
    with torch.no_grad():
        for s, t in zip(tokenizer.encode_src(src), tokenizer.encode_tgt(tgt), strict=True):
            src_ids = torch.tensor([[*s, EOS_ID]])
            tgt_in, tgt_out = torch.tensor([[BOS_ID, *t]]), torch.tensor([*t, EOS_ID])
            logits = model(src_ids, torch.zeros_like(src_ids, dtype=torch.bool), tgt_in)[0].double()
            loss += float(F.cross_entropy(logits, tgt_out, label_smoothing=smoothing, reduction="sum"))
            nll += float(F.cross_entropy(logits, tgt_out, reduction="sum"))
            n += len(tgt_out)
    return loss, nll, n


def test_validation_loss_perplexity_and_scores_of_the_first_sentences(small_corpus, trained):
    """Loss and perplexity cover the whole validation set; text metrics the first `valid_max_sentences` greedy
    translations, chrF among them although `eval.metrics` names only BLEU, since it picks the best checkpoint."""
    raw = tiny_raw(small_corpus, trained, max_steps=4, valid_bleu=True, valid_max_sentences=7,
                   early_stop_metric="chrf")
    raw["eval"] = {"metrics": ["bleu"]}
    cfg = config_from_dict(raw)
    data = prepare_run(cfg, trained)  # the run directory's own sentencepiece model and cache
    model, tokenizer, _ = model_from_checkpoint(load_checkpoint(trained / "ckpt_4.pt"))
    src = (small_corpus / "valid.en").read_text(encoding="utf-8").splitlines()
    tgt = (small_corpus / "valid.de").read_text(encoding="utf-8").splitlines()
    assert len(src) == len(tgt) == len(data.valid) == 30  # the premise: every validation pair is clean

    result = validate(model, data, cfg, torch.device("cpu"))
    assert model.training  # left in training mode
    assert set(result) == {"loss", "ppl", "bleu", "chrf"}
    loss, nll, n = reference_sums(model, tokenizer, src, tgt, cfg.train.label_smoothing)
    assert result["loss"] == pytest.approx(loss / n, abs=1e-4)
    assert result["ppl"] == pytest.approx(math.exp(nll / n), abs=0.011)

    translator = Translator(model, tokenizer, cfg, torch.device("cpu"))
    hyps = translator.translate(src[:7], beam=1)
    bleu, chrf = BLEU(tokenize=cfg.eval.tokenize, lowercase=cfg.eval.lowercase), CHRF(lowercase=cfg.eval.lowercase)
    assert result["bleu"] == round(bleu.corpus_score(hyps, [tgt[:7]]).score, 2)
    assert result["chrf"] == round(chrf.corpus_score(hyps, [tgt[:7]]).score, 2)
    # the premise: chrF of all 30 translations is another number
    assert round(chrf.corpus_score(translator.translate(src, beam=1), [tgt]).score, 2) != result["chrf"]


@pytest.mark.parametrize("section, change", [("model", ("transformer", "ff_dim", 48)),
                                             ("tokenizer", (None, "vocab_size", 150))])
def test_resuming_with_another_model_or_tokenizer_section_is_refused(small_corpus, trained, tmp_path, section,
                                                                      change):
    """The run directory keeps its sentencepiece model, so a changed tokenizer section would be ignored silently:
    resuming refuses it, as it refuses a changed model."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    raw = tiny_raw(small_corpus, run, max_steps=6)
    sub, key, value = change
    (raw[section][sub] if sub else raw[section])[key] = value
    key = ".".join(k for k in (section, sub, key) if k)
    with pytest.raises(UserError, match=rf"ckpt_4\.pt: the run directory holds a run with a different {section} "
                                        rf"section \({re.escape(key)}: \d+ vs {value}, the run's vs this config's\); "
                                        r"use --restart"):
        train(config_from_dict(raw))
    assert sorted(p.name for p in run.glob("ckpt_*.pt")) == ["ckpt_4.pt"]  # nothing trained


def test_resuming_in_the_other_direction_is_refused_and_leaves_the_run_as_it_was(small_corpus, trained, tmp_path):
    """data.src_lang and data.tgt_lang swapped: the run once resumed, trained its en->de weights as de->en and saved
    them as a de->en run, with a separate tokenizer's English model then cutting German sources, saying nothing."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"}
    raw = tiny_raw(small_corpus, run, max_steps=6)
    raw["data"]["src_lang"], raw["data"]["tgt_lang"] = "de", "en"
    with pytest.raises(UserError, match=r"ckpt_4\.pt: the run directory holds a run that translates en to de, and "
                                        r"this config de to en \(data\.src_lang, data\.tgt_lang\); use --restart"):
        train(config_from_dict(raw))
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"} == before


def test_resuming_without_the_runs_sentencepiece_model_takes_it_back_from_the_checkpoint(small_corpus, trained,
                                                                                         tmp_path, caplog):
    """spm.model deleted beside the checkpoints: a start once trained a new one (here on another data.train, which a
    resume may take) and went on training the checkpoint's weights with its other ids, saying nothing."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    original = (run / "spm.model").read_bytes()
    (run / "spm.model").unlink()
    raw = tiny_raw(small_corpus, run, max_steps=6)
    raw["data"]["train"]["path"] = raw["data"]["valid"]["path"]  # a sentencepiece model made of it would differ
    with caplog.at_level(logging.WARNING, logger="nmt"):
        train(config_from_dict(raw))
    assert (run / "spm.model").read_bytes() == original
    assert load_checkpoint(run / "ckpt_6.pt")["tokenizer"] == load_checkpoint(trained / "ckpt_4.pt")["tokenizer"]
    assert f"{run}: spm.model missing; restored the run's sentencepiece models from ckpt_4.pt" in caplog.text


@pytest.mark.parametrize(("name", "message"), [
    ("metrics.jsonl", "a folder, where the run writes its file metrics.jsonl; move it away"),
    ("best.pt", "a folder, where the run writes its file best.pt; move it away"),
    ("config.yaml", "a folder, where the run writes its file config.yaml; move it away"),
    ("cache", "a file, where the run keeps its folder of prepared corpora; move it away"),
])
def test_a_folder_where_the_run_writes_a_file_is_refused_in_one_line(small_corpus, trained, tmp_path, name, message):
    """Once a bare IsADirectoryError (FileExistsError for the cache), status 1; best.pt's only at the first
    validation, after the run had trained on."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    entry = run / name
    shutil.rmtree(entry) if entry.is_dir() else entry.unlink(missing_ok=True)
    entry.write_text("x") if name == "cache" else entry.mkdir()
    with pytest.raises(UserError, match=f"^{re.escape(str(entry))}: {re.escape(message)}$"):
        train(tiny_cfg(small_corpus, run, max_steps=6))
    assert sorted(p.name for p in run.glob("ckpt_*.pt")) == ["ckpt_4.pt"]  # nothing trained


def test_pairs_longer_than_the_models_positions_are_left_out_of_the_loss_and_said_so(small_corpus, tmp_path, caplog):
    """`max_positions` equal to `data.max_len` loads, and training pairs fit it, but validation pairs are not cut
    to `max_len`: the first validation failed on a longer one (`positions 0..88 are outside [0, max_positions
    (80))`) and the run was lost. The loss now leaves such pairs out, with a warning when the data is
    prepared; their translations start from a source cut to fit, as `nmt translate`'s do."""
    corpus = tmp_path / "corpus"
    shutil.copytree(small_corpus, corpus)
    long_src, long_tgt = " ".join(["the red dog runs"] * 30), " ".join(["der rote Hund rennt"] * 30)
    for lang, line in (("en", long_src), ("de", long_tgt)):
        with open(corpus / f"valid.{lang}", "a", encoding="utf-8") as f:
            f.write(line + "\n")
    raw = tiny_raw(corpus, tmp_path / "run", max_steps=2, valid_every=2, valid_bleu=True, valid_max_sentences=31)
    raw["model"]["transformer"]["max_positions"] = raw["data"]["max_len"]
    cfg = config_from_dict(raw)
    with caplog.at_level("WARNING", logger="nmt.train.data"):
        summary = train(cfg)
    said = [r.getMessage() for r in caplog.records if r.name == "nmt.train.data"]
    assert summary["step"] == 2 and summary["validated_step"] == 2
    data = prepare_run(cfg, tmp_path / "run")
    model, tokenizer, _ = model_from_checkpoint(load_checkpoint(tmp_path / "run" / "ckpt_2.pt"))
    src = (corpus / "valid.en").read_text(encoding="utf-8").splitlines()
    tgt = (corpus / "valid.de").read_text(encoding="utf-8").splitlines()
    positions = cfg.model.transformer.max_positions
    fits = [len(s) + 1 <= positions and len(t) + 1 <= positions  # with EOS, and BOS before the target
            for s, t in zip(tokenizer.encode_src(src), tokenizer.encode_tgt(tgt), strict=True)]
    assert not fits[-1] and sum(fits) >= 20  # the long pair, and others that fit
    assert said == [
        f"data.valid: {fits.count(False)} of its 31 pairs are longer than model.transformer.max_positions "
        f"({positions}) subwords on a side: the validation loss leaves them out, and they are translated from a "
        "source cut to fit; raise max_positions to score them whole"]
    kept = [i for i, ok in enumerate(fits) if ok]
    loss, _, n = reference_sums(model, tokenizer, [src[i] for i in kept], [tgt[i] for i in kept],
                                cfg.train.label_smoothing)
    assert validate(model, data, cfg, torch.device("cpu"))["loss"] == pytest.approx(loss / n, abs=1e-4)
