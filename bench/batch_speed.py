"""Building training batches: milliseconds per batch as `nmt train` builds them, against `dataset[indices]`.

    python bench/batch_speed.py configs/multi30k_transformer.yaml [--max-tokens 4096,32768] [--batches 50]
        [--run-dir DIR] [--set key=value ...] [--json out.json]

For each token budget it cuts an epoch's batches as training does (shuffled, lengths
padded as on a GPU: `--multiple`, default 8) and builds the first `--batches` of them
two ways from the same rows, twice over (the second round is timed):

    dataset     `dataset[indices]` (every id a Python int) padded by `collate`, as the
                training loop built batches before `IdColumns`
    IdColumns   `IdColumns.gather` (NumPy views of the Arrow table) padded by
                `collate_flat`, as `nmt train` builds them now

It checks that both give identical batches. With `train.num_workers: 0` (the default)
the training process builds every batch itself, so on a GPU this is host time in
every update. With `train.num_workers` 1 or more it receives each batch from a worker
instead: `from worker ms` is the training process's time to take one batch that a
worker built in advance (`batch_loader` with one worker, 20 ms of pretended step
between batches), which is what a worker saves only where it is below `IdColumns ms`.

At scale: run `bench/data_scale.py --pairs N` first, then point `--run-dir` at its run
directory (`WORK/run-N`) and `--set data.train=...`/`data.valid=...` at its corpus, as
`bench/data_scale.py` configures them; the tokenizer and tokenized cache are reused.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from nmt.config import load_config
from nmt.data.collate import Padding, collate, collate_flat
from nmt.data.dataset import IdColumns
from nmt.data.tokenizer import PAD_ID
from nmt.train.data import batch_loader, build_sampler, prepare_run

FIELDS = ("src", "src_pad_mask", "tgt_in", "tgt_out", "indices")


def measure(ds, lists: list[list[int]], padding: Padding) -> dict:
    """Seconds per batch of both ways over `lists` (second of two rounds), and whether they agree."""
    columns = ds.select_columns(["src_ids", "tgt_ids"])
    ids = IdColumns(ds)
    for _ in range(2):
        t0 = time.perf_counter()
        old = [collate(columns[idx], idx, pad_id=PAD_ID, padding=padding) for idx in lists]
        t1 = time.perf_counter()
        new = [collate_flat(*ids.gather(idx), idx, pad_id=PAD_ID, padding=padding) for idx in lists]
        t2 = time.perf_counter()
    same = all(a.ntokens == b.ntokens and all(torch.equal(getattr(a, f), getattr(b, f)) for f in FIELDS)
               for a, b in zip(old, new, strict=True))
    return {"dataset_ms": 1e3 * (t1 - t0) / len(lists), "idcolumns_ms": 1e3 * (t2 - t1) / len(lists), "identical": same}


def from_worker(ds, lists: list[list[int]], padding: Padding, step_s: float = 0.02) -> float:
    """Median seconds the training process spends taking a batch from a loader worker that built it in advance."""
    loader = iter(batch_loader(ds, lists, num_workers=1, padding=padding))
    waits = []
    for _ in lists:
        time.sleep(step_s)  # the step, while the worker builds the next batches
        start = time.perf_counter()
        next(loader)
        waits.append(time.perf_counter() - start)
    return statistics.median(waits[min(5, len(waits) - 1):])  # after the worker's start


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--max-tokens", default="4096,32768", help="Comma-separated token budgets.")
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--multiple", type=int, default=8, help="Round lengths up to this (8: as on a GPU).")
    ap.add_argument("--run-dir", type=Path, default=None,
                    help="Where the tokenizer and data caches are (default runs/bench/CONFIG).")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", type=Path, help="Also write the rows here.")
    args = ap.parse_args(argv)

    cfg = load_config(args.config, args.overrides, training=True)
    run_dir = args.run_dir or Path("runs/bench") / Path(args.config).stem
    run_dir.mkdir(parents=True, exist_ok=True)
    data = prepare_run(cfg, run_dir)
    ds = data.train
    print(f"{len(ds):,} training pairs in {ds.data.column('src_ids').num_chunks} Arrow chunks ({run_dir})", flush=True)
    rows = []
    print(f"{'max_tokens':>10} {'pairs/batch':>11} {'dataset ms':>10} {'IdColumns ms':>12} {'speed-up':>8} "
          f"{'from worker ms':>14} identical")
    for budget in (int(b) for b in args.max_tokens.split(",")):
        sampler = build_sampler(ds, max_tokens=budget, shuffle=True, seed=cfg.train.seed)
        lists = [list(map(int, b)) for b in sampler.batch_list(0)[: args.batches]]
        r = {"max_tokens": budget, "batches": len(lists), "pairs_per_batch": sum(map(len, lists)) / len(lists),
             "pairs": len(ds), **measure(ds, lists, Padding(multiple=args.multiple))}
        r["from_worker_ms"] = 1e3 * from_worker(ds, lists, Padding(multiple=args.multiple))
        rows.append(r)
        print(f"{budget:>10} {r['pairs_per_batch']:>11.0f} {r['dataset_ms']:>10.2f} {r['idcolumns_ms']:>12.2f} "
              f"{r['dataset_ms'] / r['idcolumns_ms']:>7.1f}x {r['from_worker_ms']:>14.2f} {r['identical']}",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if not all(r["identical"] for r in rows):
        raise SystemExit("batch_speed: the two ways built different batches")


if __name__ == "__main__":
    main()
