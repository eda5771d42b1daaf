"""A pattern as a table: equal calls of a phase and stage folded into one row with a count."""

import re
from dataclasses import dataclass

from patterns.ops import Op, Phase, Step, Transport
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


@dataclass(frozen=True)
class MoeLayerRow:
    """The calls of one layer of a kind (moe or dense) in the first step of a phase, on a
    rank of DP rank 0: the dispatch and combine of the experts and everything else."""

    phase: Phase
    kind: str  # "moe" or "dense"
    layers: int  # layers of this kind in the stage
    tokens: int  # T of the step
    dispatch_calls: int
    dispatch_bytes: int  # input bytes of one layer's dispatch calls on one rank
    combine_calls: int
    combine_bytes: int
    other_calls: int  # attention all-reduce, sequence-parallel all-gather, ...
    other_bytes: int


_LAYER = re.compile(r"^layers\.(\d+)\.")


def _is_moe_layer(pattern: Pattern, layer: int) -> bool:
    check = getattr(pattern.model, "is_moe_layer", None)  # per-layer MoE map when known
    return bool(check(layer)) if check is not None else pattern.model.is_moe


def _layer_row(pattern: Pattern, phase: Phase, step: Step, kind: str) -> MoeLayerRow | None:
    from patterns.shapes import stage_layer_counts
    layers = [i for i in range(stage_layer_counts(pattern.model.num_hidden_layers,
                                                  pattern.layout.pp)[0])
              if _is_moe_layer(pattern, i) == (kind == "moe")]
    if not layers:
        return None
    per_layer: dict[int, list[Op]] = {i: [] for i in layers}
    for op in step.ops:
        found = _LAYER.match(op.tag)
        if found and int(found.group(1)) in per_layer:
            per_layer[int(found.group(1))].append(op)
    ops = per_layer[layers[0]]  # layers of a kind issue the same calls
    parts = {"dispatch": [o for o in ops if ".dispatch" in o.tag],
             "combine": [o for o in ops if ".combine" in o.tag]}
    other = [o for o in ops if o not in parts["dispatch"] and o not in parts["combine"]]
    return MoeLayerRow(phase, kind, len(layers), step.tokens,
                       len(parts["dispatch"]), sum(o.bytes for o in parts["dispatch"]),
                       len(parts["combine"]), sum(o.bytes for o in parts["combine"]),
                       len(other), sum(o.bytes for o in other))


def moe_layer_rows(pattern: Pattern) -> list[MoeLayerRow]:
    """Per phase and layer kind, one layer's calls and bytes in the phase's first step
    (stage 0, DP rank 0); empty for a dense model."""
    if not pattern.model.is_moe:
        return []
    rows = []
    for phase in Phase:
        step = pattern.first_step(0, phase)
        if step is None:
            continue
        for kind in ("moe", "dense"):
            row = _layer_row(pattern, phase, step, kind)
            if row is not None:
                rows.append(row)
    return rows
