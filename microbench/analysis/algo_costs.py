"""Alpha-beta costs of the all-reduce algorithms (algorithms/schedules.py), per level.

Each step of a schedule is one exchange: a rank sends and receives at once, so the step
costs alpha + beta x bytes of the larger of the two messages, with the alpha and beta of the
level the step's peers are on (within a node, or across). The point-to-point time of one
message is half a sweep `sendrecv` iteration (sweep/cases.py: an iteration is two one-way
trips, one after the other), fitted per level (analysis/fits.py). The schedule is run on
clocks: a step begins when its rank is free and its incoming message has been sent, so the
fold of a group that is not a power of two, and the waits it causes, are priced as issued.
The reduction's arithmetic is not priced (on a CPU it adds about one memory pass a step).

The standard costs come out of it (m bytes, p ranks, alpha a, beta b):
- ring: 2 (p - 1) steps of m / p: 2 (p - 1) a + 2 (p - 1) / p m b;
- recursive doubling, p a power of two: log2 p steps of m: log2 p (a + m b); otherwise two
  more steps of m (the fold and its return);
- rabenseifner, p a power of two: 2 log2 p steps, 2 (p - 1) / p m b in all;
- hierarchical, N nodes of L: 2 (L - 1) local steps of m / L and log2 N steps of m / L
  across: 2 (L - 1) (a_l + m / L b_l) + log2 N (a_x + m / L b_x).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from microbench.algorithms.schedules import schedule

OneWay = Callable[[float], float]  # bytes -> microseconds of one message


@dataclass(frozen=True)
class AlgoCost:
    algo: str
    group_size: int
    size_bytes: int
    time_us: float  # the slowest rank's
    steps_intra: int  # of the slowest rank's schedule
    steps_inter: int
    bytes_intra: int  # sent by the slowest rank
    bytes_inter: int


@lru_cache(maxsize=4096)
def _schedules(algo: str, n: int, size_bytes: int, nodes: tuple[int, ...]) -> tuple:
    # elements of one byte: the chunks are the bytes' (rounding within an element is noise)
    return tuple(tuple(schedule(algo, n, r, size_bytes, list(nodes))) for r in range(n))


def algo_cost(algo: str, n: int, size_bytes: int, nodes: list[int] | None,
              intra: OneWay, inter: OneWay | None = None) -> AlgoCost:
    """The cost of one all-reduce of `size_bytes` over `n` ranks (`nodes[i]`: group index
    i's node; None: one node)."""
    nodes_t = tuple(nodes) if nodes is not None else (0,) * n
    inter = inter or intra
    scheds = _schedules(algo, n, size_bytes, nodes_t)
    clock = [0.0] * n
    sent_at: dict[tuple[int, int], list[float]] = defaultdict(list)
    at = [0] * n
    posted = [False] * n
    counts = [[0, 0, 0, 0] for _ in range(n)]  # steps intra, inter, bytes intra, inter
    moved = True
    while moved:
        moved = False
        for r in range(n):
            while at[r] < len(scheds[r]):
                st = scheds[r][at[r]]
                size = max(st.send[1] if st.send_to is not None else 0,
                           st.recv[1] if st.recv_from is not None else 0)
                peers = [p for p in (st.send_to, st.recv_from) if p is not None]
                across = any(nodes_t[p] != nodes_t[r] for p in peers)
                if st.send_to is not None and not posted[r]:
                    sent_at[(r, st.send_to)].append(clock[r])
                    posted[r] = True
                start = clock[r]
                if st.recv_from is not None:
                    queue = sent_at[(st.recv_from, r)]
                    if not queue:
                        break
                    start = max(start, queue.pop(0))
                cost = (inter if across else intra)(size) if size else 0.0
                clock[r] = start + cost
                c = counts[r]
                c[1 if across else 0] += 1
                c[3 if across else 2] += st.send[1] if st.send_to is not None else 0
                at[r] += 1
                posted[r] = False
                moved = True
    slowest = max(range(n), key=lambda r: (clock[r], r)) if n else 0
    c = counts[slowest] if n else [0, 0, 0, 0]
    return AlgoCost(algo, n, size_bytes, clock[slowest] if n else 0.0, *c)


def linear(alpha_us: float, beta_us_per_byte: float) -> OneWay:
    return lambda size: alpha_us + beta_us_per_byte * size


# --- plan/predict: the all-reduce of a layout priced as an algorithm ---

def _one_way(fits: dict, level: str) -> OneWay:
    from microbench.analysis.fits import fit_for
    from microbench.argtypes import UsageError
    from microbench.sweep.busbw import SweepOp

    if not any(k[0] == SweepOp.SENDRECV.value for k in fits):
        raise UsageError(f"--allreduce-algo prices each point-to-point step from a sendrecv "
                         f"sweep, and the {level}-node sweep has none; sweep with --op "
                         "allreduce,sendrecv")
    fit = fit_for(fits, SweepOp.SENDRECV, 2)
    return lambda size: fit.time_us(size) / 2  # half an iteration: one message


def group_nodes(n: int, ranks_per_node: int | None, spans: bool) -> list[int]:
    """The nodes of a group's ranks: consecutive blocks of ranks_per_node when the group
    spans nodes (halves when it straddles one boundary), else one node."""
    if not spans or not ranks_per_node:
        return [0] * n
    if n > ranks_per_node and n % ranks_per_node == 0:
        return [i // ranks_per_node for i in range(n)]
    return [0] * ((n + 1) // 2) + [1] * (n // 2)


class AlgoFits(dict):
    """A level's fit table whose all-reduce entries are the algorithm's cost (fits.Fit
    interface: time_us(size)); every other op keeps its swept fit."""

    def __init__(self, base: dict, algo: str, intra: OneWay, inter: OneWay | None,
                 ranks_per_node: int | None) -> None:
        super().__init__({k: v for k, v in base.items() if k[0] != "allreduce"})
        self.algo, self.intra, self.inter, self.rpn = algo, intra, inter, ranks_per_node

    def __contains__(self, key: object) -> bool:
        return (isinstance(key, tuple) and key[0] == "allreduce") or super().__contains__(key)

    def __missing__(self, key: tuple[str, int]) -> object:
        if key[0] != "allreduce":
            raise KeyError(key)
        self[key] = fit = AlgoFit(self.algo, key[1], group_nodes(
            key[1], self.rpn, self.inter is not None), self.intra, self.inter)
        return fit


class AlgoFit:
    """Quacks as analysis/fits.Fit where predict reads one (time_us, op, group_size, ...)."""

    def __init__(self, algo: str, n: int, nodes: list[int], intra: OneWay,
                 inter: OneWay | None) -> None:
        from microbench.algorithms.schedules import node_layout
        from microbench.argtypes import UsageError
        if algo == "hierarchical":
            try:
                node_layout(nodes)
            except ValueError as err:
                raise UsageError(f"--allreduce-algo hierarchical over {n} ranks: {err}") from None
        self.algo, self.op, self.group_size, self.nodes = algo, "allreduce", n, nodes
        self.intra, self.inter = intra, inter
        self.rms_rel_error, self.points, self.dropped = 0.0, 0, ()
        self.min_bytes, self.max_bytes, self.pieces = 0, 1 << 62, ()  # priced step by step
        self.scaled_from = self.stand_in = None
        self._cache: dict[int, float] = {}

    def time_us(self, size_bytes: float) -> float:
        size = int(size_bytes)
        if size not in self._cache:
            self._cache[size] = algo_cost(self.algo, self.group_size, size, self.nodes,
                                          self.intra, self.inter).time_us
        return self._cache[size]

    def as_dict(self) -> dict:
        return {"op": "allreduce", "group_size": self.group_size, "algorithm": self.algo,
                "priced_from": "sendrecv fits, step by step (analysis/algo_costs.py)"}


def with_algorithm(topology: object, algo: str | None) -> object:
    """`topology` with its all-reduces priced as `algo` (unchanged for the library's)."""
    if algo in (None, "library"):
        return topology
    from microbench.analysis.fits import Topology
    intra = _one_way(topology.intra, "one")  # type: ignore[attr-defined]
    inter_fits = topology.inter  # type: ignore[attr-defined]
    inter = _one_way(inter_fits, "cross") if inter_fits is not None else None
    rpn = topology.ranks_per_node  # type: ignore[attr-defined]
    return Topology(AlgoFits(topology.intra, algo, intra, None, rpn),  # type: ignore
                    AlgoFits(inter_fits, algo, intra, inter, rpn)
                    if inter_fits is not None else None, rpn)
