"""NCCL / RCCL debug logs (`NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL`), read line by line.

Formats, read from NVIDIA/nccl (tags v2.18.1-1, v2.21.5-1, v2.27.7-1, v2.30.7-1):
- prefix, `src/debug.cc` (v2.18.1-1 line 175, v2.30.7-1 lines 330 and 354):
  `"%s:%d:%d [%d] NCCL INFO "` with hostname, pid, tid, cudaDev; v2.30 may put a timestamp
  before it (NCCL_DEBUG_TIMESTAMP_FORMAT), and launchers often add their own prefix, so the
  prefix is searched for, not anchored.
- the call, `src/enqueue.cc` `ncclEnqueueCheck` (v2.18.1-1 line 1586, v2.21.5-1 line 2022,
  v2.27.7-1 line 2419, v2.30.7-1 line 3152): `"%s: opCount %lx sendbuff %p recvbuff %p count
  %zi datatype %d op %d root %d comm %p [nranks=%d] stream %p"` (`%zu` from 2.27 on).
  RCCL (ROCm/rccl @ 0cbce2a7, src/enqueue.cc line 2197) appends `task %d globalrank %d`.
- communicators, `src/init.cc`: `"comm %p rank %d nranks %d cudaDev %d ... - Init COMPLETE"`
  (v2.18.1-1 line 1326; v2.21.5-1 line 1573 and v2.27.7-1 line 1469 prefix it with the
  function name, ncclCommInitRank or ncclCommSplit; v2.30.7-1 line 1945).
Other lines (TUNING `AllReduce: 4 Bytes -> Algo TREE ...`, TRACE lines, NET, ...) are not
calls: they are counted as unparsed.
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from patterns.traces.calls import Call, RankCalls, Trace

_PREFIX = re.compile(r"(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO ")
_COLL = re.compile(
    r"(?P<op>[A-Za-z]+): opCount (?P<opcount>[0-9a-fA-F]+) sendbuff \S+ recvbuff \S+ "
    r"count (?P<count>\d+) datatype (?P<dtype>\d+) op (?P<redop>\d+) root (?P<root>-?\d+) "
    r"comm (?P<comm>\S+) \[nranks=(?P<nranks>\d+)\] stream \S+"
    r"(?: task (?P<task>-?\d+) globalrank (?P<globalrank>-?\d+))?")
_INIT = re.compile(r"comm (?P<comm>\S+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) "
                   r"cudaDev (?P<dev>\d+).*Init COMPLETE")

# ncclDataType_t, src/nccl.h.in (v2.18.1-1 lines 190-201, v2.30.7-1 lines 382-394).
DATATYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "fp16", "fp32", "fp64",
             "bf16", "fp8e4m3", "fp8e5m2")

# NCCL's opName (src/collectives.cc; v2.30.7-1 ncclFuncToString) -> the project's op names.
OPS = {"AllReduce": "allreduce", "AllGather": "allgather", "ReduceScatter": "reducescatter",
       "Broadcast": "broadcast", "Reduce": "reduce", "Send": "send", "Recv": "recv",
       "Gather": "gather", "Scatter": "scatter", "AlltoAll": "alltoall"}


@dataclass
class _Process:
    """One host:pid:cudaDev: a rank."""

    key: str
    calls: RankCalls
    ranks_in: dict[str, tuple[int, int]] = field(default_factory=dict)  # comm -> (rank, nranks)


class LogReader:
    """Feeds lines of one or more logs into one Trace."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.procs: dict[str, _Process] = {}
        self.files_with_calls = 0

    def _proc(self, key: str) -> _Process:
        proc = self.procs.get(key)
        if proc is None:
            proc = self.procs[key] = _Process(key, RankCalls(rank=-1, name=key))
        return proc

    def feed(self, lines: Iterable[str]) -> int:
        """Read lines; return the calls found."""
        trace, found = self.trace, 0
        coll_search, init_search, prefix_search = _COLL.search, _INIT.search, _PREFIX.search
        intern = trace.intern
        for line in lines:
            if "opCount" in line:
                pre = prefix_search(line)
                m = coll_search(line, pre.end()) if pre else None
                if m is None or m.start() != pre.end():  # e.g. a TRACE line of opCount
                    trace.unparsed += 1
                    trace.unknown["non-call line with opCount"] += 1
                    continue
                call = _call(m)
                if call is None:
                    trace.unparsed += 1
                    trace.unknown[f"NCCL op {m['op']}"] += 1
                    continue
                proc = self._proc(f"{pre['host']}:{pre['pid']}:{pre['dev']}")
                proc.calls.ids.append(intern(call))
                if m["globalrank"] is not None:
                    proc.ranks_in.setdefault(m["comm"], (int(m["globalrank"]), call.group_size))
                found += 1
            elif "Init COMPLETE" in line:
                pre = prefix_search(line)
                m = init_search(line, pre.end()) if pre else None
                if m is None:
                    trace.unparsed += 1
                    trace.unknown["other line"] += 1
                    continue
                proc = self._proc(f"{pre['host']}:{pre['pid']}:{pre['dev']}")
                proc.ranks_in[m["comm"]] = (int(m["rank"]), int(m["nranks"]))
            elif line.strip():
                trace.unparsed += 1
                trace.unknown["other line"] += 1
        if found:
            self.files_with_calls += 1
        return found

    def finish(self) -> None:
        """Give each process its rank: its rank in the largest communicator it belongs to
        (from init lines, or RCCL's globalrank); else its place in sorted order."""
        procs = [p for p in self.procs.values() if len(p.calls.ids)]
        chosen: list[int] = []
        for proc in procs:
            if proc.ranks_in:
                rank, _ = max(proc.ranks_in.values(), key=lambda rn: rn[1])
                chosen.append(rank)
        if len(chosen) == len(procs) and len(set(chosen)) == len(chosen):
            for proc, rank in zip(procs, chosen, strict=True):
                proc.calls.rank = rank
        else:
            if chosen:
                self.trace.notes.append("ranks numbered by host:pid:cudaDev order: the init "
                                        "lines do not give every process a distinct rank")
            for rank, proc in enumerate(sorted(procs, key=lambda p: _sort_key(p.key))):
                proc.calls.rank = rank
        self.trace.ranks.extend(sorted((p.calls for p in procs), key=lambda r: r.rank))


def _sort_key(key: str) -> tuple[str, int, int]:
    host, pid, dev = key.rsplit(":", 2)
    return host, int(pid), int(dev)


def _call(m: re.Match) -> Call | None:
    op = OPS.get(m["op"])
    dtype_id = int(m["dtype"])
    if op is None or not 0 <= dtype_id < len(DATATYPES):
        return None
    count, nranks, root = int(m["count"]), int(m["nranks"]), int(m["root"])
    # ReduceScatter's count is the receive count; its input is nranks times that
    # (v2.30.7-1 src/include/enqueue.h:33 ncclFuncSendCount); AllGather's count is the send
    # count (enqueue.h:36 ncclFuncRecvCount multiplies the receive side).
    numel = count * nranks if op == "reducescatter" else count
    peer = root if op in ("send", "recv") else None
    root_of = root if op in ("broadcast", "reduce", "gather", "scatter") else None
    return Call(op=op, numel=numel, dtype=DATATYPES[dtype_id], group_size=nranks,
                group=f"comm {m['comm']}", peer=peer, root=root_of)
