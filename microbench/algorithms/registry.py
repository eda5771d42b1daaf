"""`--allreduce-algo`: a backend whose all-reduce is one of the point-to-point algorithms.

`with_algorithm` wraps an opened backend; every call but the all-reduce goes to the backend
unchanged, and the all-reduce of each group is bound to its schedule (schedules.py) executed
over the backend's own send/receive (execute.py). The algorithm and the node of each rank
are added to the backend's versions (so to every run's meta.json).
"""

from __future__ import annotations

import socket
from typing import Any

from microbench.algorithms.execute import EXECUTORS, scratch_count
from microbench.algorithms.schedules import ALGORITHMS, node_layout, schedule
from microbench.argtypes import UsageError


def node_of_ranks(hosts: list[str], ranks_per_node: int | None) -> list[int]:
    """Each global rank's node: consecutive blocks of --ranks-per-node, else by host name."""
    if ranks_per_node is not None:
        return [r // ranks_per_node for r in range(len(hosts))]
    order = list(dict.fromkeys(hosts))
    return [order.index(h) for h in hosts]


class AlgoBackend:
    """The backend, with `bind("allreduce", ...)` issuing `algo` from point-to-point calls."""

    def __init__(self, inner: Any, algo: str, nodes: list[int]) -> None:
        self._inner, self.algo, self.nodes = inner, algo, nodes
        self._scratches: dict[str, tuple[int, Any]] = {}
        if inner.name not in EXECUTORS:
            raise UsageError(f"--allreduce-algo is not available on backend {inner.name}")
        self._execute = EXECUTORS[inner.name]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def bind(self, kind: str, group: Any, send: Any, recv: Any, peer_or_root: int | None,
             counts: tuple[int, ...] | None = None) -> Any:
        if kind != "allreduce" or group.index < 0:
            return self._inner.bind(kind, group, send, recv, peer_or_root, counts)
        group_nodes = [self.nodes[r] for r in group.ranks]
        if self.algo == "hierarchical":
            try:
                node_layout(group_nodes)
            except ValueError as err:
                raise UsageError(f"--allreduce-algo hierarchical: {err}; set --ranks-per-node "
                                 "to a divisor of the group") from None
        numel = _numel(send)
        steps = schedule(self.algo, group.size, group.index, numel, group_nodes)
        dtype = _dtype_name(send)
        return self._execute(self._inner, group, send, steps,
                             self._scratch(dtype, max(scratch_count(steps), 1)))

    def _scratch(self, dtype: str, count: int) -> Any:
        """One receive buffer per dtype for every all-reduce (they run one at a time), grown
        to the largest step any of them receives: a pattern's hundreds of calls share it."""
        have = self._scratches.get(dtype)
        if have is None or have[0] < count:
            have = self._scratches[dtype] = (count, self._inner.empty(count, dtype))
        return have[1]

    def versions(self) -> dict[str, Any]:
        return {**self._inner.versions(), "allreduce_algo": self.algo,
                "allreduce_algo_nodes": self.nodes}


def _dtype_name(buffer: Any) -> str:
    """The pattern dtype of a backend buffer (MPI and CuPy buffers carry it; a torch tensor
    carries torch's)."""
    if isinstance(buffer.dtype, str):
        return buffer.dtype
    from microbench.backends.torch_backend import TORCH_DTYPES
    return next(name for name, dt in TORCH_DTYPES.items() if dt == buffer.dtype)


def _numel(buffer: Any) -> int:
    for name in ("numel", "size"):
        value = getattr(buffer, name, None)
        if isinstance(value, int):
            return value
    if hasattr(buffer, "host"):
        return int(buffer.host.size)
    return int(buffer.numel())  # a torch tensor


def with_algorithm(backend: Any, algo: str | None, ranks_per_node: int | None) -> Any:
    """`backend` itself for the library's all-reduce, else the wrapped one (collective: every
    rank calls it, to learn the others' hosts)."""
    if algo in (None, "library"):
        return backend
    if algo not in ALGORITHMS:
        raise UsageError(f"unknown --allreduce-algo {algo!r}; use one of {', '.join(ALGORITHMS)}")
    hosts = backend.allgather_object(socket.gethostname())
    return AlgoBackend(backend, algo, node_of_ranks(hosts, ranks_per_node))
