"""What each call of a pattern costs its stage, priced from a sweep's fits: a collective's fit
at its message size, a transfer's gap (a stream iteration) and latency (the stream iteration,
no sooner than half the smallest ping-pong); the model these feed is `predict.py`'s.

A group whose ranks lie on more than one node, or a transfer between stages on different
nodes, takes the inter-node fits (`Topology.fits_of`). Whether one does is counted, not
enumerated (`spans_at`): every group of a kind is an arithmetic progression of ranks (global
rank = (dp_rank x pp + stage) x tp + tp_rank), so a plan's cost does not grow with the GPUs.
"""

from dataclasses import dataclass
from typing import Any

from microbench.analysis.fits import (
    FitTable,
    Topology,
    fit_for,
    stand_in_note,
)
from microbench.argtypes import UsageError
from microbench.sweep.busbw import SweepOp, pattern_message
from patterns import Op, OpKind, Pattern, Transport
from patterns.groups import rank_of
from patterns.layout import Layout


def call_time_us(fits: FitTable, op: Op) -> float:
    """One call's time in isolation: a collective's fit, or for a transfer half the 2-rank
    sendrecv (a ping-pong: the even rank sends first) at its size as the sweep measured it
    (`Fit.measured_us`), what a transfer costs where the sweep has no stream
    (`latency_us`)."""
    kind, size, _, n = pattern_message(op)
    fit = fit_for(fits, kind, n)
    if op.kind in (OpKind.SEND, OpKind.RECV):
        return fit.measured_us(size) / 2
    return fit.time_us(size)


_STREAMS: dict[int, tuple[FitTable, bool]] = {}


def _has_stream(fits: FitTable) -> bool:
    """Whether the sweep has a stream (looked up once a table: it is asked every transfer)."""
    known = _STREAMS.get(id(fits))
    if known is None or known[0] is not fits:
        known = _STREAMS[id(fits)] = (fits, any(k[0] == SweepOp.STREAM.value for k in fits))
    return known[1]


def gap_us(fits: FitTable, op: Op) -> float:
    """A transfer's gap: a stream message of its size as the sweep measured it where the
    sweep has a stream (`Fit.measured_us`: between measured sizes the line between them, a
    fit only beyond them), else its latency.

    A pair's transfer is never scaled to another group size (fits.fit_for), so the measured
    points price it as they are; a collective's fit is scaled and stays a fit."""
    if _has_stream(fits):
        _, size, _, n = pattern_message(op)
        return fit_for(fits, SweepOp.STREAM, n).measured_us(size)
    return call_time_us(fits, op)


def latency_us(fits: FitTable, op: Op) -> float:
    """A transfer's latency, from its send's start to its data's arrival: a one-way message
    of the stream (osu_bw's figure), and no sooner than half the ping-pong at the sweep's
    smallest size (osu_latency's: the time any message takes to be seen); half the
    ping-pong where the sweep has no stream.

    Not half the ping-pong at the message's own size: for a large message the two measure one
    quantity (a 512 KiB MPI send on one host took 16.8-17.2 us in a replay, sender and
    receiver in lockstep; the same minutes' sweeps gave 17.3-19.0 us a stream message and
    17.5-18.9 us half a ping-pong), and on a shared machine noise only adds time, so the
    later of two figures is the one noise raised most: with it, six rounds of
    benchmarks/predict_accuracy.py (MPI PP2) put the prefill at 0.86-0.93 of its prediction,
    with the stream at 0.91-0.98. The stream alone is too early for a small message, whose
    stream iterations overlap (MPICH's eager sends return before the data lands)."""
    if not _has_stream(fits):
        return call_time_us(fits, op)
    _, size, _, n = pattern_message(op)
    ping_pong = fit_for(fits, SweepOp.SENDRECV, n)
    return max(gap_us(fits, op), ping_pong.measured_us(min(size, ping_pong.min_bytes)) / 2)


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


def _spans(first: int, step: int, count: int, copies: int, rpn: int) -> bool:
    """Whether any of the `copies` progressions first + t, first + t + step, ...
    (`count` ranks each, t < copies) lies on more than one node of `rpn` ranks: one does
    when its first rank's offset in its node plus its width reaches the next node."""
    if count < 2:
        return False
    width = (count - 1) * step
    if width >= rpn:
        return True
    low = first % rpn
    most = rpn - 1 if low + copies - 1 >= rpn else low + copies - 1
    return most + width >= rpn


def spans_at(layout: Layout, kind: str, dp_rank: int, stage: int, rpn: int | None,
             peer: int | None = None) -> bool:
    """Whether a group of `kind` that the ranks of one (DP rank, stage) call together (or,
    for `peer`, a stage's transfer pairs) spans nodes of `rpn` ranks: `groups_at`'s groups,
    counted arithmetically."""
    if not rpn:
        return False
    dp, pp, tp = layout.dp, layout.pp, layout.tp
    if peer is not None:  # every TP rank to its counterpart on the peer stage
        low = min(stage, peer)
        return _spans((dp_rank * pp + low) * tp, abs(peer - stage) * tp, 2, tp, rpn)
    if kind == "tp":
        return _spans((dp_rank * pp + stage) * tp, 1, tp, 1, rpn)
    if kind == "dp":
        return _spans(stage * tp, pp * tp, dp, tp, rpn)
    if kind == "ep":
        first, last = stage * tp, ((dp - 1) * pp + stage) * tp + tp - 1
        return first // rpn != last // rpn
    if kind in ("pp", "pp_broadcast"):
        return _spans(dp_rank * pp * tp, tp, pp, tp, rpn)
    raise UsageError(f"the pattern names a group {kind!r} that predict cannot place; "
                     "one of tp, pp, dp, ep, pp_broadcast")


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
        self.cache: dict[tuple[int, int, int], Cost] = {}
        # the same call of another layer (ops differ by tag alone) at the same level: priced
        # once (its notes are said the first time, the same for every layer)
        self.by_level: dict[tuple[Any, ...], Cost] = {}
        self.fits_seen = topology.fits_seen

    def _note(self, fits: FitTable, op: Op, kind: SweepOp | None = None) -> None:
        k, size, _, n = pattern_message(op)
        kind = kind or k
        fit = fit_for(fits, kind, n)
        self.fits_seen[(kind.value, size, id(fit))] = fit

    def of(self, dp_rank: int, stage: int, op: Op) -> Cost:
        # A dp or ep call's groups are the same for every DP rank of the stage; any other
        # call's sit against node boundaries as the replica's first rank does (its offset
        # within its node), so DP ranks at the same offset share one cost.
        rpn, layout = self.topology.ranks_per_node, self.layout
        place = (0 if op.group in DP_GROUPS or not rpn
                 else dp_rank * layout.tp * layout.pp % rpn)
        key = (place, stage, id(op))  # ops live as long as their pattern, and this
        cost = self.cache.get(key)
        if cost is None:
            cost = self.cache[key] = self._cost(dp_rank, stage, op)
        return cost

    def _fits(self, spans: bool, groups: Any) -> FitTable:
        """The fits of a call whose groups span nodes or not (`Topology.fits_of`, the
        groups built only to name a spanning one where no inter-node fits were given)."""
        if spans and self.topology.inter is None:
            return self.topology.fits_of(groups())
        self.topology.used.add("inter" if spans else "intra")
        return self.topology.inter if spans else self.topology.intra  # type: ignore[return-value]

    def _cost(self, dp_rank: int, stage: int, op: Op) -> Cost:
        layout, rpn = self.layout, self.topology.ranks_per_node
        transfer = op.kind in (OpKind.SEND, OpKind.RECV)
        peer = (op.peer if op.peer is not None else stage) if transfer else None
        spans = spans_at(layout, op.group, dp_rank, stage, rpn, peer)
        key = (spans, op.kind, op.group, op.group_size, op.shape, op.out_shape, op.dtype,
               op.transport, op.counts, peer)
        cost = self.by_level.get(key)
        if cost is None:
            cost = self.by_level[key] = self._priced(dp_rank, stage, op, spans, peer)
        return cost

    def _priced(self, dp_rank: int, stage: int, op: Op, spans: bool, peer: int | None) -> Cost:
        layout = self.layout
        if peer is not None:
            # Every TP rank of the stage sends to its counterpart; the slowest pair counts.
            fits = self._fits(spans, lambda: [
                [rank_of(layout, dp_rank, stage, t), rank_of(layout, dp_rank, peer, t)]
                for t in range(layout.tp)])
            self._note(fits, op)
            stand_in_note(fits, SweepOp.SENDRECV, 2, self.topology.notes)
            if any(k[0] == SweepOp.STREAM.value for k in fits):
                self._note(fits, op, SweepOp.STREAM)
            return Cost(op.kind.value, gap_us(fits, op), latency_us(fits, op), peer)
        fits = self._fits(spans, lambda: groups_at(layout, op.group, dp_rank, stage))
        self._note(fits, op)
        if op.transport == Transport.GLOO:
            self.topology.notes.add(
                f"{op.tag} ({op.kind} over the {op.group} group of {op.group_size}) runs on "
                "gloo (CPU) in the engine; it is priced from the sweep's own backend, as "
                "replay issues it")
        stand_in_note(fits, pattern_message(op)[0], op.group_size, self.topology.notes)
        # An uneven all-gather or reduce-scatter (Op.counts) is priced by its total, as
        # pattern_message sizes it: vLLM's all_gatherv / reduce_scatterv issue one
        # broadcast / reduce per part (pynccl.py), so each part crosses every link once and
        # the links carry the total, as an even call of that total does. The largest part
        # times n would price padding that is never sent.
        return Cost(op.kind.value, call_time_us(fits, op),
                    joins=op.group in DP_GROUPS and layout.dp > 1)
