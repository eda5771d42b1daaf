"""What a user reads off a workload: per step its tokens and communication, per request the
communication under its TTFT (the steps of its prefill chunks) and under its TPOT (its
decode steps, per step), and percentiles over requests.

Communication of a step: the calls and input bytes one rank issues in it (every rank of the
TP group issues the same). A step's value can be bytes, calls, or a measured time (replay
and predict hand in their own per-step values); per-request sums use prefix sums over the
folded steps, so the cost is O(segments + requests log segments), not O(steps).
"""

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from patterns.ops import Phase
from patterns.workload.schedule import Schedule, Segment

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


class StepSums:
    """Sums of a per-segment value over ranges of issued steps: all steps, and decode-only."""

    def __init__(self, segments: Sequence[Segment], value: Callable[[int], float]) -> None:
        self.starts = [s.start for s in segments]
        self.per_step = [value(i) for i in range(len(segments))]
        self.decode = [s.shape.phase == Phase.DECODE for s in segments]
        self.before: list[float] = []
        self.before_decode: list[float] = []
        self.decode_steps_before: list[int] = []
        total = total_d = 0.0
        count_d = 0
        for seg, v, d in zip(segments, self.per_step, self.decode, strict=True):
            self.before.append(total)
            self.before_decode.append(total_d)
            self.decode_steps_before.append(count_d)
            total += v * seg.repeat
            if d:
                total_d += v * seg.repeat
                count_d += seg.repeat

    def _at(self, step: int, decode_only: bool) -> tuple[float, int]:
        """(sum, decode steps) over issued steps [0, step)."""
        if step <= 0 or not self.starts:
            return 0.0, 0
        j = bisect_right(self.starts, step - 1) - 1
        inside = step - self.starts[j]
        if decode_only:
            own = inside if self.decode[j] else 0
            return (self.before_decode[j] + self.per_step[j] * own,
                    self.decode_steps_before[j] + own)
        return self.before[j] + self.per_step[j] * inside, 0

    def over(self, start: int, end: int, decode_only: bool = False) -> tuple[float, int]:
        """(sum, steps) over issued steps [start, end), decode-only ones if asked."""
        if end <= start:
            return 0.0, 0
        s1, d1 = self._at(end, decode_only)
        s0, d0 = self._at(start, decode_only)
        return s1 - s0, (d1 - d0 if decode_only else end - start)


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
    sums = StepSums(schedule.segments, value)
    out = []
    for span in schedule.spans:
        ttft, n_pre = sums.over(*span.prefill)
        total, n_dec = sums.over(span.decode[0], span.decode[1],
                                 decode_only=not schedule.decode_in_mixed)
        out.append(RequestFigures(ttft, n_pre, total / n_dec if n_dec else None, n_dec,
                                  span.waited_steps))
    return out


def summary(figures: Sequence[RequestFigures]) -> dict[str, dict[str, float | None]]:
    """p50 / p90 / p99 over requests of the TTFT and TPOT figures."""
    ttft = [f.ttft for f in figures]
    tpot = [f.tpot for f in figures if f.tpot is not None]
    return {"ttft": {f"p{p}": percentile(ttft, p) for p in PERCENTILES},
            "tpot": {f"p{p}": percentile(tpot, p) for p in PERCENTILES}}
