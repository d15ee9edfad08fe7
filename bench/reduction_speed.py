"""The gradients that are column sums, each way of computing them, at the widths of a training update.

    python bench/reduction_speed.py [CONFIG] [--shape config|base] [--tokens N] [--device cuda] [--dtype bf16]
        [--steps 50] [--json FILE]

A Linear layer's bias gradient is its output gradient g (N, D) summed over the N positions of the batch,
and a LayerNorm's weight and bias gradients are such sums too, of g * x_hat and of g. On an H200 a
recorded Multi30k update (2026-11-27, bench/MEASUREMENTS.md) spent 0.34 of its 3.78 ms of kernels on
its 33 bias sums, about 10 us each for a few MB, and Transformer-base 3.3 of its 56 ms on LayerNorm's
weight and bias gradients. This times each way of computing them on the widths of the config's model
(`--shape base`: Transformer-base's), for batches of N positions (the config's `train.max_tokens`, or
32,768 for base):

    bias   sum      g.sum(0): what autograd runs for a Linear's bias
           mv       g^T times a vector of ones: a matrix-vector product
    norm   native   torch's LayerNorm backward, its weight and bias gradients alone
           sums     x_hat = (x - mean) * rstd, then (g * x_hat).sum(0) and g.sum(0)
           mv       the same two sums as matrix-vector products

`max diff` is the largest difference from the sums in fp64, in units of their largest value. On CUDA a
row's calls are recorded as one CUDA graph and replayed, as a recorded update replays them
(`train.cuda_graphs`), so its time is the kernels' and not their launches'. `update ms` sums one
update's worth: each of the model's Linear biases and LayerNorms once.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
from torch import Tensor, nn
from train_speed import BASE  # bench/train_speed.py, beside this script

from nmt.config import load_config
from nmt.models import build_model
from nmt.runtime import HALF_DTYPES

DTYPES = {"fp32": torch.float32, **HALF_DTYPES}
KINDS = ("bias", "norm")


@dataclass
class Row:
    kind: str  # bias, norm
    width: int
    count: int  # how many of the model's layers have this width
    way: str
    us: float = 0.0  # one call
    gb_per_s: float = 0.0  # the bytes the sums must read, over the time
    max_diff: float = 0.0


def widths(model: nn.Module) -> dict[str, collections.Counter[int]]:
    """How many Linear biases and LayerNorms of each width the model has."""
    found: dict[str, collections.Counter[int]] = {kind: collections.Counter() for kind in KINDS}
    for m in model.modules():
        if isinstance(m, nn.Linear) and m.bias is not None:
            found["bias"][m.out_features] += 1
        elif isinstance(m, nn.LayerNorm) and m.bias is not None:
            found["norm"][m.normalized_shape[-1]] += 1
    return found


def _ways(kind: str, g: Tensor, x: Tensor, weight: Tensor) -> dict[str, Callable[[], tuple[Tensor, ...]]]:
    """Each way of `kind`'s sums of (N, D) `g` (and, for a LayerNorm, its input `x` and `weight`)."""
    ones = torch.ones(g.size(0), dtype=g.dtype, device=g.device)
    if kind == "bias":
        return {"sum": lambda: (g.sum(0),), "mv": lambda: (torch.mv(g.t(), ones),)}
    D, bias = g.size(1), torch.zeros_like(weight)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [D], weight, bias, 1e-5)  # what the forward saves

    def native() -> tuple[Tensor, ...]:
        _, dw, db = torch.ops.aten.native_layer_norm_backward(g, x, [D], mean, rstd, weight, bias,
                                                              [False, True, True])
        return dw, db

    def x_hat_g() -> Tensor:  # in fp32, as torch's kernel computes it
        return (x.float() - mean.float()) * rstd.float() * g.float()

    return {"native": native, "sums": lambda: (x_hat_g().sum(0), g.sum(0)),
            "mv": lambda: (torch.mv(x_hat_g().t(), ones.float()), torch.mv(g.t(), ones))}


def _reference(kind: str, g: Tensor, x: Tensor) -> tuple[Tensor, ...]:
    g64 = g.double()
    if kind == "bias":
        return (g64.sum(0),)
    x64 = x.double()
    x_hat = (x64 - x64.mean(1, keepdim=True)) * torch.rsqrt(x64.var(1, keepdim=True, correction=0) + 1e-5)
    return (x_hat * g64).sum(0), g64.sum(0)


def _timed(fn: Callable[[], object], steps: int, device: torch.device) -> float:
    """Seconds per call of `fn`: on CUDA `steps` calls recorded as one graph and replayed, elsewhere called."""
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        return (time.perf_counter() - start) / steps
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # what runs before a recording runs on a side stream
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(steps):
            fn()
    graph.replay()
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / steps


def measure(kind: str, width: int, count: int, *, tokens: int, dtype: torch.dtype, steps: int,
            device: torch.device, seed: int = 0) -> list[Row]:
    """Every way's row for `kind`'s sums over `tokens` positions of `width`."""
    gen = torch.Generator().manual_seed(seed)
    g, x = (torch.randn(tokens, width, generator=gen).to(device, dtype) for _ in range(2))
    weight = torch.ones(width, dtype=dtype, device=device)
    reference = _reference(kind, g, x)
    scale = max(float(r.abs().max()) for r in reference)
    read = g.numel() * g.element_size() * (1 if kind == "bias" else 2)  # g, and for a LayerNorm x
    rows = []
    for way, fn in _ways(kind, g, x, weight).items():
        got = fn()
        diff = max(float((a.double() - r).abs().max()) for a, r in zip(got, reference, strict=True)) / scale
        seconds = _timed(fn, steps, device)
        rows.append(Row(kind=kind, width=width, count=count, way=way, us=1e6 * seconds,
                        gb_per_s=read / seconds / 1e9, max_diff=diff))
    return rows


def update_ms(rows: list[Row], kind: str, way: str) -> float:
    """One update's time for `kind`'s sums computed `way`: each layer of each width once."""
    return sum(r.count * r.us for r in rows if r.kind == kind and r.way == way) / 1e3


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", default="configs/multi30k_transformer.yaml",
                    help="A Transformer config: the model whose widths are timed.")
    ap.add_argument("--shape", default="config", choices=("config", "base"),
                    help="The config's model, or Transformer-base (6+6 layers, d_model 512, FFN 2048).")
    ap.add_argument("--tokens", type=int, default=0,
                    help="Positions per batch (default: the config's train.max_tokens; 32768 for base).")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--steps", type=int, default=50, help="Timed calls per row.")
    ap.add_argument("--json", help="Also write the rows to this file.")
    args = ap.parse_args(argv)

    cfg = load_config(args.config)
    if cfg.model.type != "transformer":
        ap.error(f"{args.config} has an {cfg.model.type} model: use a Transformer config")
    model_cfg = cfg.model
    if args.shape == "base":
        model_cfg = replace(model_cfg, transformer=replace(model_cfg.transformer, **BASE))
    tokens = args.tokens or (32768 if args.shape == "base" else cfg.train.max_tokens)
    vocab = cfg.tokenizer.vocab_size
    found = widths(build_model(model_cfg, src_vocab_size=vocab, tgt_vocab_size=vocab, pad_id=0))
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {device} ({name}), torch {torch.__version__}, {args.dtype}, {tokens} positions, "
          f"{args.shape} model of {args.config}, {args.steps} calls per row"
          + (" replayed as one CUDA graph" if device.type == "cuda" else ""))
    print(f"{'kind':<5} {'width':>6} {'layers':>6} {'way':<7} {'us':>8} {'GB/s':>7} {'max diff':>9}")
    rows: list[Row] = []
    for kind in KINDS:
        for width, count in sorted(found[kind].items()):
            for row in measure(kind, width, count, tokens=tokens, dtype=DTYPES[args.dtype], steps=args.steps,
                               device=device):
                rows.append(row)
                print(f"{row.kind:<5} {row.width:>6} {row.count:>6} {row.way:<7} {row.us:>8.1f} "
                      f"{row.gb_per_s:>7.0f} {row.max_diff:>9.1e}", flush=True)
    print("\nupdate ms: one update's sums, each of the model's layers once")
    for kind in KINDS:
        ways = dict.fromkeys(r.way for r in rows if r.kind == kind)  # in the order measured
        print(f"  {kind}: " + ", ".join(f"{way} {update_ms(rows, kind, way):.3f}" for way in ways))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": name, "dtype": args.dtype, "tokens": tokens, "rows": [asdict(r) for r in rows]},
                      f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
