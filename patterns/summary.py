"""A pattern as a table: equal calls of a phase and stage folded into one row with a count."""

from dataclasses import dataclass

from patterns.ops import Op, Phase, Transport
from patterns.pattern import Pattern


@dataclass(frozen=True)
class PatternRow:
    phase: Phase
    stage: int
    op: str
    group: str
    group_size: int
    shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    dtype: str
    count: int  # calls by one rank of the stage over the whole phase
    bytes: int  # input bytes of one call
    transport: Transport = Transport.NCCL  # what the engine sends these calls through


def _key(phase: Phase, stage: int, op: Op) -> tuple[object, ...]:
    return (phase, stage, op.kind, op.group, op.shape, op.out_shape, op.dtype, op.transport)


def pattern_rows(pattern: Pattern) -> list[PatternRow]:
    """Rows in the order their first call is issued, phase by phase and stage by stage."""
    counts: dict[tuple[object, ...], int] = {}
    first: dict[tuple[object, ...], Op] = {}
    for phase in Phase:
        for stage, runs in enumerate(pattern.stages):
            for run in runs:
                if run.phase != phase:
                    continue
                for op in run.step.ops:
                    key = _key(phase, stage, op)
                    counts[key] = counts.get(key, 0) + run.repeat
                    first.setdefault(key, op)
    return [
        PatternRow(phase=key[0], stage=key[1], op=op.kind.value, group=op.group,  # type: ignore[arg-type]
                   group_size=op.group_size, shape=op.shape, out_shape=op.out_shape,
                   dtype=op.dtype, count=counts[key], bytes=op.bytes, transport=op.transport)
        for key, op in first.items()
    ]


def transport_split(pattern: Pattern) -> dict[Phase, dict[Transport, tuple[int, int]]]:
    """Per phase, (calls, bytes) per transport on the busiest rank of each stage, summed
    over stages: what one inference sends through each transport, rank by rank."""
    split: dict[Phase, dict[Transport, tuple[int, int]]] = {}
    for row in pattern_rows(pattern):
        calls, nbytes = split.setdefault(row.phase, {}).get(row.transport, (0, 0))
        split[row.phase][row.transport] = (calls + row.count, nbytes + row.count * row.bytes)
    return split


def engine_transport_calls(pattern: Pattern, stage: int) -> dict[Transport, int]:
    """Calls per inference of one rank of `stage`, by the transport the engine would use."""
    calls: dict[Transport, int] = {}
    for run in pattern.stages[stage]:
        for op in run.step.ops:
            calls[op.transport] = calls.get(op.transport, 0) + run.repeat
    return calls
