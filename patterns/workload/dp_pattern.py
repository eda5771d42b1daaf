"""A request workload over DP ranks as a pattern: the requests routed to the ranks
(`dp_routing.py`), each rank's own schedule, their global steps (`dp_timeline.py`), and in
each global segment every rank's step: its own, a dummy or idle batch where the engine keeps
the ranks in step, nothing where they are independent replicas.

`stages` is DP rank 0's runs, `dp_stages` every rank's, as for a batch with --dp-batches:
replay, predict and validate read each rank's own. `schedule` is the global one (each
segment's shape summed over the ranks, the requests' spans in global steps), `views[d]`
rank d's: its own shapes in global segments and its requests, what per-request figures are
summed over (`dp_figures`).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from patterns.ops import Phase, Step
from patterns.pattern import Run
from patterns.workload.dp_timeline import GlobalSegment, Timeline
from patterns.workload.metrics import RequestFigures, request_figures
from patterns.workload.schedule import Schedule, Segment, StepShape
from patterns.workload.steps import StepGraph, WorkloadPattern

DUMMY, IDLE, NONE = "dummy", "idle", "none"  # what a rank without a step of its own runs


@dataclass(frozen=True)
class DPWorkloadPattern(WorkloadPattern):
    routing: str = ""  # the --dp-routing the requests reached the ranks by
    rank_of: tuple[int, ...] = ()  # each request's DP rank, in the order of `requests`
    rank_schedules: tuple[Schedule, ...] = ()  # each rank's own steps
    timeline: Timeline | None = None
    # per rank, per global segment: its step and its graph (`step_graphs` are rank 0's)
    rank_steps: tuple[tuple[Step, ...], ...] = ()
    rank_graphs: tuple[tuple[StepGraph, ...], ...] = ()
    filler: str = NONE  # DUMMY (vLLM), IDLE (SGLang DP attention), NONE (replicas)
    wave: bool = False  # vLLM's waves: their syncs, and the tails of dummy forwards

    @property
    def views(self) -> tuple[Schedule, ...]:
        assert self.timeline is not None
        return self.timeline.views

    @property
    def lockstep(self) -> bool:
        return self.filler != NONE


def _summed(shapes: Sequence[StepShape]) -> StepShape:
    return StepShape(sum(s.prefill_tokens for s in shapes), sum(s.prefill_seqs for s in shapes),
                     sum(s.decode_seqs for s in shapes), 1, sum(s.samples for s in shapes))


def build_dp_pattern(base: WorkloadPattern, rank_of: Sequence[int], routing: str,
                     schedules: Sequence[Schedule], timeline: Timeline, filler: str,
                     steps_of: Callable[[GlobalSegment], Sequence[tuple[StepGraph, Step]]],
                     ) -> DPWorkloadPattern:
    """`base`: the pattern's engine, model, layout, options, requests and source;
    `steps_of(segment)`: every rank's graph and step in a global segment (the engine's,
    cached by what the calls follow from)."""
    dp = len(schedules)
    rank_steps: list[list[Step]] = [[] for _ in range(dp)]
    rank_graphs: list[list[StepGraph]] = [[] for _ in range(dp)]
    runs: list[list[Run]] = [[] for _ in range(dp)]
    for g in timeline.segments:
        for d, (graph, step) in enumerate(steps_of(g)):
            rank_steps[d].append(step)
            rank_graphs[d].append(graph)
            item = g.items[d]
            phase = (Phase.WAVE_TAIL if g.tail and filler == DUMMY else
                     schedules[d].segments[item].shape.phase if item >= 0 else Phase.DECODE)
            own = runs[d]
            if own and own[-1].phase == phase and own[-1].step == step:
                own[-1] = Run(phase, step, own[-1].repeat + g.repeat)
            else:
                own.append(Run(phase, step, g.repeat))
    order = {}  # request -> its index among its rank's requests
    counts = [0] * dp
    for r, d in enumerate(rank_of):
        order[r] = counts[d]
        counts[d] += 1
    views = timeline.views
    spans = tuple(views[d].spans[order[r]] for r, d in enumerate(rank_of))
    shapes = [[views[d].segments[k].shape for d in range(dp)]
              for k in range(len(timeline.segments))]
    whole = Schedule(base.engine, tuple(Segment(_summed(s), g.repeat, g.start) for s, g in
                                        zip(shapes, timeline.segments, strict=True)),
                     spans, schedules[0].step_time_s,
                     max(s.clock_steps for s in schedules), schedules[0].decode_in_mixed)
    replicas = tuple((tuple(r),) for r in runs)
    return DPWorkloadPattern(
        engine=base.engine, model=base.model, layout=base.layout, workload=base.workload,
        options=base.options, stages=replicas[0], dp_stages=replicas, schedule=whole,
        requests=base.requests, source=base.source, step_graphs=tuple(rank_graphs[0]),
        segment_steps=tuple(rank_steps[0]), spec=base.spec, routing=routing,
        rank_of=tuple(rank_of), rank_schedules=tuple(schedules), timeline=timeline,
        rank_steps=tuple(tuple(s) for s in rank_steps),
        rank_graphs=tuple(tuple(g) for g in rank_graphs), filler=filler,
        wave=timeline.waves > 0)


def dp_figures(p: DPWorkloadPattern, value: Callable[[int, int], float]
               ) -> list[RequestFigures]:
    """Per request (in the order of `p.requests`), `value(rank, global segment)` summed
    over its TTFT's steps and averaged over its TPOT's, on its own rank's view."""
    per_rank = [request_figures(view, lambda k, d=d: value(d, k)) for d, view in
                enumerate(p.views)]
    seen = [0] * len(per_rank)
    out = []
    for d in p.rank_of:
        out.append(per_rank[d][seen[d]])
        seen[d] += 1
    return out
