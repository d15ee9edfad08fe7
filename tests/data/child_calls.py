"""What the tests run through `in_child_process`: a module the child imports alone, where unpickling a
function of the test module imported all of that module's imports (torch among them) first."""

from __future__ import annotations

import numpy as np

from nmt.errors import DataError


def allocate_and_sum(mb: int) -> int:
    block = np.ones(mb << 20, dtype=np.uint8)
    return int(block.sum())


def fail(message: str) -> None:
    raise DataError(message)
