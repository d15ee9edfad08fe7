"""Tiny training runs for the loop, fault, signal and distributed tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

from nmt.checkpoint import load_checkpoint
from nmt.config import ExperimentConfig, config_from_dict
from tests.conftest import ROOT, tiny_config_dict


def random_rows(seed: int = 0, n: int = 5, vocab: int = 23) -> list[dict]:
    """`n` dataset rows of random ids below `vocab` (sources 2-8 ids and EOS, targets 1-8 ids), seeded."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        s, t = int(torch.randint(2, 9, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
        rows.append({"src_ids": torch.randint(4, vocab, (s,), generator=g).tolist() + [2],
                     "tgt_ids": torch.randint(4, vocab, (t,), generator=g).tolist(), "index": i})
    return rows


def tiny_raw(corpus: Path, run_dir: Path, **train) -> dict:
    """The shared tiny config without BLEU and with validation only at the end, plus `train` overrides."""
    raw = tiny_config_dict(corpus, run_dir)
    raw["train"].update({"valid_bleu": False, "valid_every": 1000, "log_every": 1, **train})
    return raw


def tiny_cfg(corpus: Path, run_dir: Path, **train) -> ExperimentConfig:
    return config_from_dict(tiny_raw(corpus, run_dir, **train))


def write_cfg(path: Path, corpus: Path, run_dir: Path, **train) -> Path:
    path.write_text(yaml.safe_dump(tiny_raw(corpus, run_dir, **train)), encoding="utf-8")
    return path


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path)["model"]


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Bitwise equality of two state dicts."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def nmt_process(*args: str) -> subprocess.Popen:
    """`python -m nmt ARGS` with one torch thread, output captured, in a process group of its own."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    return subprocess.Popen([sys.executable, "-m", "nmt", *args], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, proc: subprocess.Popen, timeout: float = 120.0, poll: float = 0.005) -> None:
    """Poll until `condition()` holds; fail with the process's output if it exits or time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"process exited ({proc.returncode}) before the condition held:\n{err[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"timed out after {timeout:g}s waiting; the process's stderr:\n{err[-3000:]}")
        time.sleep(poll)


def without_key_biases(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict with the attention projections' biases of the keys cut out.

    A key bias adds the same amount to every score of a query, which softmax ignores: its true gradient
    is 0, and Adam turns the rounding noise in it into steps of about the learning rate, either way.
    """
    out = {}
    for name, t in state.items():
        if name.endswith("qkv_proj.bias"):  # queries, keys, values
            q, _, v = t.chunk(3)
            t = torch.cat([q, v])
        elif name.endswith("kv_proj.bias"):  # keys, values
            t = t.chunk(2)[1]
        out[name] = t
    return out
