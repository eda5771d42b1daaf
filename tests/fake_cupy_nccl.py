"""The NCCL side of the stand-in CuPy (tests/fake_cupy.py): NcclCommunicator with the
parameter names of CuPy's nccl.pyx, groups of sends and receives, and NcclError. A world of
one copies; a world of several ranks moves the bytes over gloo (tests/fake_nccl_wire.py).

The reduction op of allReduce, reduce and reduceScatter is NCCL's ncclRedOp_t, as CuPy's
nccl.pxd numbers it (NCCL_SUM 0, NCCL_PROD 1, NCCL_MAX 2, NCCL_MIN 3, NCCL_AVG 4;
cupy_backends/cuda/libs/nccl.pxd @ 8f4c987d) and each is computed as named: a backend that
passes the wrong op gets a wrong result that --check sees. Any other value is refused as
NCCL's ArgsCheck refuses it ("invalid reduction operation", or "unknown to this
communicator" for one no ncclRedOpCreatePreMulSum made: src/misc/argcheck.cc @ 0f900e1b)."""

import ctypes
import weakref
from functools import partial
from typing import Any, ClassVar

from tests import fake_nccl_wire
from tests.fake_cupy_cuda import Graph, _check_live, _copy, _on, _refuse_in_capture, state

_SIZES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2}  # ncclDataType_t bytes
REDUCTIONS = {"NCCL_SUM": 0, "NCCL_PROD": 1, "NCCL_MAX": 2, "NCCL_MIN": 3, "NCCL_AVG": 4}

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
        Communicator.log.comm_init(id(self), rank, ndev, state.device)

    def __hash__(self) -> int:
        return id(self)

    def _log(self, name: str, count: int, datatype: int, root: int = 0, send: int = 0,
             recv: int = 0, stream: int = 0, op: int = 0) -> None:
        assert Communicator.log is not None
        Communicator.log.call(name, id(self), self.ndev, state.device, count, datatype,
                              root, send, recv, stream, op)

    def _collective(self, name: str, send: int, recv: int, count: int, datatype: int,
                    stream: int, root: int = 0, op: int | None = None) -> None:
        """One collective; `count` is the input's elements (the output's for allgather's
        input is count, its output count x ndev); `op` the reduction of a reducing one."""
        assert not self.destroyed, f"{name} on a destroyed communicator"
        if op is not None and op not in REDUCTIONS.values():
            raise NcclError(f"NCCL_ERROR_INVALID_ARGUMENT: {name} : invalid reduction "
                            f"operation {op} (ncclRedOp_t 0-4, or one made by "
                            "ncclRedOpCreatePreMulSum)")
        size = _SIZES[datatype]
        out_count = count * self.ndev if name == "AllGather" else (
            count // self.ndev if name == "ReduceScatter" else count)
        in_count = count

        def run() -> None:
            _check_live(send, in_count * size)
            self._log(name, out_count if name == "ReduceScatter" else count, datatype, root,
                      send, recv, stream, op or 0)
            if self.wire is None:  # any reduction over one rank is its input
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
            else:  # AllReduce, Reduce, ReduceScatter: reduced everywhere, kept where due
                self.wire.allreduce(tensor, op or 0)
            if name == "Reduce" and self.rank != root:
                return
            if name == "ReduceScatter":
                data = data[self.rank * out_count:(self.rank + 1) * out_count]
            fake_nccl_wire.host_array(recv, out_count * size, datatype)[:] = data
        _on(stream, run, self)

    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
                  stream: int) -> None:
        Communicator.calls += 1
        self._collective("AllReduce", sendbuf, recvbuf, count, datatype, stream, op=op)

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int,
                  stream: int) -> None:
        self._collective("AllGather", sendbuf, recvbuf, count, datatype, stream)

    def reduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int, datatype: int,
                      op: int, stream: int) -> None:
        self._collective("ReduceScatter", sendbuf, recvbuf, recvcount * self.ndev, datatype,
                         stream, op=op)

    def broadcast(self, sendbuff: int, recvbuff: int, count: int, datatype: int, root: int,
                  stream: int) -> None:
        assert 0 <= root < self.ndev
        self._collective("Broadcast", sendbuff, recvbuff, count, datatype, stream, root)

    def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
               root: int, stream: int) -> None:
        assert 0 <= root < self.ndev
        self._collective("Reduce", sendbuf, recvbuf, count, datatype, stream, root, op=op)

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
