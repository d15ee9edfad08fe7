"""bench/compile_probe.py on the CPU: a compiled probe trains as its eager twin does, a probe that
fails is reported with its exit status and last lines while the others still run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # compiles a small model (about 30 s here); CI runs it with make test-slow
def test_the_compile_probe_reports_each_mode_alone(tmp_path: Path):
    results = tmp_path / "probe.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "compile_probe.py"), "--device", "cpu",
                           "--modes", "default,no-such-mode", "--dynamic", "true", "--json", str(results)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    ok = re.search(r"^default +true +ok: [\d.]+ s, largest loss difference from eager (\S+)$", proc.stdout, re.M)
    assert ok and float(ok.group(1)) < 1e-4, proc.stdout
    assert re.search(r"^no-such-mode +true +FAILED \(exit status 1\); its last lines:$", proc.stdout, re.M)
    assert "Unrecognized mode=no-such-mode" in proc.stdout
    written = {r["mode"]: r for r in json.loads(results.read_text())}
    assert written["default"]["ok"] and f"{written['default']['max_loss_diff']:.2e}" == ok.group(1)
    assert not written["no-such-mode"]["ok"] and written["no-such-mode"]["failure"] == "exit status 1"
