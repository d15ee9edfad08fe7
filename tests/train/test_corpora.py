"""Several training corpora with weights, one of them a TSV file without a header, through `nmt train`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nmt.checkpoint import load_checkpoint
from nmt.config import config_from_dict, load_config
from nmt.errors import DataError
from nmt.train.data import prepare_run
from tests.conftest import tiny_config_dict


def two_corpora(small_corpus: Path, tmp_path: Path) -> dict:
    """The text training split (weight 1) and the test split as a headerless TSV, German first (weight 3);
    the tiny config translates English (column 1) into German (column 0)."""
    de = (small_corpus / "test.de").read_text(encoding="utf-8").splitlines()
    en = (small_corpus / "test.en").read_text(encoding="utf-8").splitlines()
    (tmp_path / "extra.tsv").write_text("".join(f"{d}\t{e}\n" for d, e in zip(de, en)), encoding="utf-8")
    raw = tiny_config_dict(small_corpus, tmp_path / "run")
    raw["data"]["train"] = [
        {"kind": "text", "path": str(small_corpus / "train")},
        {"kind": "tsv", "path": str(tmp_path / "extra.tsv"), "src_field": 1, "tgt_field": 0, "weight": 3},
    ]
    raw["train"].update({"max_steps": 2, "valid_every": 2})
    return raw


def nmt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nmt", *args], capture_output=True, text=True)


def test_weighted_corpora_train_through_the_cli(small_corpus, tmp_path):
    raw = two_corpora(small_corpus, tmp_path)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    run = nmt("train", str(tmp_path / "c.yaml"))
    assert run.returncode == 0, run.stderr
    kept = re.search(r"data\.train\[1\] \(\S+extra\.tsv\): 30 pairs read, (\d+) kept", run.stderr)
    assert kept, run.stderr
    assert f"data.train[1]: {kept[1]} pairs, weight 3: about {3 * int(kept[1])} pairs per epoch" in run.stderr
    saved = load_checkpoint(tmp_path / "run" / "best.pt")["config"]["data"]["train"]
    assert [spec["weight"] for spec in saved] == [1.0, 3.0] and saved[1]["src_field"] == 1
    assert config_from_dict(load_checkpoint(tmp_path / "run" / "best.pt")["config"]).data.train_corpora[1].weight == 3


def test_the_corpora_are_one_split_in_order_with_their_weights(small_corpus, tmp_path):
    cfg = config_from_dict(two_corpora(small_corpus, tmp_path))
    (tmp_path / "run").mkdir()
    data = prepare_run(cfg, tmp_path / "run")
    first, second = data.reports["train[0]"]["kept"], data.reports["train[1]"]["kept"]
    assert data.reports["train[1]"]["pairs"] == 30 and second > 20
    assert data.train_parts == [(first, 1.0), (second, 3.0)] and len(data.train) == first + second
    assert data.reports["train"]["kept"] == first + second
    # the TSV's rows come last, in file order, the source read from column 1
    en = (small_corpus / "test.en").read_text(encoding="utf-8").splitlines()
    sources = data.tokenizer.decode_tgt([ids[:-1] for ids in data.train[first:]["src_ids"]])
    assert sources == [line for line in en if line in sources] and len(sources) == second


def test_a_weight_that_makes_an_epoch_too_large_to_list_is_refused_naming_it(small_corpus, tmp_path):
    # weight: 99999999999 failed when the first epoch was drawn, with "MemoryError:" and exit 1.
    raw = two_corpora(small_corpus, tmp_path)
    raw["data"]["train"][1]["weight"] = 99999999999
    (tmp_path / "run").mkdir()
    with pytest.raises(DataError, match=r"^data.train\[1\].weight \(1e\+11\) takes its \d+ pairs 1e\+11 times an "
                                        r"epoch, which would hold [\d.e+]+ pairs, more than the 1,000,000,000 an epoch "
                                        r"may; lower the weight$"):
        prepare_run(config_from_dict(raw), tmp_path / "run")


def test_a_weight_on_the_validation_set_is_refused_in_one_line(small_corpus, tmp_path):
    raw = tiny_config_dict(small_corpus, tmp_path / "run")
    raw["data"]["valid"]["weight"] = 2
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    run = nmt("train", str(tmp_path / "c.yaml"))
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"nmt: error: {tmp_path / 'c.yaml'}: data: valid.weight: weights apply to training corpora only; remove it"]


def test_the_weight_of_a_single_corpus_counts_too(small_corpus, tmp_path):
    raw = tiny_config_dict(small_corpus, tmp_path / "run")
    raw["data"]["train"]["weight"] = 2
    (tmp_path / "run").mkdir()
    data = prepare_run(config_from_dict(raw), tmp_path / "run")
    assert data.train_parts == [(len(data.train), 2.0)]


def test_a_corpus_key_that_its_kind_does_not_read_is_refused_for_training(small_corpus, tmp_path):
    """A `split` on text files, a hub configuration on a TSV file or fields on text files would be left unused,
    and the run would train on something else than the config says: refused, naming the key, before training."""
    cases = [
        ("data.train[0].split", lambda d: d["train"][0].update(split="validation"),
         "kind text does not read split (split is for kind disk and hf)"),
        ("data.train[1].hf_config", lambda d: d["train"][1].update(hf_config="de-en"),
         "kind tsv does not read hf_config (hf_config is for kind hf)"),
        ("data.valid.src_field", lambda d: d["valid"].update(src_field="en", tgt_field="de"),
         "kind text does not read src_field (src_field is for kind tsv, jsonl, parquet, disk and hf)"),
        ("data.test.test.split", lambda d: d["test"]["test"].update(split="test"),
         "kind text does not read split (split is for kind disk and hf)"),
    ]
    for key, change, problem in cases:
        raw = two_corpora(small_corpus, tmp_path)  # data.train: a text corpus, then a TSV file
        change(raw["data"])
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
        run = nmt("train", str(tmp_path / "c.yaml"))
        assert run.returncode == 2, run.stderr
        assert run.stderr.strip().splitlines() == [
            f"nmt: error: {tmp_path / 'c.yaml'}: {key}: {problem}; remove it, or give the kind that reads it"]
        assert not (tmp_path / "run").exists()
    raw = tiny_config_dict(small_corpus, tmp_path / "run")
    raw["data"]["train"] = {"kind": "hf", "path": str(tmp_path / "folder"), "split": "train", "hf_config": "de-en",
                            "src_field": "en", "tgt_field": "de"}
    raw["data"]["valid"] = {"kind": "disk", "path": str(tmp_path / "saved"), "split": "validation"}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    assert load_config(tmp_path / "c.yaml", training=True).data.valid.split == "validation"  # the kinds that read them


def test_a_test_set_that_cannot_be_read_stops_training_before_it_starts(small_corpus, tmp_path):
    """Training does not use the test sets, but `nmt eval --split test` does after the run: a mistyped path is
    found at the start, naming the set, with nothing trained."""
    raw = tiny_config_dict(small_corpus, tmp_path / "run")
    raw["data"]["test"]["mistyped"] = {"kind": "text", "path": str(small_corpus / "tset")}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    run = nmt("train", str(tmp_path / "c.yaml"))
    assert run.returncode == 2, run.stderr
    [line] = run.stderr.strip().splitlines()
    assert line.startswith(f"nmt: error: data.test.mistyped: text corpus not found: tried {small_corpus / 'tset.en'}")
    assert not list((tmp_path / "run").glob("*.pt")) and not (tmp_path / "run" / "spm.model").exists()


def test_a_test_set_named_valid_is_refused_for_training(small_corpus, tmp_path):
    """`nmt eval --split valid` and the translations file valid.hyp name data.valid: a test set of that name could
    not be picked, and its translations would overwrite the validation set's."""
    raw = tiny_config_dict(small_corpus, tmp_path / "run")
    raw["data"]["test"] = {"valid": {"kind": "text", "path": str(small_corpus / "test")}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    run = nmt("train", str(tmp_path / "c.yaml"))
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines() == [
        f"nmt: error: {tmp_path / 'c.yaml'}: data.test.valid: `nmt eval --split valid` and its translations file "
        "(valid.hyp) name data.valid; rename the test set"]
    assert not (tmp_path / "run").exists()
