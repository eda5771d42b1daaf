"""Timestamps taken inside an inference: a monotonic clock on CPUs and for host-blocking
backends (MPI), CUDA events on the communication stream of GPU backends (torch, nccl).

Both record into preallocated storage with one cheap call (`mark`) and are read only after
the inference, so nothing on the replay path waits for the device.
"""

import time
from collections.abc import Callable
from functools import partial
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
    """CUDA events recorded on the communication stream, which waits for (or runs) every call.

    `stream` is the backend's: torch's current stream (torch.distributed makes it wait for
    each NCCL call), or the CuPy stream the nccl backend issues its calls and graphs on, in
    which case CuPy events are used. None records on torch's current stream.
    """

    def __init__(self, capacity: int, stream: Any = None) -> None:
        if stream is not None and type(stream).__module__.startswith("cupy"):
            import cupy
            self._events: list[Any] = [cupy.cuda.Event() for _ in range(capacity)]
            self._elapsed_ms: Callable[[Any, Any], float] = cupy.cuda.get_elapsed_time
        else:
            import torch
            self._events = [torch.cuda.Event(enable_timing=True) for _ in range(capacity)]
            self._elapsed_ms = _torch_elapsed_ms
        # One bound call per mark, made once, so a mark costs one event record and no lookup.
        self._records = [partial(event.record, stream) for event in self._events]
        self._count = 0

    def reset(self) -> None:
        self._count = 0

    def mark(self) -> None:
        self._records[self._count]()
        self._count += 1

    def elapsed_us(self) -> np.ndarray:
        first, elapsed = self._events[0], self._elapsed_ms
        return np.array([elapsed(first, e) * 1e3 for e in self._events[:self._count]],
                        dtype=np.float64)


def _torch_elapsed_ms(start: Any, end: Any) -> float:
    return float(start.elapsed_time(end))


def make_marks(device: str, capacity: int, stream: Any = None) -> Marks:
    """CUDA events on `stream` (the backend's communication stream) on GPUs, else a clock.

    A backend on a GPU without a stream (MPI, whose calls block the host until they are done,
    CUDA-aware or staged) gets the host clock too: an event recorded after a blocking call
    lands on an idle stream and is stamped when the GPU's front end reaches it, which adds
    launch latency and jitter to a time the host already knows exactly.
    """
    return CudaMarks(capacity, stream) if device == "cuda" and stream is not None \
        else CpuMarks(capacity)
