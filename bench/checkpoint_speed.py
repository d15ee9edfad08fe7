"""How long a training loop waits for a checkpoint: written in its own thread, or in the background.

    python bench/checkpoint_speed.py [CONFIG] [--device cuda] [--repeat 5] [--gap 1.0] [--dir DIR]

Builds the config's model and its optimizer, with one step taken so that Adam's moments exist, and
times what a validation's save costs the loop (`ckpt_<step>.pt`, then `best.pt`, then pruning):

    sync        the files written where the loop runs (`nmt.train.saving.write_checkpoints`)
    background  `nmt.train.saving.CheckpointWriter.submit`: the state copied to host memory, the files
                written by the writer thread while the loop goes on (`--gap` seconds between two saves,
                the updates between them)

The files go to `--dir` (default: a fresh folder under runs/), removed at the end.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch

from nmt.config import load_config
from nmt.models import build_model, count_parameters
from nmt.train.optim import build_optimizer
from nmt.train.saving import CheckpointWriter, write_checkpoints


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", default="configs/multi30k_transformer.yaml")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--vocab", type=int, default=8000, help="Source and target vocabulary size.")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--gap", type=float, default=1.0, help="Seconds between two background saves.")
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()

    cfg = load_config(args.config)
    device = torch.device(args.device)
    model = build_model(cfg.model, src_vocab_size=args.vocab, tgt_vocab_size=args.vocab, pad_id=0).to(device)
    optimizer = build_optimizer(model, cfg.train, device)
    sum(p.float().sum() for p in model.parameters()).backward()
    optimizer.step()
    parent = args.dir or Path("runs")
    parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="checkpoint_speed_", dir=parent))

    def payload() -> dict:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    try:
        sync, background = [], []
        for i in range(args.repeat):
            synchronize()
            start = time.perf_counter()
            write_checkpoints(payload(), folder / f"ckpt_{i}.pt", best=True, run_dir=folder, keep_last=5)
            sync.append(time.perf_counter() - start)
        writer = CheckpointWriter(folder, keep_last=5)
        for i in range(args.repeat, 2 * args.repeat):
            synchronize()
            start = time.perf_counter()
            writer.submit(payload(), folder / f"ckpt_{i}.pt", best=True)
            background.append(time.perf_counter() - start)
            time.sleep(args.gap)
        writer.close()
        size = (folder / "best.pt").stat().st_size
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{args.config}: {count_parameters(model):,} parameters on {device}, a checkpoint of {size / 2**20:.1f} MiB; "
          f"the loop's wait for a checkpoint and best.pt, ms over {args.repeat} saves")
    for name, times in (("sync", sync), ("background", background)):
        ms = sorted(1000 * t for t in times)
        print(f"  {name:<11} median {ms[len(ms) // 2]:7.1f}   min {ms[0]:7.1f}   max {ms[-1]:7.1f}")


if __name__ == "__main__":
    main()
