"""`--profile` for the benches: where a timed run spends its time, on the host and on the device.

    with Profile(device, trace="trace.json") as prof:
        ...  # the run
    print(prof.summary(steps=20))

The summary is torch.profiler's table of the operators with the most self time
(device time on CUDA, host time elsewhere), the wall time per step and, on CUDA, the
kernels launched per step and the time the GPU spent running them: a step whose
kernels fill a small part of its wall time is bound by the host that launches them
(or by a wait for the host), whatever the GPU. The trace opens in https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile


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

    def kernels(self) -> int:
        """Device kernels the block launched (0 off CUDA)."""
        if self.device.type != "cuda":
            return 0
        return sum(1 for e in self._prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)

    def kernel_seconds(self) -> float:
        """Time the device spent running the block's kernels (0 off CUDA)."""
        if self.device.type != "cuda":
            return 0.0
        return sum(e.time_range.elapsed_us() for e in self._prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA) / 1e6

    def summary(self, steps: int, unit: str = "step") -> str:
        """The top operators by self time, the wall time per `unit` (`steps` of them), and on CUDA the
        kernels and the GPU's time in them per `unit`."""
        on_device = self.device.type == "cuda"
        key = "self_cuda_time_total" if on_device else "self_cpu_time_total"
        table = self._prof.key_averages().table(sort_by=key, row_limit=self.rows)
        lines = [f"profile of {steps} {unit}s, sorted by self {'GPU' if on_device else 'CPU'} time:", table]
        n = max(steps, 1)
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
    return sum("synchroniz" in str(w.message) for w in caught)
