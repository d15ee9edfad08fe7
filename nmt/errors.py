"""Errors that reach the user as one line, never as a traceback.

`UserError` covers everything the user can fix: a bad config, a missing or
malformed data file, an incompatible checkpoint. The CLI prints its message and
exits with status 2. Anything else is a bug or a runtime failure (exit 1), except
`OutputClosed`: a reader that stopped reading (status 141, no message).

A message is one line that starts with what the user must look at, then says
what is wrong and, where it is not obvious, what to do:
`<file, file:line, key path or option>: <what is wrong>; <what to do>`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


class UserError(Exception):
    """A problem with the user's input: config, data files, checkpoints, arguments."""

    exit_code = 2


class ConfigError(UserError):
    """An invalid configuration file or override; the message names the key path.

    It follows from the config and the command line alone, so under torchrun every process
    of a node meets it alike, and the node's local rank 0 alone prints it."""


class NodeError(UserError):
    """A setting this machine cannot run as asked: a device it lacks, more processes than GPUs, CUDA graphs
    on a CPU or under torchrun.

    It follows from the config, the command line and the node, so under torchrun every process of a
    node meets it alike, and the node's local rank 0 alone prints it, as a `ConfigError`."""


class DataError(UserError):
    """A missing, malformed or unusable corpus; the message names the file (and line)."""


class CheckpointError(UserError):
    """A missing, truncated or incompatible checkpoint."""


class RelayedError(UserError):
    """Rank 0's error, raised on the ranks that waited for it so that they stop too (`nmt.distributed.on_main`).

    Rank 0 prints it; the others exit with its status in silence, not with a copy of its line each."""


class PeerStopped(Exception):
    """Another process of this torchrun job stopped (its own error, a signal, the OOM killer), and this one,
    which needed it for a collective, cannot go on (`nmt.distributed.lost_peers_named`).

    That process's message says why; this one prints a line that points there, where gloo's own message
    ("Connection closed by peer [127.0.0.1]:52121") names a socket and reads as the failure itself."""

    exit_code = 1


class OutputClosed(Exception):
    """Standard output's reader went away (`nmt translate ... | head`): the CLI stops quietly with status 141,
    as a Unix tool killed by SIGPIPE does, so `set -o pipefail` tells it from a finished run."""

    exit_code = 141


@contextmanager
def reader_may_leave() -> Iterator[None]:
    """Around writes to standard output: its reader going away (`| head`) raises `OutputClosed`, after pointing
    standard output at the null device, so that what is still buffered goes nowhere at exit, without an error."""
    try:
        yield
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        raise OutputClosed() from None


def shorten(text: str, limit: int = 200) -> str:
    """`text` if it has at most `limit` characters, else its start and end around the count.

    Messages quote what the user wrote; a 1 MB value must not make a 1 MB line.
    `shorten("x" * 10_000, 20)` is `"xxxxxxxxxx ... (10000 characters) ... xxxxxxxxxx"`.
    """
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]} ... ({len(text)} characters) ... {text[len(text) - half:]}"


def headline(err: BaseException) -> str:
    """The first line of `err`'s message ("" for none): torch's errors run to several lines of advice."""
    text = str(err).strip()
    return text.splitlines()[0] if text else ""
