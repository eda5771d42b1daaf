"""Communication volume: every call of the deployment counted once (DESIGN.md, "Volume").

A collective counts once for its group, with the traffic factor below; a send counts its
bytes once; a recv is the other half of a send and counts nothing.
"""

from collections.abc import Iterator
from fractions import Fraction

from patterns.ops import Op, OpKind
from patterns.pattern import Pattern
from patterns.tiled import weighted_ops


def op_volume(op: Op) -> Fraction:
    """Bytes one call moves, by the volume convention (exact, as a fraction).

    Uneven all-gathers and reduce-scatters (`Op.counts`) keep the convention: the gathered
    (reduced) tensor's bytes x (n-1)/n, that tensor being the sum of the parts.
    """
    n = op.group_size
    spread = Fraction(n - 1, n)
    match op.kind:
        case OpKind.ALLREDUCE:
            return op.bytes * 2 * spread
        case OpKind.ALLGATHER:
            return op.out_bytes * spread
        case OpKind.REDUCESCATTER | OpKind.ALLTOALL:
            return op.bytes * spread
        case OpKind.GATHER | OpKind.BROADCAST | OpKind.SEND:
            return Fraction(op.bytes)
        case OpKind.RECV:
            return Fraction(0)
    raise ValueError(f"no volume rule for {op.kind}")


def _calls_in_deployment(op: Op, ranks_in_stage: int) -> Fraction:
    """The share of distinct calls the tp ranks of one (DP rank, stage) make when each
    issues `op` once.

    A point-to-point call is each rank's own; a collective is one call per group, and its
    members spread over group_size / tp positions (an EP group of dp x tp ranks spans the
    dp positions of a stage, so each contributes 1/dp of the call).
    """
    if op.kind in (OpKind.SEND, OpKind.RECV):
        return Fraction(ranks_in_stage)
    return Fraction(ranks_in_stage, op.group_size)


def _walk(pattern: Pattern) -> Iterator[tuple[Op, Fraction]]:
    """Every distinct op of every (DP rank, stage) with the calls of the deployment it
    stands for (equal ops are counted together: DP replicas repeat the same calls)."""
    # Counted by object first (hashing an op hashes its every field; the same object recurs
    # step after step), then by what its volume follows from (kind, group, sizes: the ops of
    # every layer differ by tag alone), so the exact arithmetic runs once a kind of call.
    by_object: dict[int, list] = {}
    # Without dp_stages every DP rank runs `stages`: walk them once, dp times over.
    replicas, times = ((pattern.dp_stages, 1) if pattern.dp_stages
                       else ((pattern.stages,), pattern.layout.dp))
    for replica in replicas:
        for runs in replica:
            for run in runs:
                count = run.repeat * times
                # a tiled step's layers' copies, each counted with its layer's call
                for op, n in weighted_ops(run.step.ops):
                    seen = by_object.get(id(op))
                    if seen is None:
                        by_object[id(op)] = [op, count * n]
                    else:
                        seen[1] += count * n
    repeats: dict[tuple, list] = {}
    for op, count in by_object.values():
        key = (op.kind, op.group, op.group_size, op.bytes, op.out_bytes)
        seen = repeats.get(key)
        if seen is None:
            repeats[key] = [op, count]
        else:
            seen[1] += count
    ranks_in_stage = pattern.layout.tp
    for op, repeat in repeats.values():
        yield op, _calls_in_deployment(op, ranks_in_stage) * repeat


def volume_bytes(pattern: Pattern) -> dict[str, Fraction]:
    """Volume of one inference by op kind, plus `p2p` (send + recv) and `total`."""
    totals = {kind.value: Fraction(0) for kind in OpKind}
    for op, calls in _walk(pattern):
        totals[op.kind.value] += op_volume(op) * calls
    totals["p2p"] = totals[OpKind.SEND.value] + totals[OpKind.RECV.value]
    totals["total"] = sum((totals[kind.value] for kind in OpKind), Fraction(0))
    return totals


def volume_by_group(pattern: Pattern) -> dict[str, Fraction]:
    """Volume of one inference by group kind (tp, pp, dp, ep, ...), every call once."""
    totals: dict[str, Fraction] = {}
    for op, calls in _walk(pattern):
        totals[op.group] = totals.get(op.group, Fraction(0)) + op_volume(op) * calls
    return totals


def as_number(value: Fraction) -> int | float:
    """An exact volume as JSON wants it: an int when whole."""
    return int(value) if value.denominator == 1 else float(value)
