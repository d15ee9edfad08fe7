"""`--restart` and refused starts never lose the run a directory holds: the old run goes only once the new one starts;
and what a start that made no checkpoint left is not taken for a run."""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

import pytest

from nmt.config import config_from_dict
from nmt.data.tokenizer import Tokenizer
from nmt.errors import UserError
from nmt.train.loop import train
from nmt.train.resume import REPLACED, prepare_run_dir
from nmt.train.setup import build_run
from tests.train.helpers import tiny_cfg, tiny_raw

OUTPUTS = ("best.pt", "ckpt_2.pt", "metrics.jsonl", "spm.model", "spm.json", "config.yaml")


def _trained(small_corpus: Path, tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    run = tmp_path / "run"
    train(tiny_cfg(small_corpus, run, max_steps=2, save_every=2))
    return run, _contents(run)


def _contents(run: Path) -> dict[str, bytes]:
    return {name: (run / name).read_bytes() for name in OUTPUTS if (run / name).is_file()}


def test_a_restart_that_fails_before_its_start_leaves_the_old_run_as_it_was(small_corpus, tmp_path):
    run, before = _trained(small_corpus, tmp_path)
    assert set(before) == set(OUTPUTS) and (run / "cache").is_dir() and (run / "tensorboard").is_dir()
    raw = tiny_raw(small_corpus, run, max_steps=2, save_every=2)
    raw["data"]["train"]["path"] = str(tmp_path / "trian")  # a typo
    with pytest.raises(UserError, match="text corpus not found"):
        build_run(config_from_dict(raw), restart=True)
    assert _contents(run) == before
    assert (run / "cache").is_dir() and (run / "tensorboard").is_dir() and not (run / REPLACED).exists()
    # a restart that starts replaces the run: nothing of the old one is left aside
    summary = train(tiny_cfg(small_corpus, run, max_steps=1, save_every=1), restart=True)
    assert summary["step"] == 1 and not (run / "ckpt_2.pt").exists() and (run / "ckpt_1.pt").is_file()
    assert not (run / REPLACED).exists()


def test_a_refused_or_failed_start_keeps_config_yaml(small_corpus, tmp_path):
    run, before = _trained(small_corpus, tmp_path)
    wider = tiny_raw(small_corpus, run, max_steps=2, save_every=2)
    wider["model"]["transformer"].update(d_model=64, ff_dim=64)
    with pytest.raises(UserError, match="different model section"):
        build_run(config_from_dict(wider))
    missing = tiny_raw(small_corpus, run, max_steps=4)
    missing["data"]["train"]["path"] = str(tmp_path / "nope")
    with pytest.raises(UserError, match="text corpus not found"):
        build_run(config_from_dict(missing))
    assert _contents(run) == before
    # the run that starts writes its own
    train(tiny_cfg(small_corpus, run, max_steps=3, save_every=3))
    assert b"max_steps: 3" in (run / "config.yaml").read_bytes()


def test_a_config_without_corpora_creates_no_run_directory(small_corpus, tmp_path):
    cfg = tiny_cfg(small_corpus, tmp_path / "run")
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, valid=None))
    with pytest.raises(UserError, match="data.valid: required for training"):
        build_run(cfg)
    assert not (tmp_path / "run").exists()


def test_a_restart_killed_before_its_start_is_undone_by_the_next_start(small_corpus, tmp_path, caplog):
    run, before = _trained(small_corpus, tmp_path)
    prepare_run_dir(run, restart=True)  # what a --restart does first; then it was killed, having written this:
    (run / "spm.model").write_bytes(b"half a tokenizer")
    prepare_run_dir(run, restart=True)  # restarted again: the old run stays aside, the killed one's files go
    assert not (run / "spm.model").exists() and (run / REPLACED / "ckpt_2.pt").is_file()
    (run / "spm.model").write_bytes(b"half a tokenizer")
    with caplog.at_level(logging.WARNING, logger="nmt"):
        prepare_run_dir(run, restart=False)  # a plain start puts the old run back
    assert "putting back the run that a --restart killed before its start had set aside" in caplog.text
    assert _contents(run) == before and not (run / REPLACED).exists()
    summary = train(tiny_cfg(small_corpus, run, max_steps=4, save_every=2))  # and resumes it
    assert summary["step"] == 4


def _filtered_out(small_corpus: Path, run: Path, vocab_size: int) -> dict:
    """A config whose training pairs are all longer than `data.max_len`: it fails after training its tokenizer."""
    raw = tiny_raw(small_corpus, run, max_steps=1)
    raw["tokenizer"]["vocab_size"] = vocab_size
    raw["data"]["max_len"] = 2
    with pytest.raises(UserError, match="no pairs left"):
        build_run(config_from_dict(raw))
    assert (run / "spm.model").is_file() and not list(run.glob("ckpt_*.pt"))
    return raw


def test_a_corrected_start_trains_its_own_tokenizer_not_the_failed_starts(small_corpus, tmp_path, caplog):
    run = tmp_path / "run"
    raw = _filtered_out(small_corpus, run, vocab_size=150)
    assert Tokenizer.load(run).src_vocab_size == 150
    raw["data"]["max_len"] = 64
    raw["tokenizer"]["vocab_size"] = 200  # corrected too
    with caplog.at_level(logging.INFO, logger="nmt"):
        build_run(config_from_dict(raw)).close()
    assert "left a tokenizer made otherwise; training a new one" in caplog.text
    assert Tokenizer.load(run).src_vocab_size == 200
    # so does a start on another corpus, of the same tokenizer section
    raw = _filtered_out(small_corpus, tmp_path / "other", vocab_size=200)
    before = (tmp_path / "other" / "spm.model").read_bytes()
    raw["data"]["max_len"] = 64
    raw["data"]["train"]["path"] = str(small_corpus / "valid")
    build_run(config_from_dict(raw)).close()
    assert (tmp_path / "other" / "spm.model").read_bytes() != before


def test_a_start_on_corpus_files_corrected_in_place_trains_its_own_tokenizer(small_corpus, tmp_path, caplog):
    """The record named the corpus by its path alone: a user who corrected the training files where they were
    (a wrong language on one side, a glob that now matches one more shard) got the failed start's tokenizer."""
    corpus = tmp_path / "corpus"
    shutil.copytree(small_corpus, corpus)
    run = tmp_path / "run"
    raw = _filtered_out(corpus, run, vocab_size=200)
    before = (run / "spm.model").read_bytes()
    source = corpus / "train.de"
    source.write_text(source.read_text(encoding="utf-8").upper(), encoding="utf-8")  # the same path, other text
    raw["data"]["max_len"] = 64
    with caplog.at_level(logging.INFO, logger="nmt"):
        build_run(config_from_dict(raw)).close()
    assert "left a tokenizer made otherwise; training a new one" in caplog.text
    assert (run / "spm.model").read_bytes() != before


def test_a_start_made_as_the_failed_one_keeps_its_tokenizer(small_corpus, tmp_path, caplog):
    run = tmp_path / "run"
    raw = _filtered_out(small_corpus, run, vocab_size=200)
    before = (run / "spm.model").read_bytes()
    raw["data"]["max_len"] = 64  # the length filter is no part of the tokenizer: it learns from the pairs as read
    with caplog.at_level(logging.INFO, logger="nmt"):
        build_run(config_from_dict(raw)).close()
    assert "keeping the sentencepiece model an earlier start of this run trained" in caplog.text
    assert "trained sentencepiece" not in caplog.text and (run / "spm.model").read_bytes() == before


def test_a_run_with_checkpoints_keeps_its_tokenizer_without_its_record(small_corpus, tmp_path):
    run, before = _trained(small_corpus, tmp_path)
    (run / "spm.json").unlink()  # a run of an nmt that wrote none
    summary = train(tiny_cfg(small_corpus, run, max_steps=4, save_every=2))
    assert summary["step"] == 4 and (run / "spm.model").read_bytes() == before["spm.model"]


def test_a_resume_on_other_training_data_says_so(small_corpus, tmp_path, caplog):
    """Allowed (fine-tuning on in the same run directory), but the epoch's position then counts other batches."""
    run, _ = _trained(small_corpus, tmp_path)
    raw = tiny_raw(small_corpus, run, max_steps=3, save_every=3)
    raw["data"]["train"]["path"] = str(small_corpus / "valid")
    with caplog.at_level(logging.WARNING, logger="nmt"):
        assert train(config_from_dict(raw))["step"] == 3
    assert "ckpt_2.pt was trained with another data.train: training goes on with this config's" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nmt"):  # the same data: nothing to say
        train(config_from_dict({**raw, "train": {**raw["train"], "max_steps": 4, "save_every": 4}}))
    assert "trained with another" not in caplog.text


def test_a_file_named_like_the_restarts_folder_is_refused_in_one_line(tmp_path):
    # --restart failed on it with a bare "FileExistsError: [Errno 17] File exists: '.../.replaced'" and exit 1.
    run = tmp_path / "run"
    run.mkdir()
    (run / REPLACED).write_text("a note\n")
    (run / "ckpt_2.pt").write_bytes(b"the earlier run")
    with pytest.raises(UserError, match=rf"{REPLACED}: a file, where --restart sets the earlier run aside; move it away$"):
        prepare_run_dir(run, restart=True)
    assert (run / "ckpt_2.pt").read_bytes() == b"the earlier run"
    prepare_run_dir(run, restart=False)  # a plain start does not use it
