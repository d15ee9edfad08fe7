"""Published results stay reproducible: the toy corpus gives the same batches, seed for seed.

The `longer` digests were computed with the pipeline as it was before the data path was made
to scale (per-row length reads, Python batch lists), the `lengths` ones when that order
(`train.batch_order`) was added; any change to reading, cleaning, tokenizer sampling,
tokenizing, filtering or batching that moves one sentence fails here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from nmt.config import load_config
from nmt.data.batching import TokenBatchSampler
from nmt.train.data import prepare_run

ROOT = Path(__file__).resolve().parents[2]

LENGTHS_SHA = "4693f4c7ca40d2b5f4018dc7b6bf0a240101bd73b5dfa7b1981350a9a5dde498"
EPOCH_SHA = {  # (train.batch_order, epoch, world_size, rank): sha256 of the JSON list of batches
    ("longer", 0, 1, 0): "32b0e88f802472e5df69e17c97e8bf311af370a9ebb762466fd876acfc37e6c3",
    ("longer", 1, 1, 0): "e96abc9b4cff61339f90bfbf893d528bb1b31bf7c72cdf4d61d95e503e203073",
    ("longer", 0, 2, 1): "b36afe7f43505b0a230c68adecfb771f7c8159c6eb5a4d8b87e9a5459ab3c5b0",
    ("lengths", 0, 1, 0): "188abd3c795a64be4c3fb987ca2c2b01588ae41a1da31be1462affb170cc0631",
    ("lengths", 1, 1, 0): "10fba9273f5ef5cfb6173338f24d7f7a1b7252f1eaad1b42a94791d90a320d92",
    ("lengths", 0, 2, 1): "cc3f2055ed861c25b4901e44b7b3e6b6fff2be49a0fb6fd97e5b420fa323593a",
}


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, separators=(",", ":")).encode()).hexdigest()


@pytest.fixture(scope="module")
def toy_train(tmp_path_factory):
    """The toy corpus prepared as `make demo` prepares it (configs/toy_transformer.yaml)."""
    run_dir = tmp_path_factory.mktemp("toy_run")
    toy = ROOT / "data" / "toy"
    cfg = load_config(ROOT / "configs" / "toy_transformer.yaml", [
        f"run_dir={run_dir}", f"data.train.path={toy / 'train'}", f"data.valid.path={toy / 'valid'}"])
    return cfg, prepare_run(cfg, run_dir).train


def test_toy_lengths_are_pinned(toy_train) -> None:
    _, ds = toy_train
    lens = ds.select_columns(["src_len", "tgt_len"]).with_format("numpy")[:]
    assert _sha([np.asarray(lens["src_len"]).tolist(), np.asarray(lens["tgt_len"]).tolist()]) == LENGTHS_SHA


@pytest.mark.parametrize(("order", "epoch", "world_size", "rank"), list(EPOCH_SHA))
def test_toy_epoch_batches_are_pinned(toy_train, order: str, epoch: int, world_size: int, rank: int) -> None:
    cfg, ds = toy_train
    lens = ds.select_columns(["src_len", "tgt_len"]).with_format("numpy")[:]
    sampler = TokenBatchSampler(src_lens=lens["src_len"], tgt_lens=lens["tgt_len"], max_tokens=cfg.train.max_tokens,
                                seed=cfg.train.seed, rank=rank, world_size=world_size, order=order)
    batches = [list(map(int, b)) for b in sampler.batch_list(epoch)]
    assert _sha(batches) == EPOCH_SHA[(order, epoch, world_size, rank)]
