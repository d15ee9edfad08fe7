"""Checkpoints written in the background: the training loop waits for a copy of the state, not for the disk.

Writing a checkpoint of the Multi30k Transformer (7.6M parameters and Adam's two moments, 91 MB) took
130-140 ms on a 2-core CPU's disk, and a validation writes two (`ckpt_<step>.pt` and `best.pt`). At the
941,000 target tokens/s of recorded updates (`train.cuda_graphs`) that `bench/train_speed.py` measured on
an H200, the 250 updates between two checkpoints of `configs/multi30k_transformer.yaml` take about 1.1 s,
so a GPU waiting for such writes would idle for about a tenth of the run. Here the loop only copies the
state into host memory (`to_host`), and one writer thread writes it:

    the loop's thread                          the writer thread
    the payload, copied to host memory   ->    ckpt_<step>.pt, then best.pt, then pruning,
    (the next updates run meanwhile)           each atomic (`nmt.checkpoint.save_checkpoint`)

One write at a time and in order, each as the loop wrote it before, so a kill at any moment leaves what
`nmt.train.resume` expects. A checkpoint waits for the one before it, so at most one copy of the state
is held besides the model's own. The loop waits for the writer where it needs the files (a signal,
averaging, the end of training), and a write's error (a full disk) is raised in the loop's thread at
its next update.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from nmt.checkpoint import prune_checkpoints, save_checkpoint


def to_host(tree: Any) -> Any:
    """A copy of `tree` (dicts, lists, tuples, tensors, plain values) whose tensors are copies in host memory,
    which later updates of the live tensors leave alone."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {key: to_host(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(to_host(value) for value in tree)
    return tree  # numbers, strings, bytes, None: nothing the loop changes in place


def write_checkpoints(payload: dict[str, Any], path: Path, *, best: bool, run_dir: Path, keep_last: int,
                      off_schedule: bool = False, replaces: Path | None = None) -> None:
    """What a save writes, in this order: `path`, then `run_dir/best.pt` with `best`, then `replaces` removed,
    then the periodic checkpoints pruned to `keep_last`, each atomically. A kill before best.pt is written
    leaves the new checkpoint for `nmt.train.resume` to copy, and removals, which could take it, come last.

    A checkpoint `off_schedule` (written where training stopped: a signal, `train.max_time`, a last step
    off the save schedule; or the parent's weights where fine-tuning starts) is spared by the pruning and
    not counted in `keep_last`; the next save of a run that goes on `replaces` it. So a run stopped and
    resumed keeps, and averages, the checkpoints of the same steps as one that ran straight through.
    """
    save_checkpoint(payload, path)
    if best:
        save_checkpoint(payload, run_dir / "best.pt")
    if replaces is not None and replaces != path:
        replaces.unlink(missing_ok=True)
    prune_checkpoints(run_dir, keep_last, spare=path if off_schedule else None)


class CheckpointWriter:
    """Writes a run's checkpoints on one background thread (see the module docstring).

    Args:
        run_dir: the run directory, where `best.pt` goes and old checkpoints are pruned.
        keep_last: periodic checkpoints to keep (`train.keep_last`).
    """

    def __init__(self, run_dir: Path, keep_last: int) -> None:
        self.run_dir, self.keep_last = Path(run_dir), keep_last
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nmt-checkpoint")
        self._last: Future[None] | None = None

    def submit(self, payload: dict[str, Any], path: Path, *, best: bool, off_schedule: bool = False,
               replaces: Path | None = None) -> None:
        """Write `payload` to `path` (and to `best.pt` with `best`), then prune, after the write before it
        (`write_checkpoints` says what `off_schedule` and `replaces` do).

        `payload` is copied to host memory first; the call returns once it is.

        Raises:
            UserError: the write before it failed (a full disk).
        """
        self.wait()
        copy = to_host(payload)
        self._last = self._pool.submit(write_checkpoints, copy, Path(path), best=best, run_dir=self.run_dir,
                                       keep_last=self.keep_last, off_schedule=off_schedule, replaces=replaces)

    def raise_if_failed(self) -> None:
        """Raise the error of a write that has failed, without waiting for one in progress."""
        if self._last is not None and self._last.done():
            self.wait()

    def wait(self) -> None:
        """Wait until every checkpoint submitted is written.

        Raises:
            UserError: a write failed (a full disk); the files it would have replaced are as they were.
        """
        last, self._last = self._last, None
        if last is not None:
            last.result()

    def close(self) -> None:
        """Wait for the writes (raising a failure), then stop the thread."""
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
