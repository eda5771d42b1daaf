"""Timestamps taken inside an inference: a monotonic clock on CPUs, CUDA events on GPUs.

Both record into preallocated storage with one cheap call (`mark`) and are read only after
the inference, so nothing on the replay path waits for the device.
"""

import time
from typing import Any, Protocol

import numpy as np


class Marks(Protocol):
    def reset(self) -> None: ...

    def mark(self) -> None: ...

    def elapsed_us(self) -> np.ndarray:
        """Microseconds from the first mark to each mark (call after a device sync)."""


class CpuMarks:
    """perf_counter_ns after each blocking call: the call has completed when it returns."""

    def __init__(self, capacity: int) -> None:
        self._stamps = [0] * capacity
        self._count = 0

    def reset(self) -> None:
        self._count = 0

    def mark(self) -> None:
        self._stamps[self._count] = time.perf_counter_ns()
        self._count += 1

    def elapsed_us(self) -> np.ndarray:
        stamps = np.array(self._stamps[:self._count], dtype=np.float64)
        return (stamps - stamps[0]) / 1e3


class CudaMarks:
    """CUDA events recorded on the current stream, which waits for each communication call."""

    def __init__(self, capacity: int) -> None:
        import torch
        self._events: list[Any] = [torch.cuda.Event(enable_timing=True) for _ in range(capacity)]
        self._count = 0

    def reset(self) -> None:
        self._count = 0

    def mark(self) -> None:
        self._events[self._count].record()
        self._count += 1

    def elapsed_us(self) -> np.ndarray:
        first = self._events[0]
        return np.array([first.elapsed_time(e) * 1e3 for e in self._events[:self._count]],
                        dtype=np.float64)


def make_marks(device: str, capacity: int) -> Marks:
    return CudaMarks(capacity) if device == "cuda" else CpuMarks(capacity)
