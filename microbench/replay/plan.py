"""A pattern bound to one rank: its groups, its buffers, and every call ready to issue.

Buffers are allocated once per distinct (role, elements, dtype); communicators once per
group. Every rank creates every group in the same order, as torch.distributed requires.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from microbench.backends import Backend, BoundCall, Group
from patterns import Op, OpKind, Pattern, Phase


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
    def prefill_calls(self) -> int:
        return sum(len(run.ops) * run.repeat for run in self.runs if run.phase == Phase.PREFILL)

    def step_call_counts(self) -> list[int]:
        return [len(run.ops) for run in self.runs for _ in range(run.repeat)]

    def add_to_every_step(self, call: Callable[[], None]) -> None:
        for run in self.runs:
            run.calls.append(call)


def make_groups(pattern: Pattern, backend: Backend) -> dict[str, Group]:
    """This rank's TP and PP groups (created on every rank for every stage / TP index).

    `pp_broadcast` (vLLM Model Runner V2's own NCCL group for its per-step broadcasts) has
    the ranks of `pp`; it gets its own communicators, as in the engine, only when used.
    """
    layout = pattern.layout
    stage, tp_rank = layout.stage_of(backend.rank), layout.tp_rank_of(backend.rank)
    mine: dict[str, Group] = {}
    if layout.tp > 1:
        for s in range(layout.pp):
            group = backend.new_group(f"tp{s}", [layout.rank_of(s, t) for t in range(layout.tp)])
            if s == stage:
                mine["tp"] = group
    if layout.pp > 1:
        for t in range(layout.tp):
            group = backend.new_group(f"pp{t}", [layout.rank_of(s, t) for s in range(layout.pp)])
            if t == tp_rank:
                mine["pp"] = group
        used = {op.group for runs in pattern.stages for run in runs for op in run.step.ops}
        if "pp_broadcast" in used:
            for t in range(layout.tp):
                group = backend.new_group(f"pp_broadcast{t}",
                                          [layout.rank_of(s, t) for s in range(layout.pp)])
                if t == tp_rank:
                    mine["pp_broadcast"] = group
    return mine


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def build_plan(pattern: Pattern, backend: Backend) -> Plan:
    groups = make_groups(pattern, backend)
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
        group = groups[op.group]
        send = recv = None
        match op.kind:
            case OpKind.ALLREDUCE | OpKind.BROADCAST:
                send = buffer("inout", op.shape, op.dtype)
            case OpKind.SEND:
                send = buffer("in", op.shape, op.dtype)
            case OpKind.RECV:
                recv = buffer("recv", op.shape, op.dtype)
            case OpKind.GATHER:
                send = buffer("in", op.shape, op.dtype)
                if group.index == op.root:
                    recv = buffer("out", op.out_shape, op.dtype)
            case _:  # allgather, reducescatter, alltoall
                send = buffer("in", op.shape, op.dtype)
                recv = buffer("out", op.out_shape, op.dtype)
        target = op.peer if op.peer is not None else op.root
        call = backend.bind(op.kind.value, group, send, recv, target)
        bound[op] = BoundOp(op, group, send, recv, call)
        return bound[op]

    runs = []
    for run in pattern.stages[stage]:
        ops = [bind(op) for op in run.step.ops]
        runs.append(BoundRun(run.phase, run.repeat, ops, [b.call for b in ops]))
    return Plan(backend.rank, stage, runs, buffers)
