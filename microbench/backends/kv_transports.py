"""What carries the KV blocks in a replay: NIXL (as vLLM and SGLang call it), Mooncake's
transfer engine (as SGLang calls it: mooncake_transport.py), MPI one-sided
(a window, Get or Put: MPI's READ and WRITE), MPI send/recv and torch.distributed send/recv,
each behind one small class.

Every rank holds one buffer: its side's cache of the request (kvcache.SideCache layout).
A pair's descriptors are (prefill offset, decode offset, bytes). The initiator is the side
the connector makes act: the decode rank for a READ (vLLM's pull), the prefill rank for a
WRITE (SGLang's push); send/recv needs both. `transfer()` issues this rank's part of one
request's transfer and returns once it is complete here.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from microbench.argtypes import UsageError
from microbench.backends.host_memory import written_zeros
from patterns.disagg import Pair


@dataclass
class PairDescs:
    pair: Pair
    index: int  # the pair's place in the transfer (a tag)
    prefill_rank: int  # job ranks
    decode_rank: int
    src: np.ndarray  # uint64 offsets into the prefill rank's buffer
    dst: np.ndarray  # uint64 offsets into the decode rank's buffer
    length: np.ndarray  # uint64 bytes of each descriptor
    # (first, count) of each batch the connector hands its library in one call (Mooncake's
    # batch_transfer_sync_*, patterns KVTransfer.batches); None: the pair's list is one
    batches: list[tuple[int, int]] | None = None


@dataclass
class Role:
    """This rank's part: its side, its buffer's size, and the pairs it is in."""

    rank: int
    side: str  # "prefill" or "decode"
    nbytes: int
    pairs: list[PairDescs]
    direction: str  # "read" (decode initiates) or "write" (prefill initiates)

    @property
    def initiates(self) -> bool:
        return (self.side == "decode") == (self.direction == "read")

    def peer(self, pd: PairDescs) -> int:
        return pd.prefill_rank if self.side == "decode" else pd.decode_rank

    def local_remote(self, pd: PairDescs) -> tuple[np.ndarray, np.ndarray]:
        """(offsets in this rank's buffer, offsets in the peer's) of a pair."""
        return (pd.dst, pd.src) if self.side == "decode" else (pd.src, pd.dst)


def _hindexed(mpi: Any, lengths: np.ndarray, offsets: np.ndarray) -> Any:
    """A descriptor list as one MPI datatype: blocks of bytes at byte displacements."""
    return mpi.BYTE.Create_hindexed(lengths.tolist(), offsets.tolist()).Commit()


class MpiRma:
    """MPI one-sided: every rank's buffer is a window (MPI_Win_allocate); the initiator opens
    a passive epoch on all targets (Lock_all), issues one Get (READ) or Put (WRITE) per pair
    with the pair's descriptors as datatypes, and Unlock_all completes them."""

    name = "rma"

    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI
        self.mpi, self.comm = MPI, comm
        self.ops: list[tuple[Callable[..., None], list[Any], int, list[Any]]] = []
        self.types: list[Any] = []

    def allocate(self, nbytes: int) -> np.ndarray:
        self.win = self.mpi.Win.Allocate(max(nbytes, 1), disp_unit=1, comm=self.comm)
        return np.frombuffer(self.win.tomemory(), dtype=np.uint8)[:nbytes]

    def prepare(self, role: Role, buffer: np.ndarray, allgather: Callable) -> None:
        if not role.initiates:
            return
        call = self.win.Get if role.direction == "read" else self.win.Put
        for pd in role.pairs:
            if not pd.length.size:
                continue
            local, remote = role.local_remote(pd)
            ltype = _hindexed(self.mpi, pd.length, local)
            rtype = _hindexed(self.mpi, pd.length, remote)
            self.types += [ltype, rtype]
            self.ops.append((call, [buffer, 1, ltype], role.peer(pd), [0, 1, rtype]))

    def clear(self) -> None:
        """Forget the prepared pairs (a sweep prepares one case after another)."""
        for t in self.types:
            t.Free()
        self.ops, self.types = [], []

    def transfer(self) -> None:
        if not self.ops:
            return
        self.win.Lock_all()
        for call, origin, target, where in self.ops:
            call(origin, target, where)
        self.win.Unlock_all()

    def versions(self) -> dict[str, Any]:
        return {"mpi_library": self.mpi.Get_library_version().splitlines()[0].strip()}

    def close(self) -> None:
        self.clear()
        self.win.Free()


class MpiP2P:
    """MPI send/recv: the prefill rank sends each pair's descriptors as one datatype, the
    decode rank receives them in place (both sides act, whatever the connector's direction)."""

    name = "p2p"

    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI
        self.mpi, self.comm = MPI, comm
        self.ops: list[Callable[[], Any]] = []
        self.types: list[Any] = []

    def allocate(self, nbytes: int) -> np.ndarray:
        return written_zeros(nbytes)

    def prepare(self, role: Role, buffer: np.ndarray, allgather: Callable) -> None:
        for pd in role.pairs:
            if not pd.length.size:
                continue
            local, _ = role.local_remote(pd)
            dtype = _hindexed(self.mpi, pd.length, local)
            self.types.append(dtype)
            if role.side == "prefill":
                self.ops.append(lambda d=dtype, p=pd: self.comm.Isend(
                    [buffer, 1, d], dest=p.decode_rank, tag=p.index))
            else:
                self.ops.append(lambda d=dtype, p=pd: self.comm.Irecv(
                    [buffer, 1, d], source=p.prefill_rank, tag=p.index))

    def clear(self) -> None:
        for t in self.types:
            t.Free()
        self.ops, self.types = [], []

    def transfer(self) -> None:
        if self.ops:
            self.mpi.Request.Waitall([op() for op in self.ops])

    def versions(self) -> dict[str, Any]:
        return {"mpi_library": self.mpi.Get_library_version().splitlines()[0].strip()}

    def close(self) -> None:
        self.clear()


class TorchP2P:
    """torch.distributed send/recv (gloo on CPUs, NCCL on GPUs): a pair's descriptors are
    gathered into one contiguous buffer on the prefill rank, sent with one isend, received
    with one irecv and scattered into place on the decode rank. The copies are part of the
    transfer: a send/recv library moves contiguous buffers only."""

    name = "torch"

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        self.ops: list[tuple[str, int, int, Any, int, np.ndarray]] = []

    def allocate(self, nbytes: int) -> np.ndarray:
        self.buffer = written_zeros(nbytes)
        return self.buffer

    def prepare(self, role: Role, buffer: np.ndarray, allgather: Callable) -> None:
        for pd in role.pairs:
            if not pd.length.size:
                continue
            local, _ = role.local_remote(pd)
            way = "send" if role.side == "prefill" else "recv"
            size = int(pd.length[0])
            if (local % size).any() or (pd.length != size).any() or buffer.size % size:
                # Descriptors of several sizes (SGLang's chunks, its sliding-window runs),
                # or not on a multiple of their size: gathered one slice at a time.
                spans = [(int(o), int(n)) for o, n in zip(local, pd.length, strict=True)]
                staging = np.empty(int(pd.length.sum()), dtype=np.uint8)
                self.ops.append((way, role.peer(pd), pd.index, spans, 0, staging))
                continue
            rows = (local // size).astype(np.int64)
            staging = np.empty((rows.size, size), dtype=np.uint8)
            self.ops.append((way, role.peer(pd), pd.index, rows, size, staging))

    def transfer(self) -> None:
        requests, unpack = [], []
        for way, peer, tag, rows, size, staging in self.ops:
            tensor = self.torch.from_numpy(staging)
            if way == "send":
                if size:
                    np.take(self.buffer.reshape(-1, size), rows, axis=0, out=staging)
                else:
                    np.concatenate([self.buffer[o:o + n] for o, n in rows], out=staging)
                requests.append(self.dist.isend(tensor, dst=peer, tag=tag))
            else:
                requests.append(self.dist.irecv(tensor, src=peer, tag=tag))
                unpack.append((rows, size, staging))
        for request in requests:
            request.wait()
        for rows, size, staging in unpack:
            if size:
                self.buffer.reshape(-1, size)[rows] = staging
                continue
            at = 0
            for o, n in rows:
                self.buffer[o:o + n] = staging[at:at + n]
                at += n

    def clear(self) -> None:
        self.ops = []

    def versions(self) -> dict[str, Any]:
        return {"torch": self.torch.__version__}

    def close(self) -> None:
        self.clear()


def import_nixl() -> Any:
    """NIXL's Python API: the `nixl` meta package's module, or nixl-cu12's/cu13's."""
    import logging
    import os
    import sys
    # WARN is a level both NIXL's C++ log and its Python logger take ("WARNING" is refused by
    # the C++ one); its INFO lines would fill the output.
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    for module in ("nixl._api", "nixl_cu12._api", "nixl_cu13._api"):
        try:
            api = __import__(module, fromlist=["nixl_agent"])
        except ImportError:
            continue
        # NIXL's Python logger writes to stdout (its logging.py); stdout's last line is ours
        for handler in logging.getLogger("nixl").handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
                handler.setStream(sys.stderr)
        return api
    raise UsageError("--kv-transport nixl needs NIXL's Python package: pip install "
                     "'infercomm[nixl]' (nixl-cu12), or use --backend mpi --kv-transport rma")


class Nixl:
    """NIXL with its UCX backend, as the connectors use it: every rank an agent with its
    buffer registered (DRAM here, VRAM on GPUs); agents exchange metadata; the initiator
    prepares each pair's local and remote descriptor lists once (`prep_xfer_dlist`), and
    per request posts one `make_prepped_xfer` READ or WRITE a pair with a notification,
    then polls it to DONE; the target waits for the notifications, as vLLM's prefill side
    (to free its blocks) and SGLang's decode side (to start decoding) do."""

    name = "nixl"

    def __init__(self, rank: int, progress_thread: bool = False) -> None:
        self.api = import_nixl()
        # The engines keep NIXL's progress thread (vLLM with num_threads 4, worker.py:180);
        # on a host with few cores it is starved (notifications took 8 ms on a 2-core VM
        # where polling took 0.06 ms), so by default the ranks progress UCX themselves by
        # polling, as the engines' loops also do (check_xfer_state, get_new_notifs).
        config = (self.api.nixl_agent_config(backends=["UCX"], num_threads=4)
                  if progress_thread else
                  self.api.nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
        self.progress_thread = progress_thread
        self.agent = self.api.nixl_agent(f"infercomm-{rank}", config)
        self.xfers: list[tuple[Any, np.ndarray, Any, bytes]] = []
        self.notify: list[tuple[str, bytes]] = []  # notifications without data (MLA)
        self.expected = 0
        self.remotes: dict[bytes, str] = {}  # agent metadata -> name, added once

    def allocate(self, nbytes: int) -> np.ndarray:
        self.buffer = written_zeros(max(nbytes, 1))
        self.registered = self.agent.register_memory(
            [(self.buffer.ctypes.data, self.buffer.nbytes, 0, "")], "DRAM")
        return self.buffer[:nbytes]

    def prepare(self, role: Role, buffer: np.ndarray, allgather: Callable) -> None:
        peers = allgather((self.agent.get_agent_metadata(), int(buffer.ctypes.data)))
        base = int(buffer.ctypes.data)
        self.op = "READ" if role.direction == "read" else "WRITE"
        for pd in role.pairs:
            notif = f"kv:{pd.index}".encode()
            if not role.initiates:
                self.expected += 1  # one notification a pair, with data or without
                continue
            meta, remote_base = peers[role.peer(pd)]
            if meta not in self.remotes:
                self.remotes[meta] = self.agent.add_remote_agent(meta)
            name = self.remotes[meta]
            if not pd.length.size:
                self.notify.append((name, notif))
                continue
            local, remote = role.local_remote(pd)
            zeros = np.zeros_like(pd.length)
            ldescs = np.column_stack((base + local, pd.length, zeros)).astype(np.uint64)
            rdescs = np.column_stack((remote_base + remote, pd.length, zeros)).astype(np.uint64)
            lhandle = self.agent.prep_xfer_dlist(
                "NIXL_INIT_AGENT", self.agent.get_xfer_descs(ldescs, "DRAM"))
            rhandle = self.agent.prep_xfer_dlist(name, self.agent.get_xfer_descs(rdescs, "DRAM"))
            self.xfers.append((lhandle, np.arange(len(pd.length)), rhandle, notif))

    def clear(self) -> None:
        for lhandle, _, rhandle, _ in self.xfers:
            self.agent.release_dlist_handle(lhandle)
            self.agent.release_dlist_handle(rhandle)
        self.xfers, self.notify, self.expected = [], [], 0

    def transfer(self) -> None:
        agent = self.agent
        handles = [agent.make_prepped_xfer(self.op, lh, ids, rh, ids, notif)
                   for lh, ids, rh, notif in self.xfers]
        for h in handles:
            if agent.transfer(h) == "ERR":
                raise RuntimeError("NIXL could not post a transfer")
        for name, notif in self.notify:
            agent.send_notif(name, notif)
        for h in handles:
            state = agent.check_xfer_state(h)
            while state == "PROC":
                state = agent.check_xfer_state(h)
            if state != "DONE":
                raise RuntimeError(f"NIXL transfer ended in state {state}")
            agent.release_xfer_handle(h)
        received = 0
        while received < self.expected:
            received += sum(len(v) for v in agent.get_new_notifs().values())

    def versions(self) -> dict[str, Any]:
        from importlib.metadata import PackageNotFoundError, version
        for dist in ("nixl", "nixl-cu12", "nixl-cu13"):
            try:
                return {"nixl": f"{dist} {version(dist)}", "nixl_backend": "UCX",
                        "nixl_progress_thread": self.progress_thread}
            except PackageNotFoundError:
                continue
        return {"nixl": "unknown", "nixl_backend": "UCX",
                "nixl_progress_thread": self.progress_thread}

    def close(self) -> None:
        self.clear()
        for name in self.remotes.values():  # while the peers' agents still exist
            self.agent.remove_remote_agent(name)
        self.remotes = {}
        self.agent.deregister_memory(self.registered)


# Transports whose libraries may crash in their ELF destructors at process exit (see
# ranks/teardown.exit_past_library_destructors): their ranks end without running them.
ENDS_PAST_DESTRUCTORS = frozenset({"nixl"})


def mooncake_options(args: Any) -> tuple[str | None, str | None]:
    return getattr(args, "mooncake_protocol", None), getattr(args, "mooncake_host", None)


def check_transport_here(args: Any) -> None:
    """Before any rank starts: the chosen transport's library is there and takes the
    options given (one line, exit status 2, where not)."""
    if args.kv_transport == "nixl":
        import_nixl()
    elif args.kv_transport == "mooncake":
        from microbench.backends.mooncake_transport import check_mooncake
        check_mooncake(*mooncake_options(args))


def open_transport(name: str, rank: int, comm: Any | None, nixl_thread: bool = False,
                   mooncake: tuple[str | None, str | None] = (None, None)) -> Any:
    """mooncake: (--mooncake-protocol, --mooncake-host), None for the defaults."""
    if name == "nixl":
        return Nixl(rank, nixl_thread)
    if name == "mooncake":
        from microbench.backends.mooncake_transport import Mooncake
        return Mooncake(rank, *mooncake)
    if name == "torch":
        return TorchP2P()
    if comm is None:
        raise UsageError(f"--kv-transport {name} issues MPI calls; use --backend mpi")
    return MpiRma(comm) if name == "rma" else MpiP2P(comm)
