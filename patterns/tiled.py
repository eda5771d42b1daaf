"""A step's calls kept as one layer's calls and the layers that issue them: a request
workload over DP ranks has tens of thousands of distinct steps, each of a few hundred calls
that differ from layer to layer by their tag alone, so a step holds a few calls and builds
the rest only when they are read.

`TiledOps` is a read-only sequence of `Op`s, equal to the tuple of its calls in order: parts
issued once, and parts of one layer's calls issued by each of `count` consecutive layers
from `first`, whose tags name their own layer ("layers.7.mlp.experts.combine" for layer 7 of
a part built from layer 3's "layers.3.mlp.experts.combine"). `weighted_ops` reads any
step's calls as (call, times issued), never building the layers' copies: what counts,
bytes and prices need.
"""

from collections.abc import Iterator, Sequence
from dataclasses import replace
from itertools import islice
from typing import overload

from patterns.ops import Op

# (calls, first layer, layers): a part of `layers` layers' calls from `first` on; layers 0
# means the calls are issued once as they are.
Part = tuple[tuple[Op, ...], int, int]


def retag(tag: str, layer: int) -> str:
    """`tag` with its layer number made `layer`: "layers.3.x" -> "layers.7.x"."""
    if not tag.startswith("layers."):
        return tag
    _, _, rest = tag[7:].partition(".")
    return f"layers.{layer}.{rest}"


class TiledOps(Sequence[Op]):
    __slots__ = ("_hash", "_len", "parts")

    def __init__(self, parts: Sequence[Part]) -> None:
        self.parts: tuple[Part, ...] = tuple(p for p in parts if p[0])
        self._len = sum(len(ops) * max(layers, 1) for ops, _, layers in self.parts)
        self._hash: int | None = None

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Op]:
        for ops, first, layers in self.parts:
            if not layers:
                yield from ops
                continue
            for layer in range(first, first + layers):
                for op in ops:
                    tag = retag(op.tag, layer)
                    yield op if tag == op.tag else replace(op, tag=tag)

    @overload
    def __getitem__(self, index: int) -> Op: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Op, ...]: ...

    def __getitem__(self, index: int | slice) -> Op | tuple[Op, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("TiledOps index out of range")
        return next(islice(iter(self), index, None))

    def weighted(self) -> Iterator[tuple[Op, int]]:
        """Each stored call and how many times the step issues it (its layers' copies
        differ by tag alone)."""
        for ops, _, layers in self.parts:
            for op in ops:
                yield op, max(layers, 1)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TiledOps):
            return self is other or (self._len == other._len and self.parts == other.parts)
        if isinstance(other, Sequence):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self.parts)
        return self._hash

    def __add__(self, other: Sequence[Op]) -> "TiledOps":
        return TiledOps((*self.parts, (tuple(other), 0, 0)))

    def __repr__(self) -> str:
        return f"TiledOps({self._len} calls in {len(self.parts)} parts)"


def weighted_ops(ops: Sequence[Op]) -> Iterator[tuple[Op, int]]:
    """(call, times) over a step's calls, tiled or not."""
    if isinstance(ops, TiledOps):
        return ops.weighted()
    return ((op, 1) for op in ops)


def from_runs(flat: Sequence[Op], layer_runs: Sequence[tuple[int, int, int, int]]) -> TiledOps:
    """A TiledOps of a forward's untagged calls `flat` (each layer of a run the same call
    objects) and where each run of layers lies in it: (position, first layer, layers,
    calls a layer)."""
    parts: list[Part] = []
    at = 0
    for position, first, layers, per_layer in layer_runs:
        if position > at:
            parts.append((tuple(flat[at:position]), 0, 0))
        parts.append((tuple(flat[position:position + per_layer]), first, layers))
        at = position + per_layer * layers
    if at < len(flat):
        parts.append((tuple(flat[at:]), 0, 0))
    return TiledOps(parts)
