"""NCCL called directly, without torch.distributed, through CuPy's NCCL bindings.

CuPy or nccl4py. Both are on PyPI: `cupy-cuda12x` (14.x) and NVIDIA's `nccl4py` (0.6.0).
CuPy's `cupy.cuda.nccl` is a thin Cython layer over the C API: `NcclCommunicator(n, id,
rank)`, `get_unique_id()`, `groupStart/groupEnd`, and methods such as `allReduce(sendptr,
recvptr, count, datatype, op, stream_ptr)` that take raw pointers, so a bound call is one
C call with no per-call argument checks. nccl4py is more Pythonic: `Communicator.init(nranks,
rank, unique_id)` and `all_reduce(sendbuf, recvbuf, op, stream)` taking tensors or arrays,
whose dtype, count and device it reads and checks on every call (per-call Python work that
an eager decode step of ~65 small calls would pay), and it exposes newer NCCL (native
alltoall and gather, buffer registration, split/shrink). Graph capture belongs to the
stream, not to the binding: NCCL calls issued on a capturing stream are captured (NCCL >=
2.9). CuPy has the capture API itself (`Stream.begin_capture/end_capture` ->
`cupy.cuda.Graph`); with nccl4py it comes from `cuda.core` or torch. Dependencies: nccl4py
pins `cuda.core` and pulls `cuda-python` and `nvidia-nccl-cu12`; CuPy requires numpy only
(it loads NCCL from the `nvidia-nccl-cu12` wheel that a CUDA torch already installs, or from
the system) and is the project's `cuda` extra already. CuPy is used here: raw-pointer calls,
capture in the same library, one dependency.

Buffers are CuPy arrays (bf16 stored as uint16 with NCCL's bfloat16 datatype). Every call
is issued on one dedicated non-blocking stream, which is also where --check copies and CUDA
events go. gather and alltoall are grouped send/recv exactly as torch's ProcessGroupNCCL
issues them. The unique id of each communicator is shared through a torch TCPStore on
MASTER_ADDR:MASTER_PORT (rank 0 serves it; under torchrun, the one its agent already serves
there), or through MPI under an MPI launcher.
"""

import importlib.util
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from microbench.argtypes import UsageError
from microbench.backends import BoundCall, Group, displacements, register
from microbench.backends.nccl_exchange import open_exchange
from microbench.ranks.dist import DistEnv

CUPY_MISSING = "the nccl backend needs CuPy: pip install 'infercomm[cuda]'"

STORAGE = {"bf16": np.uint16, "fp16": np.float16, "fp32": np.float32, "int64": np.int64,
           "int32": np.int32, "uint8": np.uint8, "bool": np.bool_}
# NCCL has no bool: torch's ProcessGroupNCCL sends at::kBool as ncclUint8 (its ncclDataType
# map), and so does this backend
_NCCL_TYPE_NAMES = {"bf16": "NCCL_BFLOAT16", "fp16": "NCCL_FLOAT16", "fp32": "NCCL_FLOAT32",
                    "int64": "NCCL_INT64", "int32": "NCCL_INT32", "uint8": "NCCL_UINT8",
                    "bool": "NCCL_UINT8"}
_NCCL_BFLOAT16 = 9  # ncclBfloat16 in nccl.h (NCCL >= 2.10), for CuPy versions without the name


def require_cupy() -> None:
    """Refuse early (one line, exit 2) when CuPy is not installed; imports nothing."""
    if importlib.util.find_spec("cupy") is None:
        raise UsageError(CUPY_MISSING)


@register("nccl")
def open_nccl(env: DistEnv, device: str, timeout: float, **_: Any) -> "NcclBackend":
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError:
        raise UsageError(CUPY_MISSING) from None
    if not getattr(nccl, "available", False):
        raise UsageError("CuPy finds no NCCL library; pip install nvidia-nccl-cu12 (or the "
                         "cu13 one that matches CuPy)")
    if device != "cuda":
        raise UsageError("the nccl backend runs on CUDA devices only; drop --device cpu or "
                         "use --backend torch")
    return NcclBackend(env, timeout, cupy, nccl)


class NcclBackend:
    name = "nccl"
    transport = "nccl"
    device = "cuda"

    def __init__(self, env: DistEnv, timeout: float, cupy: Any, nccl: Any) -> None:
        self.rank, self.world_size = env.rank, env.world_size
        self._cp, self._nccl = cupy, nccl
        from microbench.ranks.device import check_device_index  # no silent wrap-around
        cupy.cuda.Device(check_device_index(env, cupy.cuda.runtime.getDeviceCount())).use()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._types = {d: getattr(nccl, n, _NCCL_BFLOAT16 if d == "bf16" else None)
                       for d, n in _NCCL_TYPE_NAMES.items()}
        self._exchange = open_exchange(env, timeout)
        self._groups_made = 0
        self._comms: list[Any] = []  # in creation order, destroyed in that order
        self._comms_lock = threading.Lock()  # new_group/close vs the watchdog's async_error
        self._world: Group | None = None
        world = self._world = self.new_group("world", list(range(self.world_size)))
        # kept: a bound call holds raw pointers only, and CuPy's pool hands a freed block out
        # again (cupy/cuda/memory.pyx _arena @ v14.2.0)
        self._barrier_buffer = self.empty(1, "fp32")
        self._barrier_call = self.bind("allreduce", world, self._barrier_buffer, None, None)

    # --- groups and buffers ---

    def new_group(self, name: str, ranks: list[int]) -> Group:
        """Every rank calls this in the same order; only members create the communicator."""
        self._groups_made += 1
        index = ranks.index(self.rank) if self.rank in ranks else -1
        if self._world is not None and ranks == list(range(self.world_size)):
            return Group(name, tuple(ranks), index, self._world.handle)  # world: reuse it
        key = f"infercomm/nccl-id/{self._groups_made}/{name}"
        make = _id_bytes_of(self._nccl.get_unique_id) if index == 0 else None
        unique_id = self._exchange.share(key, ranks[0], make, member=index >= 0)
        if index < 0:
            return Group(name, tuple(ranks), -1, None)
        comm = _communicator(self._cp, self._nccl, len(ranks), unique_id, index)
        with self._comms_lock:
            self._comms.append(comm)
        return Group(name, tuple(ranks), index, comm)

    def empty(self, numel: int, dtype: str) -> "_Buffer":
        with self.stream:  # the zero fill is ordered before every call on the stream
            array = self._cp.zeros(numel, dtype=STORAGE[dtype])
        return _Buffer(array, dtype)

    # --- calls ---

    def bind(self, kind: str, group: Group, send: Any, recv: Any,
             peer_or_root: int | None, counts: tuple[int, ...] | None = None) -> BoundCall:
        comm, s, nccl = group.handle, self.stream.ptr, self._nccl
        dt = self._types[(send if send is not None else recv).dtype]
        match kind:
            case "allgather" if counts is not None:
                return self._allgatherv(comm, group, send, recv, counts, dt)
            case "reducescatter" if counts is not None:
                return self._reducescatterv(comm, send, recv, counts, dt)
            case "allreduce":
                return partial(comm.allReduce, send.ptr, send.ptr, send.numel, dt,
                               nccl.NCCL_SUM, s)
            case "allgather":
                return partial(comm.allGather, send.ptr, recv.ptr, send.numel, dt, s)
            case "reducescatter":
                return partial(comm.reduceScatter, send.ptr, recv.ptr, recv.numel, dt,
                               nccl.NCCL_SUM, s)
            case "broadcast":
                return partial(comm.broadcast, send.ptr, send.ptr, send.numel, dt,
                               peer_or_root, s)
            case "send":
                return partial(comm.send, send.ptr, send.numel, dt, peer_or_root, s)
            case "recv":
                return partial(comm.recv, recv.ptr, recv.numel, dt, peer_or_root, s)
            case "gather":
                return self._gather(comm, group, send, recv, peer_or_root or 0, dt)
            case "alltoall":
                return self._alltoall(comm, group, send, recv, dt)
        raise ValueError(f"nccl backend cannot issue {kind!r}")

    def _gather(self, comm: Any, group: Group, send: "_Buffer", recv: "_Buffer | None",
                root: int, dt: int) -> BoundCall:
        """As ProcessGroupNCCL: one NCCL group; the root receives every other rank's slice
        into its place and copies its own on the stream; every other rank sends to it."""
        s, count, nbytes = self.stream.ptr, send.numel, send.nbytes
        if group.index != root:
            return partial(_grouped, self._nccl, [partial(comm.send, send.ptr, count, dt,
                                                          root, s)])
        runtime = self._cp.cuda.runtime
        parts = [partial(comm.recv, recv.ptr + r * nbytes, count, dt, r, s)
                 for r in range(group.size) if r != root]
        parts.insert(root, partial(runtime.memcpyAsync, recv.ptr + root * nbytes, send.ptr,
                                   nbytes, runtime.memcpyDeviceToDevice, s))
        return partial(_grouped, self._nccl, parts)

    def _alltoall(self, comm: Any, group: Group, send: "_Buffer", recv: "_Buffer",
                  dt: int) -> BoundCall:
        """As ProcessGroupNCCL's equal-split all_to_all_single: in one NCCL group, chunk r
        is sent to rank r and chunk r is received from rank r, for every r (self included)."""
        s, n = self.stream.ptr, group.size
        count = send.numel // n
        step = count * send.array.itemsize
        parts: list[BoundCall] = []
        for r in range(n if count else 0):
            parts.append(partial(comm.send, send.ptr + r * step, count, dt, r, s))
            parts.append(partial(comm.recv, recv.ptr + r * step, count, dt, r, s))
        return partial(_grouped, self._nccl, parts)

    def _allgatherv(self, comm: Any, group: Group, send: "_Buffer", recv: "_Buffer",
                    counts: tuple[int, ...], dt: int) -> BoundCall:
        """As vLLM's PyNcclCommunicator.all_gatherv (distributed/device_communicators/
        pynccl.py): in one NCCL group, one ncclBroadcast per rank, each rank the root of its
        part of the output (the send buffer is read at the root only)."""
        s, size = self.stream.ptr, recv.array.itemsize
        parts = [partial(comm.broadcast, send.ptr if root == group.index else recv.ptr + at * size,
                         recv.ptr + at * size, count, dt, root, s)
                 for root, (count, at) in enumerate(zip(counts, displacements(counts),
                                                        strict=True)) if count]
        return partial(_grouped, self._nccl, parts)

    def _reducescatterv(self, comm: Any, send: "_Buffer", recv: "_Buffer",
                        counts: tuple[int, ...], dt: int) -> BoundCall:
        """As vLLM's PyNcclCommunicator.reduce_scatterv: in one NCCL group, one ncclReduce
        per rank, rank r the root of part r of the input (the output is written at the
        root only)."""
        s, size, total = self.stream.ptr, send.array.itemsize, self._nccl.NCCL_SUM
        parts = [partial(comm.reduce, send.ptr + at * size, recv.ptr, count, dt, total,
                         root, s)
                 for root, (count, at) in enumerate(zip(counts, displacements(counts),
                                                        strict=True)) if count]
        return partial(_grouped, self._nccl, parts)

    # --- --check, synchronisation, results ---

    def write(self, buffer: "_Buffer", values: np.ndarray) -> None:
        buffer.array.set(_to_storage(buffer.dtype, values), stream=self.stream)

    def read(self, buffer: "_Buffer") -> np.ndarray:
        return _from_storage(buffer.dtype, buffer.array.get(stream=self.stream))

    def barrier(self) -> None:
        self._barrier_call()
        self.stream.synchronize()

    def synchronize(self) -> None:
        self.stream.synchronize()

    def allgather_object(self, obj: Any) -> list[Any]:
        return self._exchange.allgather(obj)

    def versions(self) -> dict[str, Any]:
        cp, runtime = self._cp, self._cp.cuda.runtime
        name = runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
        return {"nccl": _nccl_version(self._nccl.get_version()), "cupy": cp.__version__,
                "cuda": _cuda_version(runtime.runtimeGetVersion()),
                "cuda_driver": _cuda_version(runtime.driverGetVersion()),
                "gpu": name.decode() if isinstance(name, bytes) else str(name),
                "unique_id_exchange": self._exchange.name,
                # R13 of the GPU review: NCCL >= 2.28 has native gather and all-to-all that
                # torch may call; this path groups sends and receives (CuPy has no native
                # ones), so a torch-vs-nccl comparison says which it ran.
                "gather_alltoall": "grouped send/recv"}

    def async_error(self) -> str | None:
        """NCCL's asynchronous error of any communicator (a network error, a peer that
        died), for the watchdog thread: ncclCommGetAsyncError, the route NCCL's docs give
        for such errors (usage/communicators.rst @ 5067397c); CuPy raises NcclError."""
        if not self._comms_lock.acquire(blocking=False):  # closing: the comms are going
            return None
        try:
            for comm in self._comms:
                try:
                    comm.check_async_error()
                except Exception as err:  # CuPy's NcclError, reported in one line
                    return f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"
            return None
        finally:
            self._comms_lock.release()

    def close(self) -> None:
        self.barrier()  # no rank leaves while another still reads the store rank 0 serves
        with self._comms_lock:  # the watchdog's async_error skips its poll meanwhile
            comms, self._comms = self._comms, []
        for comm in comms:
            comm.destroy()
        self._exchange.close()


class _Buffer:
    """A CuPy array, its pattern dtype (bf16 and fp16 share uint16/float16 storage), and
    the raw pointer the NCCL calls take."""

    __slots__ = ("array", "dtype", "nbytes", "numel", "ptr")

    def __init__(self, array: Any, dtype: str) -> None:
        self.array, self.dtype = array, dtype
        self.ptr, self.numel, self.nbytes = array.data.ptr, array.size, array.nbytes


def _grouped(nccl: Any, parts: list[BoundCall]) -> None:
    nccl.groupStart()
    try:
        for part in parts:
            part()
    finally:
        nccl.groupEnd()


# --- unique ids: bytes on the wire, whatever CuPy's version takes ---

def _id_bytes_of(get_unique_id: Callable[[], Any]) -> Callable[[], bytes]:
    def make() -> bytes:
        uid = get_unique_id()  # bytes since CuPy 14, a tuple of C chars before
        return uid if isinstance(uid, bytes) else bytes(b & 0xFF for b in uid)
    return make


def _communicator(cupy: Any, nccl: Any, size: int, unique_id: bytes, index: int) -> Any:
    if int(cupy.__version__.split(".")[0]) >= 14:
        return nccl.NcclCommunicator(size, unique_id, index)
    try:  # CuPy 13 converts each int to a C char, signed on x86 ...
        return nccl.NcclCommunicator(size, tuple(b - 256 if b > 127 else b for b in unique_id),
                                     index)
    except OverflowError:  # ... and unsigned on ARM and POWER
        return nccl.NcclCommunicator(size, tuple(unique_id), index)


# --- host copies for --check, and version strings ---

def _to_storage(dtype: str, values: np.ndarray) -> np.ndarray:
    if dtype == "bf16":  # fp32 bits rounded to the upper 16, to nearest even
        bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        return ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(
            np.uint16)
    return values.astype(STORAGE[dtype])


def _from_storage(dtype: str, stored: np.ndarray) -> np.ndarray:
    if dtype == "bf16":
        return (stored.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return stored.astype(np.float64)


def _nccl_version(code: int) -> str:
    """NCCL_VERSION_CODE: X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z from 2.9 on."""
    if code < 10000:
        return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"


def _cuda_version(code: int) -> str:
    return f"{code // 1000}.{code % 1000 // 10}"
