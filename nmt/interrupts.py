"""SIGTERM stops a command as Ctrl-C does, so that its cleanup runs.

SIGTERM is how `kill`, batch schedulers, systemd and docker stop a process, and its default
action ends the process where it stands: a temporary file beside an output (`nmt.fileio.write_atomic`)
stays behind, and a stopped translation does not say where its lines were kept. While
`sigterm_interrupts` is active, SIGTERM raises `Terminated`, a `KeyboardInterrupt`, so every
`finally` and `except BaseException` on the way out runs as for Ctrl-C; the process then ends
by SIGTERM after all (exit status 143 in a shell), as the one who sent it expects; as the first process of a
container, which the default action cannot end, it exits as Ctrl-C makes it (130).

Training has its own handling (`nmt.train.faults.StopSignals`): it finishes the update and
writes a checkpoint first.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program was when it came (`sigterm_interrupts`)."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While active, SIGTERM raises `Terminated`; a `Terminated` that leaves the block ends the process by
    SIGTERM. Code inside may catch it as a `KeyboardInterrupt` and carry on (`nmt serve` drains its requests).

    Installed only in the main thread (Python delivers signals there); elsewhere, as for a command run from a
    test's thread, it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    except Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        flush_std_streams()
        os.kill(os.getpid(), signal.SIGTERM)
        raise  # reached only where the signal's default action is ignored (PID 1 of a container): exit 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def flush_std_streams() -> None:
    """Flush standard output and error before the process ends without the interpreter's exit, which would."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None: closed when the process started (`>&-`)
                stream.flush()
        except (OSError, ValueError):
            pass


def stops_cleanly_on_sigterm(command: F) -> F:
    """`command` run inside `sigterm_interrupts` (for the commands that write files)."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        with sigterm_interrupts():
            return command(*args, **kwargs)

    return run  # type: ignore[return-value]
