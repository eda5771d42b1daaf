"""predict and plan over a request workload at --dp > 1 (patterns/workload/dp_pattern.py):
each global step priced from the sweeps' fits, per request its TTFT and TPOT on its own DP
rank.

A rank's step costs the sum of its calls' fitted times (a step's layers' copies priced once,
`patterns.tiled.weighted_ops`). Ranks that step together (vLLM's MoE DP ranks, SGLang's DP
attention) wait for each other at every step's DP and MoE collectives: a global step takes
the slowest rank's time, and a rank running a dummy forward or an idle batch costs what its
calls cost, as any rank's; the waves' tails of dummy forwards are priced apart
(`wave_tail_us`). Independent replicas (a dense model, SGLang without --ep) each take their
own steps' times. End to end: every global step's time added, the last wave's tail apart
(as replay reports it). Compute floors (analysis/compute.py) alike: a rank's step's floor
of its own tokens (a dummy forward one token, an idle batch none), the slowest rank's.
"""

from typing import Any

from microbench.analysis.costs import Costs
from microbench.analysis.fits import Topology
from patterns.tiled import weighted_ops
from patterns.workload.dp_pattern import DUMMY, DPWorkloadPattern, dp_figures
from patterns.workload.metrics import summary


class RankSteps:
    """Per rank and global segment, the predicted time of its step (each distinct step of
    a rank priced once), and each global segment's (the slowest rank's where they wait for
    each other)."""

    def __init__(self, p: DPWorkloadPattern, topology: Topology) -> None:
        costs = Costs(p, topology)
        seen: dict[tuple[int, int], float] = {}
        self.per_rank: list[list[float]] = []
        for d, steps in enumerate(p.rank_steps):
            own = []
            for step in steps:
                key = (d if topology.ranks_per_node else 0, id(step))
                t = seen.get(key)
                if t is None:
                    t = seen[key] = sum(costs.of(d, 0, op).busy_us * n
                                        for op, n in weighted_ops(step.ops))
                own.append(t)
            self.per_rank.append(own)
        self.slowest = [max(ts) for ts in zip(*self.per_rank, strict=True)]
        self.lockstep = p.lockstep

    def value(self, d: int, k: int) -> float:
        return self.slowest[k] if self.lockstep else self.per_rank[d][k]


def _tails(p: DPWorkloadPattern, per_segment: list[float]) -> tuple[float, float]:
    """(every wave tail's time, the last one's: the tail after the workload's last step)."""
    assert p.timeline is not None
    segments = p.timeline.segments
    tail = [k for k, g in enumerate(segments) if g.tail and p.filler == DUMMY]
    total = sum(per_segment[k] * segments[k].repeat for k in tail)
    last = 0.0
    for k in reversed(range(len(segments))):
        if k not in tail:
            break
        last += per_segment[k] * segments[k].repeat
    return total, last


def predict_dp_workload(p: DPWorkloadPattern, topology: Topology) -> dict[str, Any]:
    """Per-request figures (p50 / p90 / p99 of the communication under TTFT and per TPOT
    step) and the totals, as analysis/workload.predict_workload gives one replica's."""
    assert p.timeline is not None
    steps = RankSteps(p, topology)
    figs = dp_figures(p, steps.value)
    pct = summary(figs)
    segments = p.timeline.segments
    total = sum(t * g.repeat for t, g in zip(steps.slowest, segments, strict=True))
    tails, _ = _tails(p, steps.slowest)
    return {"requests": len(p.requests), "steps": p.timeline.steps,
            "all_steps_us": round(total, 3), "dp": p.layout.dp, "dp_routing": p.routing,
            "wave_tail_steps": p.timeline.tail_steps if p.filler == DUMMY else 0,
            "wave_tail_us": round(tails, 3),
            "ttft_comm_us": {k: _r(v) for k, v in pct["ttft"].items()},
            "tpot_comm_us": {k: _r(v) for k, v in pct["tpot"].items()}}


def dp_predicted(p: DPWorkloadPattern, topology: Topology) -> tuple[dict[str, float], list[str]]:
    """predict's headline figures of a DP workload: end to end (every global step's
    slowest rank, the last wave's tail apart) and that tail; per-request figures are in
    `predict_dp_workload`."""
    steps = RankSteps(p, topology)
    assert p.timeline is not None
    total = sum(t * g.repeat for t, g in zip(steps.slowest, p.timeline.segments, strict=True))
    _, last = _tails(p, steps.slowest)
    out = {"e2e_us": total - last}
    if p.wave:
        out["wave_tail_us"] = last
    notes = sorted(topology.notes)
    notes.append(f"--requests over dp({p.layout.dp}): requests routed {p.routing}; "
                 + ("every global step takes its slowest DP rank's time, dummy forwards and "
                    "idle batches priced as any step" if p.lockstep else
                    "independent replicas, each step its own rank's time"))
    return out, notes


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def dp_floors(p: DPWorkloadPattern, gpu: str) -> list[float]:
    """Each global segment's compute floor: the slowest rank's step floor (a dummy
    forward of one token; an idle batch, or no step, nothing)."""
    from microbench.analysis.compute import step_floor_us
    assert p.timeline is not None
    model, layout = p.model, p.layout
    dtype = p.workload.dtype or model.default_dtype
    context = sum(r.prompt + r.output / 2 for r in p.requests) / len(p.requests)
    found: dict[Any, float] = {}
    out = []
    for g in p.timeline.segments:
        worst = 0.0
        for d, item in enumerate(g.items):
            if item >= 0:
                s = p.rank_schedules[d].segments[item].shape
                chunk = s.prefill_tokens / s.prefill_seqs if s.prefill_seqs else 0
                key = (s.prefill_tokens, chunk, s.decode_seqs * s.decode_tokens)
            elif p.filler == DUMMY:
                key = (0, 0, 1)  # a one-token dummy forward
            else:
                continue
            floor = found.get(key)
            if floor is None:
                floor = found[key] = step_floor_us(model, layout, dtype, gpu, key[0],
                                                   key[0] * key[1] / 2, key[2], context)
            worst = max(worst, floor)
        out.append(worst)
    return out


def price_dp_workload(p: DPWorkloadPattern, topology: Topology, gpu: str,
                      ) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """plan's figures of a DP workload: (TTFT p90, TPOT p90, end to end) of communication,
    and the same of the compute floors (module doc)."""
    assert p.timeline is not None
    steps = RankSteps(p, topology)
    floors = dp_floors(p, gpu)
    segments = p.timeline.segments

    def figures(per_rank: Any, slowest: list[float]) -> tuple[float, float, float]:
        pct = summary(dp_figures(p, per_rank))
        total = sum(t * g.repeat for t, g in zip(slowest, segments, strict=True))
        return (pct["ttft"]["p90"] or 0.0, pct["tpot"]["p90"] or 0.0,
                total - _tails(p, slowest)[1])

    comm = figures(steps.value, steps.slowest)
    floor = figures(lambda d, k: floors[k], floors)
    return comm, floor


def dp_kv_tokens(p: DPWorkloadPattern) -> int:
    """The fullest DP rank's KV tokens at its peak (analysis/workload.kv_tokens of each
    rank's own requests and steps)."""
    peak = 0
    for d, schedule in enumerate(p.rank_schedules):
        requests = [r for r, k in zip(p.requests, p.rank_of, strict=True) if k == d]
        events: dict[int, int] = {}
        for span, request in zip(schedule.spans, requests, strict=True):
            size = request.prompt + request.output
            start, end = span.prefill[0], max(span.prefill[1], span.decode[1])
            events[start] = events.get(start, 0) + size
            events[end] = events.get(end, 0) - size
        held = 0
        for step in sorted(events):
            held += events[step]
            peak = max(peak, held)
    return peak
