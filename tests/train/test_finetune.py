"""Fine-tuning from a checkpoint (`train.init_from`) and bringing a sentencepiece model (`tokenizer.model`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import sentencepiece as spm
import yaml

from nmt.checkpoint import load_checkpoint
from nmt.config import config_from_dict
from nmt.data.tokenizer import Tokenizer
from nmt.errors import CheckpointError, ConfigError, UserError
from nmt.train.loop import train
from tests.conftest import tiny_config_dict


def valid_records(run_dir):
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["event"] == "valid"]


@pytest.fixture(scope="module")
def parent(small_corpus, tmp_path_factory):
    """A tiny model trained on the first half of the corpus; its best.pt."""
    run = tmp_path_factory.mktemp("parent") / "run"
    raw = tiny_config_dict(small_corpus, run)
    raw["train"].update({"max_steps": 6, "valid_every": 6})
    train(config_from_dict(raw))
    return run / "best.pt"


def child_raw(small_corpus, run_dir, parent_path, **train_keys):
    """New data (the test split as training data), the parent's validation set, and defaults for the model."""
    raw = tiny_config_dict(small_corpus, run_dir)
    del raw["model"], raw["tokenizer"]  # they come from the checkpoint
    raw["data"]["train"] = {"kind": "text", "path": str(small_corpus / "test")}
    raw["train"].update({"init_from": str(parent_path), "max_steps": 2, "valid_every": 2, **train_keys})
    return raw


def test_fine_tuning_starts_from_the_parent_and_validates_at_step_0(small_corpus, tmp_path, parent):
    raw = child_raw(small_corpus, tmp_path / "child", parent)
    summary = train(config_from_dict(raw))
    parent_payload = load_checkpoint(parent)
    first = valid_records(tmp_path / "child")[0]
    assert first["step"] == 0
    assert {k: first[k] for k in ("loss", "bleu", "chrf")} == {k: parent_payload["progress"]["last_valid"][k]
                                                               for k in ("loss", "bleu", "chrf")}
    child = load_checkpoint(tmp_path / "child" / "ckpt_2.pt")
    assert child["tokenizer"] == parent_payload["tokenizer"]  # the parent's own sentencepiece models
    assert child["config"]["model"] == parent_payload["config"]["model"]
    assert summary["step"] == 2
    assert any((child["model"][k] != v).any() for k, v in parent_payload["model"].items())  # it trained on


def test_the_parents_checkpoint_at_step_0_is_replaced_by_the_next_and_never_averaged(small_corpus, tmp_path, parent):
    """ckpt_0.pt holds the parent's weights, written so that the run can resume from its first validation: it
    took a place among keep_last, and averaged.pt mixed the parent's weights into the fine-tuned model."""
    raw = child_raw(small_corpus, tmp_path / "child", parent, max_steps=4, keep_last=3, average_last=3)
    summary = train(config_from_dict(raw))
    assert sorted(p.name for p in (tmp_path / "child").glob("ckpt_*.pt")) == ["ckpt_2.pt", "ckpt_4.pt"]
    averaged = load_checkpoint(summary["averaged_checkpoint"])["averaged"]
    assert [p.rsplit("/", 1)[-1] for p in averaged] == ["ckpt_2.pt", "ckpt_4.pt"]
    assert load_checkpoint(tmp_path / "child" / "best.pt")["progress"]["step"] in (0, 2, 4)  # best.pt is apart


def test_a_fine_tuned_run_resumes_from_its_own_checkpoints(small_corpus, tmp_path, parent, caplog):
    raw = child_raw(small_corpus, tmp_path / "child", parent)
    train(config_from_dict(raw))
    raw["train"]["max_steps"] = 4
    caplog.clear()
    with caplog.at_level("INFO", logger="nmt"):
        summary = train(config_from_dict(raw))
    assert summary["step"] == 4
    assert f"fine-tuning: model and tokenizer (weights resumed) from {parent}" in caplog.text
    assert "fine-tuning: weights" not in caplog.text
    assert [r["step"] for r in valid_records(tmp_path / "child")] == [0, 2, 4]  # no second step-0 validation


def test_a_fine_tuned_run_resumed_without_its_parent_is_told_to_name_it(small_corpus, tmp_path, parent):
    """Its model and tokenizer are the parent's: a config that leaves train.init_from out (a --set forgotten)
    describes another model, and starting over (--restart) would discard the fine-tuned run."""
    raw = child_raw(small_corpus, tmp_path / "child", parent)
    train(config_from_dict(raw))
    del raw["train"]["init_from"]
    raw["train"]["max_steps"] = 4
    with pytest.raises(UserError) as err:
        train(config_from_dict(raw))
    message = str(err.value)
    assert f"ckpt_2.pt: the run directory holds a run fine-tuned from {parent} (train.init_from)" in message
    assert message.endswith(f"set train.init_from: {parent} to resume the run") and "--restart" not in message
    assert "its model section differs (model.tie_embeddings: 'all' vs 'decoder', the run's vs this config's)" in message
    assert sorted(p.name for p in (tmp_path / "child").glob("ckpt_*.pt")) == ["ckpt_2.pt"]  # as it was: kept


def test_fine_tuning_through_the_cli(small_corpus, tmp_path, parent):
    cfg = tmp_path / "child.yaml"
    cfg.write_text(yaml.safe_dump(child_raw(small_corpus, tmp_path / "child", parent, max_steps=1)), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "nmt", "train", str(cfg)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"fine-tuning: weights, model and tokenizer from {parent}" in proc.stderr
    assert json.loads(proc.stdout)["step"] == 1


def test_a_missing_parent_is_one_clear_error(small_corpus, tmp_path):
    """The line names the setting as well as the path: the config names other checkpoints' paths nowhere else."""
    with pytest.raises(CheckpointError, match=r"^train\.init_from: \S*missing\.pt: checkpoint not found$"):
        train(config_from_dict(child_raw(small_corpus, tmp_path / "child", tmp_path / "missing.pt")))


def test_a_parent_whose_stored_config_does_not_load_is_named_once(small_corpus, tmp_path, parent):
    from nmt.checkpoint import save_checkpoint

    payload = load_checkpoint(parent)
    payload["config"]["train"]["lr"] = "fast"
    save_checkpoint(payload, tmp_path / "odd.pt")
    with pytest.raises(CheckpointError) as err:  # its path was written twice: "train.init_from: P: P: stored config"
        train(config_from_dict(child_raw(small_corpus, tmp_path / "child", tmp_path / "odd.pt")))
    assert str(err.value) == (f"train.init_from: {tmp_path / 'odd.pt'}: stored config: train.lr: expected float, got "
                              "str 'fast' (a checkpoint of another nmt version?)")


def test_a_parent_whose_search_settings_this_version_refuses_is_fine_tuned_as_translate_reads_it(
        small_corpus, tmp_path, parent):
    """`nmt translate` reads such a parent (its decode section gives way to the defaults, with a warning);
    fine-tuning, which takes only its model and tokenizer, refused it as "a checkpoint of another nmt version"."""
    from nmt.checkpoint import save_checkpoint

    payload = load_checkpoint(parent)
    payload["config"]["decode"]["beam"] = 2000  # a range narrowed since
    save_checkpoint(payload, tmp_path / "old.pt")
    summary = train(config_from_dict(child_raw(small_corpus, tmp_path / "child", tmp_path / "old.pt", max_steps=1)))
    assert summary["step"] == 1


def test_a_parent_whose_weights_do_not_fit_its_config_is_refused_before_any_data_is_read(small_corpus, tmp_path,
                                                                                        parent):
    """It failed with torch's many-line RuntimeError (exit 1) once the corpora were read and the tokenizer saved."""
    from nmt.checkpoint import save_checkpoint

    payload = load_checkpoint(parent)
    name = next(iter(payload["model"]))
    del payload["model"][name]
    save_checkpoint(payload, tmp_path / "broken.pt")
    with pytest.raises(CheckpointError) as err:
        train(config_from_dict(child_raw(small_corpus, tmp_path / "child", tmp_path / "broken.pt")))
    assert str(err.value).startswith(f"train.init_from: {tmp_path / 'broken.pt'}: weights do not fit the model its "
                                     f"config describes: Missing key(s) in state_dict: \"{name}\"")
    assert not (tmp_path / "child").exists()


def test_a_coverage_penalty_is_refused_for_a_parent_without_attention(small_corpus, tmp_path):
    """The child's own config has no model section, so only the parent's decoder tells that the penalty has no
    attention weights to read: refused when the parent is read, before the run directory is made."""
    raw = tiny_config_dict(small_corpus, tmp_path / "parent", model_type="rnn")
    raw["model"]["rnn"]["decoder"] = "none"
    raw["train"].update({"max_steps": 1, "valid_every": 1, "valid_bleu": False})
    train(config_from_dict(raw))
    parent_path = tmp_path / "parent" / "best.pt"
    child = child_raw(small_corpus, tmp_path / "child", parent_path)
    child["decode"]["coverage_penalty"] = 0.2
    with pytest.raises(ConfigError) as err:
        train(config_from_dict(child))
    assert str(err.value) == (
        f"train.init_from: {parent_path}: decode.coverage_penalty (0.2) needs attention weights, and the parent "
        "model has no attention (its model.rnn.decoder is 'none'): set decode.coverage_penalty to 0, or fine-tune "
        "a model with attention")
    assert not (tmp_path / "child").exists()
    child["decode"]["coverage_penalty"] = 0.0
    assert train(config_from_dict(child))["step"] == 2


def test_decode_lengths_that_outgrow_the_parent_s_positions_are_refused(small_corpus, tmp_path, parent):
    """The child's own model section (4096 positions) is set aside for the parent's (1024), which its
    max_len_b of 1100 outgrows: refused when the parent is read, before the run directory is made."""
    raw = child_raw(small_corpus, tmp_path / "child", parent)
    raw["model"] = {"transformer": {"max_positions": 4096}}
    raw["decode"]["max_len_b"] = 1100
    with pytest.raises(ConfigError) as err:
        train(config_from_dict(raw))
    assert str(err.value).startswith(
        f"train.init_from: {parent}: the parent model does not fit this config: decode.max_len_a (1.2) and "
        "decode.max_len_b (1100) allow outputs of more than the 1023 tokens that model.transformer.max_positions "
        "(1024) holds")
    assert not (tmp_path / "child").exists()


def test_a_copied_checkpoint_without_training_state_is_refused_with_the_way_out(small_corpus, tmp_path, parent):
    run = tmp_path / "copied"
    run.mkdir()
    payload = load_checkpoint(parent)
    from nmt.checkpoint import save_checkpoint

    save_checkpoint({k: payload[k] for k in ("config", "tokenizer", "model")}, run / "ckpt_6.pt")
    raw = tiny_config_dict(small_corpus, run)
    raw["train"]["max_steps"] = 8
    with pytest.raises(CheckpointError, match="holds no training state .*set train.init_from to it"):
        train(config_from_dict(raw))


def test_an_existing_sentencepiece_model_is_used_as_it_is(small_corpus, tmp_path, parent, caplog):
    import logging

    from nmt.train.start import starting_point

    model_file = parent.parent / "spm.model"
    raw = tiny_config_dict(small_corpus, tmp_path / "run")
    raw["tokenizer"].update({"model": str(model_file), "type": "unigram"})  # and vocab_size 200, not the default
    raw["train"].update({"max_steps": 1, "valid_bleu": False})
    with caplog.at_level(logging.WARNING, logger="nmt"):
        train(config_from_dict(raw))
    assert (tmp_path / "run" / "spm.model").read_bytes() == model_file.read_bytes()
    pieces = Tokenizer.load(tmp_path / "run").src_vocab_size
    assert (f"tokenizer.model: {model_file} ({pieces} pieces) is the tokenizer, so tokenizer.type: 'unigram'; "
            "tokenizer.vocab_size: 200 are not used") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nmt"):  # the keys left at their defaults: nothing to say
        starting_point(config_from_dict({"tokenizer": {"model": str(model_file)}}))
    assert "not used" not in caplog.text


def test_a_run_given_a_sentencepiece_file_resumes_from_the_file_moved_and_with_unused_keys_changed(
        small_corpus, tmp_path, parent):
    """The resume compared the tokenizer section whole: the file's path (moved, or named from another folder)
    and the keys the run's warning calls unused refused it, for the same models. Other models are refused."""
    import shutil

    model_file = tmp_path / "spm.model"
    shutil.copyfile(parent.parent / "spm.model", model_file)
    raw = tiny_config_dict(small_corpus, tmp_path / "run")
    raw["tokenizer"]["model"] = str(model_file)
    raw["train"].update({"max_steps": 1, "valid_bleu": False})
    train(config_from_dict(raw))
    moved = model_file.rename(tmp_path / "moved.model")
    raw["tokenizer"].update({"model": str(moved), "vocab_size": 123, "type": "unigram"})
    raw["train"]["max_steps"] = 2
    assert train(config_from_dict(raw))["step"] == 2
    other = tmp_path / "other.model"
    spm.SentencePieceTrainer.train(input=str(small_corpus / "train.en"), model_prefix=str(tmp_path / "other"),
                                   vocab_size=100, pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2)
    raw["tokenizer"]["model"] = str(other)
    raw["train"]["max_steps"] = 3
    with pytest.raises(UserError, match="holds other sentencepiece models than train.init_from or tokenizer.model"):
        train(config_from_dict(raw))


def test_a_sentencepiece_model_with_other_special_ids_is_refused(small_corpus, tmp_path):
    prefix = tmp_path / "foreign"
    spm.SentencePieceTrainer.train(input=str(small_corpus / "train.en"), model_prefix=str(prefix), vocab_size=100,
                                   minloglevel=2)  # sentencepiece's defaults: unk 0, bos 1, eos 2, no pad
    raw = tiny_config_dict(small_corpus, tmp_path / "run")
    raw["tokenizer"]["model"] = f"{prefix}.model"
    with pytest.raises(ConfigError, match=r"special ids are pad -1, unk 0, bos 1, eos 2, but nmt needs pad 0"):
        train(config_from_dict(raw))
    raw["tokenizer"].update({"model": f"{prefix}.model", "joint": False})
    with pytest.raises(ConfigError, match="set joint: true"):
        config_from_dict(raw)


def test_a_sentencepiece_model_that_leaves_target_characters_unknown_is_warned_of(small_corpus, tmp_path, parent,
                                                                                    caplog):
    """A model brought from text of the source language alone maps the target's own letters to <unk>, which
    translations leave out: training says so, naming the side, how many sentences and the characters."""
    import logging

    from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID

    prefix = tmp_path / "english"
    spm.SentencePieceTrainer.train(input=str(small_corpus / "train.en"), model_prefix=str(prefix), vocab_size=100,
                                   pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, minloglevel=2)
    english = spm.SentencePieceProcessor(model_file=f"{prefix}.model")
    german = (small_corpus / "train.de").read_text(encoding="utf-8").splitlines()
    unknown = sum(UNK_ID in ids for ids in english.encode(german))
    assert 0 < unknown < len(german)  # the premise: the German side holds letters the English text lacks
    raw = tiny_config_dict(small_corpus, tmp_path / "run")
    raw["tokenizer"]["model"] = f"{prefix}.model"
    raw["train"].update({"max_steps": 1, "valid_bleu": False})
    with caplog.at_level(logging.WARNING, logger="nmt"):
        train(config_from_dict(raw))
    warnings = [r.getMessage() for r in caplog.records if "target sentences" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith(
        f"tokenizer.model: {prefix}.model: maps characters of {unknown} of {len(german)} target sentences of "
        f"data.train ({small_corpus / 'train'}) to <unk> (")
    shown = re.findall(r"'(.)' U\+[0-9A-F]{4}", warnings[0])
    assert shown and all(UNK_ID in english.encode(c) for c in shown)
    assert "translations leave them out" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nmt"):  # the parent's joint model covers both sides
        raw = tiny_config_dict(small_corpus, tmp_path / "joint")
        raw["tokenizer"]["model"] = str(parent.parent / "spm.model")
        raw["train"].update({"max_steps": 1, "valid_bleu": False})
        train(config_from_dict(raw))
    assert "<unk>" not in caplog.text


def test_a_sentencepiece_model_whose_normalization_changes_the_target_text_is_warned_of(small_corpus, tmp_path,
                                                                                         caplog):
    """sentencepiece's default NFKC makes a full-width stop '．' an ASCII '.': a model brought with it writes text
    the references do not hold, as one trained here with `tokenizer.normalization: nmt_nfkc` would, and training
    says so for both."""
    import logging
    import shutil

    from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("train.en", "valid.en", "valid.de", "test.en", "test.de"):
        shutil.copy(small_corpus / name, corpus / name)
    german = (small_corpus / "train.de").read_text(encoding="utf-8").splitlines()
    german = [line.replace(".", "\uff0e") if i % 3 == 0 else line for i, line in enumerate(german)]
    (corpus / "train.de").write_text("\n".join(german) + "\n", encoding="utf-8")
    changed = sum("\uff0e" in line for line in german)
    prefix = tmp_path / "nfkc"
    spm.SentencePieceTrainer.train(input=f"{corpus / 'train.en'},{corpus / 'train.de'}", model_prefix=str(prefix),
                                   vocab_size=200, character_coverage=1.0, pad_id=PAD_ID, unk_id=UNK_ID,
                                   bos_id=BOS_ID, eos_id=EOS_ID, minloglevel=2)  # normalization: nmt_nfkc
    raw = tiny_config_dict(corpus, tmp_path / "run")
    raw["tokenizer"]["model"] = f"{prefix}.model"
    raw["train"].update({"max_steps": 1, "valid_bleu": False})
    with caplog.at_level(logging.WARNING, logger="nmt"):
        train(config_from_dict(raw))
    assert [r.getMessage() for r in caplog.records if "normaliz" in r.getMessage()] == [
        f"tokenizer.model: {prefix}.model: its normalization, on data.train ({corpus / 'train'}), changes {changed} "
        f"of {len(german)} target sentences ('\uff0e' U+FF0E becomes '.'): the model learns and writes the "
        "normalized text, which the references do not hold; use a sentencepiece model trained with "
        "--normalization_rule_name=identity to keep the text as it is"]


def test_settings_of_its_own_that_fine_tuning_leaves_unused_are_named(small_corpus, tmp_path, parent, caplog):
    import logging

    from nmt.train.start import starting_point

    with caplog.at_level(logging.WARNING, logger="nmt"):
        starting_point(config_from_dict(child_raw(small_corpus, tmp_path / "a", parent)))  # sections left out
    assert "not used" not in caplog.text
    raw = child_raw(small_corpus, tmp_path / "b", parent)
    # the parent's dropout, a width of its own, and heads written as the default (8), which went unnamed
    raw["model"] = {"transformer": {"d_model": 64, "dropout": 0.1, "heads": 8}}
    raw["tokenizer"] = {"vocab_size": 300}
    with caplog.at_level(logging.WARNING, logger="nmt"):
        start = starting_point(config_from_dict(raw))
    assert start.cfg.model.transformer.d_model == 32
    assert (f"train.init_from: {parent}: the model and tokenizer are the parent's, so this config's "
            "model.transformer.d_model: 64 (the parent's: 32); model.transformer.heads: 8 (the parent's: 2); "
            "tokenizer.vocab_size: 300 (the parent's: 200) are not used") in caplog.text
    # another type of model, written, is refused: it trained the parent's Transformer without a word
    raw["model"] = {"type": "rnn"}
    with pytest.raises(ConfigError) as err:
        starting_point(config_from_dict(raw))
    assert str(err.value) == (f"train.init_from: {parent}: the parent's model.type is 'transformer', and this "
                              "config's 'rnn'; fine-tuning goes on with the parent's model: remove model.type, or "
                              "choose a parent of that type")
    raw["model"] = {"type": "transformer"}  # the parent's type, written: nothing to say
    starting_point(config_from_dict(raw))


def test_a_parent_of_another_direction_is_warned_of(small_corpus, tmp_path, parent, caplog):
    """The parent translates en-de; a child config of de-en would train its encoder, which learned English, on
    German: allowed (a related pair may be meant), and said, naming both directions."""
    import logging

    from nmt.train.start import starting_point

    with caplog.at_level(logging.WARNING, logger="nmt"):
        starting_point(config_from_dict(child_raw(small_corpus, tmp_path / "a", parent)))
    assert "translates" not in caplog.text
    raw = child_raw(small_corpus, tmp_path / "b", parent)
    raw["data"].update(src_lang="de", tgt_lang="en")
    with caplog.at_level(logging.WARNING, logger="nmt"):
        starting_point(config_from_dict(raw))
    assert (f"train.init_from: {parent} translates en-de, this config de-en: the parent's encoder learned to read en "
            "and its decoder to write de; if that is not meant, set data.src_lang and data.tgt_lang or choose "
            "another parent") in caplog.text
