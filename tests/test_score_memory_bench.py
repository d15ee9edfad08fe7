"""bench/score_memory.py: both ways of scoring measured in their own processes, to the same score."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # three bench runs end to end (4 s here); CI runs it with make test-slow
def test_the_score_bench_measures_both_ways_to_one_score():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "score_memory.py"), "--lines", "3000",
                           "--metrics", "chrf"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = re.findall(r"^  chrf  (sacrebleu|nmt) +[\d.]+ s +[\d,]+ MiB peak  score ([\d.]+)$", done.stdout, re.M)
    assert [way for way, _ in rows] == ["sacrebleu", "nmt"], done.stdout
    assert rows[0][1] == rows[1][1]
