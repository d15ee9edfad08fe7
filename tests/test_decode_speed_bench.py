"""bench/decode_speed.py end to end on a tiny trained checkpoint: rows per precision, the fastest of
repeated rounds, BLEU against references, the lines identical to another run's saved outputs, a profile of each row,
and outputs of a forced length."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.train.loop import train
from tests.train.helpers import tiny_cfg

ROOT = Path(__file__).resolve().parents[1]


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "decode_speed.py"), *args, "--device", "cpu",
                           "--only", "beam", "--cached-only", "--beam", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a bench run end to end (30-45 s here); CI runs it with make test-slow
def test_the_decode_speed_bench_scores_rows_and_compares_them_with_another_runs_outputs(small_corpus, tmp_path):
    summary = train(tiny_cfg(small_corpus, tmp_path / "run", max_steps=6, device="cpu"))
    ckpt, src, ref = summary["best_checkpoint"], str(small_corpus / "test.en"), str(small_corpus / "test.de")
    first = _bench(ckpt, src, "--ref", ref, "--outputs", str(tmp_path / "first"))
    assert first.returncode == 0, first.stderr[-2000:]
    saved = (tmp_path / "first" / "beam2_cached.txt").read_text(encoding="utf-8").splitlines()
    assert len(saved) == 30

    second = _bench(ckpt, src, "--ref", ref, "--precision", "fp32,bf16", "--against", str(tmp_path / "first"),
                    "--json", str(tmp_path / "rows.json"), "--profile", "--trace", str(tmp_path / "traces"),
                    "--repeat", "2", "--outputs", str(tmp_path / "second"))
    assert second.returncode == 0, second.stderr[-2000:]
    # each precision's lines in a file of their own: bf16's wrote over fp32's
    assert sorted(p.name for p in (tmp_path / "second").iterdir()) == ["beam2_cached.txt", "beam2_cached_bf16.txt"]
    assert (tmp_path / "second" / "beam2_cached.txt").read_text(encoding="utf-8").splitlines() == saved
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert set(rows) == {"beam2_cached_fp32", "beam2_cached_bf16"}
    fp32, bf16 = rows["beam2_cached_fp32"], rows["beam2_cached_bf16"]
    assert fp32["identical"] == 30  # the same checkpoint, device and precision: the same lines
    assert 0 <= bf16["identical"] <= 30 and bf16["precision"] == "bf16"
    assert all(isinstance(r["bleu"], float) and r["sentences_per_s"] > 0 for r in rows.values())
    assert all(r["rounds"] == 2 and r["first_seconds"] >= r["seconds"] for r in rows.values())  # the fastest of two
    assert "30/30" in second.stdout
    assert second.stdout.count("profile of 30 sentences, sorted by self CPU time") == 2
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == ["beam2_cached_bf16.json", "beam2_cached_fp32.json"]

    copies = _bench(ckpt, src, "--ref", ref, "--copies", "3", "--chunk-lines", "7", "--outputs", str(tmp_path / "copies"),
                    "--json", str(tmp_path / "copies.json"))
    assert copies.returncode == 0, copies.stderr[-2000:]
    assert "90 sentences from" in copies.stdout and "(3 copies)" in copies.stdout
    assert json.loads((tmp_path / "copies.json").read_text())["beam2_cached_fp32"]["chunk_lines"] == 7
    # chunks of 7 lines, as `nmt translate` reads a file, translate each line as one batch of all did
    assert (tmp_path / "copies" / "beam2_cached.txt").read_text(encoding="utf-8").splitlines() == saved * 3

    short = tmp_path / "short.en"
    short.write_text("one line\n", encoding="utf-8")
    mismatch = _bench(ckpt, str(short), "--against", str(tmp_path / "first"))
    assert mismatch.returncode != 0 and "beam2_cached.txt: 30 lines, but this run translated 1" in mismatch.stderr
    no_rounds = _bench(ckpt, src, "--repeat", "0")
    assert no_rounds.returncode == 2 and "--repeat 0: give 1 or more rounds" in no_rounds.stderr

    forced = _bench(ckpt, src, "--output-len", "12", "--outputs", str(tmp_path / "forced"), "--json", str(tmp_path / "forced.json"))
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert "every output 12 subwords" in forced.stdout
    assert json.loads((tmp_path / "forced.json").read_text())["beam2_cached_fp32"]["target_tokens"] == 30 * 13  # EOS too
    no_length = _bench(ckpt, src, "--output-len", "0")
    assert no_length.returncode == 2 and "--output-len 0: give 1 or more subwords" in no_length.stderr
