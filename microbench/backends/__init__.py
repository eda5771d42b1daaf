"""Communication backends behind one small Protocol; each module registers its name.

A backend turns an `Op` into a bound call (a zero-argument callable holding its buffers and
group), so the replay loop does nothing per call but call it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from microbench.argtypes import UsageError

if TYPE_CHECKING:  # numpy is imported by the backends themselves, not by the CLI's parser
    import numpy as np

BoundCall = Callable[[], None]


@dataclass(frozen=True)
class Group:
    """A communicator of some ranks: global ranks in group order, and this rank's index."""

    name: str
    ranks: tuple[int, ...]
    index: int
    handle: Any

    @property
    def size(self) -> int:
        return len(self.ranks)


class Backend(Protocol):
    name: str  # "torch", "mpi", ...
    transport: str  # what carries the bytes: "gloo", "nccl", "mpi-host", "mpi-staging", ...
    device: str  # "cpu" or "cuda"
    rank: int
    world_size: int

    def new_group(self, name: str, ranks: list[int]) -> Group:
        """Create a communicator; every rank calls this for every group, in the same order."""

    def empty(self, numel: int, dtype: str) -> Any:
        """A flat device buffer of `numel` elements."""

    def bind(self, kind: str, group: Group, send: Any, recv: Any,
             peer_or_root: int | None, counts: tuple[int, ...] | None = None) -> BoundCall:
        """One call ready to issue: `send` is the input, `recv` the output (None if in place).

        `peer_or_root` is an index into `group.ranks`. `counts` (allgather, reducescatter)
        makes the call uneven: elements of each group rank's part, in group order.
        """

    def write(self, buffer: Any, values: np.ndarray) -> None:
        """Fill a buffer (used by --check only)."""

    def read(self, buffer: Any) -> np.ndarray:
        """A buffer's values as float64 (used by --check only)."""

    def barrier(self) -> None: ...

    def synchronize(self) -> None:
        """Wait until every issued call has completed on the device."""

    def allgather_object(self, obj: Any) -> list[Any]: ...

    def versions(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


BACKENDS: dict[str, str] = {
    "torch": "microbench.backends.torch_backend",
    "mpi": "microbench.backends.mpi_backend",
    "nccl": "microbench.backends.nccl_backend",
}

_FACTORIES: dict[str, Callable[..., Backend]] = {}


def displacements(counts: tuple[int, ...]) -> list[int]:
    """Where each part of an uneven call starts, in elements."""
    starts, at = [], 0
    for count in counts:
        starts.append(at)
        at += count
    return starts


def register(name: str) -> Callable[[Callable[..., Backend]], Callable[..., Backend]]:
    def add(factory: Callable[..., Backend]) -> Callable[..., Backend]:
        _FACTORIES[name] = factory
        return factory
    return add


def open_backend(name: str, **options: Any) -> Backend:
    """Import the backend's module (and so its library) only when asked for."""
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}; use one of {', '.join(BACKENDS)}")
    importlib.import_module(BACKENDS[name])
    return _FACTORIES[name](**options)
