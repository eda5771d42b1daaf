"""Fits of a sweep: time = alpha + bytes x beta, per (collective, group size) and level.

One fit per (collective, group size), over the sweep's per-call time within runs of calls
back to back (`time_run_us`, sweep/cases.py `run_time`: what a replay's steps are made of);
sweeps written before that column existed are fitted on their median times. The fit
minimises the squared *relative* error, sum(((alpha + beta x) - t) / t)^2, so 8-byte and
128-MiB points count alike (plain least squares would fit the large sizes and miss the
small ones by orders of magnitude). alpha and beta are kept >= 0.

Piecewise where the data says so: libraries switch protocol (eager to rendezvous, ring to
tree) at some size, which bends the curve. Every split point leaving at least MIN_POINTS
sizes on each side is tried (two: a regime that starts at the sweep's last two sizes, as
MPICH's all-reduce did here from 512 KiB in a sweep to 1 MiB, 56 us at 256 KiB and 305 us at
512 KiB, still gets its piece; one line over both regimes predicted a 512 KiB replay 2.4x
low); the one with the least total squared relative error is kept
only if it at most halves the single line's error (SPLIT_GAIN) and the single line is off
by more than MIN_RMS (2%) on average: noise alone rarely halves the error, and a line that
already fits needs no split. A size at or above the first size of the upper piece uses it.
"""

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from microbench.argtypes import UsageError
from microbench.sweep.busbw import SweepOp, busbw_factor

MIN_POINTS = 2
MIN_KEPT = 4  # outliers are left out only while more than this many sizes stay
SPLIT_GAIN = 0.5
MIN_RMS = 0.02
# A point more than 5x outside what both neighbours allow is an outlier; 10x at either end,
# where one neighbour alone cannot tell a change of regime from noise.
OUTLIER = 5.0
OUTLIER_END = 10.0


@dataclass(frozen=True)
class Piece:
    from_bytes: int  # first size this piece covers
    alpha_us: float
    beta_us_per_byte: float

    def time_us(self, size_bytes: float) -> float:
        return self.alpha_us + self.beta_us_per_byte * size_bytes


@dataclass(frozen=True)
class Fit:
    op: str
    group_size: int
    pieces: tuple[Piece, ...]
    rms_rel_error: float
    points: int
    min_bytes: int
    max_bytes: int
    dropped: tuple[int, ...] = ()  # sizes left out as outliers
    scaled_from: int | None = None  # group size swept, when this fit is scaled from it
    stand_in: str | None = None  # the swept op whose fit stands in for this one's
    # The (size, time) points the fit was made from, outliers left out (one time a size);
    # empty for a fit scaled to another group size.
    measured: tuple[tuple[int, float], ...] = ()

    def measured_us(self, size_bytes: float) -> float:
        """The time the sweep measured at this size; between two measured sizes, the
        straight line between their times; outside the measured sizes, the fit.

        What a one-way transfer is priced by (analysis/costs.py): a fit's line misses a
        curve that bends within one piece, as a cache cliff bends it at the top of a CPU
        sweep (an MPI stream on one host here: 20.5 us at 512 KiB, 61.7 us at 1 MiB; the
        fit of 16 KiB to 1 MiB, 12.7% rms, said 22.2 us at 512 KiB, and a pipeline hop
        of 512 KiB took 19.6-20.6 us in the same minutes)."""
        if not self.measured or not (self.measured[0][0] <= size_bytes
                                     <= self.measured[-1][0]):
            return self.time_us(size_bytes)
        sizes, times = zip(*self.measured, strict=True)
        return float(np.interp(size_bytes, sizes, times))

    def measured_times_us(self, sizes: np.ndarray) -> np.ndarray:
        """`measured_us` of many sizes, the same floats."""
        if not self.measured:
            return self.times_us(sizes)
        xs, ts = (np.array(v, dtype=np.float64) for v in zip(*self.measured, strict=True))
        inside = (sizes >= xs[0]) & (sizes <= xs[-1])
        return np.where(inside, np.interp(sizes, xs, ts), self.times_us(sizes))

    def time_us(self, size_bytes: float) -> float:
        piece = self.pieces[0]
        for p in self.pieces[1:]:
            if size_bytes >= p.from_bytes:
                piece = p
        return piece.time_us(size_bytes)

    def times_us(self, sizes: np.ndarray) -> np.ndarray:
        """`time_us` of many sizes: each its piece's alpha + beta x size, the same floats."""
        alpha = np.full(len(sizes), self.pieces[0].alpha_us)
        beta = np.full(len(sizes), self.pieces[0].beta_us_per_byte)
        for p in self.pieces[1:]:
            later = sizes >= p.from_bytes
            alpha = np.where(later, p.alpha_us, alpha)
            beta = np.where(later, p.beta_us_per_byte, beta)
        return alpha + beta * sizes

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "group_size": self.group_size, "points": self.points,
                "rms_rel_error": round(self.rms_rel_error, 6),
                "min_bytes": self.min_bytes, "max_bytes": self.max_bytes,
                "dropped_bytes": list(self.dropped),
                **({"stand_in": self.stand_in} if self.stand_in else {}),
                "pieces": [{"from_bytes": p.from_bytes, "alpha_us": round(p.alpha_us, 6),
                            "beta_us_per_byte": p.beta_us_per_byte} for p in self.pieces]}


def fit_line(x: np.ndarray, t: np.ndarray) -> tuple[float, float, float]:
    """(alpha, beta, sum of squared relative errors) of the relative least-squares line."""
    if x.size == 1:  # one size: no slope to see, so a constant
        return float(t[0]), 0.0, 0.0
    w = 1.0 / t
    alpha, beta = np.linalg.lstsq(np.column_stack([w, x * w]), np.ones_like(t), rcond=None)[0]
    if alpha < 0:  # the best line through the origin
        alpha, beta = 0.0, float(np.sum(x * w) / np.sum((x * w) ** 2))
    if beta < 0:  # the best constant
        alpha, beta = float(np.sum(w) / np.sum(w ** 2)), 0.0
    error = float(np.sum(((alpha + beta * x) - t) ** 2 * w ** 2))
    return float(alpha), float(beta), error


def _miss(x: np.ndarray, t: np.ndarray, i: int, j: int) -> float:
    """How far t[i] lies outside what neighbour j allows: between flat (latency-bound) and
    proportional to size (bandwidth-bound) from t[j]; 1 or less inside that band."""
    scale = x[i] / x[j]
    low, high = t[j] * min(1.0, scale), t[j] * max(1.0, scale)
    return float(max(low / t[i], t[i] / high))


def drop_outliers(x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Leave out, one at a time, a point that every neighbour disowns: more than OUTLIER
    times outside the band each size beside it allows (OUTLIER_END at an end, which has one
    neighbour), while enough points stay. A median that a descheduled rank spoiled (8 ms for
    a 4 KiB allreduce of 23 us) would otherwise bend the whole line; a change of regime (out
    of cache, another protocol, a token bucket running dry) agrees with the sizes on its own
    side, and stays."""
    dropped: list[int] = []
    while x.size > MIN_KEPT and np.unique(x).size == x.size:
        scores = []
        for i in range(x.size):
            sides = [j for j in (i - 1, i + 1) if 0 <= j < x.size]
            limit = OUTLIER if len(sides) == 2 else OUTLIER_END
            scores.append(min(_miss(x, t, i, j) for j in sides) / limit)
        worst = int(np.argmax(scores))
        if scores[worst] <= 1:
            break
        dropped.append(int(x[worst]))
        keep = np.arange(x.size) != worst
        x, t = x[keep], t[keep]
    return x, t, dropped


def fit_points(op: str, group_size: int, sizes: list[int], times: list[float]) -> Fit:
    order = np.argsort(sizes, kind="stable")
    x = np.asarray(sizes, dtype=np.float64)[order]
    t = np.asarray(times, dtype=np.float64)[order]
    if np.any(t <= 0):
        raise UsageError(f"{op} over {group_size} ranks: a time of zero or less in the sweep")
    swept = int(x[0]), int(x[-1])  # a left-out size was still swept: no extrapolation
    x, t, dropped = drop_outliers(x, t)
    alpha, beta, error = fit_line(x, t)
    pieces: tuple[Piece, ...] = (Piece(int(x[0]), alpha, beta),)
    best = None
    for k in range(MIN_POINTS, x.size - MIN_POINTS + 1):
        if x[k] == x[k - 1]:  # a split must fall between two distinct sizes
            continue
        lo, hi = fit_line(x[:k], t[:k]), fit_line(x[k:], t[k:])
        total = lo[2] + hi[2]
        if best is None or total < best[0]:
            best = (total, k, lo, hi)
    rms = float(np.sqrt(error / x.size))
    if best is not None and rms > MIN_RMS and best[0] <= SPLIT_GAIN * error:
        total, k, lo, hi = best
        pieces = (Piece(int(x[0]), lo[0], lo[1]), Piece(int(x[k]), hi[0], hi[1]))
        rms = float(np.sqrt(total / x.size))
    return Fit(op, group_size, pieces, rms, int(x.size), swept[0], swept[1],
               tuple(sorted(dropped)), measured=_one_time_a_size(x, t))


def _one_time_a_size(x: np.ndarray, t: np.ndarray) -> tuple[tuple[int, float], ...]:
    """The points, sizes ascending, a size swept more than once at its mean time."""
    sizes = np.unique(x)
    return tuple((int(size), float(np.mean(t[x == size]))) for size in sizes)


def fit_levels(rows: list[dict[str, Any]]) -> dict[str, dict[tuple[str, int], Fit]]:
    """Fits per placement level ("intra", "inter") from sweep.csv rows; rows without a
    level (one node) are intra."""
    by_level: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_level.setdefault(r.get("level") or "intra", []).append(r)
    return {level: fit_sweep(level_rows) for level, level_rows in by_level.items()}


def fit_sweep(rows: list[dict[str, Any]]) -> dict[tuple[str, int], Fit]:
    """One fit per (op, group size) from sweep.csv rows (run times, else median times)."""
    points: dict[tuple[str, int], tuple[list[int], list[float]]] = {}
    for r in rows:
        sizes, times = points.setdefault((r["op"], int(r["group_size"])), ([], []))
        sizes.append(int(r["size_bytes"]))
        times.append(float(point_time(r)))
    return {key: fit_points(key[0], key[1], s, t) for key, (s, t) in points.items()}


def point_time(row: dict[str, Any]) -> float:
    """The time a fit reads from a sweep.csv row: `time_run_us` where the sweep wrote it."""
    run = row.get("time_run_us")
    if run is None or run == "" or (isinstance(run, float) and np.isnan(run)):
        return float(row["time_us"])
    return float(run)


# A sweep's per-call median (time_us) and its per-call time within runs of calls back to
# back (time_run_us) measure the same call; pipelining or a wait may part them by up to ~2x.
# Beyond this factor, either way, one of them caught something else (a descheduled rank, a
# stall): a fit on it prices noise. Seen: 4 KiB all-reduce at 10 us per call, 2808 us back to
# back, and a decode step predicted 192x too slow.
UNSTABLE_FACTOR = 4.0


def unstable_sizes(rows: list[dict[str, Any]]) -> list[str]:
    """One warning per sweep.csv row whose time_us and time_run_us disagree beyond
    UNSTABLE_FACTOR, naming the op, size and group size."""
    out = []
    for r in rows:
        run, call = r.get("time_run_us"), r.get("time_us")
        if run is None or call is None or run == "" or not (float(run) > 0 < float(call)):
            continue
        factor = max(float(run) / float(call), float(call) / float(run))
        if factor > UNSTABLE_FACTOR:
            out.append(f"unstable sweep: {r['op']} {_size(int(r['size_bytes']))} over "
                       f"{r['group_size']} ranks took {float(call):.4g} us per call but "
                       f"{float(run):.4g} us back to back ({factor:.0f}x, beyond "
                       f"{UNSTABLE_FACTOR:g}x): rerun the sweep; fits of it are unreliable")
    return out


def _size(n: int) -> str:
    from microbench.views.textfmt import format_bytes

    return format_bytes(n)


FitTable = dict[tuple[str, int], Fit]
LEVELS = ("intra", "inter")
# An average relative error above this makes a fit untrustworthy; `predict` says so.
LARGE_RMS = 0.25


def scaled(fit: Fit, n: int) -> Fit:
    """A fit for a group of n ranks from one of another size, by the ring algorithms'
    model: n - 1 latency steps where the sweep had its own count, and the same bus bandwidth
    (nccl-tests' factors, busbw.py), so the cost per byte scales with the factor. Rough: a
    library may pick a tree or another protocol at n; the output says when it is used."""
    steps = (n - 1) / (fit.group_size - 1)
    op = SweepOp(fit.op)
    per_byte = busbw_factor(op, n) / busbw_factor(op, fit.group_size)
    pieces = tuple(Piece(p.from_bytes, p.alpha_us * steps, p.beta_us_per_byte * per_byte)
                   for p in fit.pieces)
    return Fit(fit.op, n, pieces, fit.rms_rel_error, fit.points, fit.min_bytes,
               fit.max_bytes, fit.dropped, fit.group_size)


# What stands in for an op the sweep lacks, nearest first, priced at the same nccl-tests size
# and group (the notes name the op). A reduce-scatter, an all-to-all and a gather move
# (n-1)/n of that size per rank, as an all-gather does (busbw.py: the same bus-bandwidth
# factor), so its bandwidth term carries over (a reduce-scatter is the all-gather's ring run
# backwards plus a sum, not priced; an all-to-all's latency is n - 1 concurrent pairs, not a
# ring's n - 1 steps: approximate). A broadcast (vLLM V1's pipeline stages broadcast the
# sampled tokens, a few bytes) is priced as an all-reduce of its size: an all-reduce moves
# at least what a broadcast does (its reduce-scatter and all-gather halves), so an upper
# bound, and at a few bytes both are the library's latency. A one-way send is priced by the
# stream where the sweep has no sendrecv. An all-reduce has no stand-in: it carries the
# layers' activations, and a layout that needs one the sweep lacks is refused.
SUBSTITUTES: dict[SweepOp, tuple[SweepOp, ...]] = {
    SweepOp.REDUCESCATTER: (SweepOp.ALLGATHER, SweepOp.ALLREDUCE),
    SweepOp.ALLTOALL: (SweepOp.ALLGATHER, SweepOp.REDUCESCATTER, SweepOp.ALLREDUCE),
    SweepOp.GATHER: (SweepOp.ALLGATHER, SweepOp.ALLREDUCE),
    SweepOp.ALLGATHER: (SweepOp.REDUCESCATTER, SweepOp.ALLREDUCE),
    SweepOp.BROADCAST: (SweepOp.ALLREDUCE,),
    SweepOp.SENDRECV: (SweepOp.STREAM,),
}
STAND_INS = frozenset(SUBSTITUTES)


def _swept(fits: FitTable, op: SweepOp) -> list[int]:
    return sorted(k[1] for k, f in fits.items()
                  if k[0] == op.value and f.scaled_from is None and f.stand_in is None)


def fit_for(fits: FitTable, op: SweepOp, n: int) -> Fit:
    if (op.value, n) in fits:
        return fits[(op.value, n)]
    swept = _swept(fits, op)
    if not swept:  # the nearest op the sweep has, at this size and group
        base = next((b for b in SUBSTITUTES.get(op, ()) if _swept(fits, b)), None)
        if base is not None:
            fit = fit_for(fits, base, n)
            fits[(op.value, n)] = Fit(op.value, n, fit.pieces, fit.rms_rel_error, fit.points,
                                      fit.min_bytes, fit.max_bytes, fit.dropped,
                                      fit.scaled_from, base.value, fit.measured)
            return fits[(op.value, n)]
    if op in (SweepOp.SENDRECV, SweepOp.STREAM):  # a pair; a ring of more is next best
        if swept:
            return fits[(op.value, swept[0])]
    elif swept:  # the nearest swept group size, scaled (and cached for the next call)
        nearest = min(swept, key=lambda g: (abs(g - n), -g))
        fits[(op.value, n)] = scaled(fits[(op.value, nearest)], n)
        return fits[(op.value, n)]
    have = ", ".join(f"{o} n={g}" for o, g in sorted(fits)) or "nothing"
    raise UsageError(f"the sweep has no {op} over {n} ranks (it has {have}), and nothing "
                     f"that stands in for it; run `infercomm sweep --op {op} --nproc {n}` "
                     "or --from-pattern")


def stand_in_note(fits: FitTable, kind: SweepOp, n: int, notes: set[str]) -> None:
    """One note per op the sweep lacks, naming it and what priced it (SUBSTITUTES)."""
    if kind in STAND_INS:
        fit = fit_for(fits, kind, n)
        if fit.stand_in is not None:
            notes.add(f"the sweep has no {kind}: each is priced as the sweep's "
                      f"{fit.stand_in} at the same size and group (approximate; "
                      "analysis/fits.py SUBSTITUTES); "
                      f"sweep --op {kind} to measure it")


@dataclass
class Topology:
    """Where ranks sit, and the fits of each level; ranks_per_node None: one node."""

    intra: FitTable
    inter: FitTable | None = None
    ranks_per_node: int | None = None
    used: set[str] = field(default_factory=set)  # levels a prediction used
    # (sweep op, size, fit id) -> the fit a prediction read, for its notes
    fits_seen: dict[tuple[str, int, int], Fit] = field(default_factory=dict)
    notes: set[str] = field(default_factory=set)  # what a prediction priced by proxy

    def reset(self) -> None:
        """Forget what the last prediction used, before the next one."""
        self.used.clear()
        self.fits_seen.clear()
        self.notes.clear()

    def spans(self, ranks: "list[int] | tuple[int, ...]") -> bool:
        rpn = self.ranks_per_node
        return rpn is not None and len({r // rpn for r in ranks}) > 1

    def fits(self, ranks: "list[int] | tuple[int, ...]") -> FitTable:
        return self.fits_of([ranks])

    def fits_of(self, groups: "list[list[int]] | list[tuple[int, ...]]") -> FitTable:
        """The fits of the slowest of some groups that run one call together: the
        inter-node ones if any group spans nodes."""
        rpn = self.ranks_per_node
        level = "inter" if any(self.spans(g) for g in groups) else "intra"
        self.used.add(level)
        if level == "intra":
            return self.intra
        if self.inter is None:
            ranks = next(g for g in groups if self.spans(g))
            raise UsageError(f"ranks {list(ranks)} lie on more than one node of {rpn} ranks, and "
                             "no inter-node fits were given; pass --sweep-inter SWEEP_RUN "
                             "(a sweep across two nodes)")
        return self.inter


def topology_from(rows: list[dict[str, Any]], inter_rows: list[dict[str, Any]] | None,
                  ranks_per_node: int | None) -> Topology:
    """Intra fits from a sweep's one-node rows; inter fits from its rows that span nodes, or
    from a second sweep run across nodes (its spanning rows where it labels them, else all)."""
    levels = fit_levels(rows)
    if "intra" not in levels:
        raise UsageError("the sweep has no rows within one node; pass a one-node sweep as "
                         "--sweep and the one across nodes as --sweep-inter")
    inter = levels.get("inter")
    if inter_rows is not None:
        other = fit_levels(inter_rows)
        inter = other.get("inter") or other.get("intra")
    return Topology(levels["intra"], inter, ranks_per_node)
