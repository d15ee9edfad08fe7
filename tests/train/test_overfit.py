"""Every model family can memorise 20 real pairs: trained with the real loop, decoded, BLEU 100."""

from __future__ import annotations

from pathlib import Path

import pytest

from nmt.config import config_from_dict
from nmt.metrics import score
from nmt.train.loop import train
from nmt.translate import Translator

TOY = Path(__file__).resolve().parents[2] / "data" / "toy"

MODELS = {
    "transformer": {"type": "transformer", "transformer": {
        "d_model": 64, "heads": 4, "encoder_layers": 2, "decoder_layers": 2, "ff_dim": 128, "dropout": 0.0}},
    "rnn-none": {"type": "rnn", "rnn": {"decoder": "none"}},
    "rnn-bahdanau": {"type": "rnn", "rnn": {"decoder": "bahdanau", "attention": "additive"}},
    "rnn-luong": {"type": "rnn", "rnn": {"decoder": "luong", "attention": "general"}},
}


@pytest.fixture(scope="module")
def twenty_pairs(tmp_path_factory) -> Path:
    """The first 20 toy pairs of at most 8 words."""
    out = tmp_path_factory.mktemp("twenty")
    en = (TOY / "train.en").read_text(encoding="utf-8").splitlines()
    de = (TOY / "train.de").read_text(encoding="utf-8").splitlines()
    pairs = [(s, t) for s, t in zip(en, de) if len(s.split()) <= 8][:20]
    (out / "pairs.en").write_text("\n".join(s for s, _ in pairs) + "\n", encoding="utf-8")
    (out / "pairs.de").write_text("\n".join(t for _, t in pairs) + "\n", encoding="utf-8")
    return out


@pytest.mark.parametrize("name", [name if name == "transformer" else pytest.param(name, marks=pytest.mark.slow)
                                  for name in MODELS])  # the RNNs' 52 s on a 2-core AVX2 CPU in the slow set
def test_overfits_twenty_pairs_to_bleu_100(name, twenty_pairs, tmp_path):
    model = {"tie_embeddings": "all", **MODELS[name]}
    if model["type"] == "rnn":
        model["rnn"] |= {"cell": "gru", "embed_dim": 64, "hidden_size": 128, "dropout": 0.0}
    corpus = {"kind": "text", "path": str(twenty_pairs / "pairs")}
    cfg = config_from_dict({
        "run_dir": str(tmp_path / "run"),
        "data": {"src_lang": "en", "tgt_lang": "de", "train": corpus, "valid": corpus},
        "tokenizer": {"vocab_size": 150},
        "model": model,
        "train": {"max_steps": 150, "max_tokens": 2000, "lr": 0.003, "warmup_steps": 10, "schedule": "constant",
                  "label_smoothing": 0.0, "valid_every": 150, "valid_bleu": False, "log_every": 50, "seed": 1},
    })
    train(cfg)
    translator = Translator.from_checkpoint(tmp_path / "run" / "best.pt", device="cpu")
    sources = (twenty_pairs / "pairs.en").read_text(encoding="utf-8").splitlines()
    refs = (twenty_pairs / "pairs.de").read_text(encoding="utf-8").splitlines()
    hyps = translator.translate(sources, beam=1)
    assert score(hyps, refs)["bleu"] == 100.0, list(zip(hyps, refs))
