"""`nmt export --format ctranslate2`: the exported model scores and translates as `nmt` does.

Two kinds of evidence: every architecture option (norm, activation, positions, tying,
separate vocabularies) gives CTranslate2 token log-probabilities equal to our model's
on real sentences (`score_batch`, teacher-forced); and a model trained by the real
loop and exported through the real CLI translates greedily to the very tokens
`nmt.Translator` gives, with the same scores.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from nmt.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from nmt.cli import app
from nmt.config import config_from_dict, config_to_dict
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, train_tokenizer
from nmt.errors import UserError
from nmt.export import export_checkpoint
from nmt.models import build_model
from nmt.train.loop import train
from nmt.translate import Translator
from tests.conftest import tiny_config_dict
from tests.test_errors import run_in_process

ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'nmt[export]')")
spm = pytest.importorskip("sentencepiece")

runner = CliRunner()


def _lines(corpus: Path, split: str, lang: str) -> list[str]:
    return (corpus / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()


def _random_checkpoint(corpus: Path, path: Path, model: dict, *, joint: bool = True) -> Path:
    """A seeded, randomly initialised tiny model; LayerNorms made non-trivial so their mapping shows."""
    d = tiny_config_dict(corpus, path.parent / "run")
    d["model"] = {"type": "transformer", **model}
    d["model"]["transformer"] = {"d_model": 32, "heads": 4, "encoder_layers": 2, "decoder_layers": 2, "ff_dim": 64,
                                 "max_positions": 128, **model.get("transformer", {})}
    d["tokenizer"]["joint"] = joint
    cfg = config_from_dict(d)
    tokenizer = train_tokenizer(cfg.tokenizer, _lines(corpus, "train", "en"), _lines(corpus, "train", "de"))
    torch.manual_seed(0)
    net = build_model(cfg.model, src_vocab_size=tokenizer.src_vocab_size, tgt_vocab_size=tokenizer.tgt_vocab_size,
                      pad_id=PAD_ID)
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.3, 0.3)
    save_checkpoint({"config": config_to_dict(cfg), "tokenizer": tokenizer.to_state(), "model": net.state_dict()},
                    path)
    return path


VARIANTS = {
    "pre-relu-sinusoidal-tied-all": {"tie_embeddings": "all"},
    "post-gelu-learned-untied": {"tie_embeddings": "none", "transformer": {
        "norm": "post", "activation": "gelu", "positions": "learned"}},
    "pre-gelu-sinusoidal-tied-decoder": {"tie_embeddings": "decoder", "transformer": {"activation": "gelu"}},
    "post-relu-sinusoidal-tied-all": {"tie_embeddings": "all", "transformer": {"norm": "post"}},
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_option_scores_like_nmt(name, small_corpus, tmp_path):
    joint = VARIANTS[name]["tie_embeddings"] == "all"
    ckpt = _random_checkpoint(small_corpus, tmp_path / "model.pt", VARIANTS[name], joint=joint)
    out = export_checkpoint(ckpt, tmp_path / "ct2")
    model, tokenizer, _ = model_from_checkpoint(load_checkpoint(ckpt))
    model.eval()
    vocab_files = {"shared_vocabulary.json"} if joint else {"source_vocabulary.json", "target_vocabulary.json"}
    spm_files = {"spm.model"} if joint else {"spm.src.model", "spm.tgt.model"}
    assert {p.name for p in out.iterdir()} == {"model.bin", "config.json"} | vocab_files | spm_files

    src = tokenizer.encode_src(_lines(small_corpus, "test", "en")[:6])
    tgt = tokenizer.encode_tgt(_lines(small_corpus, "test", "de")[:6])
    scored = ctranslate2.Translator(str(out), device="cpu").score_batch(
        [tokenizer.src_pieces(s) for s in src], [tokenizer.tgt_pieces(t) for t in tgt])
    for s, t, result in zip(src, tgt, scored):
        src_ids = torch.tensor([s + [EOS_ID]])
        with torch.no_grad():
            logits = model(src_ids, src_ids.eq(PAD_ID), torch.tensor([[BOS_ID, *t]]))[0]  # (T, V)
        logits[:, [PAD_ID, BOS_ID]] = float("-inf")  # the export's bias: tokens nmt's search never emits
        ours = logits.log_softmax(-1).gather(1, torch.tensor([*t, EOS_ID])[:, None])[:, 0]
        assert result.tokens == tokenizer.tgt_pieces(t) + ["</s>"]
        assert result.log_probs == pytest.approx(ours.tolist(), abs=1e-4)


@pytest.fixture(scope="module")
def trained(small_corpus, tmp_path_factory) -> Path:
    """A tiny Transformer trained by the real loop for 200 steps (about 10 s): some of its greedy
    outputs end by choosing EOS, the others run into the length limit, so both endings are compared."""
    run = tmp_path_factory.mktemp("export_run") / "run"
    d = tiny_config_dict(small_corpus, run)
    d["train"] |= {"max_steps": 200, "lr": 0.01, "warmup_steps": 10, "valid_every": 200, "valid_max_sentences": 5}
    train(config_from_dict(d))
    return run / "best.pt"


def _ct2_greedy(translator, sp, lines: list[str], max_len_a: float, max_len_b: int):
    """CTranslate2 greedy search under nmt's length rule: at most floor(a * S + b) tokens for a
    source of S subwords with its EOS. CTranslate2 takes one limit per call, so one call per S."""
    pieces = sp.encode(lines, out_type=str)
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(pieces):
        by_length.setdefault(len(p) + 1, []).append(i)
    results = [None] * len(lines)
    for S, rows in by_length.items():
        limit = math.floor(max_len_a * S + max_len_b)
        out = translator.translate_batch([pieces[i] for i in rows], beam_size=1, max_decoding_length=limit,
                                         min_decoding_length=0, length_penalty=0, return_scores=True)
        for i, r in zip(rows, out):
            results[i] = (r.hypotheses[0], r.scores[0], limit)
    return results


def test_cli_export_translates_like_nmt_greedy(trained, small_corpus, tmp_path):
    out = tmp_path / "ct2"
    result = runner.invoke(app, ["export", "--format", "ctranslate2", "-c", str(trained), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stdout
    umask = os.umask(0o022)
    os.umask(umask)
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
        p.name: 0o666 & ~umask for p in out.iterdir()}  # readable by whoever the umask lets read
    config = json.loads((out / "config.json").read_text())
    assert config["add_source_eos"] is True and config["decoder_start_token"] == "<s>"

    lines = _lines(small_corpus, "test", "en") + ["Ωmega ∑ unknown characters .", "the"]
    ours = Translator.from_checkpoint(trained, device="cpu")
    expected = [h[0] for h in ours.translate_nbest(lines, beam=1)]
    d = ours.cfg.decode
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))  # what a user tokenizes with
    got = _ct2_greedy(ctranslate2.Translator(str(out), device="cpu"), sp, lines, d.max_len_a, d.max_len_b)

    same = [e.tokens == tokens for e, (tokens, _, _) in zip(expected, got)]
    assert all(same), [(e.tokens, g[0]) for e, g, ok in zip(expected, got, same) if not ok][:3]
    assert [sp.decode(tokens) for tokens, _, _ in got] == [e.text for e in expected]
    ended = [(e, score) for e, (tokens, score, limit) in zip(expected, got) if len(tokens) < limit]
    assert 3 <= len(ended) < len(lines)  # both endings occur
    for e, score in ended:  # both sum the log-probabilities of the tokens and of EOS
        # CTranslate2 normalises over the vocabulary less PAD and BOS (the export's -inf bias); nmt's
        # search normalises over all of it, then excludes them: each token gains log(1 / (1 - P(PAD or BOS))).
        assert e.log_prob - 1e-4 <= score <= e.log_prob + 5e-3 * (len(e.tokens) + 1)


def test_exported_beam_search_runs(trained, small_corpus, tmp_path):
    out = export_checkpoint(trained, tmp_path / "ct2")
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    lines = _lines(small_corpus, "test", "en")[:5]
    results = ctranslate2.Translator(str(out)).translate_batch(sp.encode(lines, out_type=str), beam_size=4,
                                                                num_hypotheses=2, return_scores=True)
    for r in results:
        assert len(r.hypotheses) == 2 and r.scores[0] >= r.scores[1]


def test_int8_export_loads_and_translates(trained, small_corpus, tmp_path):
    out = export_checkpoint(trained, tmp_path / "int8", quantization="int8")
    assert (out / "model.bin").stat().st_size < (export_checkpoint(trained, tmp_path / "fp32") / "model.bin").stat().st_size
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    line = _lines(small_corpus, "test", "en")[0]
    result = ctranslate2.Translator(str(out), compute_type="int8").translate_batch([sp.encode(line, out_type=str)])
    assert result[0].hypotheses[0]


def test_output_folder_is_never_clobbered_without_force(trained, tmp_path):
    out = export_checkpoint(trained, tmp_path / "ct2")
    before = (out / "model.bin").stat().st_mtime_ns
    for args, needle in [
        ([], "already holds a CTranslate2 model; add --force"),
        (["--force"], None),
    ]:
        result = runner.invoke(app, ["export", "-c", str(trained), "-o", str(out), *args])
        if needle:
            assert isinstance(result.exception, UserError) and needle in str(result.exception)
            assert (out / "model.bin").stat().st_mtime_ns == before
        else:
            assert result.exit_code == 0, result.output
    (out / "notes.txt").write_text("mine")  # a file beside the model: --force would delete it, so no
    result = runner.invoke(app, ["export", "-c", str(trained), "-o", str(out), "--force"])
    assert isinstance(result.exception, UserError) and "such as 'notes.txt'" in str(result.exception)
    assert (out / "notes.txt").read_text() == "mine"
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine")
    result = runner.invoke(app, ["export", "-c", str(trained), "-o", str(other), "--force"])
    assert isinstance(result.exception, UserError) and "is not a CTranslate2 model" in str(result.exception)
    assert (other / "todo.txt").read_text() == "mine" and not list(tmp_path.glob(".*tmp-*"))


def test_force_replaces_an_export_named_from_inside_it_or_through_a_linked_parent(trained, tmp_path, monkeypatch):
    """`-o .` in an export: Path(".").parent is "." itself, so the new model was written inside the folder it
    replaced and deleted with it. The output is resolved first; an error still leaves the earlier export."""
    out = export_checkpoint(trained, tmp_path / "ct2")
    files = sorted(p.name for p in out.iterdir())
    monkeypatch.chdir(out)
    result = runner.invoke(app, ["export", "-c", str(trained), "-o", ".", "--force"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == files and sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]
    (tmp_path / "elsewhere").symlink_to(tmp_path)  # the parent folder, reached through a link
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["export", "-c", str(trained), "-o", "elsewhere/ct2", "--force"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == files and (tmp_path / "elsewhere").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2", "elsewhere"]

    before = {p.name: p.read_bytes() for p in out.iterdir()}
    def full(self, folder):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Tokenizer, "save", full)
    monkeypatch.chdir(out)
    result = runner.invoke(app, ["export", "-c", str(trained), "-o", ".", "--force"])
    assert isinstance(result.exception, UserError) and "disk full" in str(result.exception)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the earlier export, unchanged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2", "elsewhere"]  # and no leftovers


def test_an_export_that_fills_the_disk_says_so_and_leaves_nothing(trained, small_disk):
    """CTranslate2 writes the model itself (its own C++ error, an OSError); nmt names the folder in one line."""
    result = runner.invoke(app, ["export", "-c", str(trained), "-o", str(small_disk / "ct2")])
    assert isinstance(result.exception, UserError), result.exception
    assert re.match(re.escape(f"{small_disk / 'ct2'}: disk full (") + r".* MiB free there\); nothing was written",
                    str(result.exception)), str(result.exception)
    assert list(small_disk.iterdir()) == []


def test_rnn_checkpoint_and_bad_options_get_one_line(small_corpus, tmp_path, trained, monkeypatch):
    d = tiny_config_dict(small_corpus, tmp_path / "run", model_type="rnn")
    cfg = config_from_dict(d)
    tokenizer = train_tokenizer(cfg.tokenizer, _lines(small_corpus, "train", "en"), _lines(small_corpus, "train", "de"))
    net = build_model(cfg.model, src_vocab_size=tokenizer.src_vocab_size, tgt_vocab_size=tokenizer.tgt_vocab_size,
                      pad_id=PAD_ID)
    rnn = tmp_path / "rnn.pt"
    save_checkpoint({"config": config_to_dict(cfg), "tokenizer": tokenizer.to_state(), "model": net.state_dict()}, rnn)
    for args, needle in [
        (["-c", str(rnn)], "an RNN model; CTranslate2 runs Transformers only"),
        (["-c", str(trained), "--format", "onnx"], "--format 'onnx': not one of ctranslate2"),
        (["-c", str(trained), "--quantization", "int3"], "--quantization 'int3': not one of"),
        (["-c", str(tmp_path / "missing.pt")], "checkpoint not found"),
    ]:  # through the console entry point, as `nmt export ARGS` runs them
        status, stderr = run_in_process(["export", *args, "-o", str(tmp_path / "out")], None, monkeypatch)
        assert status == 2, stderr
        assert needle in stderr and len(stderr.strip().splitlines()) == 1
        assert not (tmp_path / "out").exists()
