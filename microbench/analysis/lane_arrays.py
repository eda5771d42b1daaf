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

import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

import numpy as np

from patterns.ops import Phase


def op_key(op: Any) -> tuple[Any, ...]:
    """What a call's cost and volume follow from: its ops differ by tag alone layer to layer."""
    return (op.kind, op.group, op.group_size, op.shape, op.out_shape, op.dtype, op.transport,
            op.counts)


def step_sums(ops: tuple[Any, ...], memo: dict[Any, Any], by_key: dict[Any, Any],
              value: Any) -> tuple[float, float]:
    """`value(op)`'s two figures (a time, a byte count) each summed over a step's calls in
    their order, as `own += figure` would. Steps that share every call but the last (one
    forward, its logits rows apart) share the sum of those: found by the last shared call's
    id and checked equal (identical objects compare at once; equal calls have equal
    figures, which follow from `op_key`). A call object is valued once. `memo` keeps what
    it keys by id with the objects, so no id is reused while it is kept."""
    hit = memo.get(id(ops))
    if hit is not None:
        return hit[0]
    head = ops[:-1]
    key = ("head", len(ops), id(head[-1]) if head else None)
    prefix = memo.get(key)
    if prefix is None or prefix[1] != head:
        # A layer's calls repeat as a few objects (profile.forward's untagged): each valued
        # once, then added in call order.
        ids = list(map(id, head))
        values = {i: _call_value(op, memo, by_key, value)
                  for i, op in dict(zip(ids, head, strict=True)).items()}
        time = size = 0.0
        for t, b in map(values.__getitem__, ids):
            time += t
            size += b
        prefix = memo[key] = ((time, size), head)
    time, size = prefix[0]
    if ops:
        t, b = _call_value(ops[-1], memo, by_key, value)
        time += t
        size += b
    memo[id(ops)] = ((time, size), ops)
    return time, size


def _call_value(op: Any, memo: dict[Any, Any], by_key: dict[Any, Any],
                value: Any) -> tuple[float, float]:
    hit = memo.get(("op", id(op)))
    if hit is None:
        key = op_key(op)
        v = by_key.get(key)
        if v is None:
            v = by_key[key] = value(op)
        hit = memo[("op", id(op))] = (v, op)
    return hit[0]


SHAPE_FIELDS = ("prefill_tokens", "prefill_seqs", "decode_seqs", "decode_tokens", "samples",
                "padded_prompts")  # a StepShape's, in a row of `LaneArrays.shapes`


@dataclass(frozen=True)
class LaneArrays:
    """What every layout of a lane's tp reads of it, found once (`Lanes.shared`)."""

    lane: Any  # the pattern, kept so that no id keyed on it is reused
    comm: np.ndarray  # per segment: its step's TP calls' time
    volume: np.ndarray  # per segment: its step's calls' bytes (a float sum)
    volume_sums: tuple[int, int, int]  # calls' bytes, tokens, sampled bytes over every step
    tokens: np.ndarray  # per segment: its step's T
    shapes: np.ndarray  # per segment: its shape, SHAPE_FIELDS
    repeats: np.ndarray
    decode: np.ndarray  # per segment: a decode-only step
    decode_only: bool  # TPOT sums decode steps alone (the schedule's not decode_in_mixed)
    context: float  # the mean context of the lane's requests
    kv_tokens: int
    prefill: np.ndarray  # per request, int rows: start segment, steps in, end segment, steps
    prefill_steps: np.ndarray  # per request: its prefill steps (0: none)
    decode_at: np.ndarray  # the same four of its decode range (decode steps alone if so)
    decode_steps: np.ndarray  # per request: its decode steps (0: no TPOT)

    def volume_rows(self) -> list[tuple[float, int, int, int]]:
        """Per segment: its calls' bytes, T, sampled tokens' bytes (vLLM broadcasts an
        int64 [S, 1] and an int32 [S + 1, 1] to every stage) and repeat."""
        samples = self.shapes[:, 4].tolist()
        return list(zip(self.volume.tolist(), self.tokens.tolist(),
                        [8 * s + 4 * (s + 1) if s else 0 for s in samples],
                        self.repeats.tolist(), strict=True))


def lane_arrays(lane: Any, figures: list[tuple[float, float]], kv_tokens: int) -> LaneArrays:
    """A lane's arrays: `figures`, per segment its step's calls' (time, bytes)."""
    schedule = lane.schedule
    segments = schedule.segments
    starts = [s.start for s in segments]
    repeats = [s.repeat for s in segments]
    decode = [s.shape.phase == Phase.DECODE for s in segments]
    decode_before, seen = [], 0  # decode steps before each segment
    for repeat, d in zip(repeats, decode, strict=True):
        decode_before.append(seen)
        seen += repeat if d else 0
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

    def placed(lo: int, hi: int, only_decode: bool) -> tuple[tuple[int, ...], int]:
        """Where issued steps [lo, hi) start and end, and how many count (over decode steps
        alone where only_decode); an empty span (0, 0, 0, 0) and none."""
        if hi <= lo:
            return (0, 0, 0, 0), 0
        if not only_decode:
            return (*where(lo), *where(hi)), hi - lo
        (j0, k0, c0), (j1, k1, c1) = where_decode(lo), where_decode(hi)
        return (j0, k0, j1, k1), c1 - c0

    prefill, prefill_steps, decode_at, decode_steps = [], [], [], []
    for span in schedule.spans:
        at, count = placed(*span.prefill, False)
        prefill.append(at)
        prefill_steps.append(count)
        at, count = placed(*span.decode, decode_only)
        decode_at.append(at)
        decode_steps.append(count)
    requests = lane.requests
    shapes = np.array([[getattr(s.shape, f) for f in SHAPE_FIELDS] for s in segments],
                      dtype=np.int64).reshape(-1, len(SHAPE_FIELDS))
    tokens = [step.tokens for step in lane.segment_steps]
    volume = [f[1] for f in figures]
    sampled = [8 * s.shape.samples + 4 * (s.shape.samples + 1) if s.shape.samples else 0
               for s in segments]
    # Whole numbers of bytes, summed exactly (Python ints): lanes_volume's fast path.
    sums = (sum(int(v) * r for v, r in zip(volume, repeats, strict=True)),
            sum(t * r for t, r in zip(tokens, repeats, strict=True)),
            sum(b * r for b, r in zip(sampled, repeats, strict=True)))
    return LaneArrays(
        lane, np.array([f[0] for f in figures], dtype=np.float64),
        np.array(volume, dtype=np.float64), sums, np.array(tokens, dtype=np.int64),
        shapes, np.array(repeats, dtype=np.int64), np.array(decode, dtype=bool), decode_only,
        sum(r.prompt + r.output / 2 for r in requests) / len(requests), kv_tokens,
        np.array(prefill, dtype=np.int64).reshape(-1, 4),
        np.array(prefill_steps, dtype=np.int64),
        np.array(decode_at, dtype=np.int64).reshape(-1, 4),
        np.array(decode_steps, dtype=np.int64))


class Block:
    """A layout's lanes stacked, a row each (in the order first given: a layout's own order
    is `rows`), segments padded to the longest lane's with 0 repeats."""

    def __init__(self, lanes: list[LaneArrays]) -> None:
        self.lanes = lanes
        self.row_of = {id(a.lane): r for r, a in enumerate(lanes)}
        count, width = len(lanes), max(len(a.repeats) for a in lanes)
        self.width = width
        lengths = [len(a.repeats) for a in lanes]
        seg_row = np.repeat(np.arange(count), lengths)  # each real segment's row and column
        seg_col = np.concatenate([np.arange(n) for n in lengths])

        def padded(values: np.ndarray, dtype: Any) -> np.ndarray:
            out = np.zeros((count, width), dtype=dtype)
            out[seg_row, seg_col] = values
            return out

        self.comm = padded(np.concatenate([a.comm for a in lanes]), np.float64)
        self.repeats = padded(np.concatenate([a.repeats for a in lanes]), np.int64)
        self.decode = padded(np.concatenate([a.decode for a in lanes]), bool)
        self.decode_only = np.array([a.decode_only for a in lanes])
        # The (T, samples) the block's steps take, and each segment's among them.
        fields = np.concatenate([a.shapes for a in lanes])
        self.pairs, pair_of = unique_rows(
            np.stack([np.concatenate([a.tokens for a in lanes]), fields[:, 4]], axis=1))
        self.pair_index = padded(pair_of, np.int64)
        # Compute floors' arguments by shape (as price_lanes gave them, one at a time):
        # prompt tokens, their causal pairs (chunks of tokens / seqs each), decode tokens.
        shapes, shape_of = unique_rows(fields)
        self.prefill_tokens, seqs = shapes[:, 0], shapes[:, 1]
        chunk = np.where(seqs > 0, self.prefill_tokens / np.maximum(seqs, 1), 0.0)
        self.prefill_pairs = np.where(seqs > 0, self.prefill_tokens * chunk / 2, 0.0)
        self.decode_seqs = shapes[:, 2] * shapes[:, 3]
        # Floors are kept by (rounded context, shape) (workload_plan.price_lanes): each
        # lane's distinct shapes are entries, and each segment has its key.
        n = len(shapes)
        self.context = np.array([a.context for a in lanes], dtype=np.float64)
        rounded = np.array([round(a.context) for a in lanes], dtype=np.int64)
        entries = np.unique(seg_row * n + shape_of)
        self.entry_lane, self.entry_shape = entries // n, entries % n
        keys, self.key_of_entry = np.unique(rounded[self.entry_lane] * n + self.entry_shape,
                                            return_inverse=True)
        self.key_of_entry = self.key_of_entry.ravel()
        self.segment_key = padded(np.searchsorted(keys, rounded[seg_row] * n + shape_of),
                                  np.int64)
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


def unique_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A table's distinct rows and each row's number among them, as np.unique(axis=0) (in
    another order), by one integer a row where its columns' ranges allow (sorting rows as
    bytes is ten times slower)."""
    spans = [int(x) + 1 for x in table.max(axis=0)] if len(table) else []
    if len(table) and table.min() >= 0 and math.prod(spans) < 2 ** 62:
        weights = np.array([math.prod(spans[:i]) for i in range(len(spans))], dtype=np.int64)
        _, first, inverse = np.unique(table @ weights, return_index=True, return_inverse=True)
        return table[first], inverse.ravel()
    rows, inverse = np.unique(table, axis=0, return_inverse=True)
    return rows, inverse.ravel()


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
