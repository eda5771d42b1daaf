"""Rank 0 turns every rank's samples into the run folder, the table and the last JSON line."""

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from microbench.backends import Backend
from microbench.ranks import cpus
from microbench.replay import aggregate
from microbench.replay.plan import Plan
from microbench.replay.replayer import RankSamples
from microbench.results.store import (
    base_meta,
    csv_text,
    gpu_standin,
    json_text,
    print_standin_line,
    write_run_or_keep,
)
from microbench.views.pattern import pattern_summary, title
from microbench.views.replay import replay_table
from patterns import Pattern
from patterns.summary import engine_transport_calls

ITERATION_COLUMNS = ["iteration", "prefill_us", "decode_us", "e2e_us", "decode_step_mean_us",
                     "decode_step_median_us", "decode_step_p99_us", "decode_step_max_us"]
WAVE_COLUMNS = ["wave_tail_us"]  # vLLM's DP wave tail, where the pattern has one


def _by_op_kind(ranks: list[RankSamples]) -> dict[str, Any]:
    """Per op kind: calls per inference and time per inference (median; slowest rank), from
    the per-kind sums each rank kept (--timing op)."""
    result = {}
    kinds = sorted({kind for r in ranks for kind in r.kind_calls or {}})
    for kind in kinds:
        per_rank, calls = [], 0
        for r in ranks:
            rank_kinds = sorted(r.kind_calls or {})
            if kind in rank_kinds and r.kind_times is not None:
                per_rank.append(r.kind_times[:, rank_kinds.index(kind)])
                calls = max(calls, (r.kind_calls or {})[kind])
        slowest = np.max(per_rank, axis=0)
        result[kind] = {"calls": calls, "time_us": float(np.median(slowest))}
    return result


def transport_of(backend: Backend, dtype: str) -> str:
    """The backend's transport, and where a CUDA-aware MPI run's sums of `dtype` go through
    host memory (bf16 always; backends/mpi_backend.py staged_reduction), that too:
    "mpi-cuda-aware+staged-bf16", since the run's dominant op (the all-reduce) is staged."""
    staged = getattr(backend, "staged_reduction", None)
    if backend.transport == "mpi-cuda-aware" and staged is not None and staged("allreduce",
                                                                                 dtype):
        return f"{backend.transport}+staged-{dtype}"
    return backend.transport


def write_replay(pattern: Pattern, plan: Plan, backend: Backend, args: argparse.Namespace,
                 ranks: list[RankSamples], ops_csv: Path | None = None,
                 ops_error: OSError | None = None) -> dict[str, Any]:
    steps = pattern.workload.decode_steps
    figures = aggregate.per_iteration(ranks, plan.prefill_steps)
    head = aggregate.headline(figures, steps)
    by_op = _by_op_kind(ranks) if args.timing == "op" else {}
    wrongs = [s.wrong for s in ranks]
    wrong = None if any(w is None for w in wrongs) else sum(wrongs)
    calls = max(pattern.calls_per_inference(s) for s in range(pattern.layout.pp))
    hosts = [s.host for s in ranks]
    where = cpus.placement(hosts, backend.device)
    transport = transport_of(backend, pattern.workload.dtype)
    summary: dict[str, Any] = {
        "kind": "replay",
        "backend": backend.name, "transport": transport, "device": backend.device,
        "world_size": backend.world_size, "hosts": hosts,
        "model": pattern.model.name, "engine": pattern.engine,
        "tp": pattern.layout.tp, "pp": pattern.layout.pp,
        "dp": pattern.layout.dp, "ep": pattern.layout.ep,
        "prompt": pattern.workload.prompt, "decode": pattern.workload.decode,
        "batch": pattern.workload.batch, "dtype": pattern.workload.dtype,
        "iterations": args.iters, "warmup": args.warmup, "timing": args.timing,
        "graph": args.graph,
        "allreduce_algo": getattr(args, "allreduce_algo", None) or "library",
        "prefill_steps": plan.prefill_steps, "decode_steps": steps,
        **({"wave_tail_steps": plan.tail_steps} if plan.tail_steps else {}),
        **head,
        "calls_per_inference": calls, "by_op": by_op, "wrong": wrong,
        "engine_transports": _engine_transports(pattern),
    }
    meta = {**base_meta(args.argv), "kind": "replay", "backend": backend.name,
            "transport": transport, "device": backend.device,
            "world_size": backend.world_size, "hosts": hosts, **where,
            "launcher": args.launcher,
            "local_ranks": getattr(args, "local_ranks", None),  # rank, local rank, its GPU
            "versions": backend.versions(), "timing": args.timing, "graph": args.graph,
            "iterations": args.iters,
            "warmup": args.warmup, "check": args.check, "timeout_s": args.timeout,
            "pattern": pattern_summary(pattern),
            "peak_rss_kib": getattr(args, "peak_rss_kib", None)}
    files: dict[str, str | Path] = {"meta.json": json_text(meta),
             "iterations.csv": csv_text(aggregate.iteration_rows(figures, steps),
                                        ITERATION_COLUMNS + (WAVE_COLUMNS if plan.tail_steps
                                                             else []))}
    if ops_csv is not None and ops_error is None:
        files["ops.csv"] = ops_csv  # streamed there by op_samples.gather_to_csv
    label = args.label or default_label(pattern, backend.name, summary["allreduce_algo"])
    from microbench.replay.workload import workload_times
    summary["workload"] = workload_times(pattern, ranks, files)  # --requests: per request
    files["summary.json"] = json_text(summary)
    folder, summary["write_error"] = write_run_or_keep(args.out, label, files)
    if ops_error is not None and summary["write_error"] is None:
        summary["write_error"] = ops_error  # the run lacks ops.csv: report it as unwritten
    # The folder's name is known once it is in place; the last line carries it. After a
    # write error it names where the run was kept instead (None if nowhere could take it).
    summary["results_dir"] = str(folder) if folder is not None else None
    summary["kept_dir"] = folder
    print_standin_line("replay")  # the output's first line: no GPU was touched
    text = cpus.warning("replay", where)
    if text:
        print(text)
    print(replay_table(summary, header_title(pattern)))
    if summary["workload"] is not None:
        from microbench.replay.workload import workload_lines
        print("\n".join(workload_lines(summary["workload"])))
    last_keys = ["backend", "transport", "device", "world_size", "model", "engine", "tp", "pp",
                 "dp", "ep", "prompt", "decode", "batch", "dtype", "iterations", "timing",
                 "allreduce_algo",
                 "prefill_us", "decode_step_us", "decode_step_p99_us", "e2e_us",
                 "calls_per_inference", "wrong", "results_dir"]
    summary["last_line"] = {k: summary[k] for k in last_keys}
    if gpu_standin():
        summary["last_line"]["gpu_standin"] = True
    if plan.tail_steps:
        summary["last_line"].update(wave_tail_steps=plan.tail_steps,
                                    wave_tail_us=summary["wave_tail_us"])
    if summary["workload"] is not None:
        summary["last_line"]["workload"] = summary["workload"]
    return summary


def _engine_transports(pattern: Pattern) -> dict[str, int]:
    """Calls per inference of the busiest rank by the transport the engine would use."""
    stage = max(range(pattern.layout.pp), key=pattern.calls_per_inference)
    calls = engine_transport_calls(pattern, stage)
    return {t.value: n for t, n in sorted(calls.items(), key=lambda kv: -kv[1])}


def default_label(pattern: Pattern, backend: str, algo: str = "library") -> str:
    """...-ring (etc.) when --allreduce-algo is not the library's own."""
    lay = pattern.layout
    dp = (f"dp{lay.dp}" if lay.dp > 1 else "") + ("ep" if lay.ep else "")
    return (f"replay-{pattern.model.name.split('/')[-1]}-tp{lay.tp}pp{lay.pp}{dp}-{backend}"
            + ("" if algo == "library" else f"-{algo}"))


def header_title(pattern: Pattern) -> str:
    return "replay: " + title(pattern)
