"""bench/checkpoint_speed.py on the CPU: both ways of saving are timed on the config's model, and its files go."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a bench run end to end (7 s here); CI runs it with make test-slow
def test_the_checkpoint_bench_times_both_ways_and_leaves_no_files(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "checkpoint_speed.py"), "configs/toy_transformer.yaml",
                           "--vocab", "300", "--repeat", "2", "--gap", "0", "--dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert re.search(r"toy_transformer.yaml: [\d,]+ parameters on cpu, a checkpoint of [\d.]+ MiB", done.stdout)
    for name in ("sync", "background"):
        assert re.search(rf"^  {name} +median +[\d.]+ +min +[\d.]+ +max +[\d.]+$", done.stdout, re.M), done.stdout
    assert list(tmp_path.iterdir()) == []
