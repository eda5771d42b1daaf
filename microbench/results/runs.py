"""Run folders read back: metadata, per-iteration samples of every metric, and the pattern.

Only files are read; nothing is rerun. Every file comes through `microbench.results.load`
(pandas DataFrames, validated as they are read), so the commands compute from exactly what a
notebook sees. Replay metrics are the slowest rank's figures of each timed inference
(iterations.csv, ops.csv); sweep metrics the slowest rank's time of each timed call
(samples.csv).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from microbench.argtypes import OneLineParser, UsageError
from microbench.results.metrics import decode_step_us
from microbench.views.textfmt import format_bytes
from patterns import ConfigError, Pattern

if TYPE_CHECKING:
    import pandas as pd

    from microbench.results.tables import Results

KINDS = ("replay", "sweep", "kvtransfer")


@dataclass(frozen=True)
class RunFolder:
    path: Path
    meta: dict[str, Any]  # as written (nested); tables.meta is the flattened one
    tables: "Results"

    @property
    def kind(self) -> str:
        return str(self.meta["kind"])

    @property
    def name(self) -> str:
        return self.path.name

    def has(self, filename: str) -> bool:
        return (self.path / filename).is_file()

    def describe(self) -> str:
        m = self.meta
        hosts = len(set(m.get("hosts") or [])) or 1
        transport = m.get("transport") or m.get("kv_transport")  # kvtransfer runs: NIXL, rma
        return (f"{m.get('backend')} ({transport}) on {m.get('device')}, "
                f"{m.get('world_size')} ranks on {hosts} host(s)")


def load_run(path: str | Path) -> RunFolder:
    from microbench.results import load

    results = load(path)
    return RunFolder(results.path, results.raw_meta, results)


# The stand-ins' GPU names (tests/fake_cupy.py, tests/fake_torch_cuda.py), for runs written
# before meta.json recorded gpu_standin.
_STANDIN_GPU_NAMES = ("Stand-in GPU", "Fake H100")


def made_on_standins(run: RunFolder) -> bool:
    """Whether the run ran on the test suite's stand-ins for CUDA, CuPy and NCCL."""
    flag = run.meta.get("gpu_standin")
    if flag is not None:
        if not isinstance(flag, bool):
            raise UsageError(f"{run.path / 'meta.json'}: gpu_standin is {flag!r}, not true or "
                             "false; the file is not one infercomm wrote")
        return flag
    versions = run.meta.get("versions")
    gpu = str(versions.get("gpu") or "") if isinstance(versions, dict) else ""
    return gpu.startswith(_STANDIN_GPU_NAMES)


def refuse_mixed_standins(runs: list[RunFolder]) -> None:
    """Stand-in runs measure no GPU: never set beside real runs (one line, exit 2)."""
    standin = [r for r in runs if made_on_standins(r)]
    real = [r for r in runs if not made_on_standins(r)]
    if standin and real:
        raise UsageError(f"{standin[0].path} ran on the test suite's GPU stand-ins "
                         f"(meta.json gpu_standin) and {real[0].path} on real devices; "
                         "stand-in runs go only with stand-in runs")


def decode_steps(run: RunFolder) -> int:
    return int(run.meta["pattern"]["workload"]["decode_steps"])


def _needed(run: RunFolder, name: str) -> "pd.DataFrame":
    frame = getattr(run.tables, name)
    if frame is None:
        raise UsageError(f"{run.path}: no {name}.csv; a {run.kind} run folder has one")
    return frame


def replay_samples(run: RunFolder) -> dict[str, np.ndarray]:
    """Per timed inference: prefill, decode step (results/metrics.py), end to end, and per
    op kind."""
    rows = _needed(run, "iterations")
    out = {"prefill_us": rows["prefill_us"].to_numpy(dtype=float)}
    steps = decode_steps(run)
    if steps:
        out["decode_step_us"] = decode_step_us(rows["decode_us"].to_numpy(dtype=float), steps)
    out["e2e_us"] = rows["e2e_us"].to_numpy(dtype=float)
    if run.tables.ops is not None:
        ops = run.tables.ops
        beyond = ops["iteration"] >= len(rows)
        if beyond.any():
            first = int(beyond.idxmax())
            raise UsageError(f"{run.path / 'ops.csv'}: line {first + 2}: iteration "
                             f"{int(ops['iteration'][first])}, but iterations.csv has "
                             f"{len(rows)} timed inferences; the files are not of one run")
        out.update(op_kind_samples(ops, len(rows)))
    return out


def kv_samples(run: RunFolder) -> dict[str, np.ndarray]:
    """A disaggregated replay's samples: one request's KV transfer per timed iteration (the
    slowest rank's time)."""
    rows = _needed(run, "iterations")
    return {"kv_transfer_us": rows["kv_transfer_us"].to_numpy(dtype=float)}


def op_kind_samples(ops: "pd.DataFrame", iterations: int) -> dict[str, np.ndarray]:
    """Per op kind and inference: each rank's summed call times, the slowest rank's sum
    (0 in an inference where the kind has no call)."""
    per_rank = ops.groupby(["op", "iteration", "rank"])["time_us"].sum()
    worst = per_rank.groupby(level=["op", "iteration"]).max().unstack("iteration")
    worst = worst.reindex(columns=range(iterations), fill_value=0.0).fillna(0.0)
    return {f"{kind}_us": worst.loc[kind].to_numpy(dtype=float) for kind in sorted(worst.index)}


SweepKey = tuple[str, int, str, int]  # op, size_bytes, dtype, group_size


def sweep_key_name(key: SweepKey) -> str:
    op, size, dtype, n = key
    return f"{op} {format_bytes(size)} {dtype} n={n}"


def sweep_samples(run: RunFolder) -> dict[SweepKey, np.ndarray]:
    """Per (op, size, dtype, group size): the slowest rank's time of each timed call."""
    frame = _needed(run, "samples")
    dtype = frame["dtype"] if "dtype" in frame else ""
    group = frame["group_size"].fillna(0) if "group_size" in frame else 0
    keyed = frame.assign(dtype=dtype, group_size=group)
    return {(str(op), int(size), str(dt), int(n)): g["time_us"].to_numpy(dtype=float)
            for (op, size, dt, n), g in keyed.groupby(["op", "size_bytes", "dtype",
                                                       "group_size"], sort=False)}


def sweep_table(run: RunFolder) -> list[dict[str, Any]]:
    """sweep.csv with numbers as numbers (validated by tables.py)."""
    frame = _needed(run, "sweep")
    out = []
    for record in frame.to_dict("records"):
        row = {k: _plain(v) for k, v in record.items()}
        row["wrong"] = row.get("wrong")
        out.append(row)
    return out


def _plain(value: Any) -> Any:
    """numpy and pandas scalars as Python ones; a missing optional value as None."""
    import pandas as pd

    if value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return None
    return value.item() if isinstance(value, np.generic) else value


def load_sweep(flag: str, path: str, collectives: bool = False) -> RunFolder:
    """The sweep run at `path`; `flag` names the option that gave it in a refusal. With
    `collectives`, a sweep of the KV transfer alone is refused: it prices no collective, and
    a plan from it took the layouts without communication (dp only) for the best."""
    sweep = load_run(path)
    if sweep.kind != "sweep":
        raise UsageError(f"{flag} {path}: a {sweep.kind} run; pass a sweep run")
    if collectives and {r["op"] for r in sweep_table(sweep)} <= {"kvtransfer"}:
        raise UsageError(f"{flag} {path}: a sweep of the KV transfer (sweep --op kvtransfer), "
                         "which prices no collective; pass a sweep of the collectives "
                         "(sweep --op allreduce,... or --from-pattern)")
    return sweep


def run_pattern(run: RunFolder) -> Pattern | None:
    """The pattern a replay (or a --from-pattern sweep) ran, rebuilt from its command line."""
    if "pattern" not in run.meta:
        return None
    from microbench.options.pattern_args import add_pattern_arguments, pattern_from_args

    parser = OneLineParser(prog="infercomm", add_help=False, allow_abbrev=False)
    add_pattern_arguments(parser, required=False)
    argv = list(run.meta["argv"])[1:]
    if "--trace" in argv:
        return _trace_pattern(run, argv)
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


def _trace_pattern(run: RunFolder, argv: list[str]) -> Pattern:
    """A `replay --trace` run's pattern, read again from the trace files it replayed.

    The files are named as the command line gave them (relative to where it ran); one that
    is gone or changed its layout is said in one line rather than priced as something else.
    """
    start = argv.index("--trace") + 1
    files = []
    for arg in argv[start:]:
        if arg.startswith("-"):
            break
        files.append(arg)
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise UsageError(f"{run.path}: replayed the trace {missing[0]}, which is not here "
                         "(run from the folder it was replayed from, or pass the pattern "
                         "options instead)")
    from patterns.traces import read_traces
    from patterns.traces.to_pattern import trace_pattern

    try:
        pattern = trace_pattern(read_traces(files))
    except ConfigError as err:  # the file changed since, or is no longer a trace
        raise UsageError(f"{run.path}: its trace no longer reads ({err}); pass the pattern "
                         "options instead") from None
    recorded = run.meta["pattern"].get("layout", {}).get("world_size")
    if recorded is not None and pattern.layout.world_size != recorded:
        raise UsageError(f"{run.path}: the trace {files[0]} now reads as "
                         f"{pattern.layout.world_size} ranks, the replay ran {recorded}; "
                         "pass the pattern options instead")
    return pattern
