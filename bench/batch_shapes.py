"""How much of each training batch is real tokens, and how many batch shapes, for each way of padding lengths.

    python bench/batch_shapes.py configs/multi30k_transformer.yaml [--max-tokens 4096,32768]
        [--join 1,2,2,4] [--run-dir DIR] [--set key=value ...] [--json out.json]

For each token budget, it cuts an epoch of the config's training data as `nmt train` does
(`TokenBatchSampler`, lengths counted as the padding rounds them) and shapes every batch as
`collate` would (`Padding.shape`), for these paddings:

    free 1          each batch as long as its longest pair (the CPU's default)
    free 8          lengths padded to a multiple of 8 (CUDA's default without CUDA graphs: torchrun,
                    the RNNs, `train.cuda_graphs: false`)
    free rel 8      lengths rounded up in relative steps of at most 8 (`train.length_buckets: relative`)
    static 8        one shape per length bucket, lengths rounded to a multiple of 8, short batches
                    filled with empty pairs (CUDA graphs of a compiled model: each shape compiles)
    static 4, 2     the same with finer buckets
    static rel 8    buckets in relative steps of at most 8 (`Rounding(8, relative=True)`: CUDA graphs
                    of an uncompiled model, `train.cuda_graphs`)
    packed 128, 256 not built in nmt, the bound it would reach: pairs laid back to back in rows of
                    128 (256) source and 128 (256) target positions, in the epoch's shuffled order, a
                    pair that fits on neither side opening a new row (next fit); max_tokens // N rows a
                    batch, so one shape whatever the lengths

Free rows are measured in both orders of `train.batch_order` (pairs sorted by their longer side
alone, or by it, then the source and target lengths); static rows pad both sides of every batch
to its bucket's length whatever the order ("any").

It prints the batches in the epoch, the distinct batch shapes (what static shapes record a CUDA
graph, and a compiled model a compilation, for), the target tokens per batch, and the share of
the computed source and target positions that hold a real token. The rest is padding, computed
for nothing: on a GPU whose step is bound by its kernels, throughput in real tokens is about that
share of what the kernels could do. Nothing is trained; only the lengths are read.

Longer sentences: `--join 1,2,2,4` measures instead a corpus made of the training pairs in a shuffled
order, joined 1, 2, 2, 4, 1, 2, ... at a time into one pair (written to the run directory, which gets
its own tokenizer): Multi30k's mean length doubles, about that of WMT's news sentences. Lines joined
may need a larger `data.max_len` (`--set data.max_len=250`).

At scale: `--repeat K` measures the corpus's lengths K times over, a corpus K times as large with the
same lengths (`--repeat 35`: a million pairs of Multi30k's lengths), where each batch of a sorted epoch
spans fewer lengths; or point `--run-dir` at `bench/data_scale.py`'s run directory (`WORK/run-N`) and
`--set data.train=...` at its corpus, whose tokenizer and tokenized cache are then reused.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from nmt.config import load_config
from nmt.data.batching import TokenBatchSampler
from nmt.data.collate import Padding
from nmt.data.corpus import load_pairs
from nmt.train.data import length_arrays, prepare_run

PADDINGS = {  # name: (multiple, static, relative)
    "free 1": (1, False, False),
    "free 8": (8, False, False),
    "free rel 8": (8, False, True),
    "static 8": (8, True, False),
    "static 4": (4, True, False),
    "static 2": (2, True, False),
    "static rel 8": (8, True, True),
}
PACKED = (128, 256)  # row widths of the `packed N` rows
ORDERS = ("longer", "lengths")  # train.batch_order of the free rows


def packed_rows(src_lens: np.ndarray, tgt_lens: np.ndarray, width: int) -> np.ndarray:
    """The row of each pair, (N,), when pairs of these lengths are laid back to back in this order into rows of
    `width` source and `width` target positions: each pair in the current row if both its sides fit, else in a new
    one (next fit); a pair longer than `width` on a side is a row of its own. A loop over the pairs: about a second
    for a million."""
    rows = np.empty(len(src_lens), dtype=np.int64)
    row, src_used, tgt_used = -1, width, width  # as if a full row were open: the first pair opens one
    for i, (s, t) in enumerate(zip(src_lens.tolist(), tgt_lens.tolist())):
        if src_used + s > width or tgt_used + t > width:
            row, src_used, tgt_used = row + 1, 0, 0
        rows[i], src_used, tgt_used = row, src_used + s, tgt_used + t
    return rows


def measure_packed(src_lens: np.ndarray, tgt_lens: np.ndarray, width: int, max_tokens: int, seed: int) -> dict:
    """What packing pairs back to back (`packed_rows`) in an epoch's shuffled order would compute: batches of
    `max_tokens // width` rows, every one of one shape."""
    order = np.random.default_rng(seed).permutation(len(src_lens))
    rows = int(packed_rows(src_lens[order], tgt_lens[order], width)[-1]) + 1 if len(order) else 0
    batches = -(-rows // max(max_tokens // width, 1))
    real_src, real_tgt = int(src_lens.sum()), int(tgt_lens.sum())
    return {"batches": batches, "shapes": 1, "tgt_tokens_per_batch": real_tgt / max(batches, 1),
            "real_src": real_src / max(rows * width, 1), "real_tgt": real_tgt / max(rows * width, 1)}


def measure(src_lens: np.ndarray, tgt_lens: np.ndarray, padding: Padding, max_tokens: int, seed: int,
            order: str) -> dict:
    """Batches, shapes and real shares of one epoch of pairs of these lengths, sorted in `order`
    (`train.batch_order`), cut and shaped as `padding` says."""
    sampler = TokenBatchSampler(src_lens=src_lens, tgt_lens=tgt_lens, max_tokens=max_tokens, shuffle=True, seed=seed,
                                rounding=padding.sampler_rounding, order=order)  # as `build_sampler` cuts training's
    batches = sampler.batch_list(0)
    shapes, computed_src, computed_tgt = set(), 0, 0
    for rows in batches:
        B, S, T = padding.shape(len(rows), int(src_lens[rows].max()), int(tgt_lens[rows].max()))
        shapes.add((B, S, T))
        computed_src, computed_tgt = computed_src + B * S, computed_tgt + B * T
    # tgt_len counts the target ids plus one: the positions the decoder reads and predicts
    real_src, real_tgt = int(src_lens.sum()), int(tgt_lens.sum())
    return {"batches": len(batches), "shapes": len(shapes), "tgt_tokens_per_batch": real_tgt / max(len(batches), 1),
            "real_src": real_src / max(computed_src, 1), "real_tgt": real_tgt / max(computed_tgt, 1)}


def write_joined(cfg, counts: list[int], folder: Path) -> str:
    """The config's (first) training corpus in a shuffled order, `counts[i % len(counts)]` pairs joined into the
    i-th pair, written as folder/joined.SRC and folder/joined.TGT; the prefix to read it by."""
    data = cfg.data
    pairs = load_pairs(data.train_corpora[0], src_lang=data.src_lang, tgt_lang=data.tgt_lang, cache_dir=folder / "cache")
    order = np.random.default_rng(cfg.train.seed).permutation(len(pairs))
    src, tgt = pairs["src"], pairs["tgt"]
    joined, start = [], 0
    while start < len(order):
        rows = order[start : start + counts[len(joined) % len(counts)]]
        joined.append((" ".join(src[i] for i in rows), " ".join(tgt[i] for i in rows)))
        start += len(rows)
    prefix = folder / "joined"
    for k, lang in enumerate((data.src_lang, data.tgt_lang)):
        Path(f"{prefix}.{lang}").write_text("".join(pair[k] + "\n" for pair in joined), encoding="utf-8")
    return str(prefix)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--max-tokens", default="4096,32768", help="Comma-separated token budgets.")
    ap.add_argument("--run-dir", default=None, help="Where the tokenizer and tokenized cache live "
                                                     "(default: runs/bench/batch_shapes/CONFIG).")
    ap.add_argument("--join", default=None, help="Comma-separated counts of pairs joined into one, in turn "
                                                  "(e.g. 1,2,2,4): measure longer sentences made of the corpus's.")
    ap.add_argument("--repeat", type=int, default=1, metavar="K",
                    help="Measure the corpus's pair lengths K times over: a corpus K times as large.")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="Config override.")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat {args.repeat}: give 1 (the corpus as it is) or more")
    cfg = load_config(args.config, args.set, training=True)
    joined = f"-joined-{args.join.replace(',', '-')}" if args.join else ""
    run_dir = Path(args.run_dir or Path("runs/bench/batch_shapes") / (Path(args.config).stem + joined))
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.join:
        prefix = write_joined(cfg, [int(k) for k in args.join.split(",")], run_dir)
        cfg = load_config(args.config, [*args.set, f"data.train={{kind: text, path: {prefix}}}"], training=True)
    ds = prepare_run(cfg, run_dir).train
    src_lens, tgt_lens = (np.tile(a.astype(np.int64), args.repeat) for a in length_arrays(ds))
    times = f" (the corpus {args.repeat} times)" if args.repeat > 1 else ""
    print(f"{len(src_lens)} training pairs{times}; mean length {src_lens.mean():.1f} source, {tgt_lens.mean():.1f} target "
          f"(ids + 1), longest {src_lens.max()} / {tgt_lens.max()}")
    head = (f"{'max_tokens':>10s} {'padding':13s} {'order':8s} {'batches':>7s} {'shapes':>6s} {'tgt tok/batch':>13s} "
            f"{'real src %':>10s} {'real tgt %':>10s}")
    print(head + "\n" + "-" * len(head))
    results = []

    def report(max_tokens: int, name: str, order: str, measured: dict) -> None:
        results.append({"max_tokens": max_tokens, "padding": name, "order": order, **measured})
        print(f"{max_tokens:10d} {name:13s} {order:8s} {measured['batches']:7d} {measured['shapes']:6d} "
              f"{measured['tgt_tokens_per_batch']:13.0f} {100 * measured['real_src']:10.1f} "
              f"{100 * measured['real_tgt']:10.1f}", flush=True)

    for max_tokens in (int(x) for x in args.max_tokens.split(",")):
        for name, (multiple, static, relative) in PADDINGS.items():
            padding = Padding(multiple=multiple, fill_tokens=max_tokens if static else 0, relative=relative)
            for order in ("any",) if static else ORDERS:  # static batches pad both sides to their bucket: any order
                report(max_tokens, name, order,
                       measure(src_lens, tgt_lens, padding, max_tokens, cfg.train.seed, order.replace("any", "longer")))
        for width in PACKED:
            report(max_tokens, f"packed {width}", "shuffled",
                   measure_packed(src_lens, tgt_lens, width, max_tokens, cfg.train.seed))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
