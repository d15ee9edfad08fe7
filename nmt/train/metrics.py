"""The run's metrics: `metrics.jsonl` always, TensorBoard event files when `tensorboard` is installed.

Each record is one JSON object with an `event` (train, valid, summary, ...)
and a `step`. On resume, records past the checkpoint's step (written by the
interrupted session after its last checkpoint) and a half-written last line are
dropped, so the file reads as if the run had never stopped, but for an `interrupted`
record and the first `train` record after it, which averages the updates since the resume.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

from nmt.errors import headline, shorten
from nmt.fileio import write_atomic

log = logging.getLogger(__name__)


class MetricsLog:
    """Appends records to `run_dir/metrics.jsonl` (and TensorBoard); does nothing when not `enabled`."""

    def __init__(self, run_dir: Path, *, resume_step: int, enabled: bool = True, tensorboard: bool = True) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled
        self.writer = None
        if not enabled:
            return
        _drop_records_after(self.path, resume_step)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except Exception as err:  # optional (the `tensorboard` extra): missing, or broken (its protobuf's version)
                why = ("the tensorboard package is not installed" if importlib.util.find_spec("tensorboard") is None
                       else f"torch.utils.tensorboard does not import ({type(err).__name__}: {shorten(headline(err))})")
                log.warning("train.tensorboard: %s, so this run writes metrics.jsonl but no TensorBoard event files; "
                            "install it with: pip install 'nmt[tensorboard]' (or set train.tensorboard: false)", why)
            else:
                self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step + 1)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is not None and record.get("event") in ("train", "valid"):
            for key, value in record.items():
                if key not in ("event", "step", "epoch", "best") and isinstance(value, (int, float)):
                    self.writer.add_scalar(f"{record['event']}/{key}", value, record["step"])
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _drop_records_after(path: Path, step: int) -> None:
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    keep = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # cut short by a kill
            continue
        if record.get("step", 0) <= step:
            keep.append(line if line.endswith("\n") else line + "\n")
    if len(keep) != len(lines):
        log.info("metrics.jsonl: dropped %d records written after step %d", len(lines) - len(keep), step)
        write_atomic(path, lambda f: f.write("".join(keep).encode("utf-8")))
