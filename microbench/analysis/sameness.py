"""Whether two runs measured the same thing, and whether they are the same run.

Runs compare only when they replayed the same pattern (model, layout, workload, engine) or
swept the same (op, size, dtype, group size) set; the metrics of a run are its per-iteration
samples (results/runs.py).
"""

import contextlib
import hashlib
import json
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
    found = first_repeat([a, b])
    return found[2] if found else None


def _sizes(run: RunFolder) -> tuple[int, ...]:
    """Each run file's size (-1 where absent): runs of different sizes are never copies."""
    return tuple((Path(run.path) / name).stat().st_size if (Path(run.path) / name).is_file()
                 else -1 for name in _RUN_FILES)


def _digest(run: RunFolder) -> str:
    """SHA-256 over the run files, each preceded by its name and size, read in 1 MiB pieces
    (ops.csv can be gigabytes)."""
    h = hashlib.sha256()
    for name, size in zip(_RUN_FILES, _sizes(run), strict=True):
        h.update(f"{name}:{size};".encode())
        if size >= 0:
            with open(Path(run.path) / name, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
    return h.hexdigest()


def first_repeat(runs: list[RunFolder]) -> tuple[int, int, str] | None:
    """(i, j, how) of the first run j that is run i again (the same folder, or a copy of it),
    in one pass: folders keyed by their resolved path, then by their files' sizes, and only
    runs whose sizes meet are read whole and hashed. Linear in the runs (pairwise it was
    quadratic: 300 runs a side took 24 s)."""
    folders: dict[Path, int] = {}
    for j, run in enumerate(runs):
        where = Path(run.path).resolve()
        if where in folders:
            return folders[where], j, "the same folder"
        folders[where] = j
    by_size: dict[tuple[int, ...], list[int]] = {}
    for j, run in enumerate(runs):
        by_size.setdefault(_sizes(run), []).append(j)
    repeats = []
    for group in by_size.values():
        if len(group) < 2:
            continue
        seen: dict[str, int] = {}
        for j in group:
            key = _digest(runs[j])
            if key in seen:
                repeats.append((seen[key], j, "copies of one run"))
                break
            seen[key] = j
    return min(repeats, key=lambda r: (r[1], r[0])) if repeats else None


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
        return _workload_difference(a, b) or _calls_difference(a, b)
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


# The options that make a workload beyond pattern.workload (which holds a request workload's
# longest prompt and output only): how requests become steps, and speculative decoding.
WORKLOAD_FLAGS = ("--requests", "--step-time-ms", "--max-batched-tokens", "--max-num-seqs",
                  "--mixed-chunk", "--speculative-config", "--acceptance-length",
                  "--acceptance-rate")


def workload_options(run: RunFolder) -> dict[str, str]:
    """The workload options of a replay's recorded command line: {flag: value} ("" for a
    switch). --requests is kept as "given" (the same file may be named from another folder:
    its calls are compared below); a speculative config as its parsed JSON, key order aside."""
    argv = [str(a) for a in run.meta.get("argv") or []]
    found: dict[str, str] = {}
    for i, word in enumerate(argv):
        flag, eq, value = word.partition("=")
        if flag not in WORKLOAD_FLAGS:
            continue
        if flag == "--mixed-chunk":
            found[flag] = ""
            continue
        value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        if flag == "--requests":
            value = value if value.startswith("poisson:") else "given"
        elif flag == "--speculative-config":
            with contextlib.suppress(ValueError, RecursionError):  # compared as written
                value = json.dumps(json.loads(value), sort_keys=True)
        found[flag] = value
    return found


def _workload_difference(a: RunFolder, b: RunFolder) -> str | None:
    """A workload replay against one batch, different step times or budgets, speculative
    against plain: the pattern's shell workload can read the same for all of them."""
    wa, wb = workload_options(a), workload_options(b)
    if ("--requests" in wa) != ("--requests" in wb):
        one = "a request workload (--requests)"
        return (f"workload differs: {one if '--requests' in wa else 'one batch'} in A, "
                f"{one if '--requests' in wb else 'one batch'} in B")
    for flag in WORKLOAD_FLAGS:
        if wa.get(flag) != wb.get(flag):
            def said(value: str | None) -> str:
                return "not given" if value is None else (value or "given")
            return f"{flag} differs: {said(wa.get(flag))} in A, {said(wb.get(flag))} in B"
    return None


def _calls_difference(a: RunFolder, b: RunFolder) -> str | None:
    """Runs whose patterns issue different calls (another request file, another engine
    release's rules) did not measure one thing, whatever their options read."""
    pa, pb = a.meta["pattern"], b.meta["pattern"]
    for key, what in (("calls_per_inference", "calls per inference"),
                      ("volume_bytes", "bytes per inference")):
        va, vb = pa.get(key), pb.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            va, vb = va.get("total"), vb.get("total")
        if isinstance(va, int | float) and isinstance(vb, int | float) and va != vb:
            return f"the calls differ: {va:,} {what} in A, {vb:,} in B"
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
