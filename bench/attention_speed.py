"""Attention's forward and backward time for each kernel, at the shapes of a token-budget batch.

    python bench/attention_speed.py [--device cuda] [--dtype bf16] [--tokens 32768] [--heads 8] [--head-dim 64]
        [--lengths 16,24,32,48,64,128] [--kernels flash,efficient,math,manual,varlen,packed,rows,cudnn]
        [--pack 128] [--dropout 0.0] [--layers 6,6] [--steps 20] [--json FILE]

A batch of `tokens` positions in sentences of L positions holds B = tokens // L sentences, and each
attention call of a Transformer sees (B, H, L, Dh) queries, keys and values, laid out in memory as
(B, L, H, Dh), as nmt's projections make them. A call computes
4 B H L^2 Dh FLOPs forward (Q K^T, then the weights times V; half of it under a causal mask) and twice
that backward: over Multi30k's short sentences little work per tile of a fused kernel, which tiles 64
or 128 query positions. Transformer-base's attention kernels took more GPU time than its largest
matrix products on such batches (H200 profile, bench/MEASUREMENTS.md). This times, for every L, the two kinds of
call a training update makes:

    padded   keys with padding (each sentence 70% to 100% of L long), masked by the additive bias that
             nmt's layers build once and pass on: the encoder's self-attention and the cross-attention
    causal   the decoder's self-attention (`is_causal`, no padding mask: targets are right-padded)

with each kernel alone: torch's `scaled_dot_product_attention` restricted to one backend (flash,
efficient, cudnn, math), `manual`, nmt's own `attention` (the model's `attention_impl: manual`), and
`varlen`, torch's variable-length flash attention (`torch.nn.attention.varlen`) over the batch packed
without its padding, every sentence's real positions one after another, each attending within its own
sentence: what attention would cost a model that kept its activations packed. `packed` asks the same of
a batch packed into rows: the sentences' real positions laid one after another into rows of `--pack`
positions (a sentence never split across two rows), each attending within its own sentence through a
block-diagonal bias, by the memory-efficient kernel (math off CUDA). It spends L^2-scale work on the
whole row, in return for tiles a fused kernel fills. Both rows time the packing and unpacking too,
which a model that kept its activations packed would not pay. `rows` is what the model's
`attention_pack: --pack` does, with no copy: the padded batch's sentences side by side, padding and all,
as many to a row of at most `--pack` positions as divide the batch, kept apart by a block-diagonal bias
(`nmt.models.masks.block_bias`), by the same kernels as `packed`. A kernel that refuses a case (flash takes no
padding bias; off CUDA only flash and math exist) is reported with torch's reason. Outputs at padded
query positions are no one's concern (a model's later layers mask them, and the loss never sees them),
so their gradients are zero and they are not compared. `max diff` is the largest difference of a
kernel's output and input gradients from the manual path's, in units of the largest manual value: a
kernel that computes something else shows here. `update ms` sums, per kernel, what one training update of a Transformer of
`--layers` E,D (encoder, decoder) spends: E + D padded calls and D causal ones, forward and backward.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.kernels import sdpa_backends
from nmt.models.masks import (
    attention_bias,
    block_bias,
    causal_mask,
    pad_mask_from_lengths,
    sentences_per_row,
)
from nmt.models.multihead import attention, side_by_side
from nmt.runtime import HALF_DTYPES

DTYPES = {"fp32": torch.float32, **HALF_DTYPES}
KERNELS = ("flash", "efficient", "math", "manual", "varlen", "packed", "rows", "cudnn")  # cuDNN last: a crash there loses no other row


@dataclass
class Row:
    length: int
    kind: str  # padded, causal
    kernel: str
    sentences: int
    ms: float | None = None  # forward and backward, one call
    tflops: float | None = None
    max_diff: float | None = None  # against the manual path, relative to its largest value
    peak_mib: float | None = None
    refused: str | None = None  # why the kernel did not run


def _call(kernel: str, kind: str, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, bias: Tensor,
          lengths: Tensor, dropout: float, pack: int) -> Callable[[], Tensor]:
    """One attention call of `kind` by `kernel`, as a function of nothing (the inputs are fixed): the manual
    path takes the boolean `mask`, torch's kernels the padding `bias` or `is_causal`, varlen and packed the
    sentences' `lengths`, packed its rows of `pack` positions."""
    causal = kind == "causal"
    if kernel == "manual":
        return lambda: attention(q, k, v, mask, dropout)[0]
    if kernel == "varlen":
        return _varlen(causal, q, k, v, lengths, dropout)
    if kernel == "packed":
        return _packed(causal, q, k, v, lengths, dropout, pack)
    if kernel == "rows":
        return _rows(causal, q, k, v, mask, dropout, pack)
    from torch.nn.attention import sdpa_kernel

    (backend,) = sdpa_backends([kernel])

    def run() -> Tensor:
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=None if causal else bias, dropout_p=dropout,
                                                  is_causal=causal)
    return run


def _varlen(causal: bool, q: Tensor, k: Tensor, v: Tensor, lengths: Tensor, dropout: float) -> Callable[[], Tensor]:
    """Variable-length attention over q, k, v (B, H, L, Dh) packed without the padding past each sentence's
    length, its output unpacked to (B, H, L, Dh) with zeros at padded positions."""
    if dropout:
        raise RuntimeError("varlen attention takes no dropout")
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as e:
        raise RuntimeError(f"this torch has no variable-length attention ({e})") from e
    B, H, L, Dh = q.shape
    rows = (~pad_mask_from_lengths(lengths, L)).flatten().nonzero().squeeze(1).to(q.device)  # packed -> padded
    starts = F.pad(lengths.cumsum(0), (1, 0)).to(q.device, torch.int32)  # each sentence's first packed row
    options = {}
    if causal:  # older torch: is_causal; newer: a window of all the positions before and none after
        options = ({"is_causal": True} if "is_causal" in inspect.signature(varlen_attn).parameters
                   else {"window_size": (-1, 0)})

    def pack(x: Tensor) -> Tensor:
        return x.transpose(1, 2).reshape(B * L, H, Dh).index_select(0, rows)  # (real positions, H, Dh)

    def run() -> Tensor:
        out = varlen_attn(pack(q), pack(k), pack(v), starts, starts, L, L, **options)
        return out.new_zeros(B * L, H, Dh).index_copy(0, rows, out).view(B, L, H, Dh).transpose(1, 2)
    return run


def _biased_kernel(device: torch.device):
    """Within the block, the kernel a model's attention with a full (block-diagonal) bias runs: the
    memory-efficient one on CUDA (flash takes no bias), the plain one elsewhere."""
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(sdpa_backends(["efficient"] if device.type == "cuda" else ["math"]))


def pack_rows(lengths: list[int], width: int) -> list[int]:
    """The row of each sentence, laid in order into rows of `width` positions: a sentence that does not fit
    in what is left of a row starts the next one (each is at most `width` long)."""
    rows, row, used = [], 0, 0
    for n in lengths:
        if used + n > width:
            row, used = row + 1, 0
        rows.append(row)
        used += n
    return rows


def _packed(causal: bool, q: Tensor, k: Tensor, v: Tensor, lengths: Tensor, dropout: float,
            pack: int) -> Callable[[], Tensor]:
    """Attention over q, k, v (B, H, L, Dh) laid into rows of max(pack, L) positions without the padding
    past each sentence's length (`pack_rows`), every position attending to those of its own sentence (and no
    later one where `causal`) through an additive bias; the output unpacked to (B, H, L, Dh), zeros at padded
    positions."""
    B, H, L, Dh = q.shape
    width = max(pack, L)
    sizes = lengths.tolist()
    row_of = pack_rows(sizes, width)
    src, dest, sentence = [], [], []  # per real position: its padded row, its packed row, its sentence
    used: dict[int, int] = {}
    for b, (n, r) in enumerate(zip(sizes, row_of, strict=True)):
        start = r * width + used.get(r, 0)
        used[r] = used.get(r, 0) + n
        src.extend(range(b * L, b * L + n))
        dest.extend(range(start, start + n))
        sentence.extend([b] * n)
    R = row_of[-1] + 1
    seg = torch.full((R * width,), -1, dtype=torch.long)  # -1: a row's empty tail, which attends within itself
    seg[dest] = torch.tensor(sentence)
    pos = torch.arange(R * width) % width
    seg, pos = seg.view(R, width), pos.view(R, width)
    allowed = seg[:, :, None] == seg[:, None, :]  # (R, width, width): query, key
    if causal:
        allowed &= pos[:, None, :] <= pos[:, :, None]
    bias = attention_bias(~allowed[:, None], q.dtype).to(q.device)  # (R, 1, width, width)
    src_t, dest_t = torch.tensor(src, device=q.device), torch.tensor(dest, device=q.device)

    def pack_in(x: Tensor) -> Tensor:
        real = x.transpose(1, 2).reshape(B * L, H, Dh).index_select(0, src_t)
        return real.new_zeros(R * width, H, Dh).index_copy(0, dest_t, real).view(R, width, H, Dh).transpose(1, 2)

    def run() -> Tensor:
        with _biased_kernel(q.device):
            out = F.scaled_dot_product_attention(pack_in(q), pack_in(k), pack_in(v), attn_mask=bias,
                                                 dropout_p=dropout)
        real = out.transpose(1, 2).reshape(R * width, H, Dh).index_select(0, dest_t)
        return real.new_zeros(B * L, H, Dh).index_copy(0, src_t, real).view(B, L, H, Dh).transpose(1, 2)
    return run


def _rows(causal: bool, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout: float,
          pack: int) -> Callable[[], Tensor]:
    """Attention as a model with `attention_pack: pack` computes it: the padded batch's sentences side by side
    in rows of up to `pack` positions (`side_by_side`, views of the projections' layout), padding and all, kept
    apart by their `block_bias`; the output (B, H, L, Dh) seen as the model sees it."""
    B, H, L, Dh = q.shape
    group = sentences_per_row(B, L, pack)
    key_pad = None if causal else mask[:, 0, 0, :]  # (B, L)
    bias = block_bias(key_pad, group, L, L, causal=causal, dtype=q.dtype, device=q.device)

    def run() -> Tensor:
        with _biased_kernel(q.device):
            out = F.scaled_dot_product_attention(*(side_by_side(t, group) for t in (q, k, v)), attn_mask=bias,
                                                 dropout_p=dropout)
        return out.transpose(1, 2).reshape(B, L, H, Dh).transpose(1, 2)
    return run


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(length: int, kind: str, kernels: list[str], *, tokens: int, heads: int, head_dim: int,
            dtype: torch.dtype, dropout: float, steps: int, device: torch.device, pack: int = 128,
            seed: int = 0) -> Iterator[Row]:
    """Every kernel's row for sentences of `length` positions, calls of `kind`, each as soon as it is measured."""
    B = max(1, tokens // length)
    g = torch.Generator().manual_seed(seed)
    # laid out as a model's projections make them, (B, L, H, Dh) in memory seen as (B, H, L, Dh)
    leaves = [torch.randn((B, length, heads, head_dim), generator=g).to(device, dtype).requires_grad_()
              for _ in range(3)]
    q, k, v = (t.transpose(1, 2) for t in leaves)
    grad = torch.randn((B, heads, length, head_dim), generator=g).to(device, dtype)
    lengths = torch.randint(max(1, (7 * length + 9) // 10), length + 1, (B,), generator=g)
    lengths[0] = length  # the longest sentence fills the bucket
    if kind == "causal":  # targets are right-padded: the causal mask alone, every sentence full length
        lengths.fill_(length)
    pad = pad_mask_from_lengths(lengths, length).to(device)[:, None, None, :]  # (B, 1, 1, L)
    bias = attention_bias(pad, dtype)
    mask = causal_mask(length, device=device) if kind == "causal" else pad
    real = (~pad).transpose(2, 3)  # (B, 1, L, 1): the queries a model's loss depends on
    grad = grad * real
    flops = 12 * B * heads * length * length * head_dim * (0.5 if kind == "causal" else 1.0)

    def outputs(fn: Callable[[], Tensor]) -> list[Tensor]:
        for t in leaves:
            t.grad = None
        out = fn()
        out.backward(grad)
        return [x.detach().float() for x in (out * real, *(t.grad.transpose(1, 2) for t in leaves))]

    # the reference: the manual path in fp32 without dropout, on the same inputs
    leaves32 = [t.detach().float().requires_grad_() for t in leaves]
    ref_out = attention(*(t.transpose(1, 2) for t in leaves32), mask)[0]
    ref_out.backward(grad.float())
    reference = [ref_out.detach() * real, *(t.grad.transpose(1, 2) for t in leaves32)]

    for kernel in kernels:
        row = Row(length=length, kind=kind, kernel=kernel, sentences=B)
        why: list = []
        try:
            fn = _call(kernel, kind, q, k, v, mask, bias, lengths, dropout, pack)  # varlen may refuse here
            with warnings.catch_warnings(record=True) as why:  # torch warns why a backend cannot take a case
                warnings.simplefilter("always")
                first = outputs(fn)
            if dropout == 0.0:
                row.max_diff = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                                   for a, b in zip(first, reference, strict=True))
            for _ in range(2):
                outputs(fn)
        except RuntimeError as e:  # no kernel of this backend takes the case
            reasons = [str(w.message) for w in why] or [str(e)]
            row.refused = " ".join(" / ".join(reasons).split())[:200]
            yield row
            continue
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        for _ in range(steps):
            out = fn()
            out.backward(grad)
        _sync(device)
        row.ms = 1e3 * (time.perf_counter() - start) / steps
        row.tflops = flops / (row.ms / 1e3) / 1e12
        if device.type == "cuda":
            row.peak_mib = torch.cuda.max_memory_allocated(device) / 2**20
        yield row


def update_ms(rows: list[Row], length: int, kernel: str, encoder: int, decoder: int) -> float | None:
    """One update's attention time with `kernel` for sentences of `length`: E + D padded calls, D causal."""
    ms = {r.kind: r.ms for r in rows if r.length == length and r.kernel == kernel}
    if ms.get("padded") is None or ms.get("causal") is None:
        return None
    return (encoder + decoder) * ms["padded"] + decoder * ms["causal"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--tokens", type=int, default=32768, help="Positions per batch (Transformer-base's budget).")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--lengths", default="16,24,32,48,64,128", help="Sentence lengths L, comma-separated.")
    ap.add_argument("--kernels", default=",".join(KERNELS), help=f"Comma-separated choice of {', '.join(KERNELS)}.")
    ap.add_argument("--pack", type=int, default=128, help="Positions per row of the packed kernel (at least L).")
    ap.add_argument("--dropout", type=float, default=0.0, help="Dropout on the attention weights (no max diff then).")
    ap.add_argument("--layers", default="6,6", help="Encoder and decoder layers for the update column.")
    ap.add_argument("--steps", type=int, default=20, help="Timed calls per row, after three untimed.")
    ap.add_argument("--json", help="Also write the rows to this file.")
    args = ap.parse_args(argv)
    kernels = args.kernels.split(",")
    if not set(kernels) <= set(KERNELS):
        ap.error(f"--kernels {args.kernels!r}: use a comma-separated choice of {', '.join(KERNELS)}")
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
        encoder, decoder = (int(x) for x in args.layers.split(","))
    except ValueError:
        ap.error(f"--lengths {args.lengths!r} and --layers {args.layers!r} take comma-separated integers")
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {device} ({name}), torch {torch.__version__}, {args.dtype}, {args.tokens} positions per batch, "
          f"{args.heads} heads of {args.head_dim}, dropout {args.dropout}, {args.steps} timed calls per row",
          flush=True)
    rows: list[Row] = []

    def save() -> None:  # after every row: a process that dies in a kernel keeps the rows before
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": name, "dtype": args.dtype, "tokens": args.tokens,
                           "rows": [asdict(r) for r in rows]}, f, indent=1)

    print(f"{'L':>4s} {'kind':6s} {'kernel':9s} {'sentences':>9s} {'ms':>8s} {'TFLOP/s':>8s} {'max diff':>9s} "
          f"{'peak MiB':>9s}", flush=True)
    for length in lengths:
        for kind in ("padded", "causal"):
            for r in measure(length, kind, kernels, tokens=args.tokens, heads=args.heads, head_dim=args.head_dim,
                             dtype=DTYPES[args.dtype], dropout=args.dropout, steps=args.steps, device=device,
                             pack=args.pack):
                rows.append(r)
                save()
                if r.refused:
                    print(f"{r.length:4d} {r.kind:6s} {r.kernel:9s} {r.sentences:9d} refused: {r.refused}", flush=True)
                    continue
                diff = "-" if r.max_diff is None else f"{r.max_diff:.1e}"
                peak = "-" if r.peak_mib is None else f"{r.peak_mib:.0f}"
                print(f"{r.length:4d} {r.kind:6s} {r.kernel:9s} {r.sentences:9d} {r.ms:8.3f} {r.tflops:8.2f} "
                      f"{diff:>9s} {peak:>9s}", flush=True)
    print(f"\nupdate ms: one update's attention, forward and backward ({encoder + decoder} padded calls, {decoder} "
          f"causal), per kernel")
    print(f"{'L':>4s} " + " ".join(f"{k:>9s}" for k in kernels))
    for length in lengths:
        cells = [update_ms(rows, length, k, encoder, decoder) for k in kernels]
        print(f"{length:4d} " + " ".join(f"{'-' if c is None else f'{c:.2f}':>9s}" for c in cells))


if __name__ == "__main__":
    sys.exit(main())
