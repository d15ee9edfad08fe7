"""bench/data_scale.py end to end on a small corpus: both starts train, and the second reuses every cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_data_scale_bench_times_both_starts_and_the_second_reuses_the_caches(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "data_scale.py"), "--pairs", "3000", "--work",
                           str(tmp_path / "work"), "--json", str(out), "--timeout", "300"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, second = json.loads(out.read_text())
    assert (first["start"], first["step"], second["start"], second["step"]) == ("first", 1, "second", 2)
    assert second["tokenizer"] == 0.0  # the tokenizer was loaded, not trained again
    assert second["cache_files"] == first["cache_files"] > 0  # nothing read or tokenized again
    corpus = tmp_path / "work" / "corpus-3000"
    assert sum(1 for _ in (corpus / "train.de").open(encoding="utf-8")) == 3000
    assert "| 3,000 | second |" in proc.stdout
