"""DP ranks that step together over a request workload: each rank's own schedule laid on the
clock, the global steps they run together, and each rank's steps and requests in global
steps.

Each DP rank's scheduler runs its own requests (its `Schedule`, with the clock step of each
issued step: `Schedule.resumes`). Ranks that step together (vLLM's MoE DP ranks, SGLang's
DP attention: `patterns/dp_steps.py`) run one global step at each clock step at which any
rank runs one, a rank with nothing then running a dummy (vLLM) or idle (SGLang) batch;
under vLLM's wave (`patterns/engines/vllm/dp_wave.py`) the global steps run on from a
wave's first real step until its sync, every 32nd step of the wave, finds no rank with an
unfinished request, so the steps after the last real one are dummy forwards on every rank
(`GlobalSegment.tail`). A request is unfinished at the syncs of clock steps c with
arrival <= c < its last step + `lag` (the steps before its rank sees it finished: 0 under
the synchronous scheduler, whose step c ends with the update of its own output).

Cost: linear in the ranks' segments and the waves' syncs (a segment is a run of equal
steps), not in steps.
"""

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from patterns.workload.schedule import Schedule, Segment, Span, StepShape

# A rank's step where it runs nothing of its own (a dummy or idle batch), in its view.
NO_STEP = StepShape(0, 0, 0, 1, 0)


@dataclass(frozen=True)
class GlobalSegment:
    start: int  # global step index of its first step
    repeat: int
    clock: int  # clock step of its first step
    items: tuple[int, ...]  # per DP rank: its own segment in these steps, -1: none
    sync: bool = False  # each step ends with the wave's sync (vLLM)
    tail: bool = False  # no rank runs a step of its own: the wave's dummy forwards


@dataclass(frozen=True)
class Timeline:
    segments: tuple[GlobalSegment, ...]
    waves: int  # vLLM's waves (0 without)
    views: tuple[Schedule, ...]  # per rank: its steps (NO_STEP where none) and requests,
    #                              in global steps

    @property
    def steps(self) -> int:
        return sum(s.repeat for s in self.segments)

    @property
    def tail_steps(self) -> int:
        return sum(s.repeat for s in self.segments if s.tail)


class Clock:
    """Issued step -> clock step of one rank's schedule (`Schedule.resumes`)."""

    def __init__(self, schedule: Schedule) -> None:
        self.starts = [s for s, _ in schedule.resumes] or [0]
        self.clocks = [c for _, c in schedule.resumes] or [0]

    def of(self, issued: int) -> int:
        k = bisect_right(self.starts, issued) - 1
        return self.clocks[k] + issued - self.starts[k]

    def runs(self, schedule: Schedule) -> list[tuple[int, int, int]]:
        """(clock, steps, segment index) pieces of the schedule, each without a gap."""
        out = []
        for k, seg in enumerate(schedule.segments):
            at, left = seg.start, seg.repeat
            while left:
                r = bisect_right(self.starts, at) - 1
                gap = self.starts[r + 1] if r + 1 < len(self.starts) else at + left
                n = min(left, gap - at)
                out.append((self.clocks[r] + at - self.starts[r], n, k))
                at, left = at + n, left - n
        return out


def _last_step(span: Span) -> int:
    return span.decode[1] - 1 if span.decode[1] > span.decode[0] >= 0 else span.prefill[1] - 1


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged [start, end) intervals."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _waves(real: list[tuple[int, int]], unfinished: list[tuple[int, int]], every: int,
           ) -> list[tuple[int, int, list[int]]]:
    """[start, end) clock steps and sync clocks of each wave: one starts at the first real
    step after the last wave, and ends after the first of its syncs (every `every`-th step)
    at which no request is unfinished (`real`, `unfinished`: merged intervals)."""
    starts = [a for a, _ in unfinished]
    waves = []
    i, c0 = 0, real[0][0] if real else 0
    while i < len(real):
        syncs, s = [], c0 + every - 1
        while True:
            syncs.append(s)
            k = bisect_right(starts, s) - 1
            if not (k >= 0 and unfinished[k][0] <= s < unfinished[k][1]):
                break  # no rank unfinished at this sync: the wave ends after it
            s += every
        waves.append((c0, s + 1, syncs))
        while i < len(real) and real[i][1] <= s + 1:
            i += 1
        if i < len(real):  # the next wave: the first real step after this one
            c0 = max(real[i][0], s + 1)
    return waves


def lockstep(schedules: Sequence[Schedule], wave: int | None = None, lag: int = 0,
             ) -> Timeline:
    """The global steps of ranks stepping together (module doc); `wave`: vLLM's sync
    interval (32), None for none (SGLang); `lag`: see the module doc."""
    clocks = [Clock(s) for s in schedules]
    runs = [c.runs(s) for c, s in zip(clocks, schedules, strict=True)]
    real = _merge([(c, c + n) for rank in runs for c, n, _ in rank])
    if wave is None:
        intervals: list[tuple[int, int, list[int]]] = [(a, b, []) for a, b in real]
    else:  # unfinished from arrival until `lag` steps after its last step (module doc)
        unfinished = _merge([(sp.arrival_step, clock.of(_last_step(sp)) + lag)
                             for clock, s in zip(clocks, schedules, strict=True)
                             for sp in s.spans])
        intervals = _waves(real, [(a, b) for a, b in unfinished if b > a], wave)
    syncs = {s for _, _, ss in intervals for s in ss}
    cuts = {c for a, b, _ in intervals for c in (a, b)}
    cuts |= {c for rank in runs for start, n, _ in rank for c in (start, start + n)}
    cuts |= {c for s in syncs for c in (s, s + 1)}
    points = sorted(cuts)
    inside = [a for a, _, _ in intervals]
    ends = [b for _, b, _ in intervals]
    heads = [0] * len(runs)
    segments: list[GlobalSegment] = []
    start = 0
    for a, b in pairwise(points):
        k = bisect_right(inside, a) - 1
        if k < 0 or a >= ends[k]:
            continue  # between waves or busy stretches: no step
        items = []
        for d, rank in enumerate(runs):
            h = heads[d]
            while h < len(rank) and rank[h][0] + rank[h][1] <= a:
                h += 1
            heads[d] = h
            items.append(rank[h][2] if h < len(rank) and rank[h][0] <= a else -1)
        item = tuple(items)
        sync, tail = a in syncs, all(i < 0 for i in items)
        last = segments[-1] if segments else None
        if (last is not None and not sync and not last.sync and last.items == item
                and last.clock + last.repeat == a):
            segments[-1] = GlobalSegment(last.start, last.repeat + b - a, last.clock, item,
                                         False, tail)
        else:
            segments.append(GlobalSegment(start, b - a, a, item, sync, tail))
        start += b - a
    views = tuple(_view(d, schedules[d], clocks[d], segments) for d in range(len(schedules)))
    return Timeline(tuple(segments), len(intervals) if wave is not None else 0, views)


def _view(d: int, schedule: Schedule, clock: Clock, segments: list[GlobalSegment]) -> Schedule:
    """Rank d's schedule in global steps: its shape (NO_STEP where none) in each global
    segment, its requests' spans and clock mapped onto global steps."""
    at = [g.clock for g in segments]

    def global_of(issued: int) -> int:
        c = clock.of(issued)
        g = segments[bisect_right(at, c) - 1]
        return g.start + c - g.clock

    spans = []
    for sp in schedule.spans:
        new = Span(sp.arrival_step, waited_steps=sp.waited_steps)
        if sp.prefill[1] > sp.prefill[0] >= 0:
            new.prefill = [global_of(sp.prefill[0]), global_of(sp.prefill[1] - 1) + 1]
        if sp.decode[1] > sp.decode[0] >= 0:
            new.decode = [global_of(sp.decode[0]), global_of(sp.decode[1] - 1) + 1]
        spans.append(new)
    own = schedule.segments
    view = tuple(Segment(own[g.items[d]].shape if g.items[d] >= 0 else NO_STEP, g.repeat,
                         g.start) for g in segments)
    return Schedule(schedule.engine, view, tuple(spans), schedule.step_time_s,
                    schedule.clock_steps, schedule.decode_in_mixed)
