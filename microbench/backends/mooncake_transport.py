"""Mooncake's transfer engine as a KV transport, as SGLang's Mooncake connector calls it.

SGLang (modal-projects/sglang @ 8905cbd4) makes one `TransferEngine` a rank,
`initialize(host, "P2PHANDSHAKE", protocol, device)` with the protocol from
`MOONCAKE_PROTOCOL` (rdma by default; tcp, efa ...: srt/environ.py:500,
srt/distributed/device_communicators/mooncake_transfer_engine.py:189-213), registers its KV
buffers (`register_memory`), names itself `host:rpc_port` to its peers (the session id,
mooncake_transfer_engine.py:136-138), and the prefill rank writes each batch of blocks with
`batch_transfer_sync_write(session, src_addrs, dst_addrs, lengths)`, which returns once every
block has landed (mooncake_transfer_engine.py:236-265); a non-zero return fails the request
(disaggregation/mooncake/conn.py:1410-1425). The decode rank takes no part in the writes.

Here: every rank an engine on its host buffer (`--mooncake-protocol`, tcp by default; rdma
where the host has RDMA devices), reached at loopback when all ranks share a host
(`--mooncake-host` names another address of this host); the batches are the pattern's
(`KVTransfer.batches`: one a transfer at equal tp, one a layer and K or V otherwise), issued
one after another as SGLang's one transfer thread does. A READ (vLLM's connectors' direction)
is `batch_transfer_sync_read` by the decode rank, a pair's descriptors one batch.
"""

import contextlib
import os
import socket
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from microbench.argtypes import UsageError
from microbench.backends.host_memory import written_zeros

PROTOCOLS = ("tcp", "rdma")
DEFAULT_PROTOCOL = "tcp"
LOOPBACK = "127.0.0.1"
# The wheels that hold `mooncake.engine` (the CPU one first: the one installed here).
DISTRIBUTIONS = ("mooncake-transfer-engine-non-cuda", "mooncake-transfer-engine",
                 "mooncake-transfer-engine-cuda13")
NEEDED_LIBRARIES = "libibverbs1 librdmacm1 libnuma1"  # Debian's, as the Makefile's


def import_mooncake() -> Any:
    """`mooncake.engine`, or one line naming what is missing (the wheel, or the RDMA
    user-space libraries its engine.so links even for TCP)."""
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")  # its INFO lines would fill the output
    try:
        import mooncake.engine as engine
    except ImportError as err:
        text = str(err)
        if "cannot open shared object file" in text:  # "libibverbs.so.1: cannot open ..."
            missing = text.split(":")[0].strip()
            raise UsageError(f"--kv-transport mooncake: Mooncake's engine.so needs {missing}, "
                             f"which this host lacks (it links the RDMA libraries even for "
                             f"TCP): apt-get install {NEEDED_LIBRARIES}") from None
        raise UsageError("--kv-transport mooncake needs Mooncake's transfer engine: pip "
                         "install 'infercomm[mooncake]' (mooncake-transfer-engine-non-cuda)"
                         ) from None
    return engine


def rdma_devices() -> list[str]:
    """The host's RDMA devices, as libibverbs finds them (/sys/class/infiniband)."""
    try:
        return sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return []


def check_mooncake(protocol: str | None, host: str | None) -> None:
    """Refuse, before any rank starts, what the engine would not do as asked: a missing
    wheel or library, rdma on a host without RDMA devices (the engine would fall back to
    TCP and the figures would be TCP's), a --mooncake-host that is not this host's."""
    if (protocol or DEFAULT_PROTOCOL) == "rdma" and not rdma_devices():
        raise UsageError("--mooncake-protocol rdma: this host has no RDMA device "
                         "(/sys/class/infiniband is empty; Mooncake would fall back to TCP); "
                         "use --mooncake-protocol tcp")
    if host is not None:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((host, 0))
        except OSError as err:
            why = "does not resolve" if isinstance(err, socket.gaierror) else \
                "is not an address of this host"
            raise UsageError(f"--mooncake-host {host} {why}: each rank's transfer engine "
                             f"listens there and its peers reach it there; use {LOOPBACK} or "
                             "an address of this host") from None
    import_mooncake()


def engine_address(hosts: list[str], given: str | None) -> str:
    """Where this rank's engine listens and its peers reach it: --mooncake-host where given
    (one host only), loopback where every rank runs on this host, else the address of this
    host's name, which must not be a loopback one (Debian maps the name to 127.0.1.1 unless
    /etc/hosts says otherwise)."""
    count = len(set(hosts))
    if given is not None:
        if count > 1:
            raise UsageError(f"--mooncake-host names one address for every rank, and the ranks "
                             f"run on {count} hosts; drop it (each rank then listens at the "
                             "address of its host's name)")
        return given
    if count == 1:
        return LOOPBACK
    name = socket.gethostname()
    address = socket.gethostbyname(name)
    if address.startswith("127."):
        raise UsageError(f"the ranks run on {count} hosts and this host's name {name} resolves "
                         f"to {address}, which the others cannot reach; map the name to this "
                         "host's network address (/etc/hosts)")
    return address


@contextlib.contextmanager
def _stderr_kept() -> Iterator[list[str]]:
    """Mooncake's log (glog, on descriptor 2) during a call: its start-up lines ("Logging
    before InitGoogleLogging", "Local segment descriptor not found") are kept out of the
    output and handed back, for an error to quote."""
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as kept:
        saved = os.dup(2)
        os.dup2(kept.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            kept.seek(0)
            lines += kept.read().decode(errors="replace").splitlines()


class Mooncake:
    """One transfer engine a rank: host buffer registered, sessions exchanged through the
    control backend, the initiator's batches prepared once and issued synchronously.

    One engine a process, as SGLang keeps one shared engine (`init_mooncake_transfer_engine`,
    mooncake_transfer_engine.py:280-297): a second engine in one process hung its first READ
    here. Beside MPICH's ranks (--backend mpi) transfers of 64 MiB in 2,048 descriptors
    failed now and then ("failed to read READ status frame: Operation aborted"); over gloo
    they did not (docs/disaggregated.md)."""

    name = "mooncake"

    def __init__(self, rank: int, protocol: str | None = None, host: str | None = None,
                 engine: Any = None) -> None:
        self.rank = rank
        self.protocol = protocol or DEFAULT_PROTOCOL
        self.host = host
        # engine: a stand-in for tests that record the batches; else Mooncake's own
        self.engine = engine if engine is not None else import_mooncake().TransferEngine()
        self.started = False
        self.session = ""  # host:rpc_port, once started
        self.batches: list[tuple[str, str, int, list[int], list[int], list[int]]] = []
        self.sessions: list[tuple[str, int]] = []

    def allocate(self, nbytes: int) -> np.ndarray:
        self.buffer = written_zeros(max(nbytes, 1))
        return self.buffer[:nbytes]

    def _start(self, allgather: Callable) -> None:
        """Initialise the engine at this rank's address, register the buffer, exchange
        (session, buffer address) with every rank."""
        host = engine_address(allgather(socket.gethostname()), self.host)
        with _stderr_kept() as log:
            status = self.engine.initialize(host, "P2PHANDSHAKE", self.protocol, "")
        if status != 0:
            said = next((line for line in reversed(log) if line.startswith("E")), "")
            raise RuntimeError(f"Mooncake's transfer engine did not start at {host} "
                               f"({self.protocol}): initialize returned {status}"
                               + (f"; it said: {said}" if said else ""))
        status = self.engine.register_memory(int(self.buffer.ctypes.data), self.buffer.nbytes)
        if status != 0:
            raise RuntimeError(f"Mooncake could not register {self.buffer.nbytes:,} bytes of "
                               f"host memory (register_memory returned {status})")
        self.session = f"{host}:{self.engine.get_rpc_port()}"
        self.started = True

    def prepare(self, role: Any, buffer: np.ndarray, allgather: Callable) -> None:
        if not self.started:
            self._start(allgather)
        self.sessions = allgather((self.session, int(buffer.ctypes.data)))
        if not role.initiates:
            return
        base = int(buffer.ctypes.data)
        call = f"batch_transfer_sync_{role.direction}"  # _write (SGLang), _read (a pull)
        for pd in role.pairs:
            session, remote_base = self.sessions[role.peer(pd)]
            local, remote = role.local_remote(pd)
            for first, count in pd.batches or [(0, int(pd.length.size))]:
                if not count:
                    continue
                end = first + count
                self.batches.append((
                    call, session, role.peer(pd),
                    (local[first:end].astype(np.int64) + base).tolist(),
                    (remote[first:end].astype(np.int64) + remote_base).tolist(),
                    pd.length[first:end].astype(np.int64).tolist()))

    def clear(self) -> None:
        self.batches = []

    def transfer(self) -> None:
        for call, session, peer, local, remote, lengths in self.batches:
            status = getattr(self.engine, call)(session, local, remote, lengths)
            if status != 0:
                raise RuntimeError(f"Mooncake's {call} of {len(lengths):,} blocks "
                                   f"to rank {peer} ({session}) returned {status}")

    def versions(self) -> dict[str, Any]:
        from importlib.metadata import PackageNotFoundError, version
        found = "unknown"
        for dist in DISTRIBUTIONS:
            try:
                found = f"{dist} {version(dist)}"
                break
            except PackageNotFoundError:
                continue
        return {"mooncake": found, "mooncake_protocol": self.protocol}

    def close(self) -> None:
        self.clear()
        if self.session:
            self.engine.unregister_memory(int(self.buffer.ctypes.data))
