"""Host time of bf16 training's bookkeeping on the bf16 copy (`nmt.train.half.HalfCopy`), per update.

    python bench/half_copy_speed.py configs/multi30k_transformer.yaml [--device cuda] [--vocab 8000]
        [--updates 2000]

With `train.precision: bf16` (and `train.half_weights`, the default), every update moves the
copy's gradients to the fp32 weights (`grads_to_master`) and, after the optimizer, the fp32
weights back to the copy (`refresh`). On a GPU both are one or two multi-tensor kernels whatever
the model's size, but the host pays for each parameter tensor, and a small model's update is
bound by its host: that time adds to every update. This times the host's side of it (no wait for
the device), with the gradients the backward pass would leave, on the config's model.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from nmt.config import load_config
from nmt.data.tokenizer import PAD_ID
from nmt.models import build_model
from nmt.train.half import HalfCopy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--vocab", type=int, default=8000, help="Source and target vocabulary size.")
    ap.add_argument("--updates", type=int, default=2000)
    args = ap.parse_args()
    device = torch.device(args.device)
    cfg = load_config(args.config)
    model = build_model(cfg.model, src_vocab_size=args.vocab, tgt_vocab_size=args.vocab, pad_id=PAD_ID).to(device)
    half = HalfCopy(model, torch.bfloat16)
    grads = [torch.randn_like(h) for h in half.halves]  # what a backward pass leaves on the copy

    def update() -> float:
        for h, g in zip(half.halves, grads, strict=True):
            h.grad = g
        start = time.perf_counter()
        half.grads_to_master()
        half.refresh()
        return time.perf_counter() - start

    for _ in range(min(100, args.updates)):
        update()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times = [update() for _ in range(args.updates)]
    print(f"{cfg.model.type}, {len(half.halves)} parameter tensors, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {device}: "
          f"median {1e6 * statistics.median(times):.0f} us of host time per update")


if __name__ == "__main__":
    main()
