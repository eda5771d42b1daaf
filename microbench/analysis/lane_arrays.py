"""`plan --requests`'s lanes as arrays (analysis/workload_plan.py prices them): each lane's
segments and requests read once, the lanes of a layout stacked into one block (a row a
lane, segments padded), so that a layout's per-request sums, end-to-end totals and p90s are
a few numpy operations, not a million Python ones.

Every figure is the float `patterns.workload.metrics.SpanIndex.sums` gives, term for term:
a lane's running sums are `np.cumsum` along its row (a sequential sum, as
`itertools.accumulate`), each product and difference is one IEEE operation in the same
order, and a padded segment repeats 0 times, so it adds 0.0 to a row's sums. A request's
range with no start (None there) is placed at (segment 0, 0 steps), which sums to 0.0
exactly as None does.
"""

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

import numpy as np

from patterns.ops import Phase


@dataclass(frozen=True)
class LaneArrays:
    """What every layout of a lane's tp reads of it, found once (`Lanes.shared`)."""

    lane: Any  # the pattern, kept so that no id keyed on it is reused
    comm: np.ndarray  # per segment: its step's TP calls' time
    pairs: np.ndarray  # per segment: its step's (T, samples) number among the plan's
    shapes: np.ndarray  # per segment: its shape's number among the plan's shapes
    distinct_shapes: np.ndarray  # the lane's shape numbers, each once
    repeats: np.ndarray
    decode: np.ndarray  # per segment: a decode-only step
    decode_only: bool  # TPOT sums decode steps alone (the schedule's not decode_in_mixed)
    context: float  # the mean context of the lane's requests
    kv_tokens: int
    prefill: np.ndarray  # per request, int rows: start segment, steps in, end segment, steps
    prefill_steps: np.ndarray  # per request: its prefill steps (0: none)
    decode_at: np.ndarray  # the same four of its decode range (decode steps alone if so)
    decode_steps: np.ndarray  # per request: its decode steps (0: no TPOT)


def lane_arrays(lane: Any, comm: list[float], pairs: list[int], shapes: list[int],
                kv_tokens: int) -> LaneArrays:
    """A lane's arrays: `comm`, `pairs`, `shapes` per segment, numbered by the caller."""
    schedule = lane.schedule
    segments = schedule.segments
    starts = [s.start for s in segments]
    decode = [s.shape.phase == Phase.DECODE for s in segments]
    decode_before, seen = [], 0  # decode steps before each segment
    for seg, d in zip(segments, decode, strict=True):
        decode_before.append(seen)
        seen += seg.repeat if d else 0
    decode_only = not schedule.decode_in_mixed

    def where(step: int) -> tuple[int, int]:
        """Where issued steps [0, step) end (SpanIndex.where; None as (0, 0))."""
        if step <= 0 or not starts:
            return 0, 0
        j = bisect_right(starts, step - 1) - 1
        return j, step - starts[j]

    def where_decode(step: int) -> tuple[int, int, int]:
        """The same over decode steps alone, and how many precede (SpanIndex.where_decode)."""
        if step <= 0 or not starts:
            return 0, 0, 0
        j, k = where(step)
        own = k if decode[j] else 0
        return j, own, decode_before[j] + own

    prefill, prefill_steps, decode_at, decode_steps = [], [], [], []
    for span in schedule.spans:
        (p0, p1), (d0, d1) = span.prefill, span.decode
        if p1 > p0:
            prefill.append((*where(p0), *where(p1)))
            prefill_steps.append(p1 - p0)
        else:
            prefill.append((0, 0, 0, 0))
            prefill_steps.append(0)
        if d1 > d0 and decode_only:
            j0, k0, c0 = where_decode(d0)
            j1, k1, c1 = where_decode(d1)
            decode_at.append((j0, k0, j1, k1))
            decode_steps.append(c1 - c0)
        elif d1 > d0:
            decode_at.append((*where(d0), *where(d1)))
            decode_steps.append(d1 - d0)
        else:
            decode_at.append((0, 0, 0, 0))
            decode_steps.append(0)
    requests = lane.requests
    return LaneArrays(
        lane, np.array(comm, dtype=np.float64), np.array(pairs, dtype=np.int64),
        np.array(shapes, dtype=np.int64), np.array(sorted(set(shapes)), dtype=np.int64),
        np.array([s.repeat for s in segments], dtype=np.int64), np.array(decode, dtype=bool),
        decode_only, sum(r.prompt + r.output / 2 for r in requests) / len(requests),
        kv_tokens, np.array(prefill, dtype=np.int64).reshape(-1, 4),
        np.array(prefill_steps, dtype=np.int64), np.array(decode_at, dtype=np.int64).reshape(-1, 4),
        np.array(decode_steps, dtype=np.int64))


class Block:
    """A layout's lanes stacked, a row each (in the order first given: a layout's own order
    is `rows`), segments padded to the longest lane's with 0 repeats."""

    def __init__(self, lanes: list[LaneArrays], floor_args: list[tuple[int, float, int]],
                 ) -> None:
        """`floor_args`: by shape number, its prefill tokens, causal pairs and decoding
        sequences (compute.step_floors' arguments)."""
        self.lanes = lanes
        self.prefill_tokens = np.array([a[0] for a in floor_args], dtype=np.int64)
        self.prefill_pairs = np.array([a[1] for a in floor_args], dtype=np.float64)
        self.decode_seqs = np.array([a[2] for a in floor_args], dtype=np.int64)
        self.row_of = {id(a.lane): r for r, a in enumerate(lanes)}
        count, width = len(lanes), max(len(a.repeats) for a in lanes)
        self.width = width

        def padded(name: str, dtype: Any) -> np.ndarray:
            out = np.zeros((count, width), dtype=dtype)
            for r, a in enumerate(lanes):
                values = getattr(a, name)
                out[r, :len(values)] = values
            return out

        self.comm = padded("comm", np.float64)
        self.repeats = padded("repeats", np.int64)
        self.decode = padded("decode", bool)
        self.decode_only = np.array([a.decode_only for a in lanes])
        # The (T, samples) numbers the block's steps use, and each segment's among them.
        self.pair_numbers, inverse = np.unique(padded("pairs", np.int64), return_inverse=True)
        self.pair_index = inverse.reshape(count, width)
        # Floors are kept by (rounded context, shape) (workload_plan.price_lanes): each
        # lane's distinct shapes, as keys, and each segment's key.
        self.context = np.array([a.context for a in lanes], dtype=np.float64)
        rounded = np.array([round(a.context) for a in lanes], dtype=np.int64)
        key_lane = np.repeat(np.arange(count), [len(a.distinct_shapes) for a in lanes])
        key_shape = np.concatenate([a.distinct_shapes for a in lanes])
        span = int(key_shape.max()) + 1
        keys, self.key_of_entry = np.unique(rounded[key_lane] * span + key_shape,
                                            return_inverse=True)
        self.entry_lane, self.entry_shape = key_lane, key_shape
        self.keys = len(keys)
        shapes = padded("shapes", np.int64)  # a padded segment's key is any: it repeats 0 times
        self.segment_key = np.minimum(np.searchsorted(keys, rounded[:, None] * span + shapes),
                                      len(keys) - 1)
        # Requests: their lane's row and their ranges as flat indices into the row-major
        # (count, width) per-step table and the (count, width + 1) running sums.
        row = np.repeat(np.arange(count), [len(a.prefill_steps) for a in lanes])
        self.prefill = self._flat(row, np.concatenate([a.prefill for a in lanes]))
        self.prefill_steps = np.concatenate([a.prefill_steps for a in lanes])
        self.decode_at = self._flat(row, np.concatenate([a.decode_at for a in lanes]))
        self.decode_steps = np.concatenate([a.decode_steps for a in lanes])
        self.request_decode_only = self.decode_only[row]

    def first_asked(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per floor key, the row of the first lane with it in a layout's order (`rows`: the
        block's row of each of the layout's lanes), and its shape number."""
        position = np.empty(len(rows), dtype=np.int64)
        position[rows] = np.arange(len(rows))
        order = np.argsort(position[self.entry_lane], kind="stable")
        first = order[np.unique(self.key_of_entry[order], return_index=True)[1]]
        return self.entry_lane[first], self.entry_shape[first]

    def _flat(self, row: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, ...]:
        """(start segment, start steps, end segment, end steps) as indices into the per-step
        table and into the running sums, with the steps as they are."""
        w = self.width
        return (row * w + at[:, 0], row * (w + 1) + at[:, 0], at[:, 1],
                row * w + at[:, 2], row * (w + 1) + at[:, 2], at[:, 3])

    def sums(self, per_step: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """Per request the TTFT figure and, of those that decode, the TPOT one
        (SpanIndex.sums), and the longest lane's total (0.0 at least)."""
        steps = per_step * self.repeats
        before = np.zeros((len(self.lanes), self.width + 1))
        np.cumsum(steps, axis=1, out=before[:, 1:])
        flat, values = before.ravel(), per_step.ravel()
        s0, b0, k0, s1, b1, k1 = self.prefill
        ttft = (flat[b1] + values[s1] * k1) - (flat[b0] + values[s0] * k0)
        ttft = np.where(self.prefill_steps > 0, ttft, 0.0)
        if self.request_decode_only.any():
            decoded = np.zeros_like(before)
            np.cumsum(np.where(self.decode, steps, 0.0), axis=1, out=decoded[:, 1:])
            decoded = np.where(self.decode_only[:, None], decoded, before).ravel()
        else:
            decoded = flat
        s0, b0, k0, s1, b1, k1 = self.decode_at
        has = self.decode_steps > 0
        tpot = ((decoded[b1] + values[s1] * k1) - (decoded[b0] + values[s0] * k0))[has]
        return ttft, tpot / self.decode_steps[has], max(0.0, float(before[:, -1].max()))


def p90(values: np.ndarray) -> float:
    """metrics.percentile(values, 90) (linear between closest ranks), 0 where there is none:
    the two ranks found by partition, not a sort."""
    if not len(values):
        return 0.0
    rank = 90 / 100 * (len(values) - 1)
    low = int(rank)
    high = min(low + 1, len(values) - 1)
    part = np.partition(values, (low, high))
    a, b = float(part[low]), float(part[high])
    return a + (b - a) * (rank - low) or 0.0
