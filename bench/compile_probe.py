"""Does torch.compile train on this machine? One small probe per mode, each in its own process.

    python bench/compile_probe.py [--device cuda] [--modes default,reduce-overhead] [--dynamic true,false]
                                  [--json probe.json]

Each probe compiles the training step's shape of work without any of nmt's code: an
attention block (projections, `scaled_dot_product_attention` with a padding mask, a
feed-forward layer) and a cross-entropy loss, forward and backward, then an Adam
update outside the compiled code. It trains on batches of three shapes, each shape
three times (with CUDA graphs: recorded, then replayed), beside an eager copy of the
same model on the same batches, and reports the largest loss difference. Run before
`bench/train_speed.py --compile ...`: where that dies, this says whether torch.compile
itself does on this machine, in which mode, with dynamic or static shapes.

Every probe runs in a subprocess, all at once, so that one dying of a signal (a crash
in a compiler or while recording a CUDA graph) is reported with its signal, its last
output lines and Python's stack dump (`PYTHONFAULTHANDLER`), and the others still run.

A probe that passes does not promise that nmt's model trains so: on an H200 (2026-11-26) the
reduce-overhead probe passed with dynamic shapes, while the Multi30k Transformer, compiled the same
way, died of a segmentation fault in its compiled backward pass. That is why `train.compile_dynamic`
auto compiles a graph per batch shape where batch shapes are static, as they are under CUDA graphs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import time

SHAPES = ((24, 16), (40, 8), (16, 24))  # (rows, positions) of the probe's batches
VOCAB, WIDTH, HEADS = 512, 64, 4


def probe(device: str, mode: str, dynamic: bool) -> dict:
    """Train the compiled and the eager block side by side; the compiled losses' largest difference."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, WIDTH)
            self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
            self.proj = nn.Linear(WIDTH, WIDTH)
            self.ff = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.ReLU(), nn.Linear(4 * WIDTH, WIDTH))
            self.norm = nn.LayerNorm(WIDTH)

        def forward(self, ids, pad, target):
            x = self.embed(ids)  # (B, T, D)
            q, k, v = self.qkv(x).unflatten(-1, (3, HEADS, WIDTH // HEADS)).permute(2, 0, 3, 1, 4)
            keep = ~pad[:, None, None, :]  # (B, 1, 1, T): attend to real positions only
            h = F.scaled_dot_product_attention(q, k, v, attn_mask=keep).transpose(1, 2).flatten(2)
            x = self.norm(x + self.proj(h))
            x = x + self.ff(x)
            logits = x @ self.embed.weight.T
            return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), ignore_index=0)

    torch.manual_seed(0)
    dev = torch.device(device)
    eager = Block().to(dev)
    model = Block().to(dev)
    model.load_state_dict(eager.state_dict())
    compiled = torch.compile(model, mode=None if mode == "default" else mode, dynamic=dynamic)
    opts = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in (eager, model)]
    start, worst = time.perf_counter(), 0.0
    for rows, positions in SHAPES:
        for _ in range(3):
            ids = torch.randint(1, VOCAB, (rows, positions), device=dev)
            pad = torch.arange(positions, device=dev) >= torch.randint(positions // 2, positions + 1, (rows, 1), device=dev)
            ids = ids.masked_fill(pad, 0)
            target = ids.roll(-1, dims=1)
            losses = []
            for net, opt in zip((eager, compiled), opts, strict=True):
                if net is compiled and mode == "reduce-overhead":
                    torch.compiler.cudagraph_mark_step_begin()
                loss = net(ids, pad, target)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(loss.detach().clone())
            worst = max(worst, abs(float(losses[0]) - float(losses[1])))
    return {"seconds": round(time.perf_counter() - start, 1), "max_loss_diff": worst}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--modes", default="default,reduce-overhead")
    ap.add_argument("--dynamic", default="true,false", help="Comma-separated: true (as nmt compiles), false.")
    ap.add_argument("--timeout", type=float, default=300, help="Seconds the probes, run side by side, may take.")
    ap.add_argument("--json", default=None, help="Also write each probe's result to this file.")
    ap.add_argument("--one", nargs=3, metavar=("DEVICE", "MODE", "DYNAMIC"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:  # a probe's own process
        device, mode, dynamic = args.one
        print(json.dumps(probe(device, mode, dynamic == "true")), flush=True)
        return 0
    runs = []
    for mode, dynamic in itertools.product(args.modes.split(","), args.dynamic.split(",")):
        cmd = [sys.executable, __file__, "--one", args.device, mode, dynamic]
        env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
        runs.append((mode, dynamic, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                     text=True, env=env)))
    failed, results = 0, []
    deadline = time.monotonic() + args.timeout  # one for all the probes, which run side by side
    print(f"{'mode':16s} {'dynamic':8s} {'result':40s}")
    for mode, dynamic, proc in runs:
        try:
            out, _ = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            out += f"\n(killed after {args.timeout:.0f} s)"
        lines = out.strip().splitlines()
        if proc.returncode == 0 and lines:
            r = json.loads(lines[-1])
            print(f"{mode:16s} {dynamic:8s} ok: {r['seconds']} s, largest loss difference from eager "
                  f"{r['max_loss_diff']:.2e}")
            results.append({"mode": mode, "dynamic": dynamic, "ok": True, **r})
            continue
        failed += 1
        rc = proc.returncode
        how = f"killed by {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exit status {rc}"
        print(f"{mode:16s} {dynamic:8s} FAILED ({how}); its last lines:")
        print("\n".join("    " + line for line in lines[-25:]))
        results.append({"mode": mode, "dynamic": dynamic, "ok": False, "failure": how, "last_lines": lines[-25:]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
