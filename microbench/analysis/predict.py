"""Predict a pattern's communication time from a sweep: time = alpha + bytes x beta.

One fit per (collective, group size), over the sweep's median times. The fit minimises the
squared *relative* error, sum(((alpha + beta x) - t) / t)^2, so 8-byte and 128-MiB points
count alike (plain least squares would fit the large sizes and miss the small ones by
orders of magnitude). alpha and beta are kept >= 0.

Piecewise where the data says so: libraries switch protocol (eager to rendezvous, ring to
tree) at some size, which bends the curve. Every split point leaving at least MIN_POINTS
sizes on each side is tried; the one with the least total squared relative error is kept
only if it at most halves the single line's error (SPLIT_GAIN) and the single line is off
by more than MIN_RMS (2%) on average: noise alone rarely halves the error, and a line that
already fits needs no split. A size at or above the first size of the upper piece uses it.

A pattern call's predicted time is its sweep message's (nccl-tests size convention, see
busbw.py). A send or a recv is half a sendrecv iteration: in the sweep each rank issues one
send and one recv per iteration, one after the other.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np

from microbench.argtypes import UsageError
from microbench.sweep.busbw import SweepOp, pattern_message
from patterns import OpKind, Pattern, Phase

MIN_POINTS = 3
SPLIT_GAIN = 0.5
MIN_RMS = 0.02


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

    def time_us(self, size_bytes: float) -> float:
        piece = self.pieces[0]
        for p in self.pieces[1:]:
            if size_bytes >= p.from_bytes:
                piece = p
        return piece.time_us(size_bytes)

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "group_size": self.group_size, "points": self.points,
                "rms_rel_error": round(self.rms_rel_error, 6),
                "min_bytes": self.min_bytes, "max_bytes": self.max_bytes,
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


def fit_points(op: str, group_size: int, sizes: list[int], times: list[float]) -> Fit:
    order = np.argsort(sizes, kind="stable")
    x = np.asarray(sizes, dtype=np.float64)[order]
    t = np.asarray(times, dtype=np.float64)[order]
    if np.any(t <= 0):
        raise UsageError(f"{op} over {group_size} ranks: a time of zero or less in the sweep")
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
    return Fit(op, group_size, pieces, rms, int(x.size), int(x[0]), int(x[-1]))


def fit_sweep(rows: list[dict[str, Any]]) -> dict[tuple[str, int], Fit]:
    """One fit per (op, group size) from sweep.csv rows (median times)."""
    points: dict[tuple[str, int], tuple[list[int], list[float]]] = {}
    for r in rows:
        sizes, times = points.setdefault((r["op"], int(r["group_size"])), ([], []))
        sizes.append(int(r["size_bytes"]))
        times.append(float(r["time_us"]))
    return {key: fit_points(key[0], key[1], s, t) for key, (s, t) in points.items()}


def _fit_for(fits: dict[tuple[str, int], Fit], op: SweepOp, n: int) -> Fit:
    if (op.value, n) in fits:
        return fits[(op.value, n)]
    if op == SweepOp.SENDRECV:  # a pair is two ranks; a ring of more is the next best
        rings = sorted(k[1] for k in fits if k[0] == op.value)
        if rings:
            return fits[(op.value, rings[0])]
    have = ", ".join(f"{o} n={g}" for o, g in sorted(fits)) or "nothing"
    raise UsageError(f"the sweep has no {op} over {n} ranks (it has {have}); run "
                     f"`infercomm sweep --op {op} --nproc {n}` or --from-pattern")


def call_time_us(fits: dict[tuple[str, int], Fit], op: Any) -> float:
    kind, size, _, n = pattern_message(op)
    t = _fit_for(fits, kind, n).time_us(size)
    return t / 2 if op.kind in (OpKind.SEND, OpKind.RECV) else t


def predict_pattern(pattern: Pattern, fits: dict[tuple[str, int], Fit],
                    ) -> tuple[dict[str, float], list[str]]:
    """Predicted prefill, decode step, end to end and per op kind (each the stage with the
    largest figure, as replay reports the slowest rank's), and notes on extrapolation."""
    steps = pattern.workload.decode_steps
    per_stage: list[dict[str, float]] = []
    notes: set[str] = set()
    for runs in pattern.stages:
        figures = {"prefill_us": 0.0, "decode_us": 0.0}
        for run in runs:
            for op in run.step.ops:
                t = call_time_us(fits, op) * run.repeat
                phase = "prefill_us" if run.phase == Phase.PREFILL else "decode_us"
                figures[phase] += t
                figures[f"{op.kind.value}_us"] = figures.get(f"{op.kind.value}_us", 0.0) + t
                kind, size, _, n = pattern_message(op)
                fit = _fit_for(fits, kind, n)
                if not fit.min_bytes <= size <= fit.max_bytes:
                    notes.add(f"{kind} {size} B lies outside the swept {fit.min_bytes}-"
                              f"{fit.max_bytes} B over {fit.group_size} ranks: extrapolated")
        figures["e2e_us"] = figures["prefill_us"] + figures["decode_us"]
        per_stage.append(figures)
    keys = list(dict.fromkeys(k for f in per_stage for k in f))
    out = {k: max(f.get(k, 0.0) for f in per_stage) for k in keys}
    out["decode_step_us"] = out["decode_us"] / steps if steps else 0.0
    headline = ("prefill_us", "decode_step_us", "e2e_us")
    ordered = [*headline, *sorted(k for k in out if k not in (*headline, "decode_us"))]
    if not steps:
        ordered.remove("decode_step_us")
    return {k: out[k] for k in ordered}, sorted(notes)
