"""Decoding speed of a checkpoint: greedy and beam search, with and without incremental caches.

    python bench/decode_speed.py CHECKPOINT FILE [--limit N] [--copies K] [--beam 5] [--threads T] [--device cpu]
        [--precision fp32,bf16] [--max-tokens N] [--chunk-lines N] [--repeat R] [--ref REFERENCES]
        [--outputs DIR] [--against DIR] [--output-len N]

FILE holds one source sentence per line (plain text or .gz). Each setting
translates the same lines as `nmt translate` does, through
`Translator.translate_stream_nbest`: chunks of `Translator.chunk_lines` lines
(`--chunk-lines` to choose), each tokenized, sorted into length-sorted token-budget
batches, searched and detokenized. A test set is usually one chunk; `--copies K`
translates FILE K times over, as a file of K times its lines would be. Each row runs after a short
warm-up, `--repeat` rounds (the fastest is reported; `first s` is the first
round's wall time, which also pays the process's first-time costs for the
full batch shapes). Prints sentences/s, target tokens/s (output subwords, EOS included),
wall time and peak memory (resident set size sampled every 5 ms on CPU,
`torch.cuda.max_memory_allocated` on CUDA), and the batch budget and precision
each row ran with, in one table. `cached` uses `decode_step` with KV caches;
`uncached` recomputes the decoder over the whole prefix at each step.

`--output-len N` makes every output exactly N subwords (EOS after them): `min_len` N,
`max_len_a` 0, `max_len_b` N. A toy or briefly trained model's outputs are short;
this times the search at the lengths of the users' text (news sentences are 30-70
subwords), whose cost per step grows with the length (caches, attention).

`--profile` translates once more per row under torch.profiler and prints the
operators with the most self time (GPU time on CUDA) and the kernels launched per
sentence; `--trace DIR` also writes a Chrome trace of it.

Quality next to speed: `--ref` adds each row's BLEU against references, and
`--outputs DIR` writes each row's translations to DIR/<row>.txt (a precision other
than fp32: DIR/<row>_<precision>.txt), so that another run (another device or
precision) given `--against DIR` reports how many of its lines are identical to
that run's fp32 row of the same search. For example, GPU
against CPU outputs of the same checkpoint:

    python bench/decode_speed.py CKPT test.de.gz --ref test.en.gz --device cpu --only beam \\
        --cached-only --outputs cpu/
    python bench/decode_speed.py CKPT test.de.gz --ref test.en.gz --device cuda --only beam \\
        --cached-only --precision fp32,bf16 --against cpu/
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import threading
import time
from pathlib import Path

import torch
from profiling import Profile  # bench/profiling.py, beside this script

from nmt.data.text import read_lines
from nmt.heap import keep_freed_memory
from nmt.metrics import score
from nmt.translate import Translator

SETTINGS = [("greedy", 1, True), ("greedy", 1, False), ("beam", None, True), ("beam", None, False)]


class PeakRSS:
    """Peak resident memory (MiB) of this process while the block runs, sampled every 5 ms."""

    def __enter__(self) -> PeakRSS:
        self.peak, self._stop = _rss_mib(), threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss_mib())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_mib())


def _rss_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # not Linux: the lifetime peak is the best there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10


def run_setting(translator: Translator, lines: list[str], *, beam: int, cached: bool, max_tokens: int | None,
                repeat: int = 1, chunk_lines: int | None = None, lengths: dict | None = None) -> dict:
    """Translate `lines` `repeat` times after a short warm-up; the row is the fastest round.

    The first round after the warm-up also pays what a process pays once per new
    batch shape (on CUDA: growing the caching allocator's pool, choosing matrix
    product algorithms), so its time is kept beside the fastest as `first_seconds`. `lengths` holds
    length settings of the search (`output_lengths`).
    """
    device, lengths = translator.device, lengths or {}
    translator.translate_nbest(lines[:16], beam=beam, cached=cached, max_tokens=max_tokens, **lengths)  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    rounds = []
    with PeakRSS() as rss:
        for _ in range(repeat):
            start = time.perf_counter()
            out = list(translator.translate_stream_nbest(lines, beam=beam, cached=cached, max_tokens=max_tokens,
                                                         chunk_size=chunk_lines, **lengths))
            if device.type == "cuda":
                torch.cuda.synchronize()
            rounds.append(time.perf_counter() - start)
    seconds = min(rounds)
    tokens = sum(len(n[0].tokens) + 1 for n in out if n[0].text or n[0].tokens)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else rss.peak
    return {"sentences_per_s": len(lines) / seconds, "tokens_per_s": tokens / seconds, "seconds": seconds,
            "first_seconds": rounds[0], "rounds": repeat,
            "max_tokens": translator.max_tokens_for(max_tokens), "precision": translator.precision,
            "chunk_lines": chunk_lines or translator.chunk_lines(translator.options(beam=beam, max_tokens=max_tokens,
                                                                                    **lengths)),
            "target_tokens": tokens, "peak_mem_mib": peak, "mem": "cuda_max_allocated" if device.type == "cuda" else "rss",
            "outputs": [n[0].text for n in out]}


def output_lengths(n: int | None) -> dict:
    """The search settings that make every output exactly n subwords ({} for None: the checkpoint's)."""
    return {} if n is None else {"min_len": n, "max_len_a": 0.0, "max_len_b": n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("file", help="source sentences, one per line (.gz allowed)")
    parser.add_argument("--limit", type=int, default=0, help="first N lines only (0: all)")
    parser.add_argument("--copies", type=int, default=1, help="translate the lines this many times over, as one file")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="auto",
                        help="comma-separated, each row's: auto (fp32), fp32, bf16, fp16")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="batch budget, padded source tokens x beam (default: the checkpoint's; 0: by device)")
    parser.add_argument("--chunk-lines", type=int, default=None,
                        help="lines read and translated at a time (default: as nmt translate, Translator.chunk_lines)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="time each row this many rounds and report the fastest; `first s` shows the first round")
    parser.add_argument("--only", choices=["greedy", "beam"], default=None, help="run one search only")
    parser.add_argument("--cached-only", action="store_true", help="skip the (slow) uncached runs")
    parser.add_argument("--ref", default=None, help="reference translations of FILE: adds each row's BLEU")
    parser.add_argument("--outputs", type=Path, default=None,
                        help="write each row's translations to DIR/<row>.txt (not fp32: <row>_<precision>.txt)")
    parser.add_argument("--against", type=Path, default=None,
                        help="a DIR of another run's --outputs: count the lines identical to its same search")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--output-len", type=int, default=None,
                        help="every output exactly N subwords, whatever the model would write (see above)")
    parser.add_argument("--profile", action="store_true",
                        help="after each row's timing, translate once more under torch.profiler: top operators, "
                             "kernels per sentence")
    parser.add_argument("--trace", type=Path, default=None, help="with --profile: a Chrome trace per row here")
    parser.add_argument("--malloc", choices=["keep", "default"], default="keep",
                        help="keep: freed memory kept for reuse, as the nmt command has it (nmt.heap); default: "
                             "glibc's own settings, which return it to the kernel")
    args = parser.parse_args()
    if args.malloc == "keep":
        keep_freed_memory()

    if args.threads:
        torch.set_num_threads(args.threads)
    lines = read_lines(args.file)
    lines = lines[: args.limit] if args.limit else lines
    refs = read_lines(args.ref)[: len(lines)] if args.ref else None
    if refs is not None and len(refs) != len(lines):
        parser.error(f"--ref {args.ref}: {len(refs)} lines for {len(lines)} sources")
    for name, unit in (("repeat", "rounds"), ("copies", "copies"), ("chunk_lines", "lines"), ("output_len", "subwords")):
        if getattr(args, name) is not None and getattr(args, name) < 1:  # --chunk-lines: None by default
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: give 1 or more {unit}")
    lines, refs = lines * args.copies, refs * args.copies if refs is not None else None
    if args.outputs:
        args.outputs.mkdir(parents=True, exist_ok=True)
    results, lengths = {}, output_lengths(args.output_len)
    for precision in args.precision.split(","):
        translator = Translator.from_checkpoint(args.checkpoint, device=args.device, precision=precision)
        copies = f" ({args.copies} copies)" if args.copies > 1 else ""
        forced = f"; every output {args.output_len} subwords" if args.output_len else ""
        print(f"{len(lines)} sentences from {args.file}{copies}; device {translator.device}, precision "
              f"{translator.precision}, {torch.get_num_threads()} threads{forced}")
        print(f"{'search':<8} {'cache':<9} {'sent/s':>8} {'tok/s':>9} {'seconds':>8} {'first s':>8} {'tokens':>7} {'peak MiB':>9} "
              f"{'max_tokens':>10} {'chunk':>6} {'precision':>9} {'BLEU':>6} {'same as --against':>17}")
        for name, beam, cached in SETTINGS:
            if (args.only and name != args.only) or (args.cached_only and not cached):
                continue
            beam = beam or args.beam
            r = run_setting(translator, lines, beam=beam, cached=cached, max_tokens=args.max_tokens, repeat=args.repeat,
                            chunk_lines=args.chunk_lines, lengths=lengths)
            search = f"{name}{beam}_{'cached' if cached else 'uncached'}"
            results[f"{search}_{translator.precision}"] = r
            r["bleu"] = score(r["outputs"], refs)["bleu"] if refs is not None else None
            r["identical"] = _identical(r["outputs"], args.against / f"{search}.txt") if args.against else None
            if args.outputs:  # fp32's as <row>.txt, which --against reads; another precision's beside it
                name = search if translator.precision == "fp32" else f"{search}_{translator.precision}"
                (args.outputs / f"{name}.txt").write_text("".join(f"{o}\n" for o in r["outputs"]), encoding="utf-8")
            bleu = f"{r['bleu']:6.2f}" if r["bleu"] is not None else f"{'-':>6}"
            same = f"{r['identical']}/{len(lines)}" if r["identical"] is not None else "-"
            print(f"{name + str(beam):<8} {'cached' if cached else 'uncached':<9} {r['sentences_per_s']:8.2f} "
                  f"{r['tokens_per_s']:9.1f} {r['seconds']:8.2f} {r['first_seconds']:8.2f} {r['target_tokens']:7d} {r['peak_mem_mib']:9.0f} "
                  f"{r['max_tokens']:10d} {r['chunk_lines']:6d} {r['precision']:>9} {bleu} {same:>17}", flush=True)
            if args.profile:  # after the timing, which it would slow down
                trace = None
                if args.trace:
                    args.trace.mkdir(parents=True, exist_ok=True)
                    trace = args.trace / f"{search}_{translator.precision}.json"
                with Profile(translator.device, trace=trace) as prof:
                    list(translator.translate_stream_nbest(lines, beam=beam, cached=cached, max_tokens=args.max_tokens,
                                                           chunk_size=args.chunk_lines, **lengths))
                print(f"{search} {translator.precision}: {prof.summary(len(lines), 'sentence')}", flush=True)
        for name in ("greedy1", f"beam{args.beam}"):
            c = results.get(f"{name}_cached_{translator.precision}")
            u = results.get(f"{name}_uncached_{translator.precision}")
            if c and u:
                same = sum(a == b for a, b in zip(c["outputs"], u["outputs"]))
                print(f"{name}: cached is {u['seconds'] / c['seconds']:.2f}x faster than uncached "
                      f"({same}/{len(lines)} identical outputs)")
    if args.json:
        args.json.write_text(json.dumps({k: {m: v for m, v in r.items() if m != "outputs"}
                                         for k, r in results.items()}, indent=2))


def _identical(outputs: list[str], path: Path) -> int:
    """Lines of `outputs` equal to the same line of another run's outputs file."""
    other = read_lines(path)
    if len(other) != len(outputs):
        raise SystemExit(f"{path}: {len(other)} lines, but this run translated {len(outputs)}")
    return sum(a == b for a, b in zip(outputs, other, strict=True))


if __name__ == "__main__":
    main()
