"""SIGTERM stops a command as Ctrl-C does, so that its cleanup runs.

SIGTERM is how `kill`, batch schedulers, systemd and docker stop a process, and its default
action ends the process where it stands: a temporary file beside an output (`nmt.fileio.write_atomic`)
stays behind, and a stopped translation does not say where its lines were kept. While
`sigterm_interrupts` is active, SIGTERM raises `Terminated`, a `KeyboardInterrupt`, so every
`finally` and `except BaseException` on the way out runs as for Ctrl-C; the process then ends
by SIGTERM after all (exit status 143 in a shell), as the one who sent it expects; as the first process of a
container, which the default action cannot end, it exits as Ctrl-C makes it (130).

A signal that lands while a module is being imported waits until no import is under way: raised in the
middle of one, it leaves modules half made (numpy's core then refuses to load again), or code in the import
catches it and carries on as if it never came (torch's import does, and the command would go on).
`signals_after_imports` gives Ctrl-C the same patience for the whole command.

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
from types import FrameType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program was when it came (`sigterm_interrupts`)."""


RETRY_SECONDS = 0.02
"""How soon a signal that came during an import is delivered again."""

_deferred: dict[int, threading.Timer] = {}
"""Signals that came during an import and wait to be delivered again, with the timer that sends each."""


def _raising_after_imports(exception: type[BaseException]) -> Callable[[int, FrameType | None], None]:
    """A signal handler that raises `exception` where the program is, once no import is under way."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if _importing(frame):
            _again_later(signum)
            return
        _settle(signum)
        raise exception

    return handler


_raise_terminated = _raising_after_imports(Terminated)
_raise_keyboard_interrupt = _raising_after_imports(KeyboardInterrupt)


def _importing(frame: FrameType | None) -> bool:
    """Whether `frame` runs inside an import: the import machinery's frames are on its stack."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _again_later(signum: int) -> None:
    """Send `signum` to this process again in a moment (from a thread: a handler must not wait)."""
    _settle(signum)  # one timer per signal: a second Ctrl-C during the same import sends one more, not two
    timer = threading.Timer(RETRY_SECONDS, os.kill, (os.getpid(), signum))
    timer.daemon = True
    _deferred[signum] = timer
    timer.start()


def _settle(signum: int) -> bool:
    """Stop waiting to deliver `signum` again; whether it was waiting. Its timer may have sent it already, so
    the caller leaves a handler in place that expects it."""
    timer = _deferred.pop(signum, None)
    if timer is not None:
        timer.cancel()
    return timer is not None


def _ignore(signum: int, frame: FrameType | None) -> None:
    """A handler for a signal that is already being acted on (the process is on its way out because of it)."""


@contextmanager
def signals_after_imports() -> Iterator[None]:
    """While active, Ctrl-C raises `KeyboardInterrupt` as by default, but never inside an import; on the way out,
    a signal held back by an import and not yet delivered again (the block ended first) ends the process as it
    would have: SIGTERM by SIGTERM, Ctrl-C with status 130.

    For the command line, in its main thread; a SIGINT handler of someone else's is left alone.
    """
    ours = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if ours:
        signal.signal(signal.SIGINT, _raise_keyboard_interrupt)
    try:
        yield
    finally:
        if signal.SIGTERM in _deferred:
            flush_std_streams()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        if _settle(signal.SIGINT):
            # its timer may have fired already: that copy must not raise while the interpreter exits
            signal.signal(signal.SIGINT, _ignore)
            raise SystemExit(130)
        if ours:
            signal.signal(signal.SIGINT, signal.default_int_handler)


@contextmanager
def sigterm_interrupts(*, ends_process: bool = True) -> Iterator[None]:
    """While active, SIGTERM raises `Terminated`; a `Terminated` that leaves the block ends the process by
    SIGTERM, or, with `ends_process` False, leaves it as it is, for the caller to say what stopped. Code inside
    may catch it as a `KeyboardInterrupt` and carry on (`nmt serve` drains its requests).

    Installed only in the main thread (Python delivers signals there); elsewhere, as for a command run from a
    test's thread, it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
        if _settle(signal.SIGTERM):  # came during an import the block ended with: it stops the command still
            raise Terminated
    except Terminated:
        if not ends_process:
            raise
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
