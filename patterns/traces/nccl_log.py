"""NCCL / RCCL debug logs (`NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL`), read line by line.

Formats, read from NVIDIA/nccl (tags v2.18.1-1, v2.21.5-1, v2.27.7-1, v2.30.7-1):
- prefix, `src/debug.cc` (v2.18.1-1 line 175, v2.30.7-1 lines 330 and 354):
  `"%s:%d:%d [%d] NCCL INFO "` with hostname, pid, tid, cudaDev; v2.30 may put a timestamp
  before it (NCCL_DEBUG_TIMESTAMP_FORMAT), and launchers often add their own prefix, so the
  prefix is searched for, not anchored.
- the call, `src/enqueue.cc` `ncclEnqueueCheck` (v2.18.1-1 line 1586, v2.21.5-1 line 2022,
  v2.27.7-1 line 2419, v2.30.7-1 line 3152): `"%s: opCount %lx sendbuff %p recvbuff %p count
  %zi datatype %d op %d root %d comm %p [nranks=%d] stream %p"` (`%zu` from 2.27 on).
  RCCL (ROCm/rccl @ 0cbce2a7, src/enqueue.cc line 2197) appends `task %d globalrank %d`;
  RCCL 2.27.7 (ROCm 7.2) adds `acc %p` after recvbuff (`recvbuff %p acc %p count ...`, as
  its logs print it; that source is not in the stored RCCL snapshot). A process of RCCL may
  drive several GPUs: each globalrank it prints is a rank of its own.
- lines written by concurrent processes may be cut into one another: the call is read from
  the last `NCCL INFO` prefix before its `opCount`, a host name glued to another line's
  fragment cut back to a host already seen.
- communicators, `src/init.cc`: `"comm %p rank %d nranks %d cudaDev %d ... - Init COMPLETE"`
  (v2.18.1-1 line 1326; v2.21.5-1 line 1573 and v2.27.7-1 line 1469 prefix it with the
  function name, ncclCommInitRank or ncclCommSplit; v2.30.7-1 line 1945).
Other lines (TUNING `AllReduce: 4 Bytes -> Algo TREE ...`, TRACE lines, NET, ...) are not
calls: they are counted as unparsed.
"""

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from patterns.errors import ConfigError, shown
from patterns.traces.calls import Call, RankCalls, Trace

_PREFIX = r"([^\s:]+):(\d+):\d+ \[(\d+)\] NCCL INFO "  # host, pid, (tid), cudaDev
_WHO = re.compile(r"([^\s:]+):(\d+):\d+ \[(\d+)\]$")  # the prefix's end: host:pid:tid [dev]
_LINE = re.compile(
    r"([A-Za-z]+): opCount [0-9a-fA-F]+ sendbuff \S+ recvbuff \S+ (?:acc \S+ )?count (\d+) "
    r"datatype (\d+) op \d+ root (-?\d+) comm (\S+) \[nranks=(\d+)\] stream \S+"
    r"(?: task -?\d+ globalrank (-?\d+))?")
# a rank tag between "NCCL INFO" and the op name, as some launchers' logs print it
_RANK_TAG = re.compile(r" NCCL INFO \[\d+\] $")
_INIT_LINE = re.compile(_PREFIX + r".*?comm (\S+) rank (\d+) nranks (\d+) cudaDev \d+.*"
                        r"Init COMPLETE")

# ncclDataType_t, src/nccl.h.in (v2.18.1-1 lines 190-201, v2.30.7-1 lines 382-394).
DATATYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "fp16", "fp32", "fp64",
             "bf16", "fp8e4m3", "fp8e5m2")

# NCCL's opName (src/collectives.cc; v2.30.7-1 ncclFuncToString) -> the project's op names.
OPS = {"AllReduce": "allreduce", "AllGather": "allgather", "ReduceScatter": "reducescatter",
       "Broadcast": "broadcast", "Reduce": "reduce", "Send": "send", "Recv": "recv",
       "Gather": "gather", "Scatter": "scatter", "AlltoAll": "alltoall"}

# Operations NCCL 2.32 logs (names read from libnccl.so.2 of the nvidia-nccl-cu12 2.32.3
# wheel) that no engine profile issues and replay cannot run: named, not read.
NAMED_ONLY = {"AllGatherV": "NCCL 2.32 all-gather of per-rank sizes, not replayed",
              "PutSignal": "NCCL 2.32 one-sided put, not replayed",
              "WaitSignal": "NCCL 2.32 one-sided wait, not replayed"}
_MISSING = object()
SEEN_PREFIXES = 4096  # distinct "prefix + op name" texts cached by the reader's fast path


@dataclass
class _Process:
    """One host:pid:cudaDev: a rank."""

    key: str
    calls: RankCalls
    ranks_in: dict[str, tuple[int, int]] = field(default_factory=dict)  # comm -> (rank, nranks)
    globalrank: int = -1  # RCCL's globalrank of the call lines, where printed


class LogReader:
    """Feeds lines of one or more logs into one Trace."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.procs: dict[str, _Process] = {}
        self.files_with_calls = 0
        self.hosts: set[str] = set()
        self.glued = 0  # characters of another line's fragment before the last who found
        self.fragment = ""  # a call line cut by another writer, waiting for its rest

    def _proc(self, key: str) -> _Process:
        proc = self.procs.get(key)
        if proc is None:
            proc = self.procs[key] = _Process(key, RankCalls(rank=-1, name=key))
        return proc

    def feed(self, lines: Iterable[str]) -> int:
        """Read lines; return the calls found. Hot loop: a few str.find on each call line,
        one dict look-up keyed by the call's fields (op name, then `count ... [nranks=N]`);
        the strict regex runs once per distinct call, not once per line."""
        trace, found = self.trace, 0
        init_search = _INIT_LINE.search
        calls_of: dict[str, _Process | None] = {}  # "host:pid:tid [dev]" -> its process
        ids_of: dict[str, tuple[int, int, bool]] = {}
        unknown = trace.unknown
        appends: dict[str, object] = {}  # who -> the bound append of its calls' array
        find, rfind = str.find, str.rfind
        # fastest path: the whole text before ": opCount" (prefix and op name) seen before,
        # with the same tail from " count " on: the same process issued the same call.
        # Bounded: logs with timestamps make every prefix new, and fall back to the next path.
        seen: dict[str, tuple[dict[str, int], object]] = {}
        seen_get = seen.get
        for line in lines:
            c = find(line, ": opCount ")
            if c >= 0:
                k = find(line, " count ", c)
                entry = seen_get(line[:c])
                if entry is not None:
                    call_id = entry[0].get(line[k:])
                    if call_id is not None:
                        entry[1](call_id)  # type: ignore[operator]
                        found += 1
                        continue
                # the key: the 14 characters before ": opCount" (the op name and the end
                # of " NCCL INFO ") and the line from " count " on; a new key is checked
                # in full, so a line that shares one has the same fields and shape
                hit = ids_of.get(line[c - 14:c] + line[k:]) if k > 0 else None
                if hit is not None and not line.startswith(" NCCL INFO ", c - hit[1]):
                    hit = None  # the same key with a rank tag before the op name, or without
                if hit is None:
                    hit = self._slow(line, c, k, ids_of)
                    if hit is None:
                        if self.fragment and line[:c].isalpha():
                            # the rest of a line another writer broke into: join it back
                            joined, self.fragment = self.fragment + line, ""
                            trace.unparsed -= 1
                            trace.unknown["non-call line with opCount"] -= 1
                            trace.unknown += Counter()  # drop a count that fell to 0
                            found += self.feed([joined])
                            self.files_with_calls -= 1
                        continue
                call_id, at, rccl = hit
                at = c - at
                sp = rfind(line, " ", 0, at)
                start = rfind(line, " ", 0, sp) + 1
                who = line[start:at]
                if not rccl:
                    append = appends.get(who)
                    if append is None:
                        proc = self._who(who)
                        if self.glued:  # another writer's fragment ends where who starts
                            self.fragment, self.glued = line[:start + self.glued], 0
                        if proc is None:
                            trace.unparsed += 1
                            unknown["call line without host:pid:tid [cudaDev]"] += 1
                            continue
                        append = appends[who] = proc.calls.ids.append
                    append(call_id)  # type: ignore[operator]
                    found += 1
                    if len(seen) < SEEN_PREFIXES:
                        seen.setdefault(line[:c], ({}, append))[0][line[k:]] = call_id
                    continue
                g = find(line, " globalrank ", k)
                # RCCL: one process may drive several GPUs; each globalrank is a rank
                who = who + "#" + line[g + 12:].strip()  # type: ignore[operator]
                proc = calls_of.get(who, _MISSING)
                if proc is _MISSING:
                    proc = calls_of[who] = self._who(who)
                if proc is None:
                    trace.unparsed += 1
                    unknown["call line without host:pid:tid [cudaDev]"] += 1
                    continue
                proc.calls.ids.append(call_id)
                comm = trace.table[call_id].group or ""
                if comm not in proc.ranks_in:
                    proc.ranks_in[comm] = (proc.globalrank, trace.table[call_id].group_size or 0)
                found += 1
            elif "Init COMPLETE" in line:
                m = init_search(line)
                if m is None:
                    trace.unparsed += 1
                    unknown["other line"] += 1
                    continue
                host, pid, dev, comm, rank, nranks = m.groups()
                self._proc(f"{host}:{pid}:{dev}").ranks_in[f"comm {comm}"] = (int(rank),
                                                                              int(nranks))
            elif line.strip():
                trace.unparsed += 1
                unknown["other line"] += 1
        if found:
            self.files_with_calls += 1
        return found

    def _slow(self, line: str, c: int, k: int,
              ids_of: dict[str, tuple[int, int, bool]]) -> tuple[int, int, bool] | None:
        """A call line whose key is new: check it in full, intern the call; return (call id,
        distance from the op name's prefix to ": opCount", RCCL line) or None (counted)."""
        trace = self.trace
        at = line.rfind(" ", 0, c) - 10
        tag = _RANK_TAG.search(line, 0, at + 11) if at >= 0 else None
        if tag is not None:  # "NCCL INFO [N] AllReduce: ...": a rank tag before the op name
            at = tag.start()
        if k < 0 or at < 0 or not line.startswith(" NCCL INFO ", at):
            trace.unparsed += 1
            trace.unknown["NCCL call line without its host:pid:tid [cudaDev] prefix"
                          if line.lstrip().startswith("NCCL INFO ") else
                          "non-call line with opCount"] += 1
            return None
        m = _LINE.match(line, at + 11 + (len(tag[0]) - 11 if tag else 0))
        if m is None and line.startswith(" count -", k):
            count = shown(line[k + 7:].split()[0], 30)
            raise ConfigError(f"a call line with a negative count ({count}): NCCL prints "
                              "an unsigned element count; pass an unmodified log")
        call = _call(*m.groups()[:6]) if m else None
        if m is None or call is None:
            trace.unparsed += 1
            trace.unknown[_unread(line[c - len(m[1]) if m else at + 11:c], m is not None)] += 1
            return None
        rccl = m[7] is not None
        hit = (trace.intern(call), c - at, rccl)
        if not rccl:  # RCCL's tail carries a task counter: its lines are not cached
            ids_of[line[c - 14:c] + line[k:]] = hit
        return hit

    def _who(self, who: str) -> "_Process | None":
        """The process of a prefix `host:pid:tid [dev]` (`#globalrank` appended for RCCL).
        A host name glued to a fragment of another writer's line ("Allgpu-node") is cut
        back to a host already seen."""
        who, _, grank = who.partition("#")
        m = _WHO.search(who)
        if m is None:
            return None
        host = m[1]
        if host not in self.hosts:
            known = [h for h in self.hosts if host.endswith(h)]
            if known:
                glued = host
                host = max(known, key=len)
                self.glued = len(glued) - len(host)
        self.hosts.add(host)
        if grank:
            if not grank.lstrip("-").isdigit():
                return None
            proc = self._proc(f"{host}:{m[2]}:{m[3]}#{grank}")
            proc.globalrank = int(grank)
            return proc
        return self._proc(f"{host}:{m[2]}:{m[3]}")

    def finish(self) -> None:
        """Give each process its rank: its rank in the largest communicator it belongs to
        (from init lines, or RCCL's globalrank); else its place in host, cudaDev, pid order."""
        procs = [p for p in self.procs.values() if len(p.calls.ids)]
        self._one_run(procs)
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


    def _one_run(self, procs: list[_Process]) -> None:
        """Say when the logs may be of separate runs given together: more processes than the
        largest communicator holds, and no point-to-point call that could join their groups
        (a TP2 x PP2 run has its stages' send/recv; two TP2 runs have none, and neither has a
        DP2 x TP2 run whose DP traffic goes over gloo). `replay --trace` refuses such logs."""
        table = self.trace.table
        sizes = {table[i].group_size or 0 for p in procs for i in set(p.calls.ids)}
        p2p = any(table[i].op in ("send", "recv") for p in procs for i in set(p.calls.ids))
        largest = max(sizes, default=0)
        if largest and len(procs) > largest and not p2p and not any(p.ranks_in for p in procs):
            self.trace.disjoint = (
                f"{len(procs)} processes but no communicator of more than {largest} ranks and "
                "no send/recv between them: the logs of separate runs, or data-parallel "
                "replicas, not one TP x PP layout")
            self.trace.notes.append(self.trace.disjoint)


def _sort_key(key: str) -> tuple[str, int, int, int]:
    """Host, then device (a launcher gives local rank r device r), then pid."""
    key, _, grank = key.partition("#")
    host, pid, dev = key.rsplit(":", 2)
    return host, int(dev), int(pid), int(grank or 0)


def _unread(name: str, matched: bool) -> str:
    """What a call line that is not read is, for the summary's 'not understood'."""
    if name in NAMED_ONLY:
        return f"{name} ({NAMED_ONLY[name]})"
    return f"NCCL call {name}" + (" with an unknown datatype" if matched else
                                  " in a format not understood")


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
