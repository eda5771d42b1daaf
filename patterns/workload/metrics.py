"""What a user reads off a workload: per step its tokens and communication, per request the
communication under its TTFT (the steps of its prefill chunks) and under its TPOT (its
decode steps, per step), and percentiles over requests.

Communication of a step: the calls and input bytes one rank issues in it (every rank of the
TP group issues the same). A step's value can be bytes, calls, or a measured time (replay
and predict hand in their own per-step values); per-request sums use prefix sums over the
folded steps, so the cost is O(segments + requests log segments), not O(steps).
"""

import operator
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from patterns.ops import Phase
from patterns.workload.schedule import Schedule

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default 'linear' method):
    rank = p/100 x (n - 1) in the sorted values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = p / 100 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


At = tuple[int, int] | None  # (segment, its steps counted before the step); None: none


class StepSums:
    """Sums of a per-segment value over ranges of issued steps: all steps, and decode-only."""

    def __init__(self, repeats: Sequence[int], decode: Sequence[bool],
                 per_step: Sequence[float]) -> None:
        self.per_step = per_step
        # Running sums before each segment, added in segment order (a decode-only one adds
        # 0.0 for the other segments, which changes no sum).
        steps = list(map(operator.mul, per_step, repeats))
        self.before = list(accumulate(steps, initial=0.0))
        self.before_decode = list(accumulate(
            [v if d else 0.0 for v, d in zip(steps, decode, strict=True)], initial=0.0))

    def over(self, start: At, end: At, decode_only: bool) -> float:
        """The sum over issued steps [start, end), as `SpanIndex` placed them."""
        before = self.before_decode if decode_only else self.before
        s1 = 0.0 if end is None else before[end[0]] + self.per_step[end[0]] * end[1]
        s0 = 0.0 if start is None else before[start[0]] + self.per_step[start[0]] * start[1]
        return s1 - s0


class SpanIndex:
    """Where each request's prefill and decode steps lie among a schedule's segments, and
    how many steps each range counts, found once: summing a per-segment value over them
    then searches nothing (plan sums one schedule's values under many layouts)."""

    def __init__(self, schedule: Schedule) -> None:
        segments = schedule.segments
        starts = [s.start for s in segments]
        self.repeats = [s.repeat for s in segments]
        self.decode = [s.shape.phase == Phase.DECODE for s in segments]
        counts, seen = [], 0  # decode steps before each segment
        for seg, d in zip(segments, self.decode, strict=True):
            counts.append(seen)
            seen += seg.repeat if d else 0
        self.decode_only = decode_only = not schedule.decode_in_mixed

        def where(step: int) -> At:
            """Where issued steps [0, step) end."""
            if step <= 0 or not starts:
                return None
            j = bisect_right(starts, step - 1) - 1
            return j, step - starts[j]

        def where_decode(step: int) -> tuple[At, int]:
            """The same over decode steps alone, and how many they are."""
            at = where(step)
            if at is None:
                return None, 0
            own = at[1] if self.decode[at[0]] else 0
            return (at[0], own), counts[at[0]] + own

        Range = tuple[At, At, int] | None  # (start, end, steps); None: no step
        self.spans: list[tuple[Range, Range, int]] = []
        for span in schedule.spans:
            (p0, p1), (d0, d1) = span.prefill, span.decode
            prefill: Range = (where(p0), where(p1), p1 - p0) if p1 > p0 else None
            dec: Range = None
            if d1 > d0 and decode_only:
                (e0, c0), (e1, c1) = where_decode(d0), where_decode(d1)
                dec = (e0, e1, c1 - c0)
            elif d1 > d0:
                dec = (where(d0), where(d1), d1 - d0)
            self.spans.append((prefill, dec, span.waited_steps))

    def figures(self, per_step: Sequence[float]) -> list["RequestFigures"]:
        """Per request, `per_step` (a value per segment) summed under its TTFT and averaged
        under its TPOT."""
        ttfts, tpots = self.sums(per_step)
        return [RequestFigures(ttft, 0 if prefill is None else prefill[2], tpot,
                               0 if dec is None else dec[2], waited)
                for ttft, tpot, (prefill, dec, waited) in zip(ttfts, tpots, self.spans,
                                                              strict=True)]

    def sums(self, per_step: Sequence[float]) -> tuple[list[float], list[float | None]]:
        """Per request, its TTFT's figure and its TPOT's (None: no decode step)."""
        sums = StepSums(self.repeats, self.decode, per_step)
        # StepSums.over inlined (plan sums a million ranges): the same terms, the same order.
        before, decoded = sums.before, sums.before_decode if self.decode_only else sums.before
        ttfts: list[float] = []
        tpots: list[float | None] = []
        for prefill, dec, _ in self.spans:
            if prefill is None:
                ttfts.append(0.0)
            else:
                (j0, k0), end = prefill[0] or (0, 0), prefill[1]
                s1 = 0.0 if end is None else before[end[0]] + per_step[end[0]] * end[1]
                ttfts.append(s1 - (0.0 if prefill[0] is None else
                                   before[j0] + per_step[j0] * k0))
            if dec is None or not dec[2]:
                tpots.append(None)
                continue
            (j0, k0), end = dec[0] or (0, 0), dec[1]
            s1 = 0.0 if end is None else decoded[end[0]] + per_step[end[0]] * end[1]
            s0 = 0.0 if dec[0] is None else decoded[j0] + per_step[j0] * k0
            tpots.append((s1 - s0) / dec[2])
        return ttfts, tpots


@dataclass(frozen=True)
class RequestFigures:
    ttft: float  # sum over the steps of its prefill chunks
    ttft_steps: int
    tpot: float | None  # mean over its decode steps (None: a one-token output)
    decode_steps: int
    waited_steps: int


def request_figures(schedule: Schedule, value: Callable[[int], float]) -> list[RequestFigures]:
    """Per request, `value(segment index)` summed under its TTFT and averaged under its
    TPOT."""
    return SpanIndex(schedule).figures([value(i) for i in range(len(schedule.segments))])


def summary(figures: Sequence[RequestFigures]) -> dict[str, dict[str, float | None]]:
    """p50 / p90 / p99 over requests of the TTFT and TPOT figures."""
    ttft = [f.ttft for f in figures]
    tpot = [f.tpot for f in figures if f.tpot is not None]
    return {"ttft": {f"p{p}": percentile(ttft, p) for p in PERCENTILES},
            "tpot": {f"p{p}": percentile(tpot, p) for p in PERCENTILES}}
