"""`plan --requests` over DP replicas and pipeline stages: the workload's requests routed to
the replicas, each replica's split over the batches it keeps in flight, and each such lane
scheduled and priced as one engine replica at pp 1 (analysis/workload.py), with what its
stages add to every step.

- Routing (`--dp-routing`): round-robin, request i to replica i mod dp, what vLLM's DP load
  balancer does under even load; or least-loaded, each request to the replica with the
  fewest requests still unfinished at its arrival (a request taken to finish its output
  steps after it arrives, at --step-time-ms a step; ties to the lowest replica), the
  balancer's aim under uneven load. Dense models only: a MoE model's DP ranks step
  together (DP attention), which this does not model.
- Pipeline: vLLM keeps pp batches in flight (V1's batch queue of pp, V0's pp virtual
  engines), so a replica's requests are dealt round-robin to pp lanes, each its own stream
  of steps; a lane's step walks every stage: its TP calls (those of the pp 1 step: every
  layer's calls, the stages' summed), pp - 1 hops, each the hidden state and the residual
  ([T, hidden] twice) sent to the next stage (a stream gap for the first, then the second's
  latency, fits of the hop's two ranks, across nodes where they lie on two), and under vLLM
  the sampled tokens broadcast to every stage (an int64 [S, 1] and an int32 [S + 1, 1]
  over the pp group, as patterns/engines/vllm's pp_broadcasts issue them).
- Figures: per request, as at pp 1, over every lane's requests together (p90 of TTFT's and
  of TPOT's figure); end to end, the longest lane's steps (lanes run at once); memory, a
  replica's lanes' peaks of KV tokens added (each stage holds its layers of every batch in
  flight).
"""

import heapq
import math
import operator
from dataclasses import dataclass, field
from typing import Any

from microbench.analysis.costs import Costs
from microbench.analysis.fits import Topology, fit_for, stand_in_note
from microbench.sweep.busbw import SweepOp
from patterns import ConfigError, Layout, ModelConfig, Pattern
from patterns.dtypes import DTYPE_BYTES
from patterns.groups import rank_of
from patterns.workload.metrics import SpanIndex, percentile
from patterns.workload.requests import Request

ROUTINGS = ("round-robin", "least-loaded")


@dataclass(frozen=True)
class Lanes:
    """A workload over a layout: one pp 1, dp 1 workload pattern per lane (replica r's
    lanes are r x pp .. r x pp + pp - 1) and the layout they make together."""

    layout: Layout
    model: ModelConfig
    lanes: tuple[Any, ...]  # WorkloadPattern per lane (patterns/workload/steps.py)
    routing: str
    # Shared by the layouts of one plan (lanes_of's `shared`): each step's TP communication
    # and volume by (tp, the step's ops tuple, which equal step shapes of a lane share), and
    # per tp the levels and notes its pricing gave the topology, said again on reuse.
    shared: dict[Any, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def workload(self) -> Any:
        return self.lanes[0].workload


def route(requests: list[Request], dp: int, routing: str,
          step_time_s: float | None) -> list[list[int]]:
    """Request indices per replica (module doc), in arrival order."""
    out: list[list[int]] = [[] for _ in range(dp)]
    if routing == "round-robin" or dp == 1:
        for i in range(len(requests)):
            out[i % dp].append(i)
        return out
    step = step_time_s or 0.0
    ends: list[list[float]] = [[] for _ in range(dp)]  # heaps of unfinished requests' ends
    for i in sorted(range(len(requests)), key=lambda i: requests[i].arrival_s):
        r = requests[i]
        for heap in ends:
            while heap and heap[0] <= r.arrival_s:
                heapq.heappop(heap)
        chosen = min(range(dp), key=lambda d: (len(ends[d]), d))
        heapq.heappush(ends[chosen], r.arrival_s + r.output * step)
        out[chosen].append(i)
    return out


def lanes_of(make_lane: Any, model: ModelConfig, layout: Layout, requests: list[Request],
             routing: str, step_time_s: float | None,
             shared: dict[Any, Any] | None = None) -> Lanes:
    """`make_lane(indices)`: the workload pattern of one lane at tp, pp 1, dp 1, of the
    requests at those indices (round-robin, they depend on dp x pp alone: layouts of one tp
    and one dp x pp share their lanes, which the maker may keep)."""
    if model.is_moe and (layout.dp > 1 or layout.ep):
        raise ConfigError("--requests over DP replicas of a MoE model (DP attention, whose "
                          "ranks step together) is not modelled; plan prices its dp 1 "
                          "layouts")
    lanes = []
    for replica in route(requests, layout.dp, routing, step_time_s):
        for k in range(layout.pp):
            own = replica[k::layout.pp]
            if own:  # fewer requests than lanes: the others idle
                lanes.append(make_lane(own))
    return Lanes(layout, model, tuple(lanes), routing, {} if shared is None else shared)


def _op_key(op: Any) -> tuple[Any, ...]:
    """What a call's cost and volume follow from: its ops differ by tag alone layer to layer."""
    return (op.kind, op.group, op.group_size, op.shape, op.out_shape, op.dtype, op.transport,
            op.counts)


def _step_sum(ops: tuple[Any, ...], memo: dict[Any, Any], by_key: dict[Any, float],
              value: Any) -> float:
    """`value(op)` summed over a step's calls in their order, as `own += value(op)` would:
    steps that share every call but the last (one forward, its logits rows apart) share the
    sum of those, and a call object is keyed once. `memo` holds what it keys by id, with
    the objects, so no id is reused while it is kept."""
    hit = memo.get(id(ops))
    if hit is not None:
        return hit[0]
    ids = tuple(map(id, ops[:-1]))
    prefix = memo.get(ids)
    if prefix is None:
        # A layer's calls repeat as a few objects (profile.forward's untagged): each valued
        # once.
        unique = dict(zip(ids, ops[:-1], strict=True))
        values = {i: _call_value(op, memo, by_key, value) for i, op in unique.items()}
        total = 0.0
        for i in ids:
            total += values[i]
        prefix = memo[ids] = (total, ops)
    total = prefix[0]
    if ops:
        total += _call_value(ops[-1], memo, by_key, value)
    memo[id(ops)] = (total, ops)
    return total


def _call_value(op: Any, memo: dict[Any, Any], by_key: dict[Any, float], value: Any) -> float:
    hit = memo.get(("op", id(op)))
    if hit is None:
        key = _op_key(op)
        v = by_key.get(key)
        if v is None:
            v = by_key[key] = value(op)
        hit = memo[("op", id(op))] = (v, op)
    return hit[0]


class _Stages:
    """What pp > 1 adds to one step of T tokens sampling S (module doc), the fits of each
    hop and of the broadcast looked up once per layout."""

    def __init__(self, lanes: Lanes, topology: Topology) -> None:
        layout = self.layout = lanes.layout
        dtype = lanes.workload.dtype or lanes.model.default_dtype
        self.row = lanes.model.hidden_size * DTYPE_BYTES[dtype]  # one token's hidden state
        self.hops, self.broadcast = [], None
        for s in range(layout.pp - 1):
            fits = topology.fits_of([[rank_of(layout, 0, s, t), rank_of(layout, 0, s + 1, t)]
                                     for t in range(layout.tp)])
            stand_in_note(fits, SweepOp.SENDRECV, 2, topology.notes)
            has_stream = any(k[0] == SweepOp.STREAM.value for k in fits)
            self.hops.append((fit_for(fits, SweepOp.SENDRECV, 2),
                              fit_for(fits, SweepOp.STREAM, 2) if has_stream else None))
        if layout.pp > 1 and lanes.lanes[0].engine == "vllm":
            fits = topology.fits_of([[rank_of(layout, 0, s, t) for s in range(layout.pp)]
                                     for t in range(layout.tp)])
            stand_in_note(fits, SweepOp.BROADCAST, layout.pp, topology.notes)
            self.broadcast = fit_for(fits, SweepOp.BROADCAST, layout.pp)
        self.hop_kinds: list[Any] = []  # the distinct (sendrecv, stream) fits
        self.hop_kind = []  # per hop, its kind's index
        for fits in self.hops:
            if fits not in self.hop_kinds:
                self.hop_kinds.append(fits)
            self.hop_kind.append(self.hop_kinds.index(fits))
        self.memo: dict[tuple[int, int], float] = {}

    def extra_us(self, tokens: int, samples: int) -> float:
        key = (tokens, samples)
        if key in self.memo:
            return self.memo[key]
        size, total = tokens * self.row, 0.0
        hops = []  # each kind of hop priced once (hops within a node, hops across nodes)
        for sendrecv, stream in self.hop_kinds:
            latency = sendrecv.time_us(size) / 2
            gap = stream.time_us(size) if stream is not None else latency
            hops.append(gap + max(gap, latency))  # as costs.py: no sooner than either
        for kind in self.hop_kind:
            total += hops[kind]
        if self.broadcast is not None and samples:
            total += (self.broadcast.time_us(8 * samples)
                      + self.broadcast.time_us(4 * (samples + 1)))
        self.memo[key] = total
        return total


@dataclass(frozen=True)
class _Lane:
    """What every layout of a lane's tp reads of it, found once (`lanes.shared`)."""

    lane: Any  # the pattern, kept so that no id keyed on it is reused
    index: SpanIndex
    repeats: list[int]
    steps: list[tuple[int, int]]  # per segment: the step's T and samples
    distinct_steps: set[tuple[int, int]]
    shapes: list[int]  # per segment: its shape's number among the plan's shapes
    distinct_shapes: dict[int, Any]  # the lane's shapes by number, in order of first step
    context: float  # the mean context of the lane's requests
    comm: list[float]  # per segment: its TP calls' time
    kv_tokens: int


def _lane(lane: Any, shared: dict[Any, Any], price: Any) -> _Lane:
    key = ("lane", id(lane))
    hit = shared.get(key)
    if hit is None:
        from microbench.analysis.workload import kv_tokens
        segments = lane.schedule.segments
        numbers = shared.setdefault("shapes", {})
        requests = lane.requests
        steps = [(step.tokens, s.shape.samples)
                 for step, s in zip(lane.segment_steps, segments, strict=True)]
        hit = shared[key] = _Lane(
            lane, SpanIndex(lane.schedule), [s.repeat for s in segments], steps, set(steps),
            shapes := [numbers.setdefault(s.shape, len(numbers)) for s in segments],
            {n: s.shape for n, s in zip(shapes, segments, strict=True)},
            sum(r.prompt + r.output / 2 for r in requests) / len(requests),
            [price(step.ops) for step in lane.segment_steps], kv_tokens(lane))
    return hit


def price_lanes(lanes: Lanes, topology: Topology, gpu: str,
                ) -> tuple[tuple[float, float, float], tuple[float, float, float], int]:
    """((TTFT p90, TPOT p90, end to end) of communication, the same of the compute floors,
    KV tokens of the fullest replica). A lane's TP calls are priced once for every layout
    of its tp; what a layout adds (its stages) and its floors are priced once per distinct
    step."""
    from microbench.analysis.compute import step_floor
    model, layout = lanes.model, lanes.layout
    dtype = lanes.workload.dtype or model.default_dtype
    # Per request, (TTFTs, TPOTs) of communication and of the floors.
    comm_figs: tuple[list[float], list[float]] = ([], [])
    floor_figs: tuple[list[float], list[float]] = ([], [])
    comm_ends, floor_ends = [0.0], [0.0]
    stages = _Stages(lanes, topology)
    floors: dict[Any, float] = {}
    floor_of = step_floor(model, layout, dtype, gpu)
    costs = Costs(lanes.lanes[0], topology)  # every lane has the layout tp, pp 1, dp 1
    tp = layout.tp
    # The TP group of every lane is ranks 0 .. tp - 1: across nodes only if wider than one.
    topology.used.add("inter" if topology.spans(list(range(tp))) else "intra")
    said = lanes.shared.setdefault(("notes", tp), set())  # what pricing its steps noted
    topology.notes |= said
    by_call = lanes.shared.setdefault(("call", tp), {})  # a call's time by _op_key
    steps = lanes.shared.setdefault(("comm", tp), {})  # _step_sum's memo

    def price(ops: tuple[Any, ...]) -> float:
        return _step_sum(ops, steps, by_call, lambda op: costs.of(0, 0, op).busy_us)

    before = set(topology.notes)
    flat = not stages.hops and stages.broadcast is None  # extra_us is 0.0 at every step
    extra = stages.memo
    kv = []
    for lane in lanes.lanes:
        info = _lane(lane, lanes.shared, price)
        kv.append(info.kv_tokens)
        if flat:
            comm = info.comm
        else:
            for pair in info.distinct_steps:
                if pair not in extra:
                    stages.extra_us(*pair)
            comm = [own + extra[pair] for own, pair in zip(info.comm, info.steps, strict=True)]
        # A floor by (shape, rounded context), at the context of the first lane to ask.
        known = floors.setdefault(round(info.context), {})
        for number, shape in info.distinct_shapes.items():
            if number not in known:
                chunk = shape.prefill_tokens / shape.prefill_seqs if shape.prefill_seqs else 0
                known[number] = floor_of(shape.prefill_tokens, shape.prefill_tokens * chunk / 2,
                                         shape.decode_seqs * shape.decode_tokens, info.context)
        floor = [known[number] for number in info.shapes]
        for figs, values in ((comm_figs, comm), (floor_figs, floor)):
            ttfts, tpots = info.index.sums(values)
            figs[0].extend(ttfts)
            figs[1].extend(t for t in tpots if t is not None)
        comm_ends.append(sum(map(operator.mul, comm, info.repeats)))
        floor_ends.append(sum(map(operator.mul, floor, info.repeats)))
    said |= topology.notes - before  # what pricing new calls noted
    pp = layout.pp
    peak = max(sum(kv[r * pp:(r + 1) * pp]) for r in range(-(-len(kv) // pp)))
    return ((_p90(comm_figs[0]), _p90(comm_figs[1]), max(comm_ends)),
            (_p90(floor_figs[0]), _p90(floor_figs[1]), max(floor_ends)), peak)


def _p90(values: list[float]) -> float:
    """The p90 `summary` gives (metrics.percentile), 0 where there is none."""
    return percentile(values, 90) or 0.0


def lanes_volume(lanes: Lanes) -> int:
    """Every lane's calls once, the hops' bytes (tp ranks each send both tensors) and
    vLLM's broadcasts of the sampled tokens (counted once, as a broadcast is)."""
    from patterns.volume import op_volume
    layout = lanes.layout
    dtype = lanes.workload.dtype or lanes.model.default_dtype
    hop = 2 * lanes.model.hidden_size * DTYPE_BYTES[dtype] * layout.tp * (layout.pp - 1)
    per_step = lanes.shared.setdefault(("volume", layout.tp), {})
    by_call = lanes.shared.setdefault(("call volume", layout.tp), {})
    total = 0.0
    broadcasts = layout.pp > 1 and lanes.lanes[0].engine == "vllm"
    for lane in lanes.lanes:
        key = ("lane volume", id(lane))
        steps = lanes.shared.get(key)
        if steps is None:  # per step: its calls' volume, T, broadcast bytes, repeat
            segments = lane.schedule.segments
            steps = lanes.shared[key] = (lane, [
                (_step_sum(step.ops, per_step, by_call, lambda op: float(op_volume(op))),
                 step.tokens, 8 * s.shape.samples + 4 * (s.shape.samples + 1)
                 if s.shape.samples else 0, s.repeat)
                for step, s in zip(lane.segment_steps, segments, strict=True)])
        for own, tokens, sampled, repeat in steps[1]:
            total += (own + hop * tokens + (sampled if broadcasts else 0)) * repeat
    return math.ceil(total)


def is_lanes(pattern: Pattern | Lanes) -> bool:
    return isinstance(pattern, Lanes)
