"""A trace as the summary a user wants first: per rank and group, each distinct call with
its count and bytes; the steps found; what was not understood."""

from collections import Counter
from dataclasses import dataclass

from patterns.traces.calls import TRACE_DTYPE_BYTES, Trace
from patterns.traces.steps import fold, split_steps

ROW_KEYS = ("rank", "group_size", "op", "numel", "dtype", "calls", "bytes")


@dataclass(frozen=True)
class StepsFound:
    rank: int
    steps: int
    runs: int  # distinct consecutive step kinds after folding repeats
    source: str  # "profiler steps", "repeating period" or "none"


def trace_rows(trace: Trace) -> list[dict[str, object]]:
    """One row per rank and distinct (group size, op, elements, dtype, transport), in
    first-call order; `bytes` is every call of the row together (calls x elements x dtype
    size); `transport` only where the trace names one (vLLM's CPU `shm` ops)."""
    rows = []
    for rank in trace.ranks:
        counts = Counter(rank.ids)
        merged: dict[tuple[object, ...], int] = {}
        for call_id in dict.fromkeys(rank.ids):  # first-call order
            call = trace.table[call_id]
            key = (call.group_size, call.op, call.numel, call.dtype, call.transport)
            merged[key] = merged.get(key, 0) + counts[call_id]
        for (size, op, numel, dtype, transport), calls in merged.items():
            row = {"rank": rank.rank, "group_size": size, "op": op, "numel": numel,
                   "dtype": dtype, "calls": calls,
                   "bytes": calls * numel * TRACE_DTYPE_BYTES.get(dtype, 0)}
            if transport is not None:
                row["transport"] = transport
            rows.append(row)
    return rows


def trace_document(trace: Trace) -> dict[str, object]:
    doc: dict[str, object] = {"ranks": len(trace.ranks), "calls": trace.calls,
                              "unparsed": trace.unparsed, "rows": trace_rows(trace)}
    if trace.ep_kernels:
        doc["ep_kernels"] = dict(sorted(trace.ep_kernels.items()))
    if trace.notes:
        doc["notes"] = list(trace.notes)
    return doc


def steps_found(trace: Trace) -> list[StepsFound]:
    out = []
    for rank in trace.ranks:
        steps = split_steps(rank.ids, rank.step_starts)
        source = ("profiler steps" if rank.step_starts else
                  "repeating period" if len(steps) > 1 else "none")
        out.append(StepsFound(rank.rank, len(steps), len(fold(rank.ids, steps)), source))
    return out
