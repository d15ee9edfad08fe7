"""Training throughput of a config's model, against a torch.nn.Transformer step of the same shape.

    python bench/train_speed.py configs/multi30k_transformer.yaml [--steps 30] [--warmup 5] [--set k=v ...]

Both models run the same `nmt.train.step.train_step` on the same real batches
(the config's training data and tokenizer), in the same process, taking turns
step by step so that load from other processes falls on both alike. Prints
target tokens/s, seconds per step, peak memory and, on CUDA, model FLOP utilisation.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn

from nmt.config import load_config
from nmt.data.batching import TokenBatchSampler
from nmt.data.tokenizer import PAD_ID
from nmt.models import build_model, count_parameters
from nmt.runtime import enable_fast_math, grad_scaler, peak_memory_mb, pick_device, seed_everything
from nmt.train.data import collated_batches, prepare_run
from nmt.train.optim import build_optimizer, build_scheduler
from nmt.train.step import train_step

# Dense bf16 peak of common GPUs, for MFU (FLOP/s).
_PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}


class ReferenceTransformer(nn.Module):
    """torch.nn.Transformer with embeddings, sinusoidal positions and a tied output layer."""

    def __init__(self, *, vocab: int, d_model: int, heads: int, enc: int, dec: int, ff: int, dropout: float, pre_norm: bool):
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


class Timed:
    """One model with its optimizer, stepped and timed one update at a time."""

    def __init__(self, name: str, model: nn.Module, cfg, device: torch.device) -> None:
        self.name, self.model, self.cfg, self.device = name, model, cfg, device
        self.optimizer = build_optimizer(model, cfg.train, device)
        self.scheduler = build_scheduler(self.optimizer, cfg.train)
        self.scaler = grad_scaler(device, cfg.train.precision)
        self.seconds, self.tokens, self.steps, self.peak_mem_mb = 0.0, 0, 0, 0.0
        model.train()

    def step(self, batch, *, timed: bool) -> None:
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        r = train_step(self.model, [batch], self.optimizer, self.scheduler, self.scaler, self.cfg.train, self.device)
        if cuda:
            torch.cuda.synchronize()
            self.peak_mem_mb = max(self.peak_mem_mb, peak_memory_mb(self.device)["peak_mem_mb"])
        if timed:
            self.seconds += time.perf_counter() - start
            self.tokens += r.tokens
            self.steps += 1

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    def line(self) -> str:
        mem = f"  peak mem {self.peak_mem_mb:.0f} MiB" if self.device.type == "cuda" else ""
        return (f"{self.name:22s} params {count_parameters(self.model) / 1e6:6.2f}M  {self.tokens_per_s:9.0f} tgt tok/s  "
                f"{self.seconds / self.steps:.3f} s/step{mem}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--no-reference", action="store_true", help="Skip the torch.nn.Transformer reference.")
    args = ap.parse_args(argv)

    cfg = load_config(args.config, args.overrides)
    device = pick_device(cfg.train.device)
    enable_fast_math(device)
    seed_everything(cfg.train.seed)
    run_dir = Path("runs/bench") / Path(args.config).stem
    run_dir.mkdir(parents=True, exist_ok=True)
    data = prepare_run(cfg, run_dir)
    lens = data.train.with_format("numpy")
    sampler = TokenBatchSampler(src_lens=lens["src_len"], tgt_lens=lens["tgt_len"], max_tokens=cfg.train.max_tokens,
                                shuffle=True, seed=cfg.train.seed)
    n_batches = min(args.steps + args.warmup, len(sampler))
    batches = [b.to(device) for b in collated_batches(data.train, sampler.batch_list(0)[:n_batches])]
    tok = data.tokenizer
    print(f"device {device}, precision {cfg.train.precision}, torch threads {torch.get_num_threads()}, "
          f"{args.steps} timed steps after {args.warmup} warm-up, max_tokens {cfg.train.max_tokens}")

    ours = build_model(cfg.model, src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size, pad_id=PAD_ID)
    runs = [Timed(f"nmt {cfg.model.type}", ours.to(device), cfg, device)]
    if cfg.model.type == "transformer" and not args.no_reference:
        t = cfg.model.transformer
        if tok.src_vocab_size != tok.tgt_vocab_size:
            print("reference skipped: it shares one vocabulary", file=sys.stderr)
        else:
            ref = ReferenceTransformer(vocab=tok.tgt_vocab_size, d_model=t.d_model, heads=t.heads, enc=t.encoder_layers,
                                       dec=t.decoder_layers, ff=t.ff_dim, dropout=t.dropout, pre_norm=t.norm == "pre")
            runs.append(Timed("torch.nn.Transformer", ref.to(device), cfg, device))
    for i in range(args.warmup + args.steps):
        for run in runs if i % 2 == 0 else runs[::-1]:  # alternate who goes first
            run.step(batches[i % len(batches)], timed=i >= args.warmup)
    for run in runs:
        print(run.line())
    if device.type != "cuda":
        print(f"peak RSS of the process {peak_memory_mb(device).get('peak_rss_mb', 0):.0f} MiB")
    else:
        name = torch.cuda.get_device_name()
        peak = next((v for k, v in _PEAK_BF16.items() if k in name), None)
        # ~6 FLOPs per parameter per target token (forward + backward), a lower bound ignoring attention.
        achieved = 6 * count_parameters(ours) * runs[0].tokens_per_s
        if peak:
            print(f"MFU {100 * achieved / peak:.1f}% of {name} bf16 peak ({achieved / 1e12:.1f} TFLOP/s)")
    if len(runs) == 2:
        print(f"ratio nmt / torch.nn.Transformer: {runs[0].tokens_per_s / runs[1].tokens_per_s:.2f}")


if __name__ == "__main__":
    main()
