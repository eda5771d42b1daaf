"""Run folders read back: metadata, per-iteration samples of every metric, and the pattern.

Only files are read; nothing is rerun. Replay metrics are the slowest rank's figures of each
timed inference (iterations.csv, ops.csv); sweep metrics the slowest rank's time of each
timed call (samples.csv).
"""

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from microbench.argtypes import OneLineParser, UsageError
from microbench.views.textfmt import format_bytes
from patterns import ConfigError, Pattern

KINDS = ("replay", "sweep")


@dataclass(frozen=True)
class RunFolder:
    path: Path
    meta: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.meta["kind"])

    @property
    def name(self) -> str:
        return self.path.name

    def has(self, filename: str) -> bool:
        return (self.path / filename).is_file()

    def rows(self, filename: str) -> list[dict[str, str]]:
        with open(self.path / filename, newline="") as f:
            return list(csv.DictReader(f))

    def describe(self) -> str:
        m = self.meta
        hosts = len(set(m.get("hosts") or [])) or 1
        return (f"{m.get('backend')} ({m.get('transport')}) on {m.get('device')}, "
                f"{m.get('world_size')} ranks on {hosts} host(s)")

    def library(self) -> str:
        """A short name for legends: backend/transport and the library version."""
        v = self.meta.get("versions") or {}
        version = v.get("nccl") or v.get("mpi_library") or v.get("torch") or ""
        version = " ".join(version.split(",")[0].split())[:32]
        return f"{self.meta.get('transport')} {version}".strip()


def load_run(path: str | Path) -> RunFolder:
    folder = Path(path)
    meta_file = folder / "meta.json"
    if not meta_file.is_file():
        raise UsageError(f"{str(folder)!r} is not a run folder (no meta.json); pass a folder "
                         "that replay or sweep wrote")
    try:
        meta = json.loads(meta_file.read_text())
    except json.JSONDecodeError as err:
        raise UsageError(f"{meta_file}: not valid JSON ({err})") from None
    if meta.get("kind") not in KINDS:
        raise UsageError(f"{meta_file}: kind {meta.get('kind')!r} is neither replay nor sweep")
    run = RunFolder(folder, meta)
    needed = "iterations.csv" if run.kind == "replay" else "samples.csv"
    if not run.has(needed):
        raise UsageError(f"{folder}: a {run.kind} run folder without {needed}")
    return run


def decode_steps(run: RunFolder) -> int:
    return int(run.meta["pattern"]["workload"]["decode_steps"])


def replay_samples(run: RunFolder) -> dict[str, np.ndarray]:
    """Per timed inference: prefill, mean decode step, end to end, and per op kind."""
    rows = run.rows("iterations.csv")
    out = {"prefill_us": np.array([float(r["prefill_us"]) for r in rows]),
           "e2e_us": np.array([float(r["e2e_us"]) for r in rows])}
    steps = decode_steps(run)
    if steps:
        out["decode_step_us"] = np.array([float(r["decode_us"]) / steps for r in rows])
    out = {k: out[k] for k in ("prefill_us", "decode_step_us", "e2e_us") if k in out}
    if run.has("ops.csv"):
        out.update(op_kind_samples(run.rows("ops.csv")))
    return out


def op_kind_samples(rows: list[dict[str, str]]) -> dict[str, np.ndarray]:
    """Per op kind and inference: each rank's summed call times, the slowest rank's sum."""
    sums: dict[tuple[str, int, int], float] = {}
    for r in rows:
        key = (r["op"], int(r["iteration"]), int(r["rank"]))
        sums[key] = sums.get(key, 0.0) + float(r["time_us"])
    iterations = 1 + max(i for _, i, _ in sums)
    out: dict[str, np.ndarray] = {}
    for kind in sorted({k for k, _, _ in sums}):
        worst = np.zeros(iterations)
        for (k, i, _), total in sums.items():
            if k == kind:
                worst[i] = max(worst[i], total)
        out[f"{kind}_us"] = worst
    return out


SweepKey = tuple[str, int, str, int]  # op, size_bytes, dtype, group_size


def sweep_key_name(key: SweepKey) -> str:
    op, size, dtype, n = key
    return f"{op} {format_bytes(size)} {dtype} n={n}"


def sweep_samples(run: RunFolder) -> dict[SweepKey, np.ndarray]:
    """Per (op, size, dtype, group size): the slowest rank's time of each timed call."""
    found: dict[SweepKey, list[float]] = {}
    for r in run.rows("samples.csv"):
        key = (r["op"], int(r["size_bytes"]), r.get("dtype", ""), int(r.get("group_size", 0)))
        found.setdefault(key, []).append(float(r["time_us"]))
    return {k: np.array(v) for k, v in found.items()}


def sweep_table(run: RunFolder) -> list[dict[str, Any]]:
    """sweep.csv with numbers as numbers."""
    out = []
    for r in run.rows("sweep.csv"):
        row: dict[str, Any] = dict(r)
        for k in ("size_bytes", "count", "group_size", "calls_per_inference"):
            if r.get(k):
                row[k] = int(r[k])
        for k in ("time_us", "time_p5_us", "time_p95_us", "algbw_gbps", "busbw_gbps"):
            row[k] = float(r[k])
        row["wrong"] = int(r["wrong"]) if r.get("wrong") else None
        out.append(row)
    return out


def run_pattern(run: RunFolder) -> Pattern | None:
    """The pattern a replay (or a --from-pattern sweep) ran, rebuilt from its command line."""
    if "pattern" not in run.meta:
        return None
    from microbench.cli.pattern_args import add_pattern_arguments, pattern_from_args

    parser = OneLineParser(prog="infercomm", add_help=False, allow_abbrev=False)
    add_pattern_arguments(parser, required=False)
    argv = list(run.meta["argv"])[1:]
    args, _ = parser.parse_known_args(argv)
    if not any(a == "--engine" or a.startswith("--engine=") for a in argv):
        # The default engine changed (vllm-v0, then vllm): the engine that ran is recorded.
        recorded = run.meta["pattern"].get("engine", {}).get("name")
        args.engine = recorded if isinstance(recorded, str) else args.engine
    try:
        return pattern_from_args(args)
    except (ConfigError, TypeError, AttributeError) as err:
        raise UsageError(f"{run.path}: cannot rebuild its pattern from the recorded command "
                         f"line ({err}); pass the pattern options instead") from None

