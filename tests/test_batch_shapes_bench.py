"""bench/batch_shapes.py on the toy corpus: every padding's epoch is measured, and the shares it prints agree with
batches cut and collated as training builds them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nmt.config import load_config
from nmt.data.collate import Padding
from nmt.train.data import build_sampler, collated_batches, length_arrays, prepare_run

ROOT = Path(__file__).resolve().parents[1]


def run_bench(*args: str) -> subprocess.CompletedProcess:
    """bench/batch_shapes.py on the toy config with `args`, run as a user would; it must succeed."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "batch_shapes.py"), "configs/toy_transformer.yaml", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


@pytest.mark.slow  # a bench run end to end (15 s here); CI runs it with make test-slow
def test_the_batch_shapes_bench_measures_every_padding_as_training_pads(tmp_path: Path) -> None:
    out, run_dir = tmp_path / "rows.json", tmp_path / "run"
    proc = run_bench("--max-tokens", "400,2000", "--run-dir", str(run_dir), "--json", str(out))
    rows = {(r["max_tokens"], r["padding"], r["order"]): r for r in json.loads(out.read_text())}
    assert len(rows) == 2 * 12 and "real tgt %" in proc.stdout

    def row(budget: int, padding: str, order: str = "any") -> dict:
        return rows[budget, padding, order]

    for budget in (400, 2000):
        free, static, relative = row(budget, "free 1", "longer"), row(budget, "static 8"), row(budget, "static rel 8")
        assert free["real_tgt"] > relative["real_tgt"] > static["real_tgt"]  # finer buckets pad less
        assert relative["shapes"] > static["shapes"]  # for more shapes
        assert free["real_tgt"] >= row(budget, "free rel 8", "longer")["real_tgt"] > row(budget, "free 8", "longer")["real_tgt"]
        for name in ("free 1", "free 8", "free rel 8"):  # sorted by both lengths, free batches pad less
            by_lengths, by_longer = row(budget, name, "lengths"), row(budget, name, "longer")
            assert by_lengths["real_tgt"] > by_longer["real_tgt"] and by_lengths["real_src"] > by_longer["real_src"]
            assert by_lengths["batches"] == by_longer["batches"]
        narrow, wide = row(budget, "packed 128", "shuffled"), row(budget, "packed 256", "shuffled")
        assert narrow["shapes"] == wide["shapes"] == 1
        assert wide["real_tgt"] > narrow["real_tgt"] > static["real_tgt"]  # wider rows leave less at their ends
    # the static relative row again, from batches collated as training collates them
    cfg = load_config(ROOT / "configs/toy_transformer.yaml")
    ds = prepare_run(cfg, run_dir).train  # the bench's tokenizer and cache
    padding = Padding(multiple=8, fill_tokens=400, relative=True)
    sampler = build_sampler(ds, max_tokens=400, shuffle=True, seed=cfg.train.seed, rounding=padding.sampler_rounding)
    batches = list(collated_batches(ds, sampler.batch_list(0), padding=padding))
    real = sum(b.ntokens for b in batches) / sum(b.tgt_out.numel() for b in batches)
    assert real == rows[400, "static rel 8", "any"]["real_tgt"]
    assert len({tuple(b.src.shape) for b in batches}) == rows[400, "static rel 8", "any"]["shapes"]
    assert int(length_arrays(ds)[1].sum()) == sum(b.ntokens for b in batches)  # every pair once
    # the corpus's lengths three times over: three times the pairs and the batches, the same shares when packed
    proc = run_bench("--max-tokens", "2000", "--run-dir", str(run_dir), "--json", str(out), "--repeat", "3")
    assert proc.stdout.startswith(f"{3 * len(ds)} training pairs (the corpus 3 times)")
    tripled = {(r["padding"], r["order"]): r for r in json.loads(out.read_text())}
    assert tripled["free 1", "lengths"]["batches"] == pytest.approx(3 * rows[2000, "free 1", "lengths"]["batches"],
                                                                    rel=0.05)
    assert tripled["packed 256", "shuffled"]["real_tgt"] == pytest.approx(
        rows[2000, "packed 256", "shuffled"]["real_tgt"], abs=0.02)


def test_pairs_packed_back_to_back_open_a_row_only_for_a_pair_the_last_one_cannot_hold() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from batch_shapes import packed_rows  # bench/batch_shapes.py

    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 40, 2000), rng.integers(1, 40, 2000)
    src[7], tgt[11] = 70, 65  # longer than a row: a row of its own
    rows = packed_rows(src, tgt, 64)
    assert rows[0] == 0 and set(np.diff(rows)) == {0, 1}  # rows in order, none skipped
    src_sums, tgt_sums = np.bincount(rows, weights=src), np.bincount(rows, weights=tgt)
    alone = np.bincount(rows)[rows[[7, 11]]]
    assert list(alone) == [1, 1]
    fits = np.ones(len(src_sums), dtype=bool)
    fits[rows[[7, 11]]] = False
    assert (src_sums[fits] <= 64).all() and (tgt_sums[fits] <= 64).all()
    for i in np.flatnonzero(np.diff(rows)) + 1:  # each pair that opens a row overflows the row before it
        before = rows[i - 1]
        assert src_sums[before] + src[i] > 64 or tgt_sums[before] + tgt[i] > 64
    assert len(packed_rows(src[:0], tgt[:0], 64)) == 0


@pytest.mark.slow  # two tokenizers trained and two corpora tokenized (25-35 s here); CI runs it with make test-slow
def test_joined_pairs_make_longer_sentences_of_the_same_text(tmp_path: Path) -> None:
    runs = []
    for join in ([], ["--join", "1,3"]):
        out = tmp_path / f"rows{len(join)}.json"
        proc = run_bench("--max-tokens", "2000", "--run-dir", str(tmp_path / f"run{len(join)}"), "--json", str(out),
                         "--set", "data.max_len=400", *join)
        runs.append(proc.stdout.splitlines()[0])  # "N training pairs; mean length S source, T target ..."
    (plain, joined) = ([float(w) for w in line.replace(",", "").split() if w.replace(".", "").isdigit()] for line in runs)
    n = int(plain[0])
    assert joined[0] == 2 * (n // 4) + min(n % 4, 1) + (n % 4 >= 2)  # 1 pair, then 3 pairs, and so on
    assert joined[1] > 1.8 * plain[1]  # mean source length about doubled
    text = (tmp_path / "run2" / "joined.en").read_text(encoding="utf-8").splitlines()
    assert len(text) == joined[0]
