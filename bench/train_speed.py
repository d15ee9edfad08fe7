"""Training throughput: target tokens/s, model FLOP utilisation and peak memory, in one table.

    python bench/train_speed.py configs/multi30k_transformer.yaml \\
        [--shapes config,base] [--precisions fp32,bf16,bf16-autocast] [--compile off,on,reduce-overhead] \\
        [--update-graphs off,on] [--steps 30] [--warmup 5] [--reference] [--attention efficient,flash,math] \\
        [--json results.json] [--set k=v ...]

Each row trains one model shape at one precision, eager or compiled, on the same
real batches (the config's training data and tokenizer), with what `nmt train`
uses: the model, loss, optimizer and schedule from `nmt.train.setup.build_trainable`,
readied by `prepare_step` (the bf16 copy, `torch.compile`), batches cut and padded as training
does (`train.pad_to_multiple`, `train.batch_shapes`), and `nmt.train.step.train_step`.
`--join K` trains on sentences K times as long: each K consecutive training pairs of the
config's corpus joined into one (written under `--work`), with `data.max_len` K times the
config's. Multi30k's sentences are short (about 13 words); joined by 2 or 4, they have the
lengths of news or web corpora (WMT), where attention fills more of a kernel's tiles.
`--compile` takes off, on (the config's `train.compile_mode`) or a mode's name, e.g.
reduce-overhead (CUDA graphs, with static batch shapes unless `train.batch_shapes: free`);
a compiled row first runs each batch shape of its timed updates three times, so that
compiling and graph recording stay out of the timing. `--update-graphs on` records each batch
shape's whole update as a CUDA graph (`train.cuda_graphs`; its compile column reads `MODE+update`),
after the eager uses training gives a shape first. Shapes: `config` is the config's model and
`train.max_tokens`; `base` is Transformer-base (6+6 layers, d_model 512, 8 heads,
FFN 2048: `configs/transformer_base.yaml`) with `--base-max-tokens` tokens per batch. `--reference` adds
torch.nn.Transformer of each shape (eager) as a yardstick. Precisions `bf16` and `fp16` train as
`train.half_weights: auto` does (bf16 on a bf16 copy of the weights, fp16 under autocast); a suffix
chooses: `bf16-autocast`, `fp16-copy` (an fp16 copy of the weights).

`shapes` is the number of distinct batch shapes among the timed updates, `real %` the share of their
target positions that hold a real token rather than padding (the rest is computed for nothing: static
shapes pad each batch to its length bucket, see `train.pad_to_multiple`). `ops/update` counts
the aten operations one eager update dispatches (views and allocations, which launch nothing,
left out): on a GPU nearly each is a kernel launch, and a small model whose step is bound by
launches is as fast as this count is low. `syncs` (CUDA only) counts the times one update makes
the host wait for the GPU (torch's sync debug mode): each drains the queue of launched kernels, so
a launch-bound step should have none. Before the timing, each row runs every batch shape the timing
will meet (compiled rows three times, printing a line for each): the figures are a long run's steady state.

The steps run back to back without waiting for the device; the clock stops after
the last one finishes (`torch.cuda.synchronize`), so the figure includes every
host-side cost a training run has, and none it does not.

FLOPs (for MFU) are counted per sentence pair from its unpadded lengths s (source,
EOS included) and t (target + 1), as 3x the forward matrix products (forward and
backward), with D = d_model, F = ff_dim, V = target vocabulary:
    encoder layer:  8 s D^2 + 4 s^2 D + 4 s D F        (projections, attention, FFN)
    decoder layer:  8 t D^2 + 2 t^2 D                   (self-attention, causal half)
                  + 4 t D^2 + 4 s D^2 + 4 t s D         (cross-attention)
                  + 4 t D F                             (FFN)
    output layer:   2 t D V
MFU is that count per second over the GPU's dense bf16 peak (fp32 rows too, so
rows compare directly; TF32's peak is half of it). The count is a Transformer's:
rows of RNN configs show no TFLOP/s nor MFU.

An RNN compiles by step (`RNNSeq2Seq.compile`): its compiled rows compile one
decoder step, which every target length reuses.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from profiling import OpCount, Profile, host_syncs  # bench/profiling.py, beside this script
from torch import nn

from nmt.config import CorpusConfig, load_config
from nmt.data.corpus import load_pairs
from nmt.data.tokenizer import PAD_ID
from nmt.distributed import Dist
from nmt.errors import UserError
from nmt.heap import keep_freed_memory
from nmt.kernels import ATTENTION_KERNELS, SDPA_KERNELS, enable_fast_math, set_attention_kernels
from nmt.models import count_parameters
from nmt.runtime import pick_device, seed_everything
from nmt.train.data import (
    batch_padding,
    build_sampler,
    collated_batches,
    length_arrays,
    prepare_run,
)
from nmt.train.graphs import EAGER_USES
from nmt.train.setup import batch_shape_count, build_trainable, prepare_step
from nmt.train.step import train_step

# Dense bf16 peak of common GPUs (FLOP/s).
_PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}

COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

ROOT = Path(__file__).resolve().parents[1]

BASE = {k: getattr(load_config(ROOT / "configs" / "transformer_base.yaml").model.transformer, k)
        for k in ("d_model", "heads", "encoder_layers", "decoder_layers", "ff_dim")}
"""Transformer-base's shape, as `configs/transformer_base.yaml` gives it; the rest of the model's config
(dropout, tied embeddings, the vocabulary) stays the benched config's."""


class ReferenceTransformer(nn.Module):
    """torch.nn.Transformer with embeddings, sinusoidal positions and a tied output layer."""

    def __init__(self, *, vocab: int, d_model: int, heads: int, enc: int, dec: int, ff: int, dropout: float,
                 pre_norm: bool):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model, padding_idx=PAD_ID)
        self.core = nn.Transformer(d_model, heads, enc, dec, ff, dropout, batch_first=True, norm_first=pre_norm)
        self.out = nn.Linear(d_model, vocab, bias=False)
        self.out.weight = self.embed.weight
        pos = torch.arange(4096).unsqueeze(1)
        div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(4096, d_model)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        self.register_buffer("pe", pe, persistent=False)
        self.scale = math.sqrt(d_model)

    def forward(self, src, src_pad_mask, tgt_in):
        s = self.embed(src) * self.scale + self.pe[: src.size(1)]
        t = self.embed(tgt_in) * self.scale + self.pe[: tgt_in.size(1)]
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1), device=src.device, dtype=torch.bool)
        h = self.core(s, t, tgt_mask=causal, src_key_padding_mask=src_pad_mask,
                      tgt_key_padding_mask=tgt_in.eq(PAD_ID), memory_key_padding_mask=src_pad_mask)
        return self.out(h)


def train_flops(src_lens: np.ndarray, tgt_lens: np.ndarray, *, d: int, ff: int, enc: int, dec: int, vocab: int) -> float:
    """Forward plus backward matrix-product FLOPs of a batch of pairs (see the module docstring)."""
    s, t = src_lens.astype(np.float64), tgt_lens.astype(np.float64)
    encoder = enc * (8 * s * d * d + 4 * s * s * d + 4 * s * d * ff)
    decoder = dec * (8 * t * d * d + 2 * t * t * d + 4 * t * d * d + 4 * s * d * d + 4 * t * s * d + 4 * t * d * ff)
    return float(3 * (encoder + decoder + 2 * t * d * vocab).sum())


@dataclass
class Row:
    shape: str
    model: str
    precision: str
    compile: str  # off, or torch.compile's mode
    max_tokens: int
    cuda_graphs: bool = False  # `train.cuda_graphs`: each batch shape's whole update recorded and replayed
    params: int = 0
    tokens_per_s: float = 0.0
    seconds_per_step: float = 0.0
    tflops: float | None = None  # Transformers only: the FLOP count is theirs
    mfu: float | None = None
    peak_mem_mib: float | None = None
    warmup_s: float = 0.0
    ops: int | None = None
    syncs: int | None = None  # host waits for the GPU in one update (CUDA only)
    shapes: int = 0
    real: float = 0.0  # the share of the timed batches' target positions that hold a real token, not padding
    lengths: str = ""  # how the row's batches round their lengths (`Rounding`)
    error: str = ""

    @property
    def compiled(self) -> bool:
        return self.compile != "off"

    @property
    def how(self) -> str:
        """The compile mode, `+update` with update graphs."""
        return self.compile + ("+update" if self.cuda_graphs else "")


def joined_corpus(cfg, k: int, folder: Path):
    """`cfg` training on its corpus with each k consecutive pairs joined into one (text files in `folder`,
    written once), `data.max_len` k times as large."""
    prefix = folder / "joined"
    src_file, tgt_file = (Path(f"{prefix}.{lang}.gz") for lang in (cfg.data.src_lang, cfg.data.tgt_lang))
    if not tgt_file.exists():
        for spec in cfg.data.train_corpora:
            if spec.weight != 1.0:
                raise UserError(f"--join: the training corpus {spec.paths[0]} has weight {spec.weight}; "
                                "join a config whose corpora have weight 1")
        pairs = [load_pairs(spec, src_lang=cfg.data.src_lang, tgt_lang=cfg.data.tgt_lang, cache_dir=folder / "cache")
                 for spec in cfg.data.train_corpora]
        for column, file in (("src", src_file), ("tgt", tgt_file)):
            lines = [line.strip() for corpus in pairs for line in corpus[column]]
            joined = (" ".join(lines[i: i + k]) for i in range(0, len(lines) - k + 1, k))
            with gzip.open(f"{file}.tmp", "wt", encoding="utf-8") as out:
                out.writelines(line + "\n" for line in joined)
        for file in (src_file, tgt_file):  # the target last: its presence says both are whole
            Path(f"{file}.tmp").replace(file)
    data = replace(cfg.data, train=CorpusConfig(kind="text", path=str(prefix)), max_len=cfg.data.max_len * k)
    return replace(cfg, data=data)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# what a precision's suffix makes `train.half_weights`: none as training's default, -copy, -autocast
HALF_WAYS = {"": "auto", "copy": True, "autocast": False}


def run_row(row: Row, cfg, data, device: torch.device, *, steps: int, warmup: int, reference: bool,
            peak: float | None, profile: int = 0, trace: Path | None = None) -> Row:
    """Train `steps` timed updates after `warmup` ones; fill in the row's figures."""
    precision, _, way = row.precision.partition("-")  # bf16-autocast: bf16 without the bf16 copy
    tc = replace(cfg.train, precision=precision, half_weights=HALF_WAYS[way], max_tokens=row.max_tokens,
                 compile=row.compiled, compile_mode=row.compile if row.compiled else cfg.train.compile_mode,
                 cuda_graphs=row.cuda_graphs)
    t = cfg.model.transformer
    tok = data.tokenizer
    seed_everything(tc.seed)
    if row.compiled:
        torch._dynamo.reset()  # each compiled row compiles afresh, its warm-up timed
    model = None
    if reference:
        model = ReferenceTransformer(vocab=tok.tgt_vocab_size, d_model=t.d_model, heads=t.heads, enc=t.encoder_layers,
                                     dec=t.decoder_layers, ff=t.ff_dim, dropout=t.dropout, pre_norm=t.norm == "pre")
    run_cfg = replace(cfg, train=tc)
    parts = build_trainable(run_cfg, tok, device, model=model)  # what `nmt train` builds, unwrapped
    parts.model.train()
    row.params = count_parameters(parts.model)
    padding = batch_padding(tc, device, cfg.model)
    sampler = build_sampler(data.train, max_tokens=tc.max_tokens, shuffle=True, seed=tc.seed,
                            rounding=padding.sampler_rounding, order=tc.batch_order)
    prepare_step(parts, tc, device, Dist(), shapes=batch_shape_count(sampler, tc, device))
    lists = sampler.batch_list(0)[: steps + warmup]
    batches = [b.to(device) for b in collated_batches(data.train, lists, padding=padding)]
    # the batches the timing runs: an epoch shorter than the warm-up and the timed updates (Transformer-base's
    # 32,768-token batches make 16 of Multi30k) comes round again, so the warm-up's batches are timed too
    timed = [i % len(batches) for i in range(warmup, warmup + steps)]
    row.shapes = len({batches[i].shape for i in timed})
    row.real = sum(batches[i].ntokens for i in timed) / sum(batches[i].tgt_out.numel() for i in timed)
    row.lengths = str(padding.rounding) + (", static shapes" if padding.fill_tokens else "")
    print(f"  {row.precision} {row.how}: {row.lengths}", file=sys.stderr, flush=True)
    src_lens, tgt_lens = length_arrays(data.train)  # straight from Arrow: a lazy column is walked row by row
    counted = cfg.model.type == "transformer"  # an RNN's FLOPs are not counted: its rows show no TFLOP/s nor MFU
    # tgt_len is the target ids plus one: what the decoder reads (BOS first) and predicts (EOS last).
    flops = [train_flops(src_lens[idx], tgt_lens[idx], d=t.d_model, ff=t.ff_dim, enc=t.encoder_layers,
                         dec=t.decoder_layers, vocab=tok.tgt_vocab_size) if counted else 0.0 for idx in lists]

    def run(first: int, count: int) -> tuple[float, int, float]:
        _sync(device)
        start, tokens, work = time.perf_counter(), 0, 0.0
        for i in range(first, first + count):
            b = batches[i % len(batches)]
            train_step(parts, [b], tc, device)
            tokens, work = tokens + b.ntokens, work + flops[i % len(batches)]
        _sync(device)
        return time.perf_counter() - start, tokens, work

    start = time.perf_counter()
    if row.compiled:
        print(f"  {row.precision} {row.how}: compiling over {warmup} warm-up updates", file=sys.stderr, flush=True)
    run(0, warmup)
    # Every batch shape the timing will meet runs first, eager rows included: a training run meets each shape
    # thousands of times, so what a shape's first use costs (compiling it, recording its CUDA graphs, growing
    # the allocator's pools, the kernel libraries' first choices) is spread thin there, and must not weigh on a
    # few dozen timed updates, nor favour the rows that pad to fewer shapes. Compiled rows run each shape three
    # times: compiled, then (CUDA graphs) recorded, then replayed once; rows with update graphs run it eagerly
    # as often as training does before recording it, then record it and replay it once.
    first_of_shape: dict[tuple[int, int, int], int] = {}
    for i in timed:
        first_of_shape.setdefault(batches[i].shape, i)
    uses = EAGER_USES + 2 if row.cuda_graphs else 3 if row.compiled else 1
    for k, i in enumerate(sorted(first_of_shape.values()), 1):
        if row.compiled or row.cuda_graphs:
            print(f"  {row.precision} {row.how}: warming up shape {k}/{len(first_of_shape)} "
                  f"{'x'.join(map(str, batches[i].shape))} at {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)
        for _ in range(uses):
            run(i, 1)
    _sync(device)
    row.warmup_s = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds, tokens, work = run(warmup, steps)
    row.tokens_per_s = tokens / seconds
    row.seconds_per_step = seconds / steps
    row.tflops = work / seconds / 1e12 if counted else None
    row.mfu = 100 * work / seconds / peak if peak and counted else None
    if device.type == "cuda":
        row.peak_mem_mib = torch.cuda.max_memory_allocated(device) / 2**20
    if not row.compiled and not row.cuda_graphs:  # a replayed update dispatches no operators to count
        with OpCount() as count:
            train_step(parts, [batches[0]], tc, device)
        row.ops = count.ops
    row.syncs = host_syncs(lambda: train_step(parts, [batches[timed[0]]], tc, device), device)
    if profile:  # after the timing, which it would slow down
        with Profile(device, trace=trace) as prof:
            run(warmup, profile)
        print(f"{row.shape} {row.model} {row.precision} compile {row.how}: "
              f"{prof.summary(profile, 'update')}", file=sys.stderr, flush=True)
    return row


def format_table(rows: list[Row]) -> str:
    head = (f"{'shape':6s} {'model':20s} {'prec':13s} {'compile':15s} {'tokens':>6s} {'params':>7s} "
            f"{'tgt tok/s':>10s} {'s/step':>7s} {'TFLOP/s':>8s} {'MFU %':>6s} {'peak MiB':>9s} {'warm-up s':>9s} "
            f"{'shapes':>6s} {'real %':>6s} {'ops/update':>10s} {'syncs':>5s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        what = f"{r.shape:6s} {r.model:20s} {r.precision:13s} {r.how:15s}"
        if r.error:
            lines.append(f"{what} failed: {r.error}")
            continue
        mfu = f"{r.mfu:6.1f}" if r.mfu is not None else f"{'-':>6s}"
        mem = f"{r.peak_mem_mib:9.0f}" if r.peak_mem_mib is not None else f"{'-':>9s}"
        ops = f"{r.ops:10d}" if r.ops is not None else f"{'-':>10s}"
        syncs = f"{r.syncs:5d}" if r.syncs is not None else f"{'-':>5s}"
        tflops = f"{r.tflops:8.1f}" if r.tflops is not None else f"{'-':>8s}"
        lines.append(f"{what} {r.max_tokens:6d} {r.params / 1e6:6.1f}M {r.tokens_per_s:10.0f} {r.seconds_per_step:7.4f} "
                     f"{tflops} {mfu} {mem} {r.warmup_s:9.1f} {r.shapes:6d} {100 * r.real:6.1f} {ops} {syncs}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--shapes", default="config", help="Comma-separated: config, base.")
    ap.add_argument("--precisions", default=None, help="Comma-separated: fp32, bf16, fp16, each half precision "
                                                        "with -copy or -autocast (default: the config's).")
    ap.add_argument("--compile", default="off", help="Comma-separated: off, on (train.compile_mode), or a mode: "
                                                      "default, reduce-overhead, max-autotune(-no-cudagraphs).")
    ap.add_argument("--update-graphs", default="off", help="Comma-separated: off, on (train.cuda_graphs: each "
                                                            "batch shape's whole update recorded as a CUDA graph).")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5, help="Untimed updates first (compiled rows take more, "
                                                            "so that every batch shape is compiled).")
    ap.add_argument("--base-max-tokens", type=int, default=32768)
    ap.add_argument("--reference", action="store_true", help="Add torch.nn.Transformer rows (eager).")
    ap.add_argument("--json", help="Also write the rows to this file.")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="After each row's timing, profile N more updates: top operators, kernels per update.")
    ap.add_argument("--trace", type=Path, default=None, help="With --profile: a Chrome trace per row in this folder.")
    ap.add_argument("--work", default="runs/bench", help="Where the tokenizer and data caches go (one folder per config).")
    ap.add_argument("--attention", default=",".join(ATTENTION_KERNELS),
                    help="On CUDA, the scaled_dot_product_attention kernels allowed, comma-separated, in the order "
                         "torch tries them: flash, efficient, math, cudnn (default: training's, "
                         "nmt.kernels.ATTENTION_KERNELS). `math` alone leaves attention "
                         "to plain matrix products and softmax, which a compiled row fuses. `cudnn` (which torch "
                         "prefers where allowed) plans every new shape once, a cost that static batch shapes pay "
                         "only once per length bucket.")
    ap.add_argument("--join", type=int, default=1, metavar="K",
                    help="Train on each K consecutive training pairs joined into one: sentences K times as long.")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--malloc", choices=["keep", "default"], default="keep",
                    help="keep: freed memory kept for reuse, as the nmt command has it (nmt.heap); default: glibc's "
                         "own settings, which return it to the kernel")
    args = ap.parse_args(argv)
    if args.malloc == "keep":
        keep_freed_memory()

    cfg = load_config(args.config, args.overrides, training=True)
    if args.join < 1:
        ap.error(f"--join {args.join}: give 1 (the corpus as it is) or more")
    if cfg.model.type != "transformer" and ("base" in args.shapes or args.reference):
        ap.error("--shapes base and --reference need a Transformer config")
    device = pick_device(cfg.train.device)
    enable_fast_math(device)
    if not set(args.update_graphs.split(",")) <= {"off", "on"}:
        ap.error(f"--update-graphs {args.update_graphs!r}: use off, on or off,on")
    for precision in args.precisions.split(",") if args.precisions else ():
        name, _, way = precision.partition("-")
        if name not in ("fp32", "bf16", "fp16") or way not in HALF_WAYS or (name == "fp32" and way):
            ap.error(f"--precisions: {precision!r} is none of fp32, bf16, fp16, bf16-copy, bf16-autocast, "
                     f"fp16-copy, fp16-autocast")
    kernels = args.attention.split(",")
    if not set(kernels) <= set(SDPA_KERNELS) or len(set(kernels)) < len(kernels):
        ap.error(f"--attention {args.attention!r}: use a comma-separated choice of {', '.join(SDPA_KERNELS)}, "
                 "each once, in the order to try them")
    set_attention_kernels(kernels)
    run_dir = Path(args.work) / (Path(args.config).stem + (f"-join{args.join}" if args.join > 1 else ""))
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.join > 1:
        cfg = joined_corpus(cfg, args.join, run_dir)
    data = prepare_run(cfg, run_dir)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = next((v for k, v in _PEAK_BF16.items() if k in name), None)
    padding = batch_padding(cfg.train, device)
    print(f"device {device} ({name}), torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"{args.steps} timed steps after {args.warmup} warm-up, batch {padding.rounding} (the config's; rows "
          f"with update graphs may differ)" + (f", attention kernels {args.attention}" if device.type == "cuda" else ""),
          flush=True)
    src_lens, tgt_lens = length_arrays(data.train)
    print(f"{len(tgt_lens):,} training pairs" + (f" (the corpus's joined by {args.join})" if args.join > 1 else "")
          + f", mean tokens a pair: source {src_lens.mean():.1f}, target {tgt_lens.mean():.1f}", flush=True)

    rows: list[Row] = []
    for shape in args.shapes.split(","):
        shape_cfg, max_tokens = cfg, cfg.train.max_tokens
        if shape == "base":
            shape_cfg = replace(cfg, model=replace(cfg.model, transformer=replace(cfg.model.transformer, **BASE)))
            max_tokens = args.base_max_tokens
        elif shape != "config":
            ap.error(f"unknown shape {shape!r}: use config or base")
        for precision in (args.precisions or cfg.train.precision).split(","):
            for mode in (cfg.train.compile_mode if c == "on" else c for c in args.compile.split(",")):
                compiled = mode != "off"
                if mode not in COMPILE_MODES:
                    ap.error(f"--compile {mode!r}: use off, on or one of {', '.join(COMPILE_MODES[1:])}")
                variants = [(reference, graphs == "on") for reference in ((False, True) if args.reference else (False,))
                            for graphs in args.update_graphs.split(",")]
                for reference, graphs in variants:
                    if reference and (compiled or graphs):  # the reference model runs eager only
                        continue
                    model = "torch.nn.Transformer" if reference else f"nmt {cfg.model.type}"
                    row = Row(shape, model, precision, mode, max_tokens, cuda_graphs=graphs)
                    warmup = max(args.warmup, 10) if compiled else args.warmup
                    try:
                        trace = None
                        if args.trace:
                            args.trace.mkdir(parents=True, exist_ok=True)
                            name = "reference" if reference else "nmt"
                            trace = args.trace / f"{shape}-{name}-{precision}-{row.how}.json"
                        run_row(row, shape_cfg, data, device, steps=args.steps, warmup=warmup,
                                reference=reference, peak=peak, profile=args.profile, trace=trace)
                    except Exception as err:  # one failing row (e.g. out of memory) must not lose the others
                        row.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200]
                        if not isinstance(err, UserError):  # a fault, whole to stderr: a GPU run's log is all
                            traceback.print_exc()  # there is to debug it with
                    rows.append(row)
                    print(format_table([row]).splitlines()[-1], file=sys.stderr, flush=True)
                    if args.json:  # after every row: a later row that kills the process loses none before it
                        Path(args.json).write_text(json.dumps([r.__dict__ for r in rows], indent=1))
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
    print(format_table(rows))


if __name__ == "__main__":
    main()
