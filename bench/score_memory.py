"""Scoring a large test set: seconds and peak memory of each metric, sacreBLEU's one call against `nmt.metrics.score`.

    python bench/score_memory.py [--lines 50000] [--metrics bleu,chrf,ter]

The references are the toy test set (data/toy/test.de) repeated to `--lines` lines; the hypotheses are
the references with their last two words swapped, good translations with a few errors each. Each
measurement runs in a fresh process, which reports its peak resident memory (`ru_maxrss`, the
process's startup included):

    sacrebleu  `Metric.corpus_score(hyps, [refs])`: every reference analysed before scoring
    nmt        `nmt.metrics.score` (`nmt eval`, validation, `nmt analyze`): `SCORE_CHUNK` references at a time

The two ways give the same score, printed beside each.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/score_memory.py`
    sys.path.insert(0, str(ROOT))

WAYS = ("sacrebleu", "nmt")


def pairs(lines: int) -> tuple[list[str], list[str]]:
    """(hypotheses, references) of `lines` lines each."""
    test = (ROOT / "data" / "toy" / "test.de").read_text(encoding="utf-8").splitlines()
    refs = [test[i % len(test)] for i in range(lines)]
    hyps = [" ".join([*r.split()[:-2], *reversed(r.split()[-2:])]) for r in refs]
    return hyps, refs


def measure(way: str, metric: str, lines: int) -> str:
    """One measurement in this process: "<seconds> <peak MiB> <score>"."""
    from nmt.metrics import DEFAULTS, METRICS, score, with_metrics

    hyps, refs = pairs(lines)
    start = time.perf_counter()
    if way == "sacrebleu":
        value = round(METRICS[metric].scorer(DEFAULTS.tokenize, DEFAULTS.lowercase).corpus_score(hyps, [refs]).score, 2)
    else:
        value = score(hyps, refs, with_metrics(None, [metric], besides=False))[metric]
    seconds = time.perf_counter() - start
    return f"{seconds:.2f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} {value}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=50_000)
    ap.add_argument("--metrics", default="bleu,chrf,ter")
    ap.add_argument("--child", nargs=2, metavar=("WAY", "METRIC"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(measure(*args.child, args.lines))
        return
    print(f"{args.lines:,} lines, each measurement in a fresh process")
    for metric in args.metrics.split(","):
        for way in WAYS:
            done = subprocess.run([sys.executable, __file__, "--lines", str(args.lines), "--child", way, metric],
                                  capture_output=True, text=True, check=True)
            seconds, mib, value = done.stdout.split()
            print(f"  {metric:<5} {way:<10} {float(seconds):7.2f} s  {int(mib):6,} MiB peak  score {value}")


if __name__ == "__main__":
    main()
