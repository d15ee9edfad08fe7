"""What can stop a training run early, and how each case ends.

- SIGINT or SIGTERM: `StopSignals` notes the first one; the loop then writes a
  checkpoint and raises `Interrupted` (the CLI exits 130 or 143). A second signal,
  a second or more later, raises `Interrupted` at once, without a checkpoint.
  Before the loop (`stops_before_training`: the data, tokenizer and model being
  prepared) one stops at once, with `Interrupted` too.
- Non-finite losses or gradients: the loop skips the update; after
  `train.max_bad_steps` in a row it raises `TrainingDiverged`.
- CUDA out of memory: `out_of_memory` turns the error into one that names the setting to lower.
- A run directory without room for checkpoints: `check_free_space` says so before training starts.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from nmt.errors import UserError, headline
from nmt.interrupts import Terminated, sigterm_interrupts
from nmt.launch import world_size

log = logging.getLogger(__name__)


class Interrupted(Exception):
    """Training stopped on SIGINT or SIGTERM.

    Attributes:
        signum: the signal.
        checkpoint: the checkpoint written before stopping (None after a second signal, or before training).
        exit_code: 128 + signum, as a shell reports a process killed by the signal.
    """

    def __init__(self, signum: int, checkpoint: Path | None = None, step: int | None = None, *,
                 preparing: bool = False) -> None:
        self.signum, self.checkpoint, self.step = signum, checkpoint, step
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        if preparing:
            msg = (f"stopped by {name} before training began (while the data, tokenizer and model were prepared); "
                   "run the same command again")
        elif checkpoint is None:
            msg = f"stopped by a second {name} without writing a checkpoint; the next start resumes from the last one"
        else:
            msg = f"stopped by {name} at step {step}; saved {checkpoint}; run the same command to continue"
        super().__init__(msg)


@contextlib.contextmanager
def stops_before_training() -> Iterator[None]:
    """While active (the run being built, the loop being set up), SIGINT, and SIGTERM in a lone process, stop at
    once with `Interrupted`, so that the command says so in one line, and what is on the way out (a child
    training the tokenizer, a temporary file, the run directory's lock) is cleaned up. Under torchrun SIGTERM
    keeps its default action: a process waiting for rank 0 in a collective would not run a Python handler until
    that wait ended.

    Raises:
        Interrupted: SIGINT or SIGTERM came.
    """
    alone = world_size() == 1
    try:
        # a SIGTERM held back by an import the block ended in is raised as the block ends, here too
        with sigterm_interrupts(ends_process=False) if alone else contextlib.nullcontext():
            yield
    except KeyboardInterrupt as err:  # Terminated is one: SIGTERM
        signum = signal.SIGTERM if isinstance(err, Terminated) else signal.SIGINT
        raise Interrupted(signum, preparing=True) from None


class TrainingDiverged(UserError):
    """The loss or the gradients stayed non-finite for `train.max_bad_steps` updates in a row."""


class StopSignals:
    """While active, SIGINT and SIGTERM only set `signum`; a second one raises `Interrupted`.

    A signal within `repeat_after` seconds of the first counts as the same one:
    under torchrun a worker may get it twice at once (from a terminal or a cluster
    scheduler, and forwarded by the torchrun agent), which must not cost the checkpoint.
    Installed only in the main thread (Python delivers signals there); elsewhere
    it does nothing and the signals keep their handlers.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, *, repeat_after: float = 1.0) -> None:
        self.signum = 0  # 0: none received
        self.repeat_after = repeat_after
        self._first_at = 0.0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum:
            if time.monotonic() - self._first_at >= self.repeat_after:
                raise Interrupted(signum)
            return
        self.signum, self._first_at = signum, time.monotonic()
        log.warning("%s received: saving a checkpoint after this step, then stopping "
                    "(send it again to stop at once)", signal.Signals(signum).name)


def out_of_memory(err: Exception, *, max_tokens: int, accumulate: int, shapes: str) -> UserError:
    """A user-facing error for a CUDA out-of-memory error on a batch."""
    detail = headline(err)
    return UserError(
        f"CUDA out of memory on a batch of {shapes}: lower train.max_tokens (now {max_tokens}) and raise "
        f"train.accumulate (now {accumulate}) to keep the tokens per update; or use precision bf16. ({detail})"
    )


def checkpoint_bytes(n_params: int) -> int:
    """About how large a checkpoint is: fp32 weights and Adam's two moments, plus 1 MiB of the rest."""
    return 12 * n_params + 2**20


def check_free_space(run_dir: Path, n_params: int, keep_last: int) -> None:
    """Refuse to start when `run_dir` cannot hold even one more checkpoint safely; warn when it is tight.

    Saving writes the new file beside the old ones before older ones are pruned,
    so one save needs room for two checkpoints (the new one and `best.pt`).

    Raises:
        UserError: less free space than two checkpoints need.
    """
    size = checkpoint_bytes(n_params)
    free = shutil.disk_usage(run_dir).free
    if free < 2 * size:
        raise UserError(
            f"run_dir {run_dir}: only {_gib(free)} free, but a checkpoint of this model ({n_params:,} parameters "
            f"with optimizer state) takes about {_gib(size)} and saving needs room for two; "
            f"free some space or choose another run_dir"
        )
    steady = (keep_last + 2) * size  # kept checkpoints, best.pt and the one being written
    if free < steady:
        log.warning("run_dir %s: %s free; keep_last=%d checkpoints plus best.pt need about %s",
                    run_dir, _gib(free), keep_last, _gib(steady))


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
