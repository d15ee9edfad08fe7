"""One training per run directory: an OS file lock on `run_dir/.lock`, held by rank 0 for the life of the run.

The lock is `flock(LOCK_EX | LOCK_NB)`. The kernel drops it when the holder's last file descriptor
closes, so a run killed by SIGKILL or a crash leaves a lock file that the next run simply takes:
no PID liveness check and no stale-lock heuristics. The PID and start time written into the file
are only there to name the holder in the refusal.

A forked child (a DataLoader worker) shares the parent's open file description, and with it the
lock, until it exits; a worker outliving a killed trainer by a few seconds would keep the run
directory locked. `_drop_in_child` closes the child's copy right after every `os.fork()`; closing
(unlike `LOCK_UN`) leaves the parent's lock in place. `O_CLOEXEC` does the same for `exec`.

Where `fcntl` does not exist (Windows) there is no lock.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from nmt.distributed import on_main
from nmt.errors import UserError
from nmt.fileio import not_a_file

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"
_held_fds: set[int] = set()  # descriptors of the locks this process holds


def _drop_in_child() -> None:
    for fd in _held_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    _held_fds.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_in_child)


class RunLock:
    """The lock on one run directory; `release()` (or the process ending) frees it."""

    def __init__(self, *, path: Path, fd: int | None) -> None:
        self.path, self._fd = path, fd

    @classmethod
    def acquire(cls, run_dir: Path) -> RunLock:
        """Create `run_dir` if needed and lock it for this process.

        Raises:
            UserError: another process holds the lock (the message names its PID and start time),
                or `run_dir` cannot be created or written.
        """
        path = Path(run_dir) / LOCK_NAME
        if fcntl is None:
            log.debug("no fcntl on this platform: %s is not locked against a second training", run_dir)
            return cls(path=path, fd=None)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise unwritable_run_dir(run_dir, err) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(f"{run_dir} is in use by another training ({holder(path)}); "
                            f"wait for it, stop it, or use another run_dir") from None
        os.set_inheritable(fd, False)
        _held_fds.add(fd)
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {started}\n".encode(), 0)
        return cls(path=path, fd=fd)

    def release(self) -> None:
        """Unlock (idempotent). The file stays: removing it could let two runs lock two different files."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        _held_fds.discard(fd)
        os.close(fd)  # our only descriptor on it: closing releases the flock


def holder(path: Path) -> str:
    """'PID 12345, started 2026-11-23 09:10:00' from the lock file at `path`, as its holder wrote it."""
    try:
        pid, started = path.read_text(encoding="utf-8").strip().split(" ", 1)
    except (OSError, ValueError):  # unreadable, or the holder has locked but not yet written
        return "PID unknown"
    return f"PID {pid}, started {started}"


def lock_run_dir(run_dir: Path, ctx) -> RunLock | None:
    """Rank 0 locks `run_dir`; every rank raises the same UserError when it cannot (`on_main`).

    Args:
        run_dir: the run directory.
        ctx: the `nmt.distributed.Dist` of this process.

    Returns:
        The lock on rank 0, None on the other ranks.
    """
    return on_main(lambda: RunLock.acquire(run_dir), ctx)


def unwritable_run_dir(run_dir: str | Path, err: OSError) -> UserError:
    """The error for a `run_dir` that cannot be made or written: what stands in its way, or the system's reason."""
    path = Path(run_dir)
    why = (f"{not_a_file(path) or 'a file'}, not a folder" if path.exists() and not path.is_dir()
           else f"not writable ({err.strerror})")
    return UserError(f"run_dir {run_dir}: {why}; choose another run_dir")
