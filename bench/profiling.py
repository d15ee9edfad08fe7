"""`--profile` for the benches: where a timed run spends its time, on the host and on the device.

    with Profile(device, trace="trace.json") as prof:
        ...  # the run
    print(prof.summary(steps=20))

The summary is torch.profiler's table of the operators with the most self time
(device time on CUDA, host time elsewhere), the host's time per step in each labelled
phase (`host_phases`), the wall time per step and, on CUDA, the
kernels launched per step and the time the GPU spent running them: a step whose
kernels fill a small part of its wall time is bound by the host that launches them
(or by a wait for the host), whatever the GPU. The trace opens in https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode


class Profile:
    """torch.profiler over a block, for one device; `trace` also writes a Chrome trace there."""

    def __init__(self, device: torch.device, *, trace: str | Path | None = None, rows: int = 20) -> None:
        self.device, self.trace, self.rows = device, trace, rows
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self._prof = profile(activities=activities)
        self.seconds = 0.0  # wall time of the block, the device's queued work included

    def __enter__(self) -> Profile:
        self._prof.__enter__()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds = time.perf_counter() - self._start
        self._prof.__exit__(*exc)
        if self.trace:
            self._prof.export_chrome_trace(str(self.trace))

    def _device_events(self) -> list:
        """The block's work on the device: kernels, copies and sets. Two kinds of device event are not work
        and are left out: CUPTI reports the times the host's launches waited for room in the device's queue
        ("Command Buffer Full"), the host waiting on a busy GPU; and each labelled range (`record_function`)
        has a device event from its first kernel's start to its last one's end, idle gaps included, which
        counted as busy made an eager Multi30k update's GPU look 50% busy where its kernels ran 15% of it."""
        if self.device.type != "cuda":
            return []
        return [e for e in self._prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA and e.name != "Command Buffer Full"
                and not getattr(e, "is_user_annotation", False)]

    def kernels(self) -> int:
        """Device kernels (and copies) the block launched (0 off CUDA)."""
        return len(self._device_events())

    def kernel_seconds(self) -> float:
        """Time the device spent running the block's kernels, kernels that overlap counted once (0 off CUDA)."""
        return covered((e.time_range.start, e.time_range.end) for e in self._device_events()) / 1e6

    def summary(self, steps: int, unit: str = "step") -> str:
        """The top operators by self time, the wall time per `unit` (`steps` of them), and on CUDA the
        kernels and the GPU's time in them per `unit`."""
        on_device = self.device.type == "cuda"
        key = "self_cuda_time_total" if on_device else "self_cpu_time_total"
        averages = self._prof.key_averages()
        table = averages.table(sort_by=key, row_limit=self.rows)
        lines = [f"profile of {steps} {unit}s, sorted by self {'GPU' if on_device else 'CPU'} time:", table]
        n = max(steps, 1)
        phases = host_phases(averages, n)
        if phases:
            lines.append(f"host time per {unit}: " + ", ".join(f"{name} {ms:.2f} ms" for name, ms in phases))
        wall = f"{1e3 * self.seconds / n:.2f} ms per {unit} (wall, profiled)"
        if on_device:
            busy = self.kernel_seconds()
            lines.append(f"{wall}; the GPU ran kernels for {1e3 * busy / n:.2f} ms of it "
                         f"({100 * busy / max(self.seconds, 1e-9):.0f}%), {self.kernels() / n:.1f} kernels per {unit}")
        else:
            lines.append(wall)
        if self.trace:
            lines.append(f"trace: {self.trace}")
        return "\n".join(lines)


def host_phases(averages: Iterable, steps: int) -> list[tuple[str, float]]:
    """The host's time per step (ms) in each labelled phase of the profiled block, longest first: nmt's own
    `record_function` ranges (`nmt.forward_backward`, `nmt.optimizer`) and torch's optimizer ones
    (`Optimizer.step#Adam.step`), each including the operators it ran. Where the GPU idles, these say which
    part of the step keeps the host from launching sooner."""
    phases = [(e.key, e.cpu_time_total / 1e3 / max(steps, 1)) for e in averages
              if e.key.startswith(("nmt.", "Optimizer."))]
    return sorted(phases, key=lambda phase: -phase[1])


def covered(spans: Iterable[tuple[float, float]]) -> float:
    """The length of the union of `spans` (start, end): time covered by at least one of them."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def host_syncs(fn: Callable[[], object], device: torch.device) -> int | None:
    """How many times `fn()` made the host wait for the GPU (None off CUDA).

    torch's sync debug mode warns at every synchronising CUDA call (a copy to the host
    such as `.item()`, a stream or device synchronisation), also from inside operators
    and from the backward pass, whose warnings autograd hands back to this thread.
    """
    if device.type != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # the mode's own notice, once a process, that it is a prototype is no wait
    return sum("synchroniz" in str(w.message) and "prototype" not in str(w.message) for w in caught)


class OpCount(TorchDispatchMode):
    """Counts the aten operations dispatched under it (forward, backward, optimizer) that may launch a kernel."""

    NO_KERNEL = frozenset({"view", "_unsafe_view", "reshape", "_reshape_alias", "transpose", "t", "permute",
                           "expand", "unsqueeze", "squeeze", "slice", "select", "as_strided", "alias", "detach",
                           "split", "split_with_sizes", "unbind", "chunk", "narrow", "lift_fresh", "empty",
                           "empty_like", "empty_strided", "new_empty"})  # views and allocations

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += func.overloadpacket.__name__ not in self.NO_KERNEL
        return func(*args, **(kwargs or {}))
