"""Sweep cases and their timing protocol: one collective at one size, issued back to back.

Per case: barrier, warm-up calls, then timed calls each followed by a mark (CPU: perf_counter
after the blocking call returns; GPU: a CUDA event). Each rank keeps its raw durations; rank 0
takes, per iteration, the slowest rank's, and derives median, p5 and p95 from those samples.

sendrecv follows nccl-tests' sendrecv_perf: every rank sends to rank+1 and receives from
rank-1 in a ring. The backends issue blocking calls, so even ranks send first and odd ranks
receive first (otherwise every rank would wait in its send); one iteration is therefore the
two transfers one after the other, where nccl-tests overlaps them in one NCCL group.

stream is one way: rank 2i sends to rank 2i+1, which receives, iteration after iteration with
nothing in between (a rank without a partner idles); with a stride s (sweep --ranks-per-node
s) rank i pairs with i + s instead, so that over a world of several nodes every pair crosses.
The slowest side of a pair sets the rate, so the median iteration is the gap between the
messages of a stream, where half a sendrecv iteration is the latency of one message.
"""

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from math import prod

import numpy as np

from microbench.argtypes import UsageError
from microbench.backends import Backend, Group
from microbench.ranks import faults
from microbench.ranks.watchdog import Watchdog
from microbench.replay import check
from microbench.replay.plan import BoundOp
from microbench.replay.timing import make_marks
from microbench.sweep.busbw import CHUNKED, SweepOp, message, pattern_message
from patterns import Op, OpKind, Pattern


@dataclass(frozen=True)
class Case:
    """One row of the sweep: a collective over the first `group_size` ranks at one size."""

    op: SweepOp
    size_bytes: int
    count: int
    dtype: str
    group_size: int
    calls_per_inference: int | None = None  # --from-pattern only
    stride: int = 1  # stream pairs rank i with i + stride (a node's ranks, to cross nodes)

    def stream_peer(self, g: int) -> tuple[bool, int] | None:
        """(sends, partner) of group rank g in a stream, or None when it has no partner:
        ranks pair up as (i, i + stride) within each block of 2 x stride."""
        sends = (g // self.stride) % 2 == 0
        peer = g + self.stride if sends else g - self.stride
        return (sends, peer) if 0 <= peer < self.group_size else None


def geometric_sizes(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    """nccl-tests' -b -e -f: minbytes, minbytes*f, ... while <= maxbytes."""
    if minbytes > maxbytes:
        raise UsageError(f"-b {minbytes} is larger than -e {maxbytes}; the sweep goes from "
                         "-b up to -e")
    if factor < 2:
        raise UsageError(f"-f {factor} must be at least 2 (each size is the previous times -f)")
    if minbytes == 0:
        raise UsageError("-b 0: sizes must be at least 1 byte")
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(size)
        size *= factor
    return sizes


def size_cases(ops: list[SweepOp], sizes: list[int], dtype: str,
               world: int) -> tuple[list[Case], list[str]]:
    """Cases over all ranks; sizes that hold no element for an op are skipped (and said)."""
    cases: list[Case] = []
    skipped: list[str] = []
    for op in ops:
        seen: set[int] = set()
        for requested in sizes:
            count, size = message(op, requested, world, dtype)
            if count == 0:
                unit = f"{world} x {dtype}" if op in CHUNKED else dtype
                skipped.append(f"{op} {requested} B (less than one {unit} element)")
            elif size not in seen:  # two requests can round down to the same size
                seen.add(size)
                cases.append(Case(op, size, count, dtype, world))
    return cases, skipped


def pattern_cases(pattern: Pattern) -> list[Case]:
    """The pattern's distinct messages, each with the most calls one rank issues per inference.

    A send and a recv both count as a call of the rank's sendrecv message.
    """
    calls: dict[tuple[SweepOp, int, int, str, int], list[int]] = {}
    for stage, runs in enumerate(pattern.stages):
        for run in runs:
            for op in run.step.ops:
                kind, size, count, n = pattern_message(op)
                per_stage = calls.setdefault((kind, size, count, op.dtype, n),
                                             [0] * len(pattern.stages))
                per_stage[stage] += run.repeat
    order = list(SweepOp)
    for (kind, size, count, dtype, n), per_stage in list(calls.items()):
        if kind == SweepOp.SENDRECV:  # a pipeline's transfers cost a latency and a gap
            calls[(SweepOp.STREAM, size, count, dtype, n)] = per_stage
    keys = sorted(calls, key=lambda k: (order.index(k[0]), k[4], k[1], k[3]))
    return [Case(kind, size, count, dtype, n, max(calls[(kind, size, count, dtype, n)]))
            for kind, size, count, dtype, n in keys]


def _sweep_op(case: Case, kind: OpKind, peer: int | None = None,
              root: int | None = None) -> Op:
    n, count = case.group_size, case.count
    shape, out = (count,), (count,)
    if case.op in (SweepOp.ALLGATHER, SweepOp.GATHER):
        out = (count * n,)
    elif case.op == SweepOp.REDUCESCATTER:
        shape = (count * n,)
    elif case.op == SweepOp.ALLTOALL:
        shape = out = (count * n,)
    return Op(kind=kind, group="sweep", group_size=n, shape=shape, out_shape=out,
              dtype=case.dtype, tag=f"sweep.{case.op}", peer=peer, root=root)


class Sweeper:
    """Binds and times cases on one rank; `groups[n]` is the group of the first n ranks."""

    def __init__(self, backend: Backend, groups: dict[int, Group], watchdog: Watchdog) -> None:
        self.backend, self.groups, self.watchdog = backend, groups, watchdog

    def bind(self, case: Case) -> list[BoundOp]:
        """The calls of one iteration on this rank, in issue order (empty outside the group)."""
        group = self.groups[case.group_size]
        if group.index < 0:
            return []
        b = self.backend
        if case.op == SweepOp.SENDRECV:
            g, n = group.index, group.size
            send_op = _sweep_op(case, OpKind.SEND, peer=(g + 1) % n)
            recv_op = _sweep_op(case, OpKind.RECV, peer=(g - 1) % n)
            send = b.empty(case.count, case.dtype)
            recv = b.empty(case.count, case.dtype)
            pair = [BoundOp(send_op, group, send, None,
                            b.bind("send", group, send, None, send_op.peer)),
                    BoundOp(recv_op, group, None, recv,
                            b.bind("recv", group, None, recv, recv_op.peer))]
            return pair if g % 2 == 0 else pair[::-1]
        if case.op == SweepOp.STREAM:
            pairing = case.stream_peer(group.index)
            if pairing is None:  # no partner
                return []
            kind = OpKind.SEND if pairing[0] else OpKind.RECV
            peer = pairing[1]
            op = _sweep_op(case, kind, peer=peer)
            buf = b.empty(case.count, case.dtype)
            if kind == OpKind.SEND:
                return [BoundOp(op, group, buf, None, b.bind("send", group, buf, None, peer))]
            return [BoundOp(op, group, None, buf, b.bind("recv", group, None, buf, peer))]
        root = 0 if case.op in (SweepOp.GATHER, SweepOp.BROADCAST) else None
        op = _sweep_op(case, OpKind(case.op.value), root=root)
        send = b.empty(op.numel, case.dtype)
        recv = None
        if case.op in (SweepOp.ALLGATHER, SweepOp.REDUCESCATTER, SweepOp.ALLTOALL) or (
                case.op == SweepOp.GATHER and group.index == 0):
            recv = b.empty(prod(op.out_shape), case.dtype)
        return [BoundOp(op, group, send, recv, b.bind(op.kind.value, group, send, recv, root))]

    def measure(self, case: Case, ops: list[BoundOp], warmup: int,
                iters: int) -> np.ndarray | None:
        """This rank's duration of each timed iteration in microseconds (None outside)."""
        self.backend.barrier()
        if not ops:
            return None
        calls = [o.call for o in ops]
        issue: Callable[[], None] = calls[0] if len(calls) == 1 else _chain(calls)
        watchdog = self.watchdog
        watchdog.where = f"{case.op} {case.size_bytes} B warm-up"
        for _ in range(warmup):
            issue()
            watchdog.steps += 1
        # CUDA events go on the backend's communication stream where it has one.
        stream = getattr(self.backend, "stream", None)
        marks = (make_marks(self.backend.device, iters + 1) if stream is None
                 else make_marks(self.backend.device, iters + 1, stream))
        watchdog.where = f"{case.op} {case.size_bytes} B timed"
        marks.mark()
        for _ in range(iters):
            issue()
            marks.mark()
            watchdog.steps += 1
        self.backend.synchronize()
        return np.diff(marks.elapsed_us())

    def check(self, case: Case, ops: list[BoundOp]) -> int:
        """Issue one iteration with known data; count the wrong elements on this rank."""
        self.watchdog.where = f"{case.op} {case.size_bytes} B --check"
        self.backend.barrier()
        corrupt = faults.corrupts_inputs(self.backend.rank)
        wrong = sum(check.verify(o, self.backend.write, self.backend.read, corrupt)
                    for o in ops)
        self.backend.synchronize()
        self.watchdog.steps += 1
        return wrong

    def run(self, cases: list[Case], warmup: int, iters: int, verify: bool,
            progress: bool) -> list[tuple[np.ndarray | None, int | None]]:
        out = []
        start = last = time.monotonic()
        for i, case in enumerate(cases):
            ops = self.bind(case)  # buffers live for this case only
            samples = self.measure(case, ops, warmup, iters)
            wrong = self.check(case, ops) if verify else None
            out.append((samples, wrong))
            now = time.monotonic()
            if progress and now - start > 3 and now - last > 2 and i + 1 < len(cases):
                sys.stderr.write(f"[infercomm] sweep case {i + 1}/{len(cases)} "
                                 f"({now - start:.1f} s)\n")
                last = now
        return out


def _chain(calls: list[Callable[[], None]]) -> Callable[[], None]:
    def issue() -> None:
        for call in calls:
            call()
    return issue


def rank_max(per_rank: list[np.ndarray | None]) -> np.ndarray:
    """Per iteration, the slowest group member's duration."""
    return np.max([s for s in per_rank if s is not None], axis=0)


# Calls per run for `run_time`: about a decode step of a small model (2 calls a layer).
RUN_CALLS = 10
# The slowest tenth of runs (rounded down) is left out of `run_time`'s mean: a run that held
# a rank descheduled for milliseconds, which a replay's median inference leaves out too.
SLOW_RUNS_LEFT_OUT = 0.1


def run_time(per_rank: list[np.ndarray | None], calls: int = RUN_CALLS) -> float:
    """Per-call time of `calls` calls issued back to back, as a replay issues a step's.

    Per rank, the timed iterations are summed in consecutive runs of `calls`; per run the
    slowest rank's sum counts; the figure is the mean of those runs, the slowest tenth left
    out, / `calls`. The median of per-iteration maxima overstates such runs where ranks take
    turns being late (each rank's long call is followed by a short one, so the run sums agree
    but every iteration's maximum is a long call), and understates them where one call in a
    few is delayed (a sleeping rank woken late, as gloo's are; a run of 10 holds such calls,
    one iteration's median does not). A mean, not the median run: a replay's figure is a
    median of inferences of tens of calls or more, each a mean over its calls, and runs of
    calls can fall in two clusters (an MPI 16 KiB stream on the 2-core VM: runs of 2.8-2.9
    and of 3.7-4.0 us a call, about half each, so the median run was 2.9 in some sweeps and
    3.7 in others of the same minutes, while the mean was 3.4-3.5 in four streams of six and
    a PP2 replay's decode transfers took 3.5). Fewer iterations than `calls`: the median
    iteration's maximum.
    """
    arrays = [s for s in per_rank if s is not None]
    n = min(len(s) for s in arrays) // calls * calls
    if n == 0:
        return float(np.median(rank_max(per_rank)))
    sums = np.sort(np.max([s[:n].reshape(-1, calls).sum(axis=1) for s in arrays], axis=0))
    kept = len(sums) - int(len(sums) * SLOW_RUNS_LEFT_OUT)
    return float(np.mean(sums[:kept])) / calls


def stats(samples: np.ndarray) -> tuple[float, float, float]:
    """(median, p5, p95) of the rank-max samples."""
    p5, median, p95 = np.percentile(samples, [5, 50, 95])
    return float(median), float(p5), float(p95)
