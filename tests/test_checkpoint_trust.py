"""Checkpoints are data, never code: weights_only loading, and averages and ensembles of one kind only.

Through the real command line: a file whose pickle would run code is refused in
one line (exit 2) and runs nothing; `nmt average` refuses checkpoints of other
models or tokenizers, and a file given twice; an ensemble needs one tokenizer.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from nmt.checkpoint import FORMAT, load_checkpoint, model_from_checkpoint, save_checkpoint
from nmt.cli import app
from nmt.errors import CheckpointError
from nmt.runtime import rng_states, set_rng_states
from tests.test_translate import checkpoints  # noqa: F401  (the tiny Transformer and RNN checkpoints)

runner = CliRunner()


class WritesAFile:
    """Unpickling this calls `open(marker, "w")`: what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def nmt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nmt", *args], capture_output=True, text=True)


def assert_one_line_refusal(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert needle in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- weights_only


def test_malicious_and_foreign_checkpoints_are_refused_and_run_nothing(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "model": {"w": torch.zeros(1)}, "config": WritesAFile(marker)}, evil)
    proc = nmt("translate", "-c", str(evil))
    assert_one_line_refusal(proc, f"{evil}: not an nmt checkpoint: it holds Python objects")
    assert "(io.open)" in proc.stderr and "could run code" in proc.stderr
    assert not marker.exists()

    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "epoch": 3}, foreign)
    assert_one_line_refusal(nmt("eval", "-c", str(foreign), "--split", "test"),
                            f"{foreign}: not an nmt checkpoint (expected format")


def test_rng_states_are_plain_data_and_restore_exactly(tmp_path):
    random.seed(1), np.random.seed(2), np.random.randn(), torch.manual_seed(3)
    path = tmp_path / "rng.pt"
    save_checkpoint({"rng": [rng_states()]}, path)
    assert torch.serialization.get_unsafe_globals_in_checkpoint(path) == []
    expected = (random.random(), np.random.randn(3).tolist(), torch.rand(2).tolist())
    set_rng_states(load_checkpoint(path)["rng"][0])
    assert (random.random(), np.random.randn(3).tolist(), torch.rand(2).tolist()) == expected


def test_checkpoint_of_an_earlier_version_with_numpy_rng_state_still_loads(tmp_path):
    np.random.seed(5), np.random.randn()  # leaves a cached Gaussian in the state, as training may
    old = {**rng_states(), "numpy": np.random.get_state()}  # what earlier versions saved
    path = tmp_path / "old.pt"
    torch.save({"format": FORMAT, "model": {"w": torch.ones(2)}, "rng": [old]}, path)
    assert "numpy.ndarray" in torch.serialization.get_unsafe_globals_in_checkpoint(path)
    expected = np.random.randn(5).tolist()
    np.random.seed(99)
    set_rng_states(load_checkpoint(path)["rng"][0])
    assert np.random.randn(5).tolist() == expected


# --------------------------------------------------------------------------- averaging and ensembles


def invoke_refused(*args: str, match: str) -> None:
    result = runner.invoke(app, list(args))
    assert result.exit_code != 0 and isinstance(result.exception, CheckpointError), result.output
    assert match in str(result.exception) and "\n" not in str(result.exception)


def test_average_refuses_other_models_other_tokenizers_and_duplicates(checkpoints, tmp_path):  # noqa: F811
    a, rnn = checkpoints["transformer"], checkpoints["rnn"]
    payload = load_checkpoint(a)
    b = tmp_path / "b.pt"
    save_checkpoint(payload, b)
    out = tmp_path / "avg.pt"
    assert runner.invoke(app, ["average", str(a), str(b), "-o", str(out)]).exit_code == 0

    invoke_refused("average", str(a), str(rnn), "-o", str(out),
                   match=f"{a} and {rnn}: different model configs (model.type: 'transformer' vs 'rnn')")
    wider = tmp_path / "wider.pt"
    model = payload["config"]["model"]
    config = {**payload["config"], "model": {**model, "transformer": {**model["transformer"], "ff_dim": 128}}}
    save_checkpoint({**payload, "config": config}, wider)  # refused on its config, before any weight is read
    invoke_refused("average", str(a), str(wider), "-o", str(out), match="(model.transformer.ff_dim: 64 vs 128)")

    other = tmp_path / "other_spm.pt"
    save_checkpoint({**payload, "tokenizer": {"src_model": b"another model", "tgt_model": None}}, other)
    invoke_refused("average", str(a), str(other), "-o", str(out),
                   match=f"{a} and {other}: different sentencepiece models")

    backwards = tmp_path / "backwards.pt"  # the other direction over one joint vocabulary: the same model config
    data = payload["config"]["data"]
    flipped = {**data, "src_lang": data["tgt_lang"], "tgt_lang": data["src_lang"]}
    save_checkpoint({**payload, "config": {**payload["config"], "data": flipped}}, backwards)
    invoke_refused("average", str(a), str(backwards), "-o", str(out),
                   match=f"{a} and {backwards}: translate {data['src_lang']}->{data['tgt_lang']} vs "
                         f"{data['tgt_lang']}->{data['src_lang']}")

    os.link(b, tmp_path / "b_again.pt")
    for twice in (b, tmp_path / ".." / tmp_path.name / "b.pt", tmp_path / "b_again.pt"):
        invoke_refused("average", str(a), str(b), str(twice), "-o", str(out), match=f"{twice}: given twice")
    proc = nmt("average", str(a), str(a), "-o", str(out))
    assert_one_line_refusal(proc, f"{a}: given twice (also as {a})")


def test_ensemble_from_the_command_line_needs_one_tokenizer(checkpoints, tmp_path):  # noqa: F811
    a = checkpoints["transformer"]
    other = tmp_path / "other_spm.pt"
    payload = load_checkpoint(a)
    spm = payload["tokenizer"]["src_model"]  # a joint model: the same pieces as separate models is another tokenizer
    save_checkpoint({**payload, "tokenizer": {"src_model": spm, "tgt_model": spm}}, other)
    invoke_refused("translate", "-c", str(a), "-c", str(other), match=f"{other}: its sentencepiece models differ")


def test_library_refuses_a_pickled_call_before_it_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save([WritesAFile(marker)], path)
    with pytest.raises(CheckpointError, match="not an nmt checkpoint: it holds Python objects"):
        load_checkpoint(path)
    assert not marker.exists()


def test_a_stored_decode_section_this_version_refuses_gives_way_to_the_defaults(checkpoints, tmp_path, caplog):  # noqa: F811
    """decode.length_penalty 6 was valid before its range became [-5, 5]: the model still translates."""
    payload = load_checkpoint(checkpoints["transformer"])
    payload["config"]["decode"] = {**payload["config"]["decode"], "length_penalty": 6.0}
    old = tmp_path / "old.pt"
    save_checkpoint(payload, old)
    with caplog.at_level("WARNING", logger="nmt.checkpoint"):
        model, _, cfg = model_from_checkpoint(load_checkpoint(old), source=old)
    assert cfg.decode.length_penalty == 1.0 and isinstance(model, torch.nn.Module)
    assert f"{old}: stored config: decode.length_penalty: 6.0 must be in [-5, 5]" in caplog.text
    assert "default search settings apply" in caplog.text
    payload["config"]["model"]["transformer"]["heads"] = 0  # elsewhere in the config: refused as before
    save_checkpoint(payload, old)
    with pytest.raises(CheckpointError, match=r"model.transformer.heads: 0 must be >= 1"):
        model_from_checkpoint(load_checkpoint(old), source=old)
