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

_PREFIX = r"([^\s:]+):(\d+):\d+ \[(\d+)\] NCCL INFO "  # host, pid, (tid), cudaDev
_WHO = re.compile(r"([^\s:]+):(\d+):\d+ \[(\d+)\]$")  # the prefix's end: host:pid:tid [dev]
_LINE = re.compile(
    r"([A-Za-z]+): opCount [0-9a-fA-F]+ sendbuff \S+ recvbuff \S+ count (\d+) "
    r"datatype (\d+) op \d+ root (-?\d+) comm (\S+) \[nranks=(\d+)\] stream \S+"
    r"(?: task -?\d+ globalrank (-?\d+))?")
_INIT_LINE = re.compile(_PREFIX + r".*?comm (\S+) rank (\d+) nranks (\d+) cudaDev \d+.*"
                        r"Init COMPLETE")

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
        """Read lines; return the calls found. Hot loop: one regex per call line, and a
        cache from the line's call fields to the interned call and the process's list."""
        trace, found = self.trace, 0
        line_match, init_search, who_search = _LINE.match, _INIT_LINE.search, _WHO.search
        calls_of: dict[str, _Process | None] = {}  # "host:pid:tid [dev]" -> its process
        ids_of: dict[tuple[str, ...], int] = {}
        unknown = trace.unknown
        for line in lines:
            if "opCount" in line:
                # The call's fields sit at fixed places of the format (words split on
                # spaces): checking the literal words is as strict as a regex, and faster.
                at = line.find(" NCCL INFO ")
                w = line[at + 11:].split() if at > 0 else ()
                if (len(w) < 20 or w[1] != "opCount" or w[7] != "count" or w[9] != "datatype"
                        or w[13] != "root" or w[15] != "comm" or w[18] != "stream"
                        or not w[0].endswith(":") or not w[17].startswith("[nranks=")):
                    trace.unparsed += 1  # e.g. a TRACE line about an opCount
                    unknown["non-call line with opCount"] += 1
                    continue
                who = line[max(0, line.rfind(" ", 0, line.rfind(" ", 0, at)) + 1):at]
                if who in calls_of:
                    proc = calls_of[who]
                else:
                    m = who_search(who)
                    proc = calls_of[who] = (self._proc(f"{m[1]}:{m[2]}:{m[3]}") if m else None)
                if proc is None:
                    trace.unparsed += 1
                    unknown["call line without host:pid:tid [cudaDev]"] += 1
                    continue
                key = (w[0], w[8], w[10], w[14], w[16], w[17])
                call_id = ids_of.get(key)
                if call_id is None:
                    m = line_match(line, at + 11)
                    call = _call(*m.groups()[:6]) if m else None
                    if call is None:
                        trace.unparsed += 1
                        unknown[f"NCCL call {w[0]} datatype {w[10]}"] += 1
                        continue
                    call_id = ids_of[key] = trace.intern(call)
                proc.calls.ids.append(call_id)
                if len(w) >= 24 and w[22] == "globalrank" and w[16] not in proc.ranks_in:
                    proc.ranks_in[w[16]] = (int(w[23]), trace.table[call_id].group_size or 0)
                found += 1
            elif "Init COMPLETE" in line:
                m = init_search(line)
                if m is None:
                    trace.unparsed += 1
                    unknown["other line"] += 1
                    continue
                host, pid, dev, comm, rank, nranks = m.groups()
                self._proc(f"{host}:{pid}:{dev}").ranks_in[comm] = (int(rank), int(nranks))
            elif line.strip():
                trace.unparsed += 1
                unknown["other line"] += 1
        if found:
            self.files_with_calls += 1
        return found

    def finish(self) -> None:
        """Give each process its rank: its rank in the largest communicator it belongs to
        (from init lines, or RCCL's globalrank); else its place in host, cudaDev, pid order."""
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
    """Host, then device (a launcher gives local rank r device r), then pid."""
    host, pid, dev = key.rsplit(":", 2)
    return host, int(dev), int(pid)


def _call(name: str, count_text: str, dtype_text: str, root_text: str, comm: str,
          nranks_text: str) -> Call | None:
    op = OPS.get(name)
    count, dtype_id, root = int(count_text), int(dtype_text), int(root_text)
    nranks = int(nranks_text)
    if op is None or not 0 <= dtype_id < len(DATATYPES):
        return None
    # ReduceScatter's count is the receive count; its input is nranks times that
    # (v2.30.7-1 src/include/enqueue.h:33 ncclFuncSendCount); AllGather's count is the send
    # count (enqueue.h:36 ncclFuncRecvCount multiplies the receive side).
    numel = count * nranks if op == "reducescatter" else count
    peer = root if op in ("send", "recv") else None
    root_of = root if op in ("broadcast", "reduce", "gather", "scatter") else None
    return Call(op=op, numel=numel, dtype=DATATYPES[dtype_id], group_size=nranks,
                group=f"comm {comm}", peer=peer, root=root_of)
