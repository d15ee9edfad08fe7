"""bench/compile_probe.py on the CPU: a compiled probe trains as its eager twin does, and a probe that
fails is reported with its exit status and last lines while the others still run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # compiles a small model (about 30 s here); CI runs it with make test-slow
def test_the_compile_probe_reports_each_mode_alone():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "compile_probe.py"), "--device", "cpu",
                           "--modes", "default,no-such-mode", "--dynamic", "true"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    ok = re.search(r"^default +true +ok: [\d.]+ s, largest loss difference from eager (\S+)$", proc.stdout, re.M)
    assert ok and float(ok.group(1)) < 1e-4, proc.stdout
    assert re.search(r"^no-such-mode +true +FAILED \(exit status 1\); its last lines:$", proc.stdout, re.M)
    assert "Unrecognized mode=no-such-mode" in proc.stdout
