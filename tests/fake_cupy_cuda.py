"""The CUDA side of the stand-in CuPy (tests/fake_cupy.py): streams and their captures,
graphs, arrays on host memory, timing events and devices, with the rules listed there."""

import ctypes
import itertools
import os
import time
import types
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

_ids = itertools.count(1)


class _State:
    device = 0  # the current device (Device.use, with Device(i))


state = _State()


class CaptureError(RuntimeError):
    """What CUDA answers (cudaErrorStreamCaptureUnsupported/-Invalidated/-Implicit) to a
    call that a stream capture cannot contain."""


class NotReady(RuntimeError):
    """cudaErrorNotReady, as cudaEventElapsedTime answers for an event not yet complete."""


_capturing: "Stream | None" = None  # the stream now capturing (one at a time here)
_issued: list[int] = []  # the stream of every call issued, in order (for the events' rule)
_live: dict[int, int] = {}  # live arrays: start pointer -> end pointer
_clock = itertools.count(1)  # orders event records and stream synchronizes


def _refuse_in_capture(what: str) -> None:
    if _capturing is not None:
        raise CaptureError(f"{what} while stream {_capturing.ptr:#x} captures a CUDA graph")


def _check_live(ptr: int, nbytes: int) -> None:
    if nbytes and not any(start <= ptr and ptr + nbytes <= end for start, end in _live.items()):
        raise AssertionError(f"a call uses {nbytes} bytes at {ptr:#x}, which no live array "
                             "holds: its buffer was freed and CuPy's pool may hand it out again")


class Stream:
    __module__ = "cupy.cuda.stream"  # where CudaMarks looks to pick CuPy events
    by_ptr: ClassVar[dict[int, "Stream"]] = {}
    null: ClassVar["Stream"]

    def __init__(self, non_blocking: bool = False, ptr: int | None = None) -> None:
        self.ptr = next(_ids) * 4096 if ptr is None else ptr
        self.non_blocking = non_blocking
        self.recording: list[Callable[[], None]] | None = None
        self.outstanding: set[Any] = set()  # captured by graphs launched here
        self.synced_at = 0  # len(_issued) when last synchronized
        Stream.by_ptr[self.ptr] = self

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def synchronize(self) -> None:
        _refuse_in_capture("cudaStreamSynchronize")
        self.outstanding.clear()
        self.synced_at = next(_clock)

    def begin_capture(self) -> None:
        global _capturing
        _refuse_in_capture("cudaStreamBeginCapture")
        if self.ptr in (0, 1):  # cudaStreamLegacy is 1; 0 means the legacy stream too
            raise RuntimeError("cannot capture on the default (legacy) stream")
        self.recording, self.comms = [], set()
        _capturing = self

    def end_capture(self) -> "Graph":
        global _capturing
        assert _capturing is self, "end_capture on a stream that does not capture"
        graph = Graph(self.recording or [], self.comms)
        self.recording, _capturing = None, None
        return graph


Stream.null = Stream(ptr=0)


class Graph:
    live: ClassVar["weakref.WeakSet[Graph]"] = weakref.WeakSet()

    def __init__(self, calls: list[Callable[[], None]], comms: "set[Any]") -> None:
        self.calls, self.launches, self.comms = calls, 0, set(comms)
        for comm in comms:  # as NCCL's persistent references from a graph to its comms
            comm.graphs.add(self)
        Graph.live.add(self)

    def launch(self, stream: Stream) -> None:
        _refuse_in_capture("cudaGraphLaunch")
        self.launches += 1
        _issued.append(stream.ptr)
        for call in self.calls:
            call()
        stream.outstanding |= self.comms


def _on(stream_ptr: int, work: Callable[[], None], comm: Any = None) -> None:
    stream = Stream.by_ptr[stream_ptr]
    if _capturing is not None and stream is not _capturing:
        raise CaptureError(f"a call on stream {stream_ptr:#x} while stream "
                           f"{_capturing.ptr:#x} captures (it joins no graph)")
    if stream.recording is not None:
        stream.recording.append(work)
        if comm is not None:
            stream.comms.add(comm)
        return
    if comm is not None and os.environ.get("NCCL_GRAPH_MIXING_SUPPORT") == "0" and any(
            comm in s.outstanding for s in Stream.by_ptr.values()):
        raise AssertionError("an eager NCCL call on a communicator whose launched graph may "
                             "still run, with NCCL_GRAPH_MIXING_SUPPORT=0: not supported "
                             "(NCCL env.rst, observed hangs); synchronize first")
    _issued.append(stream_ptr)
    work()


def _copy(dst: int, src: int, nbytes: int) -> Callable[[], None]:
    def copy() -> None:
        _check_live(dst, nbytes)
        _check_live(src, nbytes)
        ctypes.memmove(dst, src, nbytes)
    return copy


class Array:
    def __init__(self, numel: int, dtype: type) -> None:
        self.host = np.zeros(numel, dtype=dtype)
        self.data = types.SimpleNamespace(ptr=self.host.ctypes.data)
        self.size, self.nbytes, self.itemsize = numel, self.host.nbytes, self.host.itemsize
        self.dtype = self.host.dtype
        _live[self.data.ptr] = self.data.ptr + max(self.nbytes, 1)

    def __del__(self) -> None:
        _live.pop(self.data.ptr, None)

    def set(self, arr: np.ndarray, stream: Stream | None = None) -> None:
        _refuse_in_capture("a host-to-device copy (ndarray.set)")
        assert arr.dtype == self.host.dtype and arr.shape == self.host.shape
        self.host[:] = arr

    def get(self, stream: Stream | None = None) -> np.ndarray:
        _refuse_in_capture("a device-to-host copy (ndarray.get)")
        return self.host.copy()


class Event:
    def __init__(self) -> None:
        self.t, self.stream, self.at, self.tick = 0.0, None, -1, 0

    def record(self, stream: Stream | None = None) -> None:
        _refuse_in_capture("a timing event recorded (cudaEventRecord)")
        self.stream = stream if stream is not None else Stream.null
        self.t, self.at, self.tick = time.perf_counter(), len(_issued), next(_clock)


def get_elapsed_time(start: Event, end: Event) -> float:
    """cupy.cuda.get_elapsed_time: milliseconds between two recorded, completed events."""
    if start.stream is None or end.stream is None:
        raise RuntimeError("cudaErrorInvalidResourceHandle: an event that was never recorded")
    if start.stream is not end.stream:
        raise AssertionError(f"events on streams {start.stream.ptr:#x} and {end.stream.ptr:#x}"
                             ": their difference times neither stream's calls")
    lo, hi = sorted((start.at, end.at))
    others = {p for p in _issued[lo:hi] if p != start.stream.ptr}
    if others:
        raise AssertionError(f"calls on stream(s) {sorted(others)} between events recorded on "
                             f"{start.stream.ptr:#x}: the events do not time them")
    if end.stream.synced_at < max(start.tick, end.tick):
        raise NotReady("cudaErrorNotReady: the stream was not synchronized after the event")
    return (end.t - start.t) * 1e3


class _Device:
    """cupy.cuda.Device: `use()` makes it current; `with Device(i):` for a while."""

    def __init__(self, count: int, index: int | None = None) -> None:
        self.count = count
        self.id = state.device if index is None else index
        if not 0 <= self.id < count:
            raise RuntimeError(f"cudaErrorInvalidDevice: device {self.id} of {count}")
        self._before: list[int] = []

    def use(self) -> None:
        state.device = self.id

    def __enter__(self) -> "_Device":
        self._before.append(state.device)
        self.use()
        return self

    def __exit__(self, *exc: object) -> None:
        state.device = self._before.pop()
