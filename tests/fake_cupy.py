"""A stand-in for the few CuPy names the nccl backend, its graphs and CudaMarks use, on host
memory, for one rank: NCCL calls are memory copies (a sum over one rank is its input), send
and receive pair up at groupEnd, and a capturing stream records calls that its graph
replays on the buffers' current contents, as a CUDA graph does.

Not CuPy: it checks the backend's pointers, sizes, grouping and stream use on a CPU, and it
refuses what the real libraries refuse or hang on (docs/../shared/reference/gpu_review.md,
section 6):
- a communicator is not destroyed while a graph that captured one of its calls is alive:
  ncclCommDestroy/ncclCommFinalize loop in commDestroySync until every such graph is gone
  (NVIDIA/nccl src/init.cc @ 5067397c), i.e. hang; here it raises instead;
- while a stream captures, host syncs (Stream.synchronize), memory queries (memGetInfo),
  host copies (Array.get/set), communicator creation, CUDA events and any call on another
  stream raise CaptureError, as CUDA invalidates or refuses them inside a capture;
- the NcclCommunicator methods have the parameter names of CuPy's own
  cupy_backends/cuda/libs/nccl.pyx (NCCL_PYX_SIGNATURES below; tests/test_fake_cupy.py
  compares them with the .pyx when CuPy's source is at hand).
"""

import ctypes
import importlib.machinery
import itertools
import time
import types
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

_SIZES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2}  # ncclDataType_t bytes
_ids = itertools.count(1)

# The parameters (after self) of CuPy's NcclCommunicator, as cupy_backends/cuda/libs/nccl.pyx
# declares them at v14.2.0 (cupy/cupy @ dc1552a3; `bytes commId`, and an optional NcclConfig).
NCCL_PYX_SIGNATURES = {
    "__init__": ("ndev", "commId", "rank", "config"),
    "allReduce": ("sendbuf", "recvbuf", "count", "datatype", "op", "stream"),
    "reduce": ("sendbuf", "recvbuf", "count", "datatype", "op", "root", "stream"),
    "broadcast": ("sendbuff", "recvbuff", "count", "datatype", "root", "stream"),
    "reduceScatter": ("sendbuf", "recvbuf", "recvcount", "datatype", "op", "stream"),
    "allGather": ("sendbuf", "recvbuf", "count", "datatype", "stream"),
    "send": ("sendbuf", "count", "datatype", "peer", "stream"),
    "recv": ("recvbuf", "count", "datatype", "peer", "stream"),
    "destroy": (),
    "abort": (),
    "check_async_error": (),
}
# v13.6.0 (cupy/cupy @ 25e552d5): `tuple commId` and no config; every other method the same.
NCCL_PYX_SIGNATURES_13 = {**NCCL_PYX_SIGNATURES, "__init__": ("ndev", "commId", "rank")}


class CaptureError(RuntimeError):
    """What CUDA answers (cudaErrorStreamCaptureUnsupported/-Invalidated/-Implicit) to a
    call that a stream capture cannot contain."""


_capturing: "Stream | None" = None  # the stream now capturing (one at a time here)


def _refuse_in_capture(what: str) -> None:
    if _capturing is not None:
        raise CaptureError(f"{what} while stream {_capturing.ptr:#x} captures a CUDA graph")


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
        _refuse_in_capture("cudaStreamSynchronize")

    def begin_capture(self) -> None:
        global _capturing
        _refuse_in_capture("cudaStreamBeginCapture")
        self.recording, self.comms = [], set()
        _capturing = self

    def end_capture(self) -> "Graph":
        global _capturing
        assert _capturing is self, "end_capture on a stream that does not capture"
        graph = Graph(self.recording or [], self.comms)
        self.recording, _capturing = None, None
        return graph


class Graph:
    live: ClassVar["weakref.WeakSet[Graph]"] = weakref.WeakSet()

    def __init__(self, calls: list[Callable[[], None]], comms: "set[Communicator]") -> None:
        self.calls, self.launches = calls, 0
        for comm in comms:  # as NCCL's persistent references from a graph to its comms
            comm.graphs.add(self)
        Graph.live.add(self)

    def launch(self, stream: Stream) -> None:
        _refuse_in_capture("cudaGraphLaunch")
        self.launches += 1
        for call in self.calls:
            call()


def _on(stream_ptr: int, work: Callable[[], None], comm: "Communicator | None" = None) -> None:
    stream = Stream.by_ptr[stream_ptr]
    if _capturing is not None and stream is not _capturing:
        raise CaptureError(f"a call on stream {stream_ptr:#x} while stream "
                           f"{_capturing.ptr:#x} captures (it joins no graph)")
    if stream.recording is not None:
        stream.recording.append(work)
        if comm is not None:
            stream.comms.add(comm)
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
        _refuse_in_capture("a host-to-device copy (ndarray.set)")
        assert arr.dtype == self.host.dtype and arr.shape == self.host.shape
        self.host[:] = arr

    def get(self, stream: Stream | None = None) -> np.ndarray:
        _refuse_in_capture("a device-to-host copy (ndarray.get)")
        return self.host.copy()


class Communicator:
    """CuPy's NcclCommunicator for a world of one; parameter names as nccl.pyx."""

    pending: list[tuple[str, int, int, int, "Communicator"]] | None = None  # an open group
    calls = 0
    live: ClassVar["weakref.WeakSet[Communicator]"] = weakref.WeakSet()
    async_error: ClassVar[str | None] = None

    def __init__(self, ndev: int, commId: Any, rank: int, config: Any = None) -> None:
        _refuse_in_capture("ncclCommInitRank")
        assert (ndev, rank) == (1, 0) and isinstance(commId, bytes) and len(commId) == 128
        self.destroyed = False
        self.graphs: weakref.WeakSet[Graph] = weakref.WeakSet()
        Communicator.live.add(self)

    def __hash__(self) -> int:
        return id(self)

    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
                  stream: int) -> None:
        Communicator.calls += 1
        _on(stream, _copy(recvbuf, sendbuf, count * _SIZES[datatype]), self)

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int,
                  stream: int) -> None:
        _on(stream, _copy(recvbuf, sendbuf, count * _SIZES[datatype]), self)

    def reduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int, datatype: int,
                      op: int, stream: int) -> None:
        _on(stream, _copy(recvbuf, sendbuf, recvcount * _SIZES[datatype]), self)

    def broadcast(self, sendbuff: int, recvbuff: int, count: int, datatype: int, root: int,
                  stream: int) -> None:
        assert root == 0
        _on(stream, _copy(recvbuff, sendbuff, count * _SIZES[datatype]), self)

    def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
               root: int, stream: int) -> None:
        assert root == 0
        _on(stream, _copy(recvbuf, sendbuf, count * _SIZES[datatype]), self)

    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        assert Communicator.pending is not None, "a send to self outside a group would hang"
        Communicator.pending.append(("send", sendbuf, count * _SIZES[datatype], stream, self))

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        assert Communicator.pending is not None, "a recv from self outside a group would hang"
        Communicator.pending.append(("recv", recvbuf, count * _SIZES[datatype], stream, self))

    def destroy(self) -> None:
        if self.graphs:  # the real ncclCommDestroy would wait here for ever
            raise AssertionError(
                f"ncclCommDestroy would block: {len(self.graphs)} live CUDA graph(s) captured "
                "this communicator (NCCL src/init.cc commDestroySync)")
        self.destroyed = True

    def abort(self) -> None:
        self.destroy()  # ncclCommAbort reclaims through commDestroySync too

    def check_async_error(self) -> None:
        assert not self.destroyed, "ncclCommGetAsyncError on a destroyed communicator"
        if Communicator.async_error is not None:  # set by a test: a peer died, a link broke
            raise NcclError(Communicator.async_error)


class NcclError(RuntimeError):
    """cupy_backends.cuda.libs.nccl.NcclError: raised by check_status on a failed result."""


def group_start() -> None:
    Communicator.pending = []


def group_end() -> None:
    parts, Communicator.pending = Communicator.pending or [], None
    sends = [p for p in parts if p[0] == "send"]
    recvs = [p for p in parts if p[0] == "recv"]
    assert len(sends) == len(recvs), parts
    for (_, src, nbytes, stream, comm), (_, dst, rbytes, _, _) in zip(sends, recvs,
                                                                          strict=True):
        assert nbytes == rbytes
        _on(stream, _copy(dst, src, nbytes), comm)


class Event:
    def __init__(self) -> None:
        self.t = 0.0

    def record(self, stream: Stream | None = None) -> None:
        _refuse_in_capture("a timing event recorded (cudaEventRecord)")
        self.t = time.perf_counter()


def make_modules(version: str = "14.2.0") -> dict[str, types.ModuleType]:
    """sys.modules entries for cupy, cupy.cuda and cupy.cuda.nccl."""
    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.available = True
    for name, value in dict(NCCL_SUM=0, NCCL_UINT8=1, NCCL_INT32=2, NCCL_INT64=4,
                            NCCL_FLOAT16=6, NCCL_FLOAT32=7, NCCL_BFLOAT16=9).items():
        setattr(nccl, name, value)
    nccl.NcclCommunicator, nccl.NcclError = Communicator, NcclError
    nccl.get_unique_id = lambda: bytes(range(128))
    nccl.get_version = lambda: 22703
    nccl.groupStart, nccl.groupEnd = group_start, group_end

    def memcpy_async(dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        assert kind == 3
        _on(stream, _copy(dst, src, nbytes))

    def mem_get_info() -> tuple[int, int]:
        _refuse_in_capture("cudaMemGetInfo")
        return 8 << 30, 16 << 30

    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1, memcpyAsync=memcpy_async, memcpyDeviceToDevice=3,
        memGetInfo=mem_get_info,
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
