"""Wall-clock readings that include a device's queued work.

CUDA and MPS run kernels asynchronously: a clock read right after a forward call times the launch, not the
work. Every timing in semverify and its harness reads a `device_clock`, which waits for the device first.
"""

from __future__ import annotations

import time
from typing import Callable

import torch


def device_clock(device: torch.device | str, wait: bool = True) -> Callable[[], float]:
    """A clock for work on ``device``: `time.perf_counter` read after the device's queue has drained (on the
    CPU, where work is synchronous, or with ``wait=False``, where a reading must not stall the queue,
    `time.perf_counter` itself)."""
    device = torch.device(device)
    if not wait:
        return time.perf_counter
    if device.type == "cuda":
        def drain() -> None:
            torch.cuda.synchronize(device)
    elif device.type == "mps":
        drain = torch.mps.synchronize
    else:
        return time.perf_counter

    def now() -> float:
        drain()
        return time.perf_counter()

    return now
