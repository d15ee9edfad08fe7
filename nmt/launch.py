"""torchrun's environment (WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), read and checked.

Without torch, so that the CLI's error handler reads it as cheaply as a config error is found. A lone process
(no WORLD_SIZE, or 1) is a job of one: its rank is 0 whatever a stale RANK says. Values torchrun would not set
(`WORLD_SIZE=abc`, `RANK=5` of 2) are refused with a line that names the variable, before any rendezvous.
"""

from __future__ import annotations

import os

from nmt.errors import UserError, shorten

_WHAT_TO_DO = "unset it to run one process, or launch with torchrun, which sets it"


def _number(name: str, default: int) -> int:
    """`name` as a whole number of at least 0; `default` where it is unset or empty."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdecimal():
        raise UserError(f"environment variable {name}={shorten(repr(text))}: not a whole number of at least 0; "
                        f"{_WHAT_TO_DO}")
    return int(text)


def world_size() -> int:
    """The processes of this job: torchrun's WORLD_SIZE, 1 for a lone process."""
    size = _number("WORLD_SIZE", 1)
    if size == 0:
        raise UserError(f"environment variable WORLD_SIZE=0: a job has at least 1 process; {_WHAT_TO_DO}")
    return size


def rank() -> int:
    """This process's RANK under torchrun, which must be below WORLD_SIZE; 0 for a lone process."""
    size = world_size()
    if size == 1:
        return 0
    if not os.environ.get("RANK", "").strip():
        raise UserError(f"environment variable WORLD_SIZE={size} is set but RANK is not: launch with torchrun, which "
                        "sets both, or unset WORLD_SIZE to run one process")
    number = _number("RANK", 0)
    if number >= size:
        raise UserError(f"environment variable RANK={number}: a job of WORLD_SIZE={size} has ranks 0 to {size - 1}; "
                        f"launch with torchrun, which sets both, or unset them to run one process")
    return number


def local_rank() -> int:
    return _number("LOCAL_RANK", 0)


def local_world_size() -> int:
    """Processes on this node: torchrun's LOCAL_WORLD_SIZE, else at least this process's LOCAL_RANK + 1."""
    return _number("LOCAL_WORLD_SIZE", local_rank() + 1)


def is_main_process() -> bool:
    """Rank 0 of a torchrun job, or a lone process (reads the launcher's RANK, so it holds after teardown too)."""
    return rank() == 0


def check_rendezvous() -> None:
    """Refuse a job of several processes whose environment cannot meet (`env://`): torchrun sets MASTER_ADDR and
    MASTER_PORT; a WORLD_SIZE left set in a shell has neither."""
    size, missing = world_size(), [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if missing:
        raise UserError(f"environment variable WORLD_SIZE={size}, but {' and '.join(missing)} "
                        f"{'is' if len(missing) == 1 else 'are'} not set: launch with torchrun, which sets them, "
                        f"or unset WORLD_SIZE and RANK to run one process")
    port = os.environ["MASTER_PORT"].strip()
    if not port.isdecimal() or not 0 < int(port) < 65536:
        raise UserError(f"environment variable MASTER_PORT={shorten(repr(port))}: not a port (1 to 65535); "
                        "launch with torchrun, which sets it")


def launched_as() -> tuple[int, int, int]:
    """(world size, rank, local rank) for the error handler: a lone process's where torchrun's variables are
    themselves the error being printed."""
    try:
        return world_size(), rank(), local_rank()
    except UserError:
        return 1, 0, 0
