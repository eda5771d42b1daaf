"""Traces an engine really issued: NCCL/RCCL COLL logs and PyTorch profiler (Kineto) JSON,
read into one call record, split into steps, compared with a pattern, folded into one.

    from patterns.traces import read_traces
    trace = read_traces(["rank0.json", "rank1.json"])
"""

from collections.abc import Sequence
from pathlib import Path

from patterns.errors import ConfigError
from patterns.traces.calls import Call, RankCalls, Trace
from patterns.traces.kineto import read_kineto
from patterns.traces.nccl_log import LogReader

EXPECTED = ("NCCL/RCCL COLL lines (run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL) or a "
            "Kineto JSON (.json/.json.gz from torch.profiler) with c10d, record_param_comms "
            "or gloo:/nccl: events")


def is_kineto(path: Path) -> bool:
    return path.name.endswith((".json", ".json.gz"))


def read_traces(paths: Sequence[str]) -> Trace:
    """Read every file; refuse (ConfigError) a missing file or one that holds no call."""
    trace = Trace()
    logs = LogReader(trace)
    for index, name in enumerate(paths):
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"trace file {name!r} does not exist; pass " + EXPECTED)
        if is_kineto(path):
            ep_before = sum(trace.ep_kernels.values())
            rank = read_kineto(path, trace, index)
            found = len(rank.ids) + sum(trace.ep_kernels.values()) - ep_before
            if found:
                trace.formats.add("kineto")
                if any(r.rank == rank.rank for r in trace.ranks):
                    raise ConfigError(f"{name}: rank {rank.rank} is given twice; pass one "
                                      "Kineto file per rank")
                trace.ranks.append(rank)
        else:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    found = logs.feed(f)
                if found:
                    trace.formats.add("nccl")
            except OSError as err:
                raise ConfigError(f"trace file {name!r} cannot be read ({err.strerror}); pass "
                                  + EXPECTED) from None
        if not found:
            raise ConfigError(f"{name}: no communication call found; expected " + EXPECTED)
    logs.finish()
    trace.ranks.sort(key=lambda r: r.rank)
    return trace


__all__ = ["Call", "RankCalls", "Trace", "read_traces"]
