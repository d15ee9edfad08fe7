"""bench/train_speed.py end to end on the toy corpus: each precision row trains, and the bf16 copy dispatches
about as few operations per update as fp32 while autocast adds its casts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a bench run end to end (30-45 s here); CI runs it with make test-slow
def test_the_train_speed_bench_reports_each_precision_and_its_operations(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "train_speed.py"), "configs/toy_transformer.yaml",
                           "--precisions", "fp32,bf16,bf16-autocast", "--steps", "2", "--warmup", "1",
                           "--work", str(tmp_path / "work"), "--json", str(out), "--set", "train.device=cpu",
                           "--profile", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["precision"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"fp32", "bf16", "bf16-autocast"}
    assert all(r["error"] == "" and r["tokens_per_s"] > 0 and r["params"] > 0 and r["shapes"] >= 1 for r in rows.values())
    fp32, copy, autocast = (rows[p]["ops"] for p in ("fp32", "bf16", "bf16-autocast"))
    assert copy <= fp32 + 10  # two multi-tensor copies and the loss's casts
    assert autocast > 1.4 * fp32  # a cast per weight use, forward and backward
    assert "ops/update" in proc.stdout and "bf16-autocast" in proc.stdout
    assert proc.stderr.count("profile of 1 updates, sorted by self CPU time") == 3
