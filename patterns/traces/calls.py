"""The common record of every trace reader: distinct calls interned once, each rank's calls
as a compact array of ids (4 bytes a call), so a multi-GB log is held in bounded memory."""

from array import array
from collections import Counter
from dataclasses import dataclass, field

from patterns.errors import ConfigError, printable

# Bytes per element of every dtype a trace may name (a superset of patterns.dtypes: NCCL's
# ncclDataType_t, src/nccl.h.in of v2.30.7-1 lines 382-394, and torch's scalar types).
TRACE_DTYPE_BYTES: dict[str, int] = {
    "int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
    "fp16": 2, "fp32": 4, "fp64": 8, "bf16": 2, "fp8e4m3": 1, "fp8e5m2": 1, "bool": 1,
}

# Ops in the project's vocabulary (patterns.ops.OpKind) plus the NCCL calls no engine
# profile issues (reduce, scatter): they are read and reported, never replayed.
TRACE_OPS = ("allreduce", "allgather", "reducescatter", "gather", "broadcast", "send", "recv",
             "alltoall", "reduce", "scatter")


@dataclass(frozen=True)
class Call:
    """One distinct call as one rank issues it.

    `numel` is the elements this rank contributes to one call (its input): NCCL's count for
    AllReduce/Broadcast/Send/Recv/AllGather, count * nranks for ReduceScatter (whose count is
    the receive count). `group_size` is None where the trace does not record it (c10d events
    on gloo); `group` names the communicator (an NCCL comm pointer, a process-group name).
    `peer` is the other side's rank in the group for send/recv, `root` the root's for
    gather, broadcast, reduce and scatter. `transport` is what carried it where the trace
    says (`shm`: vLLM's CPU communicator), None where it does not.
    """

    op: str
    numel: int
    dtype: str
    group_size: int | None = None
    group: str | None = None
    peer: int | None = None
    root: int | None = None
    transport: str | None = None

    @property
    def bytes(self) -> int:
        return self.numel * TRACE_DTYPE_BYTES.get(self.dtype, 0)

    def describe(self) -> str:
        where = f" peer {self.peer}" if self.peer is not None else (
            f" root {self.root}" if self.root is not None else "")
        size = "?" if self.group_size is None else str(self.group_size)
        return f"{self.op} {self.numel} x {self.dtype} (group of {size}{where})"


@dataclass
class RankCalls:
    """The calls one rank issued, in order, as ids into `Trace.table`."""

    rank: int  # the rank's place in the job (world rank where the trace tells it)
    name: str  # where it came from: host:pid:cudaDev, or the Kineto file's host and rank
    ids: array = field(default_factory=lambda: array("I"))
    step_starts: list[int] | None = None  # index of each step's first call, where visible
    # vLLM CPU's shm tensor-list sends: the tensors of each, in order (kineto_shm)
    shm_send_lists: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        # The name is the trace's own text (a host name): escaped, it prints as it reads
        # wherever it goes (trace, validate, a replay's title) and never drives a terminal.
        self.name = printable(self.name)


@dataclass
class Trace:
    """What one or more trace files say: every rank's calls and what was not understood."""

    table: list[Call] = field(default_factory=list)
    ranks: list[RankCalls] = field(default_factory=list)
    unparsed: int = 0
    unknown: Counter = field(default_factory=Counter)  # names of events / kinds of lines
    notes: list[str] = field(default_factory=list)
    formats: set[str] = field(default_factory=set)  # "nccl" (logs), "kineto"
    # kernels of expert-parallel libraries named but not sized ("EP dispatch" -> count)
    ep_kernels: Counter = field(default_factory=Counter)
    # why the ranks may not be one run (set by the log reader; replay refuses such a trace)
    disjoint: str | None = None
    _index: dict[Call, int] = field(default_factory=dict, repr=False)

    def intern(self, call: Call) -> int:
        found = self._index.get(call)
        if found is None:
            if call.numel < 0:
                raise ConfigError(f"a {call.op} call of {call.numel} elements: an element "
                                  "count is never negative; pass an unmodified trace")
            found = self._index[call] = len(self.table)
            self.table.append(call)
        return found

    @property
    def calls(self) -> int:
        return sum(len(r.ids) for r in self.ranks)

    def rank_calls(self, rank: RankCalls) -> list[Call]:
        table = self.table
        return [table[i] for i in rank.ids]
