"""`plan --requests` over DP replicas and pipeline stages: the workload's requests routed to
the replicas, each replica's split over the batches it keeps in flight, and each such lane
scheduled and priced as one engine replica at pp 1 (analysis/workload.py), with what its
stages add to every step.

- Routing (`--dp-routing`): round-robin, request i to replica i mod dp, what vLLM's DP load
  balancer does under even load; or least-loaded, each request to the replica with the
  fewest requests still unfinished at its arrival (a request taken to finish its output
  steps after it arrives, at --step-time-ms a step; ties to the lowest replica), the
  balancer's aim under uneven load. Dense models only: a MoE model's DP ranks step
  together, priced as one DP workload (analysis/dp_workload.py); --ep at dp 1 makes the EP
  group the TP group, the same calls as without it.
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
from dataclasses import dataclass, field
from typing import Any

from microbench.analysis.costs import Costs
from microbench.analysis.fits import Topology, fit_for, stand_in_note
from microbench.analysis.lane_arrays import Block, LaneArrays, lane_arrays, p90, step_sums
from microbench.sweep.busbw import SweepOp
from patterns import ConfigError, Layout, ModelConfig, Pattern
from patterns.dtypes import DTYPE_BYTES
from patterns.groups import rank_of
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
    if model.is_moe and layout.dp > 1:
        raise ConfigError("a MoE model's DP ranks step together: plan prices them as one DP "
                          "workload (analysis/dp_workload.py), not as replicas")
    lanes = []
    for replica in route(requests, layout.dp, routing, step_time_s):
        for k in range(layout.pp):
            own = replica[k::layout.pp]
            if own:  # fewer requests than lanes: the others idle
                lanes.append(make_lane(own))
    return Lanes(layout, model, tuple(lanes), routing, {} if shared is None else shared)


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

    def extras(self, tokens: Any, samples: Any) -> Any:
        """What the stages add to steps of `tokens` sampling `samples` (numpy arrays), each
        kind of hop priced once (within a node, across nodes): per step the floats a loop
        over the hops would add, in the same order."""
        import numpy as np
        size, total = tokens * self.row, np.zeros(len(tokens))
        hops = []
        for sendrecv, stream in self.hop_kinds:
            if stream is None:  # half the ping-pong at the hop's size (costs.call_time_us)
                latency = gap = sendrecv.measured_times_us(size) / 2
            else:  # costs.latency_us: the stream, no sooner than the smallest ping-pong's half
                gap = stream.measured_times_us(size)
                smallest = np.minimum(size, sendrecv.min_bytes)
                latency = np.maximum(gap, sendrecv.measured_times_us(smallest) / 2)
            hops.append(gap + latency)
        for kind in self.hop_kind:
            total += hops[kind]
        if self.broadcast is not None:
            sent = (_times_us(self.broadcast, 8 * samples)
                    + _times_us(self.broadcast, 4 * (samples + 1)))
            total = np.where(samples > 0, total + sent, total)
        return total


def _times_us(fit: Any, sizes: Any) -> Any:
    """A fit's time at many sizes (fits.Fit.times_us; any other kind one size at a time)."""
    import numpy as np
    many = getattr(fit, "times_us", None)
    return many(sizes) if many is not None else np.array([fit.time_us(x) for x in sizes])


def _lane(lane: Any, shared: dict[Any, Any], value: Any) -> LaneArrays:
    """A lane's arrays (lane_arrays.py), its steps' (time, bytes) summed once for every
    layout of its tp: each distinct step tuple once a lane, and once a tp (`value(ops)`'s
    memo)."""
    key = ("lane", id(lane))
    hit = shared.get(key)
    if hit is None:
        from microbench.analysis.workload import kv_tokens
        steps = lane.segment_steps
        own = {i: value(ops) for i, ops in {id(step.ops): step.ops for step in steps}.items()}
        hit = shared[key] = lane_arrays(lane, [own[id(step.ops)] for step in steps],
                                        kv_tokens(lane))
    return hit


def price_lanes(lanes: Lanes, topology: Topology, gpu: str,
                ) -> tuple[tuple[float, float, float], tuple[float, float, float], int]:
    """((TTFT p90, TPOT p90, end to end) of communication, the same of the compute floors,
    KV tokens of the fullest replica). A lane's TP calls are priced once for every layout
    of its tp; what a layout adds (its stages) and its floors are priced once per distinct
    step, and summed per request over the layout's lanes stacked (lane_arrays.Block)."""
    import numpy as np

    from microbench.analysis.compute import step_floors
    from patterns.volume import op_volume
    model, layout = lanes.model, lanes.layout
    dtype = lanes.workload.dtype or model.default_dtype
    stages = _Stages(lanes, topology)
    costs = Costs(lanes.lanes[0], topology)  # every lane has the layout tp, pp 1, dp 1
    tp = layout.tp
    # The TP group of every lane is ranks 0 .. tp - 1: across nodes only if wider than one.
    topology.used.add("inter" if topology.spans(list(range(tp))) else "intra")
    said = lanes.shared.setdefault(("notes", tp), set())  # what pricing its steps noted
    topology.notes |= said
    by_call = lanes.shared.setdefault(("call", tp), {})  # a call's figures by op_key
    memo = lanes.shared.setdefault(("steps", tp), {})  # step_sums' memo

    def call(op: Any) -> tuple[float, float]:
        return costs.of(0, 0, op).busy_us, float(op_volume(op))

    def value(ops: tuple[Any, ...]) -> tuple[float, float]:
        return step_sums(ops, memo, by_call, call)

    before = set(topology.notes)
    arrays = [_lane(lane, lanes.shared, value) for lane in lanes.lanes]
    said |= topology.notes - before  # what pricing new calls noted
    key = ("block", frozenset(id(a.lane) for a in arrays))
    block = lanes.shared.get(key)
    if block is None:  # the layouts of one tp (and routing) share their lanes
        block = lanes.shared[key] = Block(arrays)
    comm = block.comm
    if stages.hops or stages.broadcast is not None:  # else the stages add nothing
        comm = comm + stages.extras(block.pairs[:, 0], block.pairs[:, 1])[block.pair_index]
    # A floor by (shape, rounded context), at the context of the first lane to ask.
    rows = np.array([block.row_of[id(a.lane)] for a in arrays])
    first, shape = block.first_asked(rows)
    floor = step_floors(model, layout, dtype, gpu, block.prefill_tokens[shape],
                        block.prefill_pairs[shape], block.decode_seqs[shape],
                        block.context[first])[block.segment_key]
    comm_ttft, comm_tpot, comm_end = block.sums(comm)
    floor_ttft, floor_tpot, floor_end = block.sums(floor)
    kv = [a.kv_tokens for a in arrays]
    pp = layout.pp
    peak = max(sum(kv[r * pp:(r + 1) * pp]) for r in range(-(-len(kv) // pp)))
    return ((p90(comm_ttft), p90(comm_tpot), comm_end),
            (p90(floor_ttft), p90(floor_tpot), floor_end), peak)


def lanes_volume(lanes: Lanes) -> int:
    """Every lane's calls once, the hops' bytes (tp ranks each send both tensors) and
    vLLM's broadcasts of the sampled tokens (counted once, as a broadcast is), from the
    lanes' arrays `price_lanes` made.

    Summed as integers, each lane's three totals (calls, tokens, sampled bytes) found once:
    every term is a whole number of bytes, so below 2**53 the float sum step by step was
    exact and this is the same number; above it, that float sum is kept."""
    layout = lanes.layout
    dtype = lanes.workload.dtype or lanes.model.default_dtype
    hop = 2 * lanes.model.hidden_size * DTYPE_BYTES[dtype] * layout.tp * (layout.pp - 1)
    broadcasts = layout.pp > 1 and lanes.lanes[0].engine == "vllm"
    arrays = [lanes.shared[("lane", id(lane))] for lane in lanes.lanes]
    total = 0
    for a in arrays:
        calls, tokens, sampled = a.volume_sums
        total += calls + hop * tokens + (sampled if broadcasts else 0)
    if total < 2 ** 53:
        return total
    inexact = 0.0  # the float sum, step by step, that figures were first given as
    for a in arrays:
        for own, tokens, sampled, repeat in a.volume_rows():
            inexact += (own + hop * tokens + (sampled if broadcasts else 0)) * repeat
    return math.ceil(inexact)


def is_lanes(pattern: Pattern | Lanes) -> bool:
    return isinstance(pattern, Lanes)
