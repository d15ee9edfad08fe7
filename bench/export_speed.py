"""`nmt translate` beside its CTranslate2 export: speed and agreement of greedy and beam search.

    python bench/export_speed.py CHECKPOINT FILE [--limit N] [--threads 2] [--beam 5] [--repeat 2]
        [--json results.json]

The checkpoint is exported (`nmt.export.export_checkpoint`, float32) to a temporary
folder. Each engine then translates the same lines of FILE (plain text or .gz) on the
CPU with the same number of threads, after a short warm-up, timing text in to text out:
- nmt: `Translator.translate_nbest`, what `nmt translate` runs (length-sorted
  token-budget batches of the checkpoint's `decode.max_tokens`);
- CTranslate2: sentencepiece encoding, `translate_batch` (length-sorted batches of
  the same source-token budget over the beam, `batch_type="tokens"`), decoding,
  as a user of the export would write it: `min_decoding_length=0`, the
  checkpoint's length penalty, CTranslate2's default `max_decoding_length` (256).
The settings take turns, `--repeat` rounds, and each keeps its fastest run (the machine may be shared). Agreement is the
share of lines whose output text is identical. Greedy CTranslate2 also runs (and is
timed) under nmt's own length rule, at most floor(max_len_a * S + max_len_b) tokens,
with one `translate_batch` call per source length S: the exact comparison.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import torch

from nmt.data.text import read_lines
from nmt.data.tokenizer import Tokenizer
from nmt.export import export_checkpoint
from nmt.translate import Translator


def ct2_translate(translator, tok: Tokenizer, lines: list[str], *, beam: int, budget: int, length_penalty: float,
                  max_decoding_length: int = 256) -> list[str]:
    pieces = tok.src.encode(lines, out_type=str)
    results = translator.translate_batch(pieces, beam_size=beam, max_batch_size=budget, batch_type="tokens",
                                         length_penalty=length_penalty, min_decoding_length=0,
                                         max_decoding_length=max_decoding_length)
    return [" ".join(tok.tgt.decode(r.hypotheses[0]).split()) for r in results]


def ct2_greedy_nmt_lengths(translator, tok: Tokenizer, lines: list[str], *, max_len_a: float,
                           max_len_b: int) -> list[str]:
    """Greedy search limited per sentence as nmt limits it: one call per source length."""
    pieces = tok.src.encode(lines, out_type=str)
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(pieces):
        by_length.setdefault(len(p) + 1, []).append(i)
    out = [""] * len(lines)
    for S, rows in by_length.items():
        results = translator.translate_batch([pieces[i] for i in rows], beam_size=1, min_decoding_length=0,
                                             max_decoding_length=math.floor(max_len_a * S + max_len_b))
        for i, r in zip(rows, results):
            out[i] = " ".join(tok.tgt.decode(r.hypotheses[0]).split())
    return out


def main() -> None:
    import ctranslate2

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("file", help="source sentences, one per line (.gz allowed)")
    parser.add_argument("--limit", type=int, default=0, help="first N lines only (0: all)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of each engine")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=2, help="runs per setting; the fastest is kept")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    ours = Translator.from_checkpoint(args.checkpoint, device="cpu")
    lines = read_lines(args.file)
    lines = lines[: args.limit] if args.limit else lines
    d = ours.cfg.decode
    with tempfile.TemporaryDirectory() as tmp:
        folder = export_checkpoint(args.checkpoint, Path(tmp) / "ct2")
        tok = Tokenizer.load(folder)  # the sentencepiece model(s) written beside the export
        ct2 = ctranslate2.Translator(str(folder), device="cpu", inter_threads=1, intra_threads=args.threads)
        print(f"{len(lines)} sentences from {args.file}; {args.threads} threads; "
              f"nmt budget {ours.max_tokens_for()} source tokens x beam")
        settings = {}  # name -> run(lines) -> outputs
        for beam in (1, args.beam):
            budget = max(1, ours.max_tokens_for() // beam)
            settings[f"nmt beam {beam}"] = lambda part, beam=beam: [
                " ".join(t.split()) for t in ours.translate(part, beam=beam)]
            settings[f"ctranslate2 beam {beam}"] = lambda part, beam=beam, budget=budget: ct2_translate(
                ct2, tok, part, beam=beam, budget=budget, length_penalty=d.length_penalty)
        settings["ctranslate2 beam 1, nmt's length limits"] = lambda part: ct2_greedy_nmt_lengths(
            ct2, tok, part, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
        for run in settings.values():
            run(lines[:16])  # warm-up
        seconds = {name: math.inf for name in settings}
        outputs = {}
        for _ in range(args.repeat):  # settings take turns, so a busy spell on the machine hits them all
            for name, run in settings.items():
                start = time.perf_counter()
                outputs[name] = run(lines)
                seconds[name] = min(seconds[name], time.perf_counter() - start)
        rows = {name: {"seconds": t, "sentences_per_s": len(lines) / t} for name, t in seconds.items()}
        for name, row in rows.items():
            print(f"{name:<40} {row['sentences_per_s']:8.1f} sentences/s ({row['seconds']:.2f} s)")
    agreement = {
        "greedy": _same(outputs["nmt beam 1"], outputs["ctranslate2 beam 1"]),
        "greedy_nmt_length_rule": _same(outputs["nmt beam 1"], outputs["ctranslate2 beam 1, nmt's length limits"]),
        f"beam{args.beam}": _same(outputs[f"nmt beam {args.beam}"], outputs[f"ctranslate2 beam {args.beam}"]),
    }
    for name, (same, n) in agreement.items():
        print(f"identical outputs, {name}: {same}/{n} ({100 * same / n:.1f}%)")
    if args.json:
        args.json.write_text(json.dumps({"lines": len(lines), "threads": args.threads, "speed": rows,
                                         "agreement": {k: v[0] / v[1] for k, v in agreement.items()}}, indent=2))


def _same(a: list[str], b: list[str]) -> tuple[int, int]:
    return sum(x == y for x, y in zip(a, b)), len(a)


if __name__ == "__main__":
    main()
