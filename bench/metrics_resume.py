"""What a resume spends on `metrics.jsonl`: the records past the checkpoint's step are cut off.

    python bench/metrics_resume.py [--records 1000000] [--past 100] [--dir DIR]

Writes a run's log of `--records` train records (one per step, as `train.log_every: 1` does), then times
`MetricsLog` opening it to resume at `--records - --past`, and prints the file's size, the time and this
process's peak resident memory. The file goes to `--dir` (default: a fresh temporary folder), removed at the end.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

from nmt.train.metrics import MetricsLog


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--past", type=int, default=100)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="metrics_resume_", dir=args.dir))
    try:
        record = {"event": "train", "epoch": 3, "loss": 3.1234567, "ppl": 22.75, "lr": 0.00012345,
                  "grad_norm": 1.2345, "tokens_per_s": 12345.6, "seconds": 0.123}
        with open(run_dir / "metrics.jsonl", "w", encoding="utf-8") as f:
            for step in range(1, args.records + 1):
                f.write(json.dumps({**record, "step": step}) + "\n")
        size = (run_dir / "metrics.jsonl").stat().st_size
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        MetricsLog(run_dir, resume_step=args.records - args.past, tensorboard=False)
        seconds = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        kept = sum(1 for _ in open(run_dir / "metrics.jsonl", "rb"))
        print(f"metrics.jsonl of {args.records:,} records ({size / 1e6:.0f} MB), resumed {args.past} steps back: "
              f"{seconds * 1000:.1f} ms, {kept:,} records kept, peak RSS {peak / 1024:.0f} MB "
              f"({(peak - before) / 1024:.0f} MB more than before opening it)")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
