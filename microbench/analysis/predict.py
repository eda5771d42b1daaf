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

A collective's predicted time is its sweep message's (nccl-tests size convention, see
busbw.py). A transfer between pipeline stages has two costs (LogP's latency and gap): its
latency, half a sendrecv iteration (each rank of the sweep's ring sends and receives one after
the other, so an iteration is two one-way trips), and its gap, a `stream` iteration (the rate
at which a stream of messages is passed on; the latency where the sweep has no stream).

What is modelled is the replay that is measured (microbench/replay/replayer.py): after a
barrier every rank issues its stage's calls back to back, with no barrier inside an inference,
and each figure is the slowest rank's (prefill: end of the prefill; decode: end minus end of
prefill; end to end). A stage is one clock (its ranks run the same calls; a collective costs
the group the fit's time). A send costs its stage the gap and its data arrives a latency after
the send began; a recv ends at the later of its own clock plus the gap and that arrival. So
the prefill, and a step whose upstream stages are still busy, cost the chain along the
pipeline, and the steady state of the decode steps runs at the busiest stage's rate.

This is the replay, not the engine: the replay has no dependency from the last stage back to
the first (the engine's step k+1 needs step k's sampled token; the pattern does not carry that
transfer), so stage 0 begins decode step k+1 while later stages are still on step k, as the
MPI and gloo replays do (their sends return once the data is handed to the library).
`token_order=True` models the engine's order instead (`plan` uses it): a decode step begins
on the first stage once the last stage has finished the previous one.

Runs of identical steps are not expanded: each is simulated for a few steps until every stage
advances by a fixed amount per step (the pipeline's transient lasts about as many steps as
there are stages), then extrapolated, so the cost does not grow with the decode length.

Two levels: given the ranks per node (consecutive ranks per node, TP innermost, then PP, then
DP: global rank = (dp_rank x pp + pp_rank) x tp + tp_rank, `patterns.groups`), a group whose
ranks lie on more than one node (tp, dp, ep, pp_broadcast), or a transfer between stages on
different nodes, uses the inter-node fits.

Data parallelism: every DP rank runs its own run list (`Pattern.replicas()`; they differ under
uneven --dp-batches) through its own stages. A collective on the `dp` or `ep` group joins
the DP ranks of one stage: it begins when the last of them reaches it (each DP rank's k-th
such call pairs with the others' k-th, as the engine's aligned steps issue them) and costs
each the group's fit from there. Without such calls the DP ranks are independent replicas,
and only the distinct ones are simulated (same run list and the same position against node
boundaries price the same). Each figure is the slowest DP rank's, as replay reports the
slowest rank's.
"""

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from microbench.argtypes import UsageError
from microbench.sweep.busbw import SweepOp, busbw_factor, pattern_message
from patterns import Op, OpKind, Pattern, Phase, Transport
from patterns.groups import rank_of
from patterns.layout import Layout
from patterns.pattern import Run

MIN_POINTS = 3
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
    while x.size > MIN_POINTS + 1 and np.unique(x).size == x.size:
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
               tuple(sorted(dropped)))


def fit_levels(rows: list[dict[str, Any]]) -> dict[str, dict[tuple[str, int], Fit]]:
    """Fits per placement level ("intra", "inter") from sweep.csv rows; rows without a
    level (one node) are intra."""
    by_level: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_level.setdefault(r.get("level") or "intra", []).append(r)
    return {level: fit_sweep(level_rows) for level, level_rows in by_level.items()}


def fit_sweep(rows: list[dict[str, Any]]) -> dict[tuple[str, int], Fit]:
    """One fit per (op, group size) from sweep.csv rows (median times)."""
    points: dict[tuple[str, int], tuple[list[int], list[float]]] = {}
    for r in rows:
        sizes, times = points.setdefault((r["op"], int(r["group_size"])), ([], []))
        sizes.append(int(r["size_bytes"]))
        times.append(float(r["time_us"]))
    return {key: fit_points(key[0], key[1], s, t) for key, (s, t) in points.items()}


FitTable = dict[tuple[str, int], Fit]
LEVELS = ("intra", "inter")
TRANSIENT_STEPS = 4  # steps simulated beyond the stage count before extrapolating
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


# Collectives an all-gather of the same nccl-tests size stands in for when the sweep lacks
# them (the notes say so). Per rank all three move (n-1)/n of that size (busbw.py: the same
# bus-bandwidth factor), so the bandwidth term carries over. A reduce-scatter is the
# all-gather's ring run backwards plus a sum (close, but the sum is not priced); an
# all-to-all's latency is not a ring's n - 1 steps but n - 1 concurrent pairs: approximate.
STAND_INS = frozenset({SweepOp.ALLTOALL, SweepOp.REDUCESCATTER})


def _fit_for(fits: FitTable, op: SweepOp, n: int) -> Fit:
    if (op.value, n) in fits:
        return fits[(op.value, n)]
    swept = sorted(k[1] for k, f in fits.items()
                   if k[0] == op.value and f.scaled_from is None and f.stand_in is None)
    if op in STAND_INS and not swept and any(
            k[0] == SweepOp.ALLGATHER.value for k in fits):
        base = _fit_for(fits, SweepOp.ALLGATHER, n)
        fits[(op.value, n)] = Fit(op.value, n, base.pieces, base.rms_rel_error, base.points,
                                  base.min_bytes, base.max_bytes, base.dropped,
                                  base.scaled_from, SweepOp.ALLGATHER.value)
        return fits[(op.value, n)]
    if op in (SweepOp.SENDRECV, SweepOp.STREAM):  # a pair; a ring of more is next best
        if swept:
            return fits[(op.value, swept[0])]
    elif swept:  # the nearest swept group size, scaled (and cached for the next call)
        nearest = min(swept, key=lambda g: (abs(g - n), -g))
        fits[(op.value, n)] = scaled(fits[(op.value, nearest)], n)
        return fits[(op.value, n)]
    have = ", ".join(f"{o} n={g}" for o, g in sorted(fits)) or "nothing"
    raise UsageError(f"the sweep has no {op} over {n} ranks (it has {have}); run "
                     f"`infercomm sweep --op {op} --nproc {n}` or --from-pattern")


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


def call_time_us(fits: FitTable, op: Op) -> float:
    """One call's time in isolation: a collective's fit, or a transfer's latency."""
    kind, size, _, n = pattern_message(op)
    t = _fit_for(fits, kind, n).time_us(size)
    return t / 2 if op.kind in (OpKind.SEND, OpKind.RECV) else t


def gap_us(fits: FitTable, op: Op) -> float:
    """A transfer's gap: the stream fit where the sweep has one, else its latency."""
    if any(k[0] == SweepOp.STREAM.value for k in fits):
        _, size, _, n = pattern_message(op)
        return _fit_for(fits, SweepOp.STREAM, n).time_us(size)
    return call_time_us(fits, op)


# Group kinds whose calls join the DP ranks of one stage (the engine's DP all-reduce, MoE
# dispatch and combine).
DP_GROUPS = frozenset({"dp", "ep"})


@dataclass(frozen=True)
class Cost:
    """One call of one stage: what it costs the stage's clock, and for a transfer, its
    latency and the other stage; `joins` for a call on the dp or ep group, which waits for
    the same stage of every DP rank."""

    kind: str
    busy_us: float
    latency_us: float = 0.0
    peer_stage: int | None = None
    joins: bool = False


def groups_at(layout: Layout, kind: str, dp_rank: int, stage: int) -> list[list[int]]:
    """The groups of `kind` that the ranks of one (DP rank, stage) call together."""
    dp, pp, tp = layout.dp, layout.pp, layout.tp
    if kind == "tp":
        return [[rank_of(layout, dp_rank, stage, t) for t in range(tp)]]
    if kind == "dp":
        return [[rank_of(layout, d, stage, t) for d in range(dp)] for t in range(tp)]
    if kind == "ep":
        return [[rank_of(layout, d, stage, t) for d in range(dp) for t in range(tp)]]
    if kind in ("pp", "pp_broadcast"):
        return [[rank_of(layout, dp_rank, s, t) for s in range(pp)] for t in range(tp)]
    raise UsageError(f"the pattern names a group {kind!r} that predict cannot place; "
                     "one of tp, pp, dp, ep, pp_broadcast")


class Costs:
    """Each distinct (DP rank, stage, op)'s cost, computed once (patterns repeat a handful of
    ops; DP ranks differ only where their groups sit differently against node boundaries)."""

    def __init__(self, pattern: Pattern, topology: Topology) -> None:
        self.layout, self.topology = pattern.layout, topology
        self.cache: dict[tuple[int, int, Op], Cost] = {}
        self.fits_seen = topology.fits_seen

    def _note(self, fits: FitTable, op: Op, kind: SweepOp | None = None) -> None:
        k, size, _, n = pattern_message(op)
        kind = kind or k
        fit = _fit_for(fits, kind, n)
        self.fits_seen[(kind.value, size, id(fit))] = fit

    def of(self, dp_rank: int, stage: int, op: Op) -> Cost:
        # A dp or ep call's groups are the same for every DP rank of the stage; any other
        # call's sit against node boundaries as the replica's first rank does (its offset
        # within its node), so DP ranks at the same offset share one cost.
        rpn, layout = self.topology.ranks_per_node, self.layout
        place = (0 if op.group in DP_GROUPS or not rpn
                 else dp_rank * layout.tp * layout.pp % rpn)
        key = (place, stage, op)
        cost = self.cache.get(key)
        if cost is None:
            cost = self.cache[key] = self._cost(dp_rank, stage, op)
        return cost

    def _cost(self, dp_rank: int, stage: int, op: Op) -> Cost:
        layout = self.layout
        if op.kind in (OpKind.SEND, OpKind.RECV):
            peer = op.peer if op.peer is not None else stage
            # Every TP rank of the stage sends to its counterpart; the slowest pair counts.
            fits = self.topology.fits_of(
                [[rank_of(layout, dp_rank, stage, t), rank_of(layout, dp_rank, peer, t)]
                 for t in range(layout.tp)])
            self._note(fits, op)
            if any(k[0] == SweepOp.STREAM.value for k in fits):
                self._note(fits, op, SweepOp.STREAM)
            return Cost(op.kind.value, gap_us(fits, op), call_time_us(fits, op), peer)
        fits = self.topology.fits_of(groups_at(layout, op.group, dp_rank, stage))
        self._note(fits, op)
        if op.transport == Transport.GLOO:
            self.topology.notes.add(
                f"{op.tag} ({op.kind} over the {op.group} group of {op.group_size}) runs on "
                "gloo (CPU) in the engine; it is priced from the sweep's own backend, as "
                "replay issues it")
        kind = pattern_message(op)[0]
        if kind in STAND_INS:
            fit = _fit_for(fits, kind, op.group_size)
            if fit.stand_in is not None:
                self.topology.notes.add(
                    f"{kind} over {op.group_size} ranks: the sweep has no {kind}; priced as "
                    f"a {fit.stand_in} of the same size (the same bytes per rank; "
                    f"approximate): sweep --op {kind} to measure it")
        # An uneven all-gather or reduce-scatter (Op.counts) is priced by its total, as
        # pattern_message sizes it: vLLM's all_gatherv / reduce_scatterv issue one
        # broadcast / reduce per part (pynccl.py), so each part crosses every link once and
        # the links carry the total, as an even call of that total does. The largest part
        # times n would price padding that is never sent.
        return Cost(op.kind.value, call_time_us(fits, op),
                    joins=op.group in DP_GROUPS and layout.dp > 1)


class Pipeline:
    """The clocks of some DP ranks' stages (index i x pp + stage for the i-th DP rank
    simulated), per-kind totals and the transfers in flight between stages."""

    def __init__(self, replicas: int, pp: int) -> None:
        self.pp = pp
        self.clock = [0.0] * (replicas * pp)
        self.kinds: list[dict[str, float]] = [{} for _ in self.clock]
        self.arrivals: dict[tuple[int, int], list[float]] = {}  # (from, to) -> FIFO

    def _spend(self, stage: int, cost: Cost, before: float) -> None:
        kinds = self.kinds[stage]
        kinds[cost.kind] = kinds.get(cost.kind, 0.0) + self.clock[stage] - before

    def issue(self, stage: int, cost: Cost) -> None:
        before = self.clock[stage]
        base = stage - stage % self.pp  # stage 0 of this DP rank
        if cost.kind == OpKind.SEND:
            queue = self.arrivals.setdefault((stage, base + (cost.peer_stage or 0)), [])
            queue.append(before + cost.latency_us)
            self.clock[stage] = before + cost.busy_us
        elif cost.kind == OpKind.RECV:
            queue = self.arrivals.get((base + (cost.peer_stage or 0), stage))
            if not queue:
                raise UsageError(f"stage {stage % self.pp} receives from stage "
                                 f"{cost.peer_stage} before it sends: the pattern's steps "
                                 "do not pair up")
            self.clock[stage] = max(before + cost.busy_us, queue.pop(0))
        else:
            self.clock[stage] = before + cost.busy_us
        self._spend(stage, cost, before)

    def _ready(self, stage: int, cost: Cost) -> bool:
        base = stage - stage % self.pp
        return not (cost.kind == OpKind.RECV
                    and not self.arrivals.get((base + (cost.peer_stage or 0), stage)))

    def step(self, ops: list[list[Cost]]) -> None:
        """One step of every stage, in an order that respects each transfer and each call
        that joins the DP ranks: a stage issues calls until a recv whose data is not yet
        sent, or a joining call that another DP rank has not reached, then the next stage
        takes over. A joining call begins on all its DP ranks at the latest one's clock."""
        position = [0] * len(ops)
        # Stages waiting at a joining call, per stage column: the last to arrive issues it.
        arrived, waiting = [False] * len(ops), [0] * self.pp
        replicas = len(ops) // self.pp
        while True:
            progressed = False
            for s, stage_ops in enumerate(ops):
                while position[s] < len(stage_ops):
                    cost = stage_ops[position[s]]
                    if cost.joins:
                        column = s % self.pp
                        if not arrived[s]:
                            arrived[s] = True
                            waiting[column] += 1
                        if waiting[column] < replicas:
                            break
                        members = range(column, len(ops), self.pp)
                        waiting[column] = 0
                        for m in members:
                            arrived[m] = False
                        start = max(self.clock[m] for m in members)
                        for m in members:
                            before, own = self.clock[m], ops[m][position[m]]
                            self.clock[m] = start + own.busy_us
                            self._spend(m, own, before)
                            position[m] += 1
                        progressed = True
                        continue
                    if not self._ready(s, cost):
                        break
                    self.issue(s, cost)
                    position[s] += 1
                    progressed = True
            if all(p == len(o) for p, o in zip(position, ops, strict=True)):
                return
            if not progressed:
                raise UsageError("the pattern's stages wait on each other's recvs, or its DP "
                                 "ranks issue different dp/ep calls, in a cycle")

    def snapshot(self) -> tuple[list[float], list[dict[str, float]]]:
        return list(self.clock), [dict(k) for k in self.kinds]


def _runs_by_step(lists: list[tuple[Run, ...]]) -> list[tuple[Phase, int, list[list[Op]]]]:
    """Run lists aligned (one per DP rank and stage): (phase, repeat, ops of each) for each
    stretch of steps over which none changes what it issues."""
    totals = {sum(run.repeat for run in runs) for runs in lists}
    if len(totals) > 1:
        raise UsageError(f"the pattern's stages or DP ranks run {sorted(totals)} steps: "
                         "every one must run the same steps to be simulated together")
    bounds: set[int] = set()
    for runs in lists:
        at = 0
        for run in runs:
            at += run.repeat
            bounds.add(at)
    out: list[tuple[Phase, int, list[list[Op]]]] = []
    cursors = [(0, 0) for _ in lists]  # (run index, steps used of it)
    at = 0
    for end in sorted(bounds):
        ops, phase = [], Phase.PREFILL
        for s, runs in enumerate(lists):
            i, used = cursors[s]
            run = runs[i]
            phase = run.phase
            ops.append(list(run.step.ops))
            used += end - at
            cursors[s] = (i + 1, 0) if used == run.repeat else (i, used)
        out.append((phase, end - at, ops))
        at = end
    return out


def _units(pattern: Pattern, topology: Topology) -> list[list[int]]:
    """The DP ranks to simulate, in groups simulated together: one DP rank per distinct
    replica, that is per run list and per offset of the replica's first rank within its
    node (its tp and pp groups then sit alike against node boundaries, so they cost alike).
    Replicas alike in both run alike, joins included (a join waits for the latest, the same
    for each of them), so one stands for all. When a call joins the DP ranks (a dp or ep
    call) the representatives are simulated together; else each on its own."""
    layout = pattern.layout
    replicas = pattern.replicas()
    rpn, size = topology.ranks_per_node, layout.tp * layout.pp
    seen: dict[tuple[object, int], int] = {}
    for d in range(layout.dp):
        seen.setdefault((replicas[d], d * size % rpn if rpn else 0), d)
    distinct = {id(r): r for r in replicas}.values()  # equal replicas are often one object
    if layout.dp > 1 and any(op.group in DP_GROUPS for replica in distinct
                             for runs in replica for run in runs for op in run.step.ops):
        return [list(seen.values())]
    return [[d] for d in seen.values()]


def _simulate_unit(pattern: Pattern, costs: Costs, dp_ranks: list[int], token_order: bool,
                   ) -> tuple[list[float], list[float], list[dict[str, float]]]:
    pp = pattern.layout.pp
    lists = [pattern.runs(s, d) for d in dp_ranks for s in range(pp)]
    pipe = Pipeline(len(dp_ranks), pp)
    prefill_end: list[float] | None = None
    settle = pp + TRANSIENT_STEPS
    for phase, repeat, ops in _runs_by_step(lists):
        if phase == Phase.DECODE and prefill_end is None:
            prefill_end = list(pipe.clock)
        step_costs = [[costs.of(dp_ranks[v // pp], v % pp, op) for op in stage_ops]
                      for v, stage_ops in enumerate(ops)]
        simulated = min(repeat, settle)
        before = pipe.snapshot()
        for _ in range(simulated):
            before = pipe.snapshot()
            if token_order and phase == Phase.DECODE:
                for first in range(0, len(pipe.clock), pp):
                    pipe.clock[first] = max(pipe.clock[first], pipe.clock[first + pp - 1])
            pipe.step(step_costs)
        left = repeat - simulated
        if left:  # steady state: every stage advances as much each step as in the last
            clock, kinds = pipe.snapshot()
            for s in range(len(clock)):
                pipe.clock[s] += left * (clock[s] - before[0][s])
                for k, v in kinds[s].items():
                    pipe.kinds[s][k] = v + left * (v - before[1][s].get(k, 0.0))
    if prefill_end is None:
        prefill_end = list(pipe.clock)
    return prefill_end, list(pipe.clock), pipe.kinds


def simulate(pattern: Pattern, topology: Topology, token_order: bool = False,
             ) -> tuple[list[float], list[float], list[dict[str, float]]]:
    """(each simulated stage's clock at the end of the prefill, at the end, per-kind time),
    over every distinct DP rank's stages.

    token_order: the engine's order, where a decode step begins on the first stage only once
    the last stage has sampled the previous step's token (the transfer of that token is not
    in the pattern and costs nothing here); without it, the replay's order."""
    costs = Costs(pattern, topology)
    prefill_end: list[float] = []
    end: list[float] = []
    kinds: list[dict[str, float]] = []
    for unit in _units(pattern, topology):
        p, e, k = _simulate_unit(pattern, costs, unit, token_order)
        prefill_end += p
        end += e
        kinds += k
    return prefill_end, end, kinds


def predict_pattern(pattern: Pattern, fits: FitTable | Topology, token_order: bool = False,
                    ) -> tuple[dict[str, float], list[str]]:
    """Predicted prefill, decode step, end to end and per op kind, each the slowest stage's
    of the slowest DP rank, as replay reports the slowest rank's, and notes on
    extrapolation, bad fits and calls priced by proxy.
    token_order: decode steps in the engine's order (`simulate`), not the replay's."""
    topology = fits if isinstance(fits, Topology) else Topology(fits)
    steps = pattern.workload.decode_steps
    prefill_end, end, kinds = simulate(pattern, topology, token_order)
    out: dict[str, float] = {
        "prefill_us": max(prefill_end),
        "decode_us": max(e - p for e, p in zip(end, prefill_end, strict=True)),
        "e2e_us": max(end)}
    for k in sorted({k for stage in kinds for k in stage}):
        out[f"{k}_us"] = max(stage.get(k, 0.0) for stage in kinds)
    out["decode_step_us"] = out["decode_us"] / steps if steps else 0.0
    notes: set[str] = set()
    outside: dict[int, tuple[Fit, list[int]]] = {}
    for (_, size, _), fit in topology.fits_seen.items():
        if not fit.min_bytes <= size <= fit.max_bytes:
            outside.setdefault(id(fit), (fit, []))[1].append(size)
    for fit, sizes in outside.values():
        notes.add(f"{fit.op} over {fit.group_size} ranks: {len(sizes)} size(s) from "
                  f"{min(sizes)} to {max(sizes)} B outside the swept {fit.min_bytes}-"
                  f"{fit.max_bytes} B: extrapolated")
    notes |= topology.notes
    for fit in {id(f): f for f in topology.fits_seen.values()}.values():
        if fit.scaled_from is not None:
            notes.add(f"{fit.op} over {fit.group_size} ranks: scaled from the sweep's "
                      f"{fit.scaled_from} ranks ({fit.group_size - 1} ring steps where it "
                      f"had {fit.scaled_from - 1}, same bus bandwidth); sweep "
                      f"{fit.group_size} ranks to measure it")
        if fit.rms_rel_error > LARGE_RMS:
            notes.add(f"the {fit.op} fit over {fit.group_size} ranks is off by "
                      f"{100 * fit.rms_rel_error:.0f}% on average: its prediction is rough")
    headline = ("prefill_us", "decode_step_us", "e2e_us")
    ordered = [*headline, *sorted(k for k in out if k not in (*headline, "decode_us"))]
    if not steps:
        ordered.remove("decode_step_us")
    return {k: out[k] for k in ordered}, sorted(notes)


def caveats(sweep_meta: dict[str, Any], pattern: Pattern,
            replay_meta: dict[str, Any] | None) -> list[str]:
    """What makes a sweep a poor witness for a prediction: another backend, transport,
    device or world than the replay's, or (without a replay) fewer ranks than the pattern."""
    out = []
    if replay_meta is not None:
        for key in ("backend", "transport", "device", "world_size"):
            a, b = sweep_meta.get(key), replay_meta.get(key)
            if a is not None and b is not None and a != b:
                out.append(f"the sweep ran with {key} {a} and the replay with {b}: the "
                           "prediction prices another setup than the one measured")
    world = sweep_meta.get("world_size")
    if world is not None and replay_meta is None and world != pattern.layout.world_size:
        out.append(f"the sweep ran on {world} ranks and the pattern has "
                   f"{pattern.layout.world_size}: contention between its groups is not "
                   "in the fits")
    return out
