"""The sweep's collectives as a table: kinds, nccl-tests' size convention, bus-bandwidth factors.

nccl-tests (src/common.cu, `setupArgs` and the result line) prints as `size` the larger of the
send and receive buffers of one rank, and as `count` the per-rank element count it passes to
NCCL (`paramcount`). Its algorithm bandwidth is size / time for every collective, and its bus
bandwidth multiplies that by a factor per collective (`GetBw` in src/<collective>.cu) so that
figures are comparable with the link speed whatever the collective:

    allreduce       2(n-1)/n   size = count x elt (in place)
    allgather        (n-1)/n   size = count x n x elt (the gathered output), count per rank
    reducescatter    (n-1)/n   size = count x n x elt (the input), count per rank
    alltoall         (n-1)/n   size = count x n x elt (send = receive buffer), count per peer
    gather           (n-1)/n   size = count x n x elt (the root's output), count per rank
    broadcast        1         size = count x elt
    sendrecv         1         size = count x elt (each rank sends to rank+1, receives from rank-1)
    stream           1         size = count x elt (rank 2i sends to 2i+1, one way, back to back)

`stream` is infercomm's own (no nccl-tests counterpart): osu_bw's one-way stream without its
window. Its time per message is the gap between messages of a long stream, what a pipeline
stage pays for a transfer whose data is already on its way; `sendrecv`'s half is the latency.
"""

from collections.abc import Callable
from enum import StrEnum

from patterns import Op, OpKind, dtype_bytes


class SweepOp(StrEnum):
    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    GATHER = "gather"
    BROADCAST = "broadcast"
    SENDRECV = "sendrecv"
    ALLTOALL = "alltoall"
    STREAM = "stream"


BUSBW_FACTOR: dict[SweepOp, Callable[[int], float]] = {
    SweepOp.ALLREDUCE: lambda n: 2 * (n - 1) / n,
    SweepOp.ALLGATHER: lambda n: (n - 1) / n,
    SweepOp.REDUCESCATTER: lambda n: (n - 1) / n,
    SweepOp.ALLTOALL: lambda n: (n - 1) / n,
    SweepOp.GATHER: lambda n: (n - 1) / n,
    SweepOp.BROADCAST: lambda n: 1.0,
    SweepOp.SENDRECV: lambda n: 1.0,
    SweepOp.STREAM: lambda n: 1.0,
}

# Collectives whose `size` covers all n ranks' chunks (count is one rank's or one peer's).
CHUNKED = frozenset({SweepOp.ALLGATHER, SweepOp.REDUCESCATTER, SweepOp.ALLTOALL,
                     SweepOp.GATHER})

# The pattern's calls as sweep collectives: a send and a recv are the two halves of a pair.
PATTERN_KIND: dict[OpKind, SweepOp] = {
    OpKind.ALLREDUCE: SweepOp.ALLREDUCE, OpKind.ALLGATHER: SweepOp.ALLGATHER,
    OpKind.REDUCESCATTER: SweepOp.REDUCESCATTER, OpKind.GATHER: SweepOp.GATHER,
    OpKind.BROADCAST: SweepOp.BROADCAST, OpKind.ALLTOALL: SweepOp.ALLTOALL,
    OpKind.SEND: SweepOp.SENDRECV, OpKind.RECV: SweepOp.SENDRECV,
}


def busbw_factor(op: SweepOp, n: int) -> float:
    return BUSBW_FACTOR[SweepOp(op)](n)


def algbw_gbps(size_bytes: int, time_us: float) -> float:
    """nccl-tests' algbw: bytes / 1e9 / seconds (GB/s, decimal)."""
    return size_bytes / 1e3 / time_us if time_us > 0 else 0.0


def busbw_gbps(op: SweepOp, size_bytes: int, time_us: float, n: int) -> float:
    return algbw_gbps(size_bytes, time_us) * busbw_factor(op, n)


def message(op: SweepOp, requested_bytes: int, n: int, dtype: str) -> tuple[int, int]:
    """(count, size_bytes) for a requested size: whole elements, and for the chunked
    collectives whole chunks of n, so the size may round down (nccl-tests rounds too)."""
    elt = dtype_bytes(dtype)
    if SweepOp(op) in CHUNKED:
        count = requested_bytes // (elt * n)
        return count, count * n * elt
    count = requested_bytes // elt
    return count, count * elt


def pattern_message(op: Op) -> tuple[SweepOp, int, int, int]:
    """(sweep op, size_bytes, count, group size) of one pattern call, in nccl-tests' convention.

    A send/recv pair is two ranks, whatever the pipeline's size.
    """
    kind = PATTERN_KIND[op.kind]
    n = op.group_size
    match kind:
        case SweepOp.ALLGATHER | SweepOp.GATHER:
            return kind, op.out_bytes, op.numel, n
        case SweepOp.REDUCESCATTER:
            return kind, op.bytes, op.numel // n, n
        case SweepOp.ALLTOALL:
            return kind, op.bytes, op.numel // n, n
        case SweepOp.SENDRECV:
            return kind, op.bytes, op.numel, 2
    return kind, op.bytes, op.numel, n
