"""The valid values of a config key: numeric `Range`s, and the names a device key takes.

A numeric field states its range once, in its metadata (`num`): `check_ranges` checks a section's fields
against them in its `__post_init__`, the loader checks every key it reads (`range_of`), and
`nmt.config.reference` prints them.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda", "mps")
"""The devices `train.device` and `--device` accept by name."""
CUDA_INDEX = re.compile(r"cuda:(\d+)")
"""`cuda:N`, one GPU by number: `train.device` and `--device` accept it besides `DEVICES`."""


def device_problem(name: str) -> str | None:
    """Why `name` is no device `--device` accepts (one of `DEVICES`, or `cuda:N`); None when it is one."""
    if name in DEVICES or CUDA_INDEX.fullmatch(name):
        return None
    return f"not one of {', '.join(map(repr, DEVICES))} or 'cuda:N'"


@dataclass(frozen=True)
class DeviceNames:
    """The valid values of a device key, checked as a `Range` is: one of `DEVICES`, or `cuda:N`."""

    def __str__(self) -> str:
        return f"{', '.join(DEVICES)} or cuda:N"

    def problem(self, value: Any) -> str | None:
        """Why `value` names no device; None where it names one."""
        problem = device_problem(value) if isinstance(value, str) else None
        return f"{value!r} is {problem}" if problem else None


INT64_LIMIT = 1 << 63
"""Integers a key may take are those of a 64-bit integer, -2**63 to 2**63 - 1, whatever its range."""


@dataclass(frozen=True)
class Range:
    """The valid values of a numeric key: from `lo` to `hi` (None: unbounded), ends open or closed.

    Floats must also be finite: NaN and infinity are never a valid setting.
    """

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    or_zero: bool = False  # 0 too, outside the bounds: a setting that 0 turns off

    def __contains__(self, x: float) -> bool:
        if isinstance(x, float) and not math.isfinite(x):
            return False
        if isinstance(x, int) and not -INT64_LIMIT <= x < INT64_LIMIT:  # beyond what torch and NumPy hold
            return False
        if self.or_zero and x == 0:
            return True
        above = self.lo is None or (x > self.lo if self.lo_open else x >= self.lo)
        below = self.hi is None or (x < self.hi if self.hi_open else x <= self.hi)
        return above and below

    def __str__(self) -> str:
        """`>= 1`, `> 0`, `in [0, 1)`, `0 or >= 1`, or `finite` where unbounded."""
        return ("0 or " if self.or_zero else "") + self._bounds()

    def _bounds(self) -> str:
        lo, hi = _number(self.lo), _number(self.hi)
        if self.lo is not None and self.hi is not None:
            return f"in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {lo}"
        if self.hi is not None:
            return f"{'<' if self.hi_open else '<='} {hi}"
        return "finite"

    def problem(self, value: Any) -> str | None:
        """Why `value` (a number, or a tuple of numbers) is out of range; None if it is in range."""
        items = value if isinstance(value, tuple) else (value,)
        for i, x in enumerate(items):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or x in self:
                continue
            shown = f"{x!r} (item {i} of {list(items)})" if isinstance(value, tuple) else repr(x)
            if isinstance(x, float) and not math.isfinite(x):
                return f"{shown} is not a finite number"
            if isinstance(x, int) and not -INT64_LIMIT <= x < INT64_LIMIT:
                return f"{shown} does not fit in a 64-bit integer"
            return f"{shown} must be {self}"
        return None


def _number(x: float | None) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


PROB = {"lo": 0, "hi": 1, "hi_open": True}
"""A dropout-like probability: [0, 1)."""
MAX_LAYERS = 1000
"""Most layers an encoder or decoder may have: deeper than any published translation model stack (DeepNet's
500 + 500), and few enough that a mistyped count fails to allocate instead of building modules for hours."""
MAX_POSITIONS = 1 << 16
"""Longest position table a Transformer may ask for (65536: sinusoidal or learned, far beyond any sentence)."""


def num(default: Any, **bounds: Any) -> Any:
    """A numeric field with its default and its valid `Range(**bounds)`."""
    return field(default=default, metadata={"range": Range(**bounds)})


def range_of(f: dataclasses.Field) -> Range | DeviceNames | None:
    """The valid range of a config field (its valid names for a device), or None for another."""
    return f.metadata.get("range")


def check_ranges(obj: Any) -> None:
    """Raise ValueError `name: value must be RANGE` for the first field of `obj` out of its range."""
    for f in dataclasses.fields(obj):
        rng = range_of(f)
        problem = rng.problem(getattr(obj, f.name)) if rng else None
        if problem:
            raise ValueError(f"{f.name}: {problem}")
