"""What carries a stand-in NCCL call between processes, and NCCL's own log of it.

The stand-in CuPy communicator (tests/fake_cupy.py) and the stand-in NCCL process group
(tests/fake_torch_nccl.py) are host memory in separate rank processes; their collectives
really move the bytes, over a gloo process group of their own, so a multi-rank --check on the
stand-ins compares real sums. `Wire` is that group for one communicator; `NcclLog` writes the
lines NCCL writes with NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,COLL, in the formats
patterns/traces/nccl_log.py reads (NVIDIA/nccl src/enqueue.cc ncclEnqueueCheck and
src/init.cc "Init COMPLETE" @ v2.30.7-1), so `infercomm validate` reads a stand-in run's log
as it reads a GPU's.

A unique id is 128 bytes (ncclUniqueId, NCCL_UNIQUE_ID_BYTES in nccl.h); the stand-in's holds
the address of a TCPStore that the process which made the id serves.
"""

import atexit
import ctypes
import itertools
import os
import socket
import threading
from datetime import timedelta
from typing import Any

import numpy as np

# ncclDataType_t -> numpy storage (bf16 is stored as uint16 and summed as torch.bfloat16)
NUMPY = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64,
         6: np.float16, 7: np.float32, 8: np.float64, 9: np.uint16}
_servers: list[Any] = []  # TCPStores this process serves for ids it made (kept alive)
atexit.register(_servers.clear)  # before interpreter teardown frees torch's objects
_tag = itertools.count(1)


def unique_id() -> bytes:
    """A 128-byte id naming a store this process serves (ncclGetUniqueId)."""
    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=60))
    _servers.append(store)
    text = f"standin-nccl 127.0.0.1:{store.port}:{next(_tag)}".encode()
    return text.ljust(128, b"\0")


def _address(commId: bytes) -> tuple[str, int, str]:
    text = bytes(commId).rstrip(b"\0").decode()
    assert text.startswith("standin-nccl "), f"not a stand-in NCCL unique id: {text[:40]!r}"
    host, port, tag = text.split(" ", 1)[1].split(":")
    return host, int(port), tag


def host_array(ptr: int, nbytes: int, datatype: int) -> np.ndarray:
    """The host memory at `ptr` as an array of the NCCL datatype's storage."""
    raw = (ctypes.c_uint8 * nbytes).from_address(ptr)
    return np.frombuffer(raw, dtype=np.uint8).view(NUMPY[datatype])


def as_tensor(array: np.ndarray, datatype: int) -> Any:
    import torch
    tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if datatype == 9 else tensor


class Wire:
    """One communicator's ranks over a gloo group of their own (ncclCommInitRank)."""

    def __init__(self, commId: bytes, ndev: int, rank: int) -> None:
        import torch.distributed as dist
        host, port, tag = _address(commId)
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=60))
        self.pg = dist.ProcessGroupGloo(dist.PrefixStore(f"nccl-{tag}", store), rank, ndev,
                                        timedelta(seconds=120))
        self.rank, self.size, self._store = rank, ndev, store

    def close(self) -> None:
        """ncclCommDestroy: the gloo group and its store connection go now, not at exit."""
        self.pg, self._store = None, None

    def allreduce(self, data: Any, op: int = 0) -> None:
        """ncclRedOp_t `op` (0 sum, 1 prod, 2 max, 3 min, 4 avg) over the ranks, in place.
        gloo has no average: NCCL's ncclAvg is the sum divided by the rank count (integers
        truncated, as C divides them)."""
        import torch
        import torch.distributed as dist
        gloo = {0: dist.ReduceOp.SUM, 1: dist.ReduceOp.PRODUCT, 2: dist.ReduceOp.MAX,
                3: dist.ReduceOp.MIN, 4: dist.ReduceOp.SUM}[op]
        options = dist.AllreduceOptions()
        options.reduceOp = gloo
        self.pg.allreduce([data], options).wait()
        if op == 4:
            if data.is_floating_point():
                data.div_(self.size)
            else:
                data.copy_(torch.div(data, self.size, rounding_mode="trunc"))

    def allgather(self, out: Any, data: Any) -> None:
        parts = list(out.chunk(self.size))
        self.pg.allgather([parts], [data]).wait()

    def broadcast(self, data: Any, root: int) -> None:
        import torch.distributed as dist
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = root, 0
        self.pg.broadcast([data], options).wait()

    def p2p(self, sends: list[tuple[int, Any]], recvs: list[tuple[int, Any]]) -> None:
        """One NCCL group of sends and receives: all posted, then all waited for."""
        works = [self.pg.send([t], peer, 0) for peer, t in sends]
        works += [self.pg.recv([t], peer, 0) for peer, t in recvs]
        for work in works:
            work.wait()


class NcclLog:
    """NCCL_DEBUG=INFO lines for the subsystems NCCL_DEBUG_SUBSYS names (INIT, COLL)."""

    _lock = threading.Lock()

    def __init__(self) -> None:
        env = os.environ
        on = env.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE")
        subsys = {s.strip().upper() for s in env.get("NCCL_DEBUG_SUBSYS", "INIT").split(",")}
        self.init = on and bool(subsys & {"INIT", "ALL"})
        self.coll = on and bool(subsys & {"COLL", "ALL"})
        self.path = env.get("NCCL_DEBUG_FILE")
        self.op_count: dict[int, int] = {}

    def _write(self, device: int, text: str) -> None:
        host, pid = socket.gethostname(), os.getpid()
        line = f"{host}:{pid}:{threading.get_native_id()} [{device}] NCCL INFO {text}\n"
        with self._lock:
            if self.path:
                name = self.path.replace("%h", host).replace("%p", str(pid))
                with open(name, "a") as f:
                    f.write(line)
            else:
                os.write(1, line.encode())

    def comm_init(self, comm: int, rank: int, nranks: int, device: int) -> None:
        if self.init:
            self._write(device, f"ncclCommInitRank comm {comm:#x} rank {rank} nranks {nranks} "
                                f"cudaDev {device} nvmlDev {device} - Init COMPLETE")

    def call(self, name: str, comm: int, nranks: int, device: int, count: int, datatype: int,
             root: int = 0, send: int = 0, recv: int = 0, stream: int = 0,
             op: int = 0) -> None:
        if not self.coll:
            return
        n = self.op_count.get(comm, 0)
        self.op_count[comm] = n + 1
        self._write(device, f"{name}: opCount {n:x} sendbuff {send:#x} recvbuff {recv:#x} "
                            f"count {count} datatype {datatype} op {op} root {root} comm {comm:#x}"
                            f" [nranks={nranks}] stream {stream:#x}")
