"""Every shipped config is a tested artifact: it loads, builds, and trains a few steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from nmt.config import config_from_dict, config_to_dict, load_config
from nmt.models import build_model, count_parameters
from nmt.train.loop import train

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))


def test_configs_exist():
    assert len(CONFIGS) >= 10


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_loads_and_builds(path):
    cfg = load_config(path)
    assert Path(cfg.run_dir).name == path.stem, "run_dir should be named after the config"
    model = build_model(cfg.model, src_vocab_size=cfg.tokenizer.vocab_size,
                        tgt_vocab_size=cfg.tokenizer.vocab_size, pad_id=0)
    assert count_parameters(model) > 0


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_trains_a_few_steps_on_toy_data(path, small_corpus, tmp_path):
    """The experiment's model and training settings, on a small slice of the toy corpus."""
    raw = config_to_dict(load_config(path))
    raw["run_dir"] = str(tmp_path / "run")
    raw["data"].update({
        "src_lang": "en", "tgt_lang": "de",
        "train": {"kind": "text", "path": str(small_corpus / "train")},
        "valid": {"kind": "text", "path": str(small_corpus / "valid")},
        "test": {},
    })
    raw["tokenizer"]["vocab_size"] = 200
    # fp32: Transformer-base's bf16 took 189 s of `make test` on a CPU without bf16 instructions (AVX2 only), which
    # emulates them; bf16 training itself is tested on tiny models (tests/train/test_half.py)
    raw["train"].update({"max_steps": 2, "max_time": 0, "max_tokens": 300, "valid_every": 2,
                         "valid_max_sentences": 2, "log_every": 1, "precision": "fp32"})
    # an untrained model translates to the length limit: a short one keeps validation to seconds
    raw["decode"].update({"max_len_a": 0.5, "max_len_b": 4})
    summary = train(config_from_dict(raw))
    assert summary["step"] == 2
    assert (tmp_path / "run" / "best.pt").is_file()
