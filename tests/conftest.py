"""Shared fixtures: small real corpora cut from the embedded toy data, tiny configs, markers."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "data" / "toy"
MULTI30K = Path(os.environ.get("NMT_DATA", ROOT.parent / "shared" / "data" / "multi30k"))

torch.set_num_threads(1)  # tiny models: threads cost more than they give
# ... and so for the `nmt` and torchrun processes the tests start: each would take a thread per core, and
# OpenMP's threads spin while they wait, so on 2 cores two test processes beside one such child ran up to
# 8 times slower (`make test`: 710 s with a child's default threads, 421 s with one thread each).
os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"

# A suite started as a background job of a shell without job control inherits SIGINT ignored, and so
# would every `nmt` process it starts (an ignored signal stays ignored across exec): the tests that
# interrupt one would wait in vain. With a handler here, children start with the default disposition.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_m30k = pytest.mark.skip(reason=f"Multi30k not found at {MULTI30K} (set NMT_DATA)")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if "multi30k" in item.keywords and not (MULTI30K / "train.de.gz").exists():
            item.add_marker(skip_m30k)


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    """First lines of the embedded toy corpus as small train/valid/test files (prefix path)."""
    out = tmp_path_factory.mktemp("corpus")
    sizes = {"train": 400, "valid": 30, "test": 30}
    for split, n in sizes.items():
        for lang in ("en", "de"):
            lines = (TOY / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[:n]
            (out / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def tiny_config_dict(corpus: Path, run_dir: Path, model_type: str = "transformer") -> dict:
    """A config that trains in seconds on `small_corpus`."""
    return {
        "run_dir": str(run_dir),
        "data": {
            "src_lang": "en",
            "tgt_lang": "de",
            "train": {"kind": "text", "path": str(corpus / "train")},
            "valid": {"kind": "text", "path": str(corpus / "valid")},
            "test": {"test": {"kind": "text", "path": str(corpus / "test")}},
            "max_len": 64,
        },
        "tokenizer": {"vocab_size": 200},
        "model": {
            "type": model_type,
            "tie_embeddings": "all",
            "transformer": {"d_model": 32, "heads": 2, "encoder_layers": 1, "decoder_layers": 1, "ff_dim": 64},
            "rnn": {"embed_dim": 32, "hidden_size": 32},
        },
        "train": {"max_tokens": 800, "max_steps": 6, "warmup_steps": 2, "log_every": 2, "valid_every": 3,
                  "valid_max_sentences": 10, "lr": 0.003},
        "decode": {"beam": 2, "max_len_a": 1.2, "max_len_b": 5},
    }


@pytest.fixture
def tiny_config_file(small_corpus, tmp_path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config_dict(small_corpus, tmp_path / "run")), encoding="utf-8")
    return path


@pytest.fixture
def small_disk(tmp_path):
    """A real 256 KiB filesystem (tmpfs); needs root, as this project's machines and CI have."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()[:200]}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)
