"""A stand-in for the few CuPy names the nccl backend, its graphs and CudaMarks use, on host
memory: at world size 1 NCCL calls are memory copies (a sum over one rank is its input) and
send and receive pair up at groupEnd; a communicator of several ranks (separate processes)
moves the bytes over gloo (tests/fake_nccl_wire.py). A capturing stream records calls that
its graph replays on the buffers' current contents, as a CUDA graph does.

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
  compares them with the .pyx when CuPy's source is at hand);
- every pointer a call or a graph uses lies in a live array (CuPy returns a freed array's
  block to its pool and hands it out again: cupy/cuda/memory.pyx `_arena` @ v14.2.0);
- elapsed time needs two events recorded on one stream, no call issued on another stream
  between them, and that stream synchronized after the later one (cudaEventElapsedTime
  answers cudaErrorNotReady before; cupy/cuda/stream.pyx get_elapsed_time);
- no capture on the legacy stream (stream.pyx begin_capture: "cannot capture on the default
  (legacy) stream" @ v14.2.0);
- with NCCL_GRAPH_MIXING_SUPPORT=0, an eager call on a communicator while a launched graph
  that captured it may still run (no synchronize since) raises: NCCL's env.rst says that
  case is not supported ("observed hangs") @ 5067397c.
"""

import ctypes
import importlib.machinery
import itertools
import os
import time
import types
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar

import numpy as np

from tests import fake_nccl_wire

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
        self.outstanding: set[Communicator] = set()  # captured by graphs launched here
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

    def __init__(self, calls: list[Callable[[], None]], comms: "set[Communicator]") -> None:
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


def _on(stream_ptr: int, work: Callable[[], None], comm: "Communicator | None" = None) -> None:
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


class Communicator:
    """CuPy's NcclCommunicator; parameter names as nccl.pyx. A world of one copies; a world
    of several ranks runs each call over its Wire when the call runs (eagerly, or when a
    graph that captured it is launched)."""

    pending: list[tuple[str, int, int, int, int, "Communicator"]] | None = None  # a group
    calls = 0
    live: ClassVar["weakref.WeakSet[Communicator]"] = weakref.WeakSet()
    async_error: ClassVar[str | None] = None
    device = 0  # set by Device.use()
    log: ClassVar[fake_nccl_wire.NcclLog | None] = None

    def __init__(self, ndev: int, commId: Any, rank: int, config: Any = None) -> None:
        _refuse_in_capture("ncclCommInitRank")
        assert isinstance(commId, bytes) and len(commId) == 128 and 0 <= rank < ndev
        self.ndev, self.rank = ndev, rank
        self.wire = fake_nccl_wire.Wire(commId, ndev, rank) if ndev > 1 else None
        self.destroyed = False
        self.graphs: weakref.WeakSet[Graph] = weakref.WeakSet()
        Communicator.live.add(self)
        if Communicator.log is None:
            Communicator.log = fake_nccl_wire.NcclLog()
        Communicator.log.comm_init(id(self), rank, ndev, Communicator.device)

    def __hash__(self) -> int:
        return id(self)

    def _log(self, name: str, count: int, datatype: int, root: int = 0, send: int = 0,
             recv: int = 0, stream: int = 0) -> None:
        assert Communicator.log is not None
        Communicator.log.call(name, id(self), self.ndev, Communicator.device, count, datatype,
                              root, send, recv, stream)

    def _collective(self, name: str, send: int, recv: int, count: int, datatype: int,
                    stream: int, root: int = 0) -> None:
        """One collective; `count` is the input's elements (the output's for allgather's
        input is count, its output count x ndev)."""
        assert not self.destroyed, f"{name} on a destroyed communicator"
        size = _SIZES[datatype]
        out_count = count * self.ndev if name == "AllGather" else (
            count // self.ndev if name == "ReduceScatter" else count)
        in_count = count

        def run() -> None:
            _check_live(send, in_count * size)
            self._log(name, out_count if name == "ReduceScatter" else count, datatype, root,
                      send, recv, stream)
            if self.wire is None:
                _copy(recv, send, min(in_count, out_count) * size)()
                return
            _check_live(recv, out_count * size)
            data = fake_nccl_wire.host_array(send, in_count * size, datatype).copy()
            tensor = fake_nccl_wire.as_tensor(data, datatype)
            if name == "AllGather":
                out = fake_nccl_wire.host_array(recv, out_count * size, datatype)
                self.wire.allgather(fake_nccl_wire.as_tensor(out, datatype), tensor)
                return
            if name == "Broadcast":
                self.wire.broadcast(tensor, root)
            else:  # AllReduce, Reduce, ReduceScatter: the sum everywhere, kept where due
                self.wire.allreduce(tensor)
            if name == "Reduce" and self.rank != root:
                return
            if name == "ReduceScatter":
                data = data[self.rank * out_count:(self.rank + 1) * out_count]
            fake_nccl_wire.host_array(recv, out_count * size, datatype)[:] = data
        _on(stream, run, self)

    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
                  stream: int) -> None:
        Communicator.calls += 1
        self._collective("AllReduce", sendbuf, recvbuf, count, datatype, stream)

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int,
                  stream: int) -> None:
        self._collective("AllGather", sendbuf, recvbuf, count, datatype, stream)

    def reduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int, datatype: int,
                      op: int, stream: int) -> None:
        self._collective("ReduceScatter", sendbuf, recvbuf, recvcount * self.ndev, datatype,
                         stream)

    def broadcast(self, sendbuff: int, recvbuff: int, count: int, datatype: int, root: int,
                  stream: int) -> None:
        assert 0 <= root < self.ndev
        self._collective("Broadcast", sendbuff, recvbuff, count, datatype, stream, root)

    def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
               root: int, stream: int) -> None:
        assert 0 <= root < self.ndev
        self._collective("Reduce", sendbuf, recvbuf, count, datatype, stream, root)

    def _p2p(self, kind: str, ptr: int, count: int, datatype: int, peer: int,
             stream: int) -> None:
        assert 0 <= peer < self.ndev, f"peer {peer} of a communicator of {self.ndev}"
        if Communicator.pending is None:
            assert peer != self.rank, f"a {kind} to self outside a group would hang"
            group_start()
            Communicator.pending.append((kind, ptr, count, datatype, peer, stream, self))
            group_end()
            return
        Communicator.pending.append((kind, ptr, count, datatype, peer, stream, self))

    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._p2p("send", sendbuf, count, datatype, peer, stream)

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._p2p("recv", recvbuf, count, datatype, peer, stream)

    def destroy(self) -> None:
        if self.graphs:  # the real ncclCommDestroy would wait here for ever
            raise AssertionError(
                f"ncclCommDestroy would block: {len(self.graphs)} live CUDA graph(s) captured "
                "this communicator (NCCL src/init.cc commDestroySync)")
        self.destroyed = True
        if self.wire is not None:
            self.wire.close()

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


def _run_group(parts: list[tuple[str, int, int, int, int, int, "Communicator"]]) -> None:
    comm = parts[0][6]
    sends = [(p[4], p[1], p[2], p[3]) for p in parts if p[0] == "send"]
    recvs = [(p[4], p[1], p[2], p[3]) for p in parts if p[0] == "recv"]
    for _, ptr, count, dt in sends + recvs:
        _check_live(ptr, count * _SIZES[dt])
    for kind, ptr, count, dt, peer, stream, _ in parts:
        comm._log("Send" if kind == "send" else "Recv", count, dt, peer, ptr, ptr, stream)
    to_self = [s for s in sends if s[0] == comm.rank]
    from_self = [r for r in recvs if r[0] == comm.rank]
    assert len(to_self) == len(from_self), f"unmatched sends/receives to self: {parts}"
    for (_, src, n, dt), (_, dst, rn, _) in zip(to_self, from_self, strict=True):
        assert n == rn
        ctypes.memmove(dst, src, n * _SIZES[dt])
    if comm.wire is not None:
        comm.wire.p2p([(peer, _view(p, c, d)) for peer, p, c, d in sends if peer != comm.rank],
                      [(peer, _view(p, c, d)) for peer, p, c, d in recvs if peer != comm.rank])


def _view(ptr: int, count: int, datatype: int) -> Any:
    return fake_nccl_wire.as_tensor(fake_nccl_wire.host_array(ptr, count * _SIZES[datatype],
                                                              datatype), datatype)


def group_end() -> None:
    parts, Communicator.pending = Communicator.pending or [], None
    if not parts:
        return
    comms = {p[6] for p in parts}
    assert len(comms) == 1, "one NCCL group over several communicators is not modelled"
    _on(parts[0][5], partial(_run_group, parts), parts[0][6])


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
        self.id = Communicator.device if index is None else index
        if not 0 <= self.id < count:
            raise RuntimeError(f"cudaErrorInvalidDevice: device {self.id} of {count}")
        self._before: list[int] = []

    def use(self) -> None:
        Communicator.device = self.id

    def __enter__(self) -> "_Device":
        self._before.append(Communicator.device)
        self.use()
        return self

    def __exit__(self, *exc: object) -> None:
        Communicator.device = self._before.pop()


def make_modules(version: str = "14.2.0", devices: int = 1) -> dict[str, types.ModuleType]:
    """sys.modules entries for cupy, cupy.cuda and cupy.cuda.nccl, on `devices` GPUs."""
    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.available = True
    for name, value in dict(NCCL_SUM=0, NCCL_UINT8=1, NCCL_INT32=2, NCCL_INT64=4,
                            NCCL_FLOAT16=6, NCCL_FLOAT32=7, NCCL_BFLOAT16=9).items():
        setattr(nccl, name, value)
    nccl.NcclCommunicator, nccl.NcclError = Communicator, NcclError
    nccl.get_unique_id = (lambda: bytes(range(128))) if devices == 1 else \
        fake_nccl_wire.unique_id
    nccl.get_version = lambda: 22703
    nccl.groupStart, nccl.groupEnd = group_start, group_end

    def memcpy_async(dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        assert kind == 3
        _on(stream, _copy(dst, src, nbytes))

    def mem_get_info() -> tuple[int, int]:
        _refuse_in_capture("cudaMemGetInfo")
        return 8 << 30, 16 << 30

    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: devices, memcpyAsync=memcpy_async, memcpyDeviceToDevice=3,
        memGetInfo=mem_get_info,
        getDeviceProperties=lambda dev: {"name": b"Stand-in GPU (tests/fake_cupy.py)"},
        runtimeGetVersion=lambda: 12040, driverGetVersion=lambda: 12080)
    cuda = types.ModuleType("cupy.cuda")
    cuda.nccl, cuda.runtime, cuda.Stream, cuda.Event = nccl, runtime, Stream, Event
    cuda.Device = partial(_Device, devices)
    cuda.get_elapsed_time = get_elapsed_time
    cupy = types.ModuleType("cupy")
    cupy.__version__, cupy.cuda = version, cuda
    cupy.zeros = lambda numel, dtype: Array(numel, dtype)
    modules = {"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.nccl": nccl}
    for name, module in modules.items():  # importlib.util.find_spec reads it
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    return modules
