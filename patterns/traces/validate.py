"""A generated pattern next to a trace: rank by rank, call kind by call kind and size by
size, per phase; and the first call where they part."""

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from patterns.errors import ConfigError
from patterns.ops import Op, Phase
from patterns.pattern import Pattern
from patterns.traces.calls import Call, RankCalls, Trace
from patterns.traces.steps import split_steps

HIDDEN_HINT = ("the trace holds fewer all-reduces than the pattern: calls replayed from a CUDA "
               "graph are not logged (NCCL prints a COLL line at capture) and custom, "
               "FlashInfer or symmetric-memory all-reduces never reach NCCL or c10d; capture "
               "with --enforce-eager and --disable-custom-all-reduce (engine spec 10.5)")


@dataclass(frozen=True)
class Row:
    rank: int
    phase: str
    op: str
    numel: int
    dtype: str
    group_size: int | None
    trace_calls: int
    pattern_calls: int

    @property
    def status(self) -> str:
        if self.trace_calls == self.pattern_calls:
            return "equal"
        if self.trace_calls == 0:
            return "missing"
        if self.pattern_calls == 0:
            return "extra"
        return "different"


@dataclass
class Validation:
    rows: list[Row]
    first_difference: str | None
    notes: list[str] = field(default_factory=list)

    @property
    def match(self) -> bool:
        return self.first_difference is None


def _pattern_calls(pattern: Pattern, stage: int) -> Iterator[tuple[Phase, int, int, Op]]:
    """(phase, step index, call index in step, op) of one inference, lazily."""
    step_index = 0
    for run in pattern.stages[stage]:
        for _ in range(run.repeat):
            for i, op in enumerate(run.step.ops):
                yield run.phase, step_index, i, op
            step_index += 1


def _same(call: Call, op: Op) -> bool:
    """Equal where the trace knows: a gloo c10d event does not record its group's size."""
    if (call.op, call.numel, call.dtype) != (op.kind.value, op.numel, op.dtype):
        return False
    if call.group_size is not None and call.group_size != op.group_size:
        return False
    if call.peer is not None and op.peer is not None and call.peer != op.peer:
        return False
    return not (call.root is not None and op.root is not None and call.root != op.root)


def _describe_op(op: Op) -> str:
    where = f" peer {op.peer}" if op.peer is not None else (
        f" root {op.root}" if op.root is not None else "")
    return f"{op.kind.value} {op.numel} x {op.dtype} (group of {op.group_size}{where}) [{op.tag}]"


def _first_difference(trace: Trace, rank: RankCalls, pattern: Pattern, stage: int) -> str | None:
    expected = _pattern_calls(pattern, stage)
    table = trace.table
    index = 0
    for index, call_id in enumerate(rank.ids):
        call = table[call_id]
        nxt = next(expected, None)
        if nxt is None:
            return (f"rank {rank.rank}: call {index} is extra: the trace has {call.describe()}, "
                    f"the pattern's {index} calls are done")
        phase, step, i, op = nxt
        if not _same(call, op):
            return (f"rank {rank.rank}: call {index} ({phase.value} step {step}, call {i} of "
                    f"the step) differs: the trace has {call.describe()}, the pattern has "
                    f"{_describe_op(op)}")
    nxt = next(expected, None)
    if nxt is not None:
        phase, step, i, op = nxt
        n = len(rank.ids)
        return (f"rank {rank.rank}: call {n} ({phase.value} step {step}, call {i} of the step) "
                f"is missing: the trace ends after {n} calls, the pattern has {_describe_op(op)}")
    return None


def _trace_phases(trace: Trace, rank: RankCalls, prefill_steps: int,
                  prefill_calls: int) -> Counter:
    """(phase, op, numel, dtype, group size) -> calls. The first `prefill_steps` steps where
    the trace shows steps, else the first `prefill_calls` calls, are the prefill."""
    counts: Counter = Counter()
    if rank.step_starts:
        steps = split_steps(rank.ids, rank.step_starts)
        boundary = steps[prefill_steps][0] if len(steps) > prefill_steps else len(rank.ids)
    else:
        boundary = prefill_calls
    table = trace.table
    for index, call_id in enumerate(rank.ids):
        call = table[call_id]
        phase = Phase.PREFILL if index < boundary else Phase.DECODE
        counts[(phase.value, call.op, call.numel, call.dtype, call.group_size)] += 1
    return counts


def validate(trace: Trace, pattern: Pattern) -> Validation:
    world = pattern.layout.world_size
    rows: list[Row] = []
    first: str | None = None
    notes: list[str] = []
    fewer_allreduces = False
    for rank in trace.ranks:
        if not 0 <= rank.rank < world:
            raise ConfigError(f"trace rank {rank.rank} ({rank.name}) is outside the layout's "
                              f"{world} ranks; pass the --tp/--pp the engine ran with")
        stage = pattern.layout.stage_of(rank.rank)
        prefill_steps = sum(r.repeat for r in pattern.stages[stage] if r.phase == Phase.PREFILL)
        prefill_calls = sum(len(r.step.ops) * r.repeat for r in pattern.stages[stage]
                            if r.phase == Phase.PREFILL)
        got = _trace_phases(trace, rank, prefill_steps, prefill_calls)
        want: Counter = Counter()
        for phase, _, _, op in _pattern_calls(pattern, stage):
            want[(phase.value, op.kind.value, op.numel, op.dtype, op.group_size)] += 1
        # a trace without group sizes (gloo) is compared on the rest of the key
        unsized = {(k[0], k[1], k[2], k[3]) for k in got if k[4] is None}
        if unsized:
            merged: Counter = Counter()
            for k, v in want.items():
                key = (*k[:4], None) if k[:4] in unsized else k
                merged[key] += v
            want = merged
        for key in list(dict.fromkeys([*want, *got])):
            rows.append(Row(rank.rank, key[0], key[1], key[2], key[3], key[4],
                            got.get(key, 0), want.get(key, 0)))
        got_ar = sum(v for k, v in got.items() if k[1] == "allreduce")
        want_ar = sum(v for k, v in want.items() if k[1] == "allreduce")
        fewer_allreduces |= got_ar < want_ar
        if first is None:
            first = _first_difference(trace, rank, pattern, stage)
    if fewer_allreduces:
        notes.append(HIDDEN_HINT)
    if any(r.group_size is None for r in rows):
        notes.append("the trace does not record every call's group size (c10d events on "
                     "gloo): those calls are compared on op, elements and dtype")
    missing = sorted(set(range(world)) - {r.rank for r in trace.ranks})
    if missing:
        notes.append(f"the trace holds {len(trace.ranks)} of the layout's {world} ranks; ranks "
                     f"{', '.join(map(str, missing))} were not compared")
    return Validation(rows, first, notes)
