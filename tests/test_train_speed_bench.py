"""bench/train_speed.py end to end on the toy corpus: each precision row trains, and the bf16 copy dispatches
about as few operations per update as fp32 while autocast adds its casts; bench/batch_speed.py builds the
same batches both ways."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

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
    assert all(0.5 < r["real"] <= 1 and r["lengths"] == "lengths as they are" for r in rows.values())  # CPU: free
    assert "real %" in proc.stdout
    assert all(r["syncs"] is None for r in rows.values()) and "syncs" in proc.stdout  # counted on CUDA only
    assert proc.stderr.count("profile of 1 updates, sorted by self CPU time") == 3
    assert proc.stderr.count(" ms per update (wall, profiled)") == 3
    assert len(re.findall(r"host time per update: .*nmt\.optimizer [\d.]+ ms", proc.stderr)) == 3


@pytest.mark.gpu
def test_host_syncs_counts_each_wait_for_the_gpu_and_nothing_else():
    sys.path.insert(0, str(ROOT / "bench"))
    from profiling import host_syncs

    x = torch.randn(1000, device="cuda", requires_grad=True)
    assert host_syncs(lambda: (x * 2).sum().backward(), x.device) == 0
    assert host_syncs(lambda: [(x + i).sum().item() for i in range(3)], x.device) == 3
    assert host_syncs(lambda: x.nonzero(), x.device) >= 1
    assert host_syncs(lambda: None, torch.device("cpu")) is None


@pytest.mark.slow  # a bench run end to end (4 s here); CI runs it with make test-slow
def test_the_half_copy_bench_times_the_bookkeeping_of_the_configs_model() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "half_copy_speed.py"), "configs/toy_transformer.yaml",
                           "--device", "cpu", "--vocab", "50", "--updates", "3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.fullmatch(r"transformer, \d+ parameter tensors, [\d.]+M parameters, cpu: median \d+ us of host time "
                        r"per update\n", proc.stdout), proc.stdout


def test_the_train_speed_bench_refuses_an_unknown_attention_kernel_in_one_line(monkeypatch, capsys) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    monkeypatch.setattr(sys, "argv", [str(ROOT / "bench" / "train_speed.py")])  # argparse names the program by it
    import train_speed  # bench/train_speed.py, called as its command line calls it

    with pytest.raises(SystemExit) as done:
        train_speed.main(["configs/toy_transformer.yaml", "--attention", "math,xformers", "--set", "train.device=cpu"])
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "train_speed.py: error: --attention 'math,xformers': use a comma-separated choice of flash, efficient, math, "
        "cudnn, each once, in the order to try them")


def test_the_host_phases_are_the_labelled_ranges_per_step_longest_first():
    sys.path.insert(0, str(ROOT / "bench"))
    from profiling import Profile, host_phases
    from torch.profiler import record_function

    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.Adam(model.parameters())
    with Profile(torch.device("cpu")) as prof:
        for _ in range(3):
            with record_function("nmt.forward_backward"):
                model(torch.randn(256, 64)).pow(2).sum().backward()
            with record_function("nmt.optimizer"):
                optimizer.step()
                optimizer.zero_grad()
    phases = dict(host_phases(prof._prof.key_averages(), 3))
    assert {"nmt.forward_backward", "nmt.optimizer", "Optimizer.step#Adam.step"} <= set(phases)
    assert not any(name.startswith("aten::") for name in phases)  # operators are inside the phases, not phases
    assert phases["nmt.optimizer"] >= phases["Optimizer.step#Adam.step"] > 0  # the step runs inside the range
    times = list(dict(host_phases(prof._prof.key_averages(), 3)).values())
    assert times == sorted(times, reverse=True)
    assert sum(phases.values()) < 1e3 * prof.seconds  # per step, so together less than the whole block's wall time
    line = next(x for x in prof.summary(3, "update").splitlines() if x.startswith("host time per update: "))
    assert "nmt.forward_backward" in line and "nmt.optimizer" in line


def test_the_gpu_busy_time_counts_overlapping_kernels_once():
    sys.path.insert(0, str(ROOT / "bench"))
    from profiling import covered

    assert covered([]) == 0
    assert covered([(5, 7), (0, 2)]) == 4  # apart, in any order
    assert covered([(0, 4), (1, 2), (3, 6)]) == 6  # one inside another, one overlapping its end
    assert covered([(0, 2), (2, 3)]) == 3  # touching


@pytest.mark.gpu
def test_the_gpu_busy_time_leaves_out_the_idle_gaps_inside_a_labelled_range():
    sys.path.insert(0, str(ROOT / "bench"))
    from profiling import Profile

    x = torch.randn(1 << 20, device="cuda")
    with Profile(x.device) as prof, torch.profiler.record_function("nmt.forward_backward"):
        x.mul_(2)
        torch.cuda.synchronize()
        time.sleep(0.2)  # the GPU idles here, inside the range
        x.mul_(2)
    assert prof.kernels() == 2
    assert prof.kernel_seconds() < 0.05 < 0.2 < prof.seconds


@pytest.mark.slow  # trains the toy tokenizer first (about 15 s here); CI runs it with make test-slow
def test_the_batch_speed_bench_builds_the_same_batches_both_ways(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "batch_speed.py"), "configs/toy_transformer.yaml",
                           "--max-tokens", "512,2048", "--batches", "3", "--run-dir", str(tmp_path / "run"),
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [r["max_tokens"] for r in rows] == [512, 2048]
    assert all(r["identical"] and r["batches"] == 3 and r["dataset_ms"] > 0 and r["idcolumns_ms"] > 0
               and r["from_worker_ms"] > 0 for r in rows)
    assert rows[1]["pairs_per_batch"] > rows[0]["pairs_per_batch"]


def test_the_train_speed_bench_joins_consecutive_pairs_into_longer_sentences(tmp_path: Path) -> None:
    """`--join K`: sentences K times as long, as news corpora have them, from the config's own corpus."""
    sys.path.insert(0, str(ROOT / "bench"))
    from train_speed import joined_corpus

    from nmt.config import CorpusConfig, load_config
    from nmt.data.corpus import load_pairs
    from nmt.errors import UserError

    cfg = load_config(ROOT / "configs" / "toy_transformer.yaml")
    joined = joined_corpus(cfg, 3, tmp_path)
    assert joined.data.max_len == 3 * cfg.data.max_len and joined.model == cfg.model
    langs = dict(src_lang=cfg.data.src_lang, tgt_lang=cfg.data.tgt_lang)
    original = load_pairs(cfg.data.train, **langs, cache_dir=tmp_path / "original")
    ours = load_pairs(joined.data.train, **langs, cache_dir=tmp_path / "ours")
    assert len(ours) == len(original) // 3 > 100
    for i in (0, len(ours) // 2, len(ours) - 1):
        for column in ("src", "tgt"):
            assert ours[i][column] == " ".join(original[3 * i + j][column].strip() for j in range(3))
    heavier = replace(cfg, data=replace(cfg.data, train=CorpusConfig(kind="text", path=cfg.data.train.path, weight=2)))
    with pytest.raises(UserError, match=r"has weight 2\b"):
        joined_corpus(heavier, 2, tmp_path / "again")
