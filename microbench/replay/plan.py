"""A pattern bound to one rank: its groups, its buffers, and every call ready to issue.

Buffers are allocated once per distinct (role, elements, dtype); communicators once per
group. Every rank creates every group in the same order, as torch.distributed requires.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from microbench.backends import Backend, BoundCall, Group
from microbench.replay.graph_spans import graph_pieces, piece_keys
from patterns import Op, OpKind, Pattern, Phase
from patterns.dtypes import dtype_bytes
from patterns.groups import GROUP_KINDS, group_size, groups


@dataclass
class BoundOp:
    op: Op
    group: Group
    send: Any
    recv: Any
    call: BoundCall


@dataclass
class BoundRun:
    phase: Phase
    repeat: int
    ops: list[BoundOp]
    calls: list[BoundCall]  # what the replay loop issues: ops' calls (plus test faults)


@dataclass
class Plan:
    rank: int
    stage: int
    runs: list[BoundRun]
    buffers: dict[tuple[str, int, str], Any]
    # Global step pieces of the inference, captured or eager alike on every rank
    # (replay/graph_spans.py); None for a plan built by hand: its own decode runs.
    pieces: tuple[tuple[int, int, bool], ...] | None = None
    graphs: list[BoundCall] = field(default_factory=list)  # graph launches in runs' calls
    # Per piece, every rank's step (graph_spans.piece_keys): equal keys share one graph.
    piece_keys: tuple[tuple[object, ...], ...] | None = None

    @property
    def calls_per_inference(self) -> int:
        return sum(len(run.ops) * run.repeat for run in self.runs)

    @property
    def steps_per_inference(self) -> int:
        return sum(run.repeat for run in self.runs)

    @property
    def prefill_steps(self) -> int:
        return sum(run.repeat for run in self.runs if run.phase == Phase.PREFILL)

    @property
    def tail_steps(self) -> int:
        """Steps of vLLM's DP wave tail after the inference's own (the last runs, of
        Phase.WAVE_TAIL; a request workload's earlier waves' tails are its own steps)."""
        steps = 0
        for run in reversed(self.runs):
            if run.phase != Phase.WAVE_TAIL:
                break
            steps += run.repeat
        return steps

    @property
    def prefill_calls(self) -> int:
        return sum(len(run.ops) * run.repeat for run in self.runs if run.phase == Phase.PREFILL)

    def step_call_counts(self) -> list[int]:
        return [len(run.ops) for run in self.runs for _ in range(run.repeat)]

    def add_to_every_step(self, call: Callable[[], None]) -> None:
        for run in self.runs:
            run.calls.append(call)


def make_groups(pattern: Pattern, backend: Backend) -> dict[str, Group]:
    """This rank's group of every kind the pattern's ops name (tp, pp, dp, ep).

    Every rank creates every group of those kinds, in `patterns.groups` order, as
    torch.distributed requires; the ranks of each come from `patterns.groups` alone.
    """
    layout = pattern.layout
    used = {op.group for replica in pattern.replicas() for runs in replica for run in runs
            for op in run.step.ops}
    unknown = used - set(GROUP_KINDS)
    if unknown:
        raise ValueError(f"ops name groups {sorted(unknown)}; the replay knows {GROUP_KINDS}")
    mine: dict[str, Group] = {}
    for kind in GROUP_KINDS:
        if kind not in used or group_size(layout, kind) < 2:
            continue
        for i, ranks in enumerate(groups(layout, kind)):
            group = backend.new_group(f"{kind}{i}", list(ranks))
            if backend.rank in ranks:
                mine[kind] = group
    return mine


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


Role = tuple[str, tuple[int, ...]] | None  # (buffer role, shape), or no buffer


def buffer_roles(op: Op, is_root: bool) -> tuple[Role, Role]:
    """The (send, recv) buffers one call uses: one place for the plan and the estimate."""
    match op.kind:
        case OpKind.ALLREDUCE | OpKind.BROADCAST:
            return ("inout", op.shape), None
        case OpKind.SEND:
            return ("in", op.shape), None
        case OpKind.RECV:
            return None, ("recv", op.shape)
        case OpKind.GATHER:
            return ("in", op.shape), (("out", op.out_shape) if is_root else None)
        case _:  # allgather, reducescatter, alltoall
            return ("in", op.shape), ("out", op.out_shape)


def buffer_bytes(pattern: Pattern, rank: int) -> int:
    """Bytes of the buffers `rank` allocates (counting a gather's output, which only the root
    allocates), computed from the pattern before anything is allocated."""
    keys = set()
    for run in pattern.runs_of_rank(rank):
        for op in run.step.ops:
            for role in buffer_roles(op, is_root=True):
                if role is not None:
                    keys.add((role[0], _numel(role[1]), op.dtype))
    return sum(numel * dtype_bytes(dtype) for _, numel, dtype in keys)


def build_plan(pattern: Pattern, backend: Backend,
               groups: dict[str, Group] | None = None) -> Plan:
    """`groups`: this rank's groups when made beforehand (a job of two sides makes both
    sides' groups on every rank, replay/kv_collectives.py); else made here."""
    mine = make_groups(pattern, backend) if groups is None else groups
    stage = pattern.layout.stage_of(backend.rank)
    buffers: dict[tuple[str, int, str], Any] = {}

    def buffer(role: str, shape: tuple[int, ...], dtype: str) -> Any:
        key = (role, _numel(shape), dtype)
        if key not in buffers:
            buffers[key] = backend.empty(key[1], dtype)
        return buffers[key]

    bound: dict[Op, BoundOp] = {}  # a decode step's ops are bound once for all its repeats

    def bind(op: Op) -> BoundOp:
        if op in bound:
            return bound[op]
        group = mine[op.group]
        send_role, recv_role = buffer_roles(op, is_root=group.index == op.root)
        send = buffer(*send_role, op.dtype) if send_role else None
        recv = buffer(*recv_role, op.dtype) if recv_role else None
        target = op.peer if op.peer is not None else op.root
        call = (backend.bind(op.kind.value, group, send, recv, target, op.counts)
                if op.counts is not None else
                backend.bind(op.kind.value, group, send, recv, target))
        bound[op] = BoundOp(op, group, send, recv, call)
        return bound[op]

    runs = []
    for run in pattern.runs_of_rank(backend.rank):
        ops = [bind(op) for op in run.step.ops]
        runs.append(BoundRun(run.phase, run.repeat, ops, [b.call for b in ops]))
    pieces = graph_pieces(pattern)
    return Plan(backend.rank, stage, runs, buffers, pieces, piece_keys=piece_keys(pattern, pieces))
