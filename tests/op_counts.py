"""Counting the aten operations a piece of code dispatches: on a GPU nearly each is a kernel launch."""

from __future__ import annotations

import collections

from torch.utils._python_dispatch import TorchDispatchMode

# Operations that make views, allocate, or answer a question about types: none computes anything.
FREE = frozenset({"view", "_unsafe_view", "slice", "select", "unsqueeze", "squeeze", "expand", "transpose", "t",
                  "permute", "unbind", "split", "as_strided", "alias", "detach", "empty", "empty_like",
                  "empty_strided", "promote_types"})


class OpCounter(TorchDispatchMode):
    """Counts the aten operations run under it (backward included), by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    @property
    def computing(self) -> int:
        """The operations counted that compute something (`FREE` left out)."""
        return sum(n for name, n in self.counts.items() if name not in FREE)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))
