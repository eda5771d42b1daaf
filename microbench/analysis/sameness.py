"""Whether two runs measured the same thing, and whether they are the same run.

Runs compare only when they replayed the same pattern (model, layout, workload, engine) or
swept the same (op, size, dtype, group size) set; the metrics of a run are its per-iteration
samples (results/runs.py).
"""

from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from microbench.results.runs import (
    RunFolder,
    kv_samples,
    replay_samples,
    sweep_key_name,
    sweep_samples,
)
from patterns import EngineOptions

# The files whose bytes make a run: two folders equal in all of them are one run (a copy).
_RUN_FILES = ("meta.json", "iterations.csv", "samples.csv", "ops.csv")


def same_run(a: RunFolder, b: RunFolder) -> str | None:
    """'the same folder' or 'copies of one run' when a and b are one run, else None."""
    if Path(a.path).resolve() == Path(b.path).resolve():
        return "the same folder"
    for name in _RUN_FILES:
        fa, fb = Path(a.path) / name, Path(b.path) / name
        if fa.is_file() != fb.is_file():
            return None
        if fa.is_file() and fa.read_bytes() != fb.read_bytes():
            return None
    return "copies of one run"


def _first_difference(a: Any, b: Any, where: str) -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(dict.fromkeys([*a, *b])):
            found = _first_difference(a.get(key), b.get(key), f"{where}.{key}")
            if found:
                return found
        return None
    return None if a == b else f"{where} differs: {a} in A, {b} in B"


def mismatch(a: RunFolder, b: RunFolder) -> str | None:
    """Why two runs did not measure the same thing, or None when they did."""
    if a.kind != b.kind:
        return f"kind differs: {a.kind} in A, {b.kind} in B"
    if a.kind == "replay":
        for field in ("model", "layout", "workload", "engine"):
            found = _first_difference(_identity(field, a.meta["pattern"].get(field)),
                                      _identity(field, b.meta["pattern"].get(field)), field)
            if found:
                return found
        return None
    if a.kind == "kvtransfer":  # one request's KV cache between the same two layouts
        for field in KV_IDENTITY:
            if a.meta.get(field) != b.meta.get(field):
                return f"{field} differs: {a.meta.get(field)} in A, {b.meta.get(field)} in B"
        return None
    keys_a, keys_b = set(sweep_samples(a)), set(sweep_samples(b))
    for index, field in enumerate(("op", "size_bytes", "dtype", "group_size")):
        va, vb = sorted({k[index] for k in keys_a}), sorted({k[index] for k in keys_b})
        if va != vb:
            return f"{field} differs: {_few(va)} in A, {_few(vb)} in B"
    if keys_a != keys_b:
        only = sorted(keys_a ^ keys_b)[0]
        return f"(op, size) sets differ: {sweep_key_name(only)} is in one run only"
    return None


def _identity(field: str, section: Any) -> Any:
    # Runs made before an engine option existed recorded no value for it: they ran with its
    # default (e.g. gpu, nccl_only, added with the engines of issue 10).
    if field == "engine" and isinstance(section, dict):
        section = {**asdict(EngineOptions()), **section}
    # A model's `source` is where its config was read from, not what it is.
    if isinstance(section, dict):
        return {k: v for k, v in section.items() if k != "source"}
    return section


def _few(values: list[Any]) -> str:
    text = ",".join(map(str, values[:6]))
    return text + (f",... ({len(values)} values)" if len(values) > 6 else "")


# What two disaggregated replays must share to be compared (the transport, NIXL or MPI,
# may differ: that is what a comparison of them is for).
KV_IDENTITY = ("model", "engine", "connector", "disagg", "prompt", "direction",
               "kv_cache_dtype", "kv_transfer_bytes")


def run_metrics(run: RunFolder) -> dict[str, np.ndarray]:
    if run.kind == "replay":
        return replay_samples(run)
    if run.kind == "kvtransfer":
        return kv_samples(run)
    return {sweep_key_name(k): v for k, v in sweep_samples(run).items()}
