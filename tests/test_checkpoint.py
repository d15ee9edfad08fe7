"""Atomic, self-describing checkpoints."""

import os
import pickle
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from nmt.checkpoint import (
    average_checkpoints,
    last_checkpoints,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from nmt.errors import CheckpointError, UserError
from nmt.fileio import remove_stale_temporaries


def test_round_trip_and_format_tag(tmp_path):
    path = tmp_path / "a.pt"
    save_checkpoint({"model": {"w": torch.ones(3)}, "step": 7}, path)
    payload = load_checkpoint(path)
    assert payload["step"] == 7 and torch.equal(payload["model"]["w"], torch.ones(3))
    assert not list(tmp_path.glob(".tmp-*"))


def test_missing_truncated_and_foreign_files_are_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        load_checkpoint(tmp_path / "none.pt")
    good = tmp_path / "good.pt"
    save_checkpoint({"model": {"w": torch.randn(1000)}}, good)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(good.read_bytes()[:500])
    with pytest.raises(CheckpointError, match="cut.pt: cannot read checkpoint"):
        load_checkpoint(cut)
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {}}, foreign)
    with pytest.raises(CheckpointError, match="not an nmt checkpoint"):
        load_checkpoint(foreign)
    legacy = tmp_path / "legacy.pt"  # torch's format before the zip archive: a pickle, read as before
    torch.save({"format": "x"}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match="found format 'x'"):
        load_checkpoint(legacy)


@pytest.mark.parametrize(("content", "said"), [
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 123\n",
     "a Git LFS pointer, not the file it stands for; fetch the file (git lfs pull)"),
    (b"\n  <!DOCTYPE html><html><body>Sign in</body></html>\n",
     "a web page, not a torch file (a download that fetched a page instead of the file?)"),
    (b"<HTML><body>Not found</body></HTML>", "a web page, not a torch file"),
    (b"junk\n", "not a torch file (it starts with neither a zip archive's nor a pickle's bytes)"),
    (b"", "an empty file (an interrupted copy?)"),
    (pickle.dumps({"model": {}}, protocol=4), "a Python pickle (protocol 4), not a file torch.save wrote"),
])
def test_a_file_that_is_no_torch_file_is_named_for_what_it_is(tmp_path, content, said):
    """A Git LFS pointer or a saved web page was refused as holding Python objects that could run code, and
    other text as `truncated or not a torch file: 174812789`."""
    path = tmp_path / "best.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(path)
    assert str(refused.value).startswith(f"{path}: not a checkpoint: {said}")


def test_prune_keeps_newest_and_latest_is_by_step(tmp_path):
    for step in (5, 100, 20):
        save_checkpoint({"step": step}, tmp_path / f"ckpt_{step}.pt")
    assert latest_checkpoint(tmp_path).name == "ckpt_100.pt"
    prune_checkpoints(tmp_path, keep_last=2)
    assert sorted(p.name for p in tmp_path.glob("ckpt_*.pt")) == ["ckpt_100.pt", "ckpt_20.pt"]


@pytest.mark.parametrize("keep_last, kept", [(2, ["ckpt_20.pt", "ckpt_30.pt", "ckpt_33.pt"]), (0, ["ckpt_33.pt"])])
def test_prune_spares_a_stops_checkpoint_and_does_not_count_it(tmp_path, keep_last, kept):
    for step in (10, 20, 30, 33):
        save_checkpoint({"step": step}, tmp_path / f"ckpt_{step}.pt")
    prune_checkpoints(tmp_path, keep_last=keep_last, spare=tmp_path / "ckpt_33.pt")
    assert sorted(p.name for p in tmp_path.glob("ckpt_*.pt")) == kept


def test_average_is_elementwise_mean(tmp_path):
    paths = []
    for i, v in enumerate([1.0, 2.0, 6.0]):
        p = tmp_path / f"c{i}.pt"
        save_checkpoint({"model": {"w": torch.full((2,), v), "n": torch.tensor(3)}, "config": {}, "tokenizer": {}}, p)
        paths.append(p)
    avg = average_checkpoints(paths)
    assert torch.allclose(avg["model"]["w"], torch.full((2,), 3.0))
    assert avg["model"]["n"].item() == 3


WRITER = """
import sys, torch
from nmt.checkpoint import save_checkpoint
big = torch.randn(8_000_000)
i = 0
while True:
    i += 1
    save_checkpoint({"model": {"w": big}, "step": i}, sys.argv[1])
    print(i, flush=True)
"""


@pytest.mark.slow
def test_kill_during_writes_never_leaves_a_broken_checkpoint(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint({"model": {"w": torch.zeros(1)}, "step": 0}, path)
    for delay in (0.3, 0.7, 1.1):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE)
        time.sleep(delay + 1.0)  # interpreter start, then some writes
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        payload = load_checkpoint(path)  # always a complete checkpoint
        assert "step" in payload
    remove_stale_temporaries(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_average_last_n_checkpoints_of_a_run_from_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from nmt.cli import app

    for step, v in [(10, 1.0), (20, 2.0), (30, 6.0)]:
        save_checkpoint({"model": {"w": torch.full((2,), v)}, "config": {}, "tokenizer": {}, "progress": {"step": step}},
                        tmp_path / f"ckpt_{step}.pt")
    assert [p.name for p in last_checkpoints(tmp_path, 2)] == ["ckpt_20.pt", "ckpt_30.pt"]
    result = CliRunner().invoke(app, ["average", "--last", "2", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.output == f"wrote {tmp_path / 'averaged.pt'} (mean of 2 checkpoints: ckpt_20.pt ckpt_30.pt)\n"
    averaged = load_checkpoint(tmp_path / "averaged.pt")
    assert torch.equal(averaged["model"]["w"], torch.full((2,), 4.0)) and averaged["progress"] == {"step": 30}
    one = CliRunner().invoke(app, ["average", "--last", "1", str(tmp_path), "-o", str(tmp_path / "one.pt")])
    assert one.output == f"wrote {tmp_path / 'one.pt'} (one checkpoint, its weights as they were: ckpt_30.pt)\n"
    assert torch.equal(load_checkpoint(tmp_path / "one.pt")["model"]["w"], torch.full((2,), 6.0))
    result = CliRunner().invoke(app, ["average", "--last", "5", str(tmp_path)])
    assert result.exit_code != 0 and "3 periodic checkpoints (ckpt_<step>.pt), 5 wanted" in str(result.exception)
    for last in ("0", "-1"):  # refused by name, not "no checkpoints to average"
        result = CliRunner().invoke(app, ["average", "--last", last, str(tmp_path)])
        assert isinstance(result.exception, UserError)
        assert str(result.exception).startswith(f"--last {last}: average at least 1 checkpoint")


def test_average_names_a_checkpoint_without_weights(tmp_path):
    good = tmp_path / "good.pt"
    save_checkpoint({"model": {"w": torch.zeros(2)}, "config": {}, "tokenizer": {}}, good)
    save_checkpoint({}, tmp_path / "nomodel.pt")  # {'format': 'nmt-checkpoint-1'} alone
    save_checkpoint({"model": {"w": "text"}}, tmp_path / "strings.pt")
    for first, second, message in [
        ("nomodel.pt", "good.pt", "nomodel.pt: incompatible checkpoint: it has no 'model' entry"),
        ("good.pt", "nomodel.pt", "nomodel.pt: incompatible checkpoint: it has no 'model' entry"),
        ("strings.pt", "good.pt", "strings.pt: its 'model' entry is a mapping of more than tensors, not the weights"),
    ]:
        with pytest.raises(CheckpointError, match=re.escape(message)):
            average_checkpoints([tmp_path / first, tmp_path / second])


def test_a_checkpoint_scored_with_a_tokenizer_this_machine_lacks_translates_and_eval_says_what_to_install(
        small_corpus, tmp_path, monkeypatch, caplog):
    """eval.tokenize ja-mecab, written where MeCab is installed, read where it is not: the model loads with its
    settings as they are (translation needs no scorer), and `nmt eval` stops before translating, naming the key
    and what to install, where scoring with another tokenizer would give numbers unlike the run's."""
    from sacrebleu.tokenizers import tokenizer_ja_mecab

    from nmt.checkpoint import model_from_checkpoint, save_checkpoint
    from nmt.config import config_from_dict, config_to_dict
    from nmt.data.tokenizer import PAD_ID, train_tokenizer
    from nmt.errors import UserError
    from nmt.evaluate import evaluate_checkpoint
    from nmt.models import build_model
    from tests.conftest import tiny_config_dict

    cfg = config_from_dict(tiny_config_dict(small_corpus, tmp_path / "run"))
    lines = {lang: (small_corpus / f"train.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "de")}
    tokenizer = train_tokenizer(cfg.tokenizer, lines["en"], lines["de"])
    model = build_model(cfg.model, src_vocab_size=tokenizer.src_vocab_size, tgt_vocab_size=tokenizer.tgt_vocab_size,
                        pad_id=PAD_ID)
    stored = config_to_dict(cfg)
    stored["eval"]["tokenize"] = "ja-mecab"
    payload = {"config": stored, "tokenizer": tokenizer.to_state(), "model": model.state_dict()}
    monkeypatch.setattr(tokenizer_ja_mecab, "MeCab", None)  # as where sacrebleu[ja] is not installed
    _, _, loaded = model_from_checkpoint(payload, source="ja.pt")
    assert loaded.eval.tokenize == "ja-mecab" and not caplog.records
    save_checkpoint(payload, tmp_path / "ja.pt")
    translated = []
    monkeypatch.setattr("nmt.translate.Translator.translate", lambda *a, **k: translated.append(a) or [])
    with pytest.raises(UserError) as err:
        evaluate_checkpoint(tmp_path / "ja.pt", src=small_corpus / "test.en", ref=small_corpus / "test.de")
    assert str(err.value) == (f"{tmp_path / 'ja.pt'}: eval.tokenize 'ja-mecab': Japanese tokenization requires extra "
                              "dependencies, but you do not have them installed; install them with: pip install "
                              "'sacrebleu[ja]', or choose another tokenizer")
    assert not translated
