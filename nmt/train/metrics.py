"""The run's metrics: `metrics.jsonl` always, TensorBoard event files when `tensorboard` is installed.

Each record is one JSON object with an `event` (start: what the session runs on; train,
valid, summary, ...) and a `step`. On resume, records past the checkpoint's step (written by the
interrupted session after its last checkpoint) and a half-written last line are
dropped, so the file reads as if the run had never stopped, but for an `interrupted`
record and the first `train` record after it, which averages the updates since the resume.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from nmt.errors import UserError, headline, shorten

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
                folder = run_dir / "tensorboard"
                if folder.exists() and not folder.is_dir():  # SummaryWriter's makedirs: a bare FileExistsError
                    raise UserError(f"{folder}: a file, where the run writes its TensorBoard folder; move it away, or "
                                    "set train.tensorboard: false")
                self.writer = SummaryWriter(str(folder), purge_step=resume_step + 1)

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
    """Cut `path` after its last record at or before `step`, and end its last line.

    Every session appends from its checkpoint's step after this cut, so the steps in the file never fall:
    only the tail past `step` (and a line cut short by a kill) needs reading, however long the run.
    """
    if not path.is_file():
        return
    with open(path, "r+b") as f:
        end = f.seek(0, os.SEEK_END)
        cut, dropped = 0, 0
        for start, line in _lines_from_the_end(f, end):
            if _at_or_before(line, step):
                cut = start + len(line)
                break
            dropped += bool(line.strip())
        f.seek(cut)
        ended = cut == 0 or f.read(1) == b"\n"  # the kept part ends in a newline (or is empty)
        keep = cut + (cut > 0 and ended)
        if keep == end and ended:
            return
        f.truncate(keep)
        if not ended:  # a last record whole but for its newline
            f.seek(keep)
            f.write(b"\n")
        f.flush()
        os.fsync(f.fileno())
    if dropped:
        log.info("metrics.jsonl: dropped %d records written after step %d", dropped, step)


def _at_or_before(line: bytes, step: int) -> bool:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):  # cut short by a kill
        return False
    return isinstance(record, dict) and record.get("step", 0) <= step


def _lines_from_the_end(f: BinaryIO, end: int, block: int = 1 << 16) -> Iterator[tuple[int, bytes]]:
    """(offset, line without its newline) for each line of `f`, the last first, reading `block` bytes at a time."""
    pos, tail = end, b""  # tail: the bytes after `pos` not yet handed out, the start of a line perhaps unread
    while pos > 0:
        size = min(block, pos)
        pos -= size
        f.seek(pos)
        tail = f.read(size) + tail
        lines = tail.split(b"\n")
        offset = pos + len(tail)
        for line in reversed(lines[1:]):  # lines[0] may continue before `pos`
            offset -= len(line) + 1
            if line or offset + 1 < end:  # not the empty piece after the file's final newline
                yield offset + 1, line
        tail = lines[0]
    if end > 0:
        yield 0, tail
