"""--check: every call issued once more with known data, and its result compared.

Inputs are small integers that depend on the rank's place in its group, so every dtype
(bf16 included) holds them and their sums exactly: element i of rank g's input is
(i mod 7) + g + 1 (at most 6 + 8 + 1 = 15; a sum over 8 ranks stays under 256). Uneven
all-gathers and reduce-scatters (`Op.counts`) are checked part by part. Groups of more than
8 ranks hold larger sums: bf16 keeps integers exact up to 256, so keep --check of bf16
reductions to groups of at most 8 (an EP group of 16 holds sums up to 16 * 23 = 368).
A bool buffer (Megatron's routing map) holds those values mod 2, and is never reduced.
"""

from collections.abc import Callable

import numpy as np

from microbench.replay.plan import BoundOp


def _base(n: int) -> np.ndarray:
    return (np.arange(n) % 7).astype(np.float64)


def _group_sum(base: np.ndarray, n: int) -> np.ndarray:
    return n * base + n * (n + 1) / 2  # sum over g of base + g + 1


def verify(op: BoundOp, write: Callable, read: Callable, corrupt: bool) -> int:
    """Fill the inputs of one call, issue it, and count the wrong elements it produced."""

    binary = op.op.dtype == "bool"

    def fill(buffer: object, values: np.ndarray) -> None:
        if corrupt and values.size:
            values = values.copy()
            values[0] += 1
        write(buffer, values % 2 if binary else values)

    kind, g, n = op.op.kind.value, op.group.index, op.group.size
    if binary and kind in ("allreduce", "reducescatter"):
        raise ValueError(f"a {kind} of bool ({op.op.tag}): bool is gathered, never reduced")
    send, recv = op.send, op.recv
    expected: np.ndarray | None = None
    target = recv
    match kind:
        case "allreduce":
            base = _base(op.op.numel)
            fill(send, base + g + 1)
            expected, target = _group_sum(base, n), send
        case "allgather" if op.op.counts is not None:
            counts = op.op.counts
            fill(send, _base(counts[g]) + g)
            write(recv, np.zeros(sum(counts)))
            expected = np.concatenate([_base(c) + j for j, c in enumerate(counts)])
        case "reducescatter" if op.op.counts is not None:
            counts, total = op.op.counts, sum(op.op.counts)
            fill(send, _base(total) + g + 1)
            start = sum(counts[:g])
            expected = _group_sum(_base(total), n)[start:start + counts[g]]
        case "allgather" | "gather":
            base = _base(op.op.numel)
            fill(send, base + g)
            if recv is not None:
                write(recv, np.zeros(op.op.numel * n))
                expected = np.concatenate([base + j for j in range(n)])
        case "reducescatter":
            chunk = op.op.numel // n
            fill(send, _base(op.op.numel) + g + 1)
            expected = _group_sum(_base(op.op.numel), n)[g * chunk:(g + 1) * chunk]
        case "alltoall":
            chunk = op.op.numel // n
            base = _base(chunk)
            fill(send, np.concatenate([base + g * n + c for c in range(n)]))
            expected = np.concatenate([base + c * n + g for c in range(n)])
        case "broadcast":
            base = _base(op.op.numel)
            if g == op.op.root:
                fill(send, base + 1)
            else:
                write(send, np.zeros(op.op.numel))
            expected, target = base + 1, send
        case "send":
            fill(send, _base(op.op.numel) + g + 1)
        case "recv":
            write(recv, np.zeros(op.op.numel))
            expected = _base(op.op.numel) + op.op.peer + 1
    op.call()
    if expected is None:
        return 0
    return int(np.count_nonzero(read(target) != (expected % 2 if binary else expected)))
