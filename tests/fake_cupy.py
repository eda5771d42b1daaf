"""A stand-in for the few CuPy names the nccl backend, its graphs and CudaMarks use, on host
memory, for one rank: NCCL calls are memory copies (a sum over one rank is its input), send
and receive pair up at groupEnd, and a capturing stream records calls that its graph
replays on the buffers' current contents, as a CUDA graph does.

Not CuPy: it checks the backend's pointers, sizes, grouping and stream use on a CPU.
"""

import ctypes
import importlib.machinery
import itertools
import time
import types
from collections.abc import Callable
from typing import ClassVar

import numpy as np

_SIZES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2}  # ncclDataType_t bytes
_ids = itertools.count(1)


class Stream:
    __module__ = "cupy.cuda.stream"  # where CudaMarks looks to pick CuPy events
    by_ptr: ClassVar[dict[int, "Stream"]] = {}

    def __init__(self, non_blocking: bool = False) -> None:
        self.ptr = next(_ids) * 4096
        self.recording: list[Callable[[], None]] | None = None
        Stream.by_ptr[self.ptr] = self

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def synchronize(self) -> None:
        assert self.recording is None, "synchronize inside a capture"

    def begin_capture(self) -> None:
        self.recording = []

    def end_capture(self) -> "Graph":
        graph, self.recording = Graph(self.recording or []), None
        return graph


class Graph:
    def __init__(self, calls: list[Callable[[], None]]) -> None:
        self.calls, self.launches = calls, 0

    def launch(self, stream: Stream) -> None:
        self.launches += 1
        for call in self.calls:
            call()


def _on(stream_ptr: int, work: Callable[[], None]) -> None:
    stream = Stream.by_ptr[stream_ptr]
    if stream.recording is not None:
        stream.recording.append(work)
    else:
        work()


def _copy(dst: int, src: int, nbytes: int) -> Callable[[], None]:
    return lambda: ctypes.memmove(dst, src, nbytes)


class Array:
    def __init__(self, numel: int, dtype: type) -> None:
        self.host = np.zeros(numel, dtype=dtype)
        self.data = types.SimpleNamespace(ptr=self.host.ctypes.data)
        self.size, self.nbytes, self.itemsize = numel, self.host.nbytes, self.host.itemsize

    def set(self, arr: np.ndarray, stream: Stream | None = None) -> None:
        assert arr.dtype == self.host.dtype and arr.shape == self.host.shape
        self.host[:] = arr

    def get(self, stream: Stream | None = None) -> np.ndarray:
        return self.host.copy()


class Communicator:
    pending: list[tuple[str, int, int, int]] | None = None  # sends/recvs of an open group
    calls = 0

    def __init__(self, ndev: int, unique_id: bytes, rank: int) -> None:
        assert (ndev, rank) == (1, 0) and isinstance(unique_id, bytes) and len(unique_id) == 128
        self.destroyed = False

    def allReduce(self, s: int, r: int, count: int, dt: int, op: int, stream: int) -> None:
        Communicator.calls += 1
        _on(stream, _copy(r, s, count * _SIZES[dt]))

    def allGather(self, s: int, r: int, count: int, dt: int, stream: int) -> None:
        _on(stream, _copy(r, s, count * _SIZES[dt]))

    def reduceScatter(self, s: int, r: int, count: int, dt: int, op: int, stream: int) -> None:
        _on(stream, _copy(r, s, count * _SIZES[dt]))

    def broadcast(self, s: int, r: int, count: int, dt: int, root: int, stream: int) -> None:
        assert root == 0
        _on(stream, _copy(r, s, count * _SIZES[dt]))

    def reduce(self, s: int, r: int, count: int, dt: int, op: int, root: int,
               stream: int) -> None:
        assert root == 0
        _on(stream, _copy(r, s, count * _SIZES[dt]))

    def send(self, ptr: int, count: int, dt: int, peer: int, stream: int) -> None:
        assert Communicator.pending is not None, "a send to self outside a group would hang"
        Communicator.pending.append(("send", ptr, count * _SIZES[dt], stream))

    def recv(self, ptr: int, count: int, dt: int, peer: int, stream: int) -> None:
        assert Communicator.pending is not None, "a recv from self outside a group would hang"
        Communicator.pending.append(("recv", ptr, count * _SIZES[dt], stream))

    def destroy(self) -> None:
        self.destroyed = True


def group_start() -> None:
    Communicator.pending = []


def group_end() -> None:
    parts, Communicator.pending = Communicator.pending or [], None
    sends = [p for p in parts if p[0] == "send"]
    recvs = [p for p in parts if p[0] == "recv"]
    assert len(sends) == len(recvs), parts
    for (_, src, nbytes, stream), (_, dst, rbytes, _) in zip(sends, recvs, strict=True):
        assert nbytes == rbytes
        _on(stream, _copy(dst, src, nbytes))


class Event:
    def __init__(self) -> None:
        self.t = 0.0

    def record(self, stream: Stream | None = None) -> None:
        self.t = time.perf_counter()


def make_modules(version: str = "14.2.0") -> dict[str, types.ModuleType]:
    """sys.modules entries for cupy, cupy.cuda and cupy.cuda.nccl."""
    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.available = True
    for name, value in dict(NCCL_SUM=0, NCCL_UINT8=1, NCCL_INT32=2, NCCL_INT64=4,
                            NCCL_FLOAT16=6, NCCL_FLOAT32=7, NCCL_BFLOAT16=9).items():
        setattr(nccl, name, value)
    nccl.NcclCommunicator = Communicator
    nccl.get_unique_id = lambda: bytes(range(128))
    nccl.get_version = lambda: 22703
    nccl.groupStart, nccl.groupEnd = group_start, group_end

    def memcpy_async(dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        assert kind == 3
        _on(stream, _copy(dst, src, nbytes))

    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1, memcpyAsync=memcpy_async, memcpyDeviceToDevice=3,
        getDeviceProperties=lambda dev: {"name": b"Fake GPU"},
        runtimeGetVersion=lambda: 12040, driverGetVersion=lambda: 12080)
    device = types.SimpleNamespace(id=0, use=lambda: None)
    cuda = types.ModuleType("cupy.cuda")
    cuda.nccl, cuda.runtime, cuda.Stream, cuda.Event = nccl, runtime, Stream, Event
    cuda.Device = lambda index=0: device
    cuda.get_elapsed_time = lambda start, end: (end.t - start.t) * 1e3
    cupy = types.ModuleType("cupy")
    cupy.__version__, cupy.cuda = version, cuda
    cupy.zeros = lambda numel, dtype: Array(numel, dtype)
    modules = {"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.nccl": nccl}
    for name, module in modules.items():  # importlib.util.find_spec reads it
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    return modules
