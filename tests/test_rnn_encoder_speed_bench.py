"""bench/rnn_encoder_speed.py on the CPU: both ways of the encoder are timed and counted, and a Transformer
config is refused in one line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "rnn_encoder_speed.py"), *args, "--vocab", "300",
                           "--batch", "8", "--length", "7", "--shortest", "2", "--passes", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a bench run end to end (7-8 s here each); CI runs it with make test-slow
@pytest.mark.parametrize("config", ["configs/toy_rnn_bahdanau.yaml", "configs/multi30k_rnn_luong_general.yaml"])
def test_the_encoder_bench_times_and_counts_both_ways(config):
    done = _bench(config)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^(gru|lstm) encoder, \d layers, bidirectional, H \d+, cpu: 8 sentences of 2-7 tokens",
                     done.stdout, re.M), done.stdout
    ops = {}
    for name in ("packed", "unpacked"):
        found = re.search(rf"^  {name} +[\d.]+ ms a pass, +(\d+) ops a pass$", done.stdout, re.M)
        assert found, done.stdout
        ops[name] = int(found.group(1))
    if "lstm" in done.stdout:  # oneDNN's fused LSTM: a call a layer and direction, where packing steps
        assert ops["unpacked"] < ops["packed"]


def test_the_encoder_bench_refuses_a_transformer_in_one_line():
    done = _bench("configs/toy_transformer.yaml")
    assert done.returncode != 0
    assert done.stderr.strip() == ("configs/toy_transformer.yaml: model.type is 'transformer'; this bench times an "
                                   "RNN's encoder")
