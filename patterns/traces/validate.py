"""A generated pattern next to a trace: rank by rank, call kind by call kind and size by
size, per phase; and the first call where they part.

A real trace holds more than one inference: an engine's start-up (warm-up forward passes,
barriers) comes before the request and other requests after it. The inference is found in
each rank's call list where the pattern's first step first matches; calls before and after
it are counted and reported, not compared. Calls inside it must match one for one.

NCCL has no gather or all-to-all before 2.30 (ncclGather, ncclAlltoAll: src/collectives.cc
of v2.30.7-1): torch's ProcessGroupNCCL, like this project's nccl backend, issues them as
grouped Send/Recv, and the COLL log prints those. Against an NCCL log a pattern's gather is
compared in that form (the root receives from every other rank in rank order, every other
rank sends to the root), and an all-to-all as a Send and a Recv to every rank in turn.

A pipeline send or receive names its peer as a rank of the group it was issued on: the
pattern's is the stage (the rank in the PP group); an engine that sends on the world group
records a world rank. Megatron-Core does (`torch.distributed.P2POp(isend, tensor,
next_rank)` with no group, next_rank from `get_process_group_ranks(pp_group)`:
megatron/core/inference/communication_utils.py, `send_to_next_pipeline_rank` and
`recv_from_prev_pipeline_rank_`, megatron-core 0.19.2), so a gloo `c10d::send` of its TP2 x
PP2 rank 0 says peer 2 where the pattern has stage 1. Either numbering matches.

A job that numbered its ranks otherwise than the layout (Megatron-Core's default order puts PP
outermost: patterns/rank_order.py) is compared with `rank_order`: each trace rank plays the
layout's rank of the same (stage, dp rank, tp rank), and a world-rank peer is the job's number.
"""

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from patterns.errors import ConfigError
from patterns.ops import Op, Phase
from patterns.pattern import Pattern
from patterns.rank_order import LAYOUT_ORDER, job_rank, layout_rank
from patterns.traces.calls import Call, RankCalls, Trace

HIDDEN_HINT = ("the trace holds fewer all-reduces than the pattern; if the engine ran CUDA "
               "graphs or custom all-reduce, those hid calls: calls replayed from a CUDA "
               "graph are not logged (NCCL prints a COLL line at capture) and custom, "
               "FlashInfer or symmetric-memory all-reduces never reach NCCL or c10d; capture "
               "with vLLM's --enforce-eager and --disable-custom-all-reduce")


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
    before: dict[int, int] = field(default_factory=dict)  # rank -> calls before the inference
    after: dict[int, int] = field(default_factory=dict)  # rank -> calls after it
    # rank -> (steps of the trace from the inference's start, each ending at the logits
    # gather; steps of the pattern)
    steps: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def match(self) -> bool:
        return self.first_difference is None


@dataclass(frozen=True)
class _Expected:
    phase: Phase
    step: int
    index: int  # the op's place in its step
    call: Call
    tag: str
    world_peer: int | None = None  # a pipeline peer's world rank (the call's is its stage)


def _group_rank(pattern: Pattern, rank: int, op: Op) -> int:
    layout = pattern.layout
    if op.group == "pp":
        return layout.stage_of(rank)
    if op.group == "dp":
        return layout.dp_rank_of(rank)
    if op.group == "ep":  # the EP group of dp x tp ranks, DP-rank-major
        return layout.dp_rank_of(rank) * layout.tp + layout.tp_rank_of(rank)
    return layout.tp_rank_of(rank)


def _as_calls(op: Op, me: int, p2p: set[str]) -> list[Call]:
    """The calls one op shows in the trace: itself, or NCCL's grouped Send/Recv form."""
    n, dt, size = op.numel, op.dtype, op.group_size
    kind = op.kind.value
    if kind == "gather" and "gather" in p2p:
        root = op.root or 0
        if me != root:
            return [Call("send", n, dt, size, peer=root)]
        return [Call("recv", n, dt, size, peer=r) for r in range(size) if r != root]
    if kind == "alltoall" and "alltoall" in p2p:
        chunk = n // size
        return [c for r in range(size) for c in (Call("send", chunk, dt, size, peer=r),
                                                  Call("recv", chunk, dt, size, peer=r))]
    return [Call(kind, n, dt, size, peer=op.peer, root=op.root)]


def _expected(pattern: Pattern, rank: int, p2p: set[str],
              order: str = LAYOUT_ORDER) -> Iterator[_Expected]:
    """What the layout's rank `rank` should issue over one inference, lazily; a pipeline
    peer's world rank numbered in the job's `order`."""
    layout = pattern.layout
    step_index = 0
    for run in pattern.runs_of_rank(rank):  # its own DP rank's (uneven batches, workloads)
        for _ in range(run.repeat):
            for i, op in enumerate(run.step.ops):
                for call in _as_calls(op, _group_rank(pattern, rank, op), p2p):
                    world = (job_rank(layout, layout.rank_of(
                        call.peer, layout.tp_rank_of(rank), layout.dp_rank_of(rank)), order)
                             if op.group == "pp" and call.peer is not None else None)
                    yield _Expected(run.phase, step_index, i, call, op.tag, world)
            step_index += 1


def _same(got: Call, want: Call) -> bool:
    """Equal where the trace knows: a gloo c10d event does not record its group's size, a
    vLLM CPU shm tensor list its tensors' dtype."""
    if (got.op, got.numel) != (want.op, want.numel):
        return False
    if got.dtype != want.dtype and not _dtype_unrecorded(got):
        return False
    if got.group_size is not None and got.group_size != want.group_size:
        return False
    if got.peer is not None and want.peer is not None and got.peer != want.peer:
        return False
    return not (got.root is not None and want.root is not None and got.root != want.root)


def _matches(got: Call, want: _Expected) -> bool:
    """`_same`, a pipeline peer read as a stage or as a world rank (module docstring)."""
    return _same(got, want.call) or (
        want.world_peer is not None and got.peer == want.world_peer
        and _same(got, replace(want.call, peer=want.world_peer)))


def _step_shapes(pattern: Pattern, rank: int) -> list[str]:
    """What each step of a request workload holds on `rank` (empty for a one-batch
    pattern); over DP ranks its own DP rank's steps (patterns/workload/dp_pattern.py)."""
    schedule = getattr(pattern, "schedule", None)
    views = getattr(pattern, "views", None) if hasattr(pattern, "rank_steps") else None
    if views is not None:
        schedule = views[pattern.layout.dp_rank_of(rank)]
    if schedule is None:
        return []
    names = []
    for seg in schedule.segments:
        shape = seg.shape
        parts = ([f"{shape.prefill_tokens} prompt tokens of {shape.prefill_seqs} "
                  f"request{'s' * (shape.prefill_seqs != 1)}"] if shape.prefill_seqs else [])
        if shape.decode_seqs:
            parts.append(f"{shape.decode_seqs} decoding x {shape.decode_tokens} token"
                         f"{'s' * (shape.decode_tokens != 1)}")
        names += [" + ".join(parts) or "nothing of its own (a dummy or idle batch)"] * seg.repeat
    return names


def _ends_like(call: Call, step_end: Call) -> bool:
    return call.op == step_end.op and call.group_size in (None, step_end.group_size)


def _ends_per_step(expected: list[_Expected], step_end: Call | None) -> int:
    """Calls of the step-ending kind in each of the pattern's steps: 1, or 1 + k where an
    EAGLE or MTP drafter gathers its own logits k times after every target step (the same
    op on the same group: `patterns/engines/vllm/speculative.py`); 1 where steps differ."""
    if step_end is None:
        return 1
    counts = set(Counter(e.step for e in expected if _ends_like(e.call, step_end)).values())
    return counts.pop() if len(counts) == 1 else 1


def _trace_steps(trace: Trace, rank: RankCalls, start: int, step_end: Call | None,
                 per_step: int) -> int:
    """Steps of the trace from `start`: each ends at a call of the kind that ends the
    pattern's steps (vLLM's logits gather), whatever its rows; `per_step` such calls a step
    (a drafter's gathers too), a last step cut short counted whole."""
    if step_end is None:
        return 0
    table = trace.table
    ends = sum(1 for i in rank.ids[start:] if _ends_like(table[i], step_end))
    return -(-ends // per_step)


def _dtype_unrecorded(call: Call) -> bool:
    return call.dtype == "unknown" and call.transport == "shm"


def _start(trace: Trace, rank: RankCalls, first_step: list[_Expected]) -> int:
    """Where the inference starts: the first place the pattern's first step matches."""
    if not first_step:
        return 0
    table, ids, k = trace.table, rank.ids, len(first_step)
    head = first_step[0]
    for start in range(len(ids) - k + 1):
        if _matches(table[ids[start]], head) and all(
                _matches(table[ids[start + j]], first_step[j]) for j in range(1, k)):
            return start
    return 0


def _compare_rank(trace: Trace, rank: RankCalls, pattern: Pattern, p2p: set[str],
                  rows: list[Row], result: Validation, order: str) -> str | None:
    plays = layout_rank(pattern.layout, rank.rank, order)
    expected = list(_expected(pattern, plays, p2p, order))
    first_step = [e for e in expected if e.step == 0]
    start = _start(trace, rank, first_step)
    end = min(len(rank.ids), start + len(expected))
    result.before[rank.rank] = start
    result.after[rank.rank] = len(rank.ids) - end
    table = trace.table
    shapes = _step_shapes(pattern, rank.rank)
    ends = [e for e in expected if e.tag == "logits"]
    step_end = ends[0].call if ends else None
    if step_end is not None:  # a stage before the last gathers no logits: no step ends seen
        result.steps[rank.rank] = (
            _trace_steps(trace, rank, start, step_end, _ends_per_step(expected, step_end)),
            expected[-1].step + 1)

    def where(want: _Expected) -> str:
        shape = f": {shapes[want.step]}" if want.step < len(shapes) else ""
        return f"{want.phase.value} step {want.step}{shape}, op {want.index} of the step"

    first: str | None = None
    for offset, call_id in enumerate(rank.ids[start:end]):
        got, want = table[call_id], expected[offset]
        if not _matches(got, want):
            world = (f", world rank {want.world_peer}"
                     if want.world_peer not in (None, want.call.peer) else "")
            first = (f"rank {rank.rank}: call {start + offset} ({where(want)}) differs: the "
                     f"trace has {got.describe()}, the pattern has {want.call.describe()} "
                     f"[{want.tag}{world}]")
            break
    if first is None and end - start < len(expected):
        want = expected[end - start]
        first = (f"rank {rank.rank}: call {end} ({where(want)}) is missing: the trace ends "
                 f"after {end} calls, the pattern has {want.call.describe()} [{want.tag}]")
    # rows: each of the window's calls in the phase of the pattern's step at its place
    got_counts: Counter = Counter()
    for offset, call_id in enumerate(rank.ids[start:end]):
        call = table[call_id]
        phase = expected[offset].phase
        got_counts[(phase.value, call.op, call.numel, call.dtype, call.group_size)] += 1
    want_counts: Counter = Counter()
    unsized = {k[:4] for k in got_counts if k[4] is None}
    untyped = {k[:3] for k in got_counts if k[3] == "unknown"}  # shm tensor lists
    for e in expected:
        c = e.call
        dtype = "unknown" if (e.phase.value, c.op, c.numel) in untyped else c.dtype
        key = (e.phase.value, c.op, c.numel, dtype, c.group_size)
        want_counts[(*key[:4], None) if key[:4] in unsized else key] += 1
    for key in dict.fromkeys([*want_counts, *got_counts]):
        rows.append(Row(rank.rank, key[0], key[1], key[2], key[3], key[4],
                        got_counts.get(key, 0), want_counts.get(key, 0)))
    return first


def validate(trace: Trace, pattern: Pattern, rank_order: str = LAYOUT_ORDER) -> Validation:
    """`rank_order`: how the job numbered the trace's ranks (patterns/rank_order.py)."""
    world = pattern.layout.world_size
    if trace.disjoint and pattern.layout.pp > 1:
        raise ConfigError(trace.disjoint + "; a pipeline's stages send/recv between them: "
                          "pass the logs of one run (every process of it)")
    result = Validation([], None)
    present = {call.op for call in trace.table}
    # the p2p form where the log holds NCCL calls and no native gather / all-to-all
    p2p = ({k for k in ("gather", "alltoall") if k not in present}
           if trace.formats == {"nccl"} else set())
    for rank in trace.ranks:
        if not 0 <= rank.rank < world:
            raise ConfigError(f"trace rank {rank.rank} ({rank.name}) is outside the layout's "
                              f"{world} ranks; pass the --tp/--pp the engine ran with")
        first = _compare_rank(trace, rank, pattern, p2p, result.rows, result, rank_order)
        if result.first_difference is None:
            result.first_difference = first
    notes = result.notes
    notes.extend(trace.notes)  # the readers' own: a trace without shapes, ranks by order
    if trace.ep_kernels:
        notes.append("expert-parallel kernels not compared (their events record no sizes): "
                     + ", ".join(f"{k} x{v}" for k, v in sorted(trace.ep_kernels.items())))
    got_ar = sum(r.trace_calls for r in result.rows if r.op == "allreduce")
    want_ar = sum(r.pattern_calls for r in result.rows if r.op == "allreduce")
    if got_ar < want_ar:
        notes.append(HIDDEN_HINT)
    if p2p & {op.kind.value for runs in pattern.stages for run in runs for op in run.step.ops}:
        notes.append("NCCL logs show gather and all-to-all as grouped Send/Recv (NCCL < 2.30); "
                     "the pattern's are compared in that form")
    if any(r.group_size is None for r in result.rows):
        notes.append("the trace does not record every call's group size (c10d events on "
                     "gloo): those calls are compared on op, elements and dtype")
    outside = {r: (result.before[r], result.after[r]) for r in result.before
               if result.before[r] or result.after[r]}
    if outside:
        text = "; ".join(f"rank {r}: {b} before, {a} after" for r, (b, a) in outside.items())
        notes.append("calls outside the inference (engine start-up, barriers, other requests) "
                     f"were not compared: {text}")
    missing = sorted(set(range(world)) - {r.rank for r in trace.ranks})
    if missing:
        notes.append(f"the trace holds {len(trace.ranks)} of the layout's {world} ranks; ranks "
                     f"{', '.join(map(str, missing))} were not compared")
    return result
