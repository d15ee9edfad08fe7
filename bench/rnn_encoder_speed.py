"""The RNN encoder's two ways, forward and backward: packed by the source lengths, and over the padded source.

    python bench/rnn_encoder_speed.py configs/multi30k_rnn_luong_general.yaml [--device cuda] [--batch 204]
        [--length 20] [--shortest 14] [--passes 30] [--vocab 8000]

`RNNEncoder` packs the source on a CPU, where its lengths are (`_packed`: one fused call a layer,
padding skipped), and runs over the padded source on a GPU (`_unpacked`: a fused call a layer and
direction, the backward one over each sentence reversed in place, and for an LSTM its final cell
states rebuilt from its outputs), so that the host never waits for the device to read the lengths.
This times both ways on the config's encoder, in training mode, on batches of `--batch` sentences
of `--shortest` to `--length` tokens (one as long as the batch): the milliseconds a pass (forward
and backward of a weighted sum of the outputs), the passes running back to back and the clock
stopping once the last is done, so a way that makes the host wait pays for it; the aten
operations a pass dispatches (views and allocations left out: on a GPU nearly each is a kernel
launch); and on CUDA the times a pass makes the host wait for the GPU.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import torch
from profiling import OpCount, host_syncs  # bench/profiling.py, beside this script

from nmt.config import load_config
from nmt.data.tokenizer import PAD_ID
from nmt.models import build_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=204, help="Sentences a batch (Multi30k's 4,096-token batches).")
    ap.add_argument("--length", type=int, default=20, help="Tokens of the longest sentence, the batch's length.")
    ap.add_argument("--shortest", type=int, default=14, help="Tokens of the shortest sentence.")
    ap.add_argument("--passes", type=int, default=30, help="Timed passes a way, after 3 untimed ones.")
    ap.add_argument("--vocab", type=int, default=8000)
    args = ap.parse_args()
    if not 1 <= args.shortest <= args.length:
        raise SystemExit(f"--shortest ({args.shortest}) must be between 1 and --length ({args.length})")
    device = torch.device(args.device)
    cfg = load_config(args.config)
    if cfg.model.type != "rnn":
        raise SystemExit(f"{args.config}: model.type is {cfg.model.type!r}; this bench times an RNN's encoder")
    torch.manual_seed(0)
    model = build_model(cfg.model, src_vocab_size=args.vocab, tgt_vocab_size=args.vocab, pad_id=PAD_ID)
    encoder = model.encoder.to(device).train()
    B, S = args.batch, args.length
    lengths = torch.randint(args.shortest, S + 1, (B,), device=device)
    lengths[0] = S
    real = torch.arange(S, device=device) < lengths[:, None]  # (B, S)
    src = torch.randint(PAD_ID + 4, args.vocab, (B, S), device=device).masked_fill(~real, PAD_ID)
    weights = None

    def one_pass(way) -> None:
        nonlocal weights
        outputs = [x for x in way(encoder.embedding(src), real) if x is not None]
        weights = weights or [torch.randn_like(x) for x in outputs]
        sum((x * w).sum() for x, w in zip(outputs, weights, strict=True)).backward()

    print(f"{cfg.model.rnn.cell} encoder, {cfg.model.rnn.encoder_layers} layers, "
          f"{'bi' if cfg.model.rnn.bidirectional else 'uni'}directional, H {cfg.model.rnn.hidden_size}, "
          f"{device}: {B} sentences of {args.shortest}-{S} tokens, {float(real.float().mean()):.0%} of the "
          f"positions real, {args.passes} passes a way")
    for name, way in (("packed", encoder._packed), ("unpacked", encoder._unpacked)):
        for _ in range(3):
            one_pass(way)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(args.passes):
            one_pass(way)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        ms = 1e3 * (time.perf_counter() - start) / args.passes
        with OpCount() as count:
            one_pass(way)
        syncs = host_syncs(partial(one_pass, way), device)
        print(f"  {name:8s} {ms:8.2f} ms a pass, {count.ops:5d} ops a pass"
              + ("" if syncs is None else f", {syncs} host syncs a pass"))


if __name__ == "__main__":
    main()
