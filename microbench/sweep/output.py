"""Rank 0 turns every rank's sweep durations into a run folder (sweep.csv, samples.csv,
summary.json, meta.json) and nccl-tests' table; the KV transfer's sweep writes the same."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from microbench.sweep.busbw import SweepOp, algbw_gbps, busbw_gbps
from microbench.views.pattern import pattern_summary
from microbench.views.textfmt import format_bytes, render_table
from patterns import Pattern

if TYPE_CHECKING:  # the sweep's timing imports numpy: only a rank needs it, not --help
    from microbench.sweep.cases import Case

COLUMNS = ["op", "size_bytes", "count", "dtype", "group_size", "time_us", "time_p5_us",
           "time_p95_us", "time_run_us", "algbw_gbps", "busbw_gbps", "wrong"]
SAMPLE_COLUMNS = ["op", "size_bytes", "dtype", "group_size", "iteration", "time_us"]


def sweep_rows(cases: list[Case], gathered: list[tuple[str, list[Any]]],
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(sweep.csv rows, samples.csv rows) from every rank's raw durations."""
    from microbench.sweep.cases import rank_max, run_time, stats

    rows, samples = [], []
    for i, case in enumerate(cases):
        per_rank = [results[i][0] for _, results in gathered]
        wrongs = [results[i][1] for _, results in gathered]
        times = rank_max(per_rank)
        median, p5, p95 = stats(times)
        row: dict[str, Any] = {
            "op": case.op.value, "size_bytes": case.size_bytes, "count": case.count,
            "dtype": case.dtype, "group_size": case.group_size, "time_us": round(median, 3),
            "time_p5_us": round(p5, 3), "time_p95_us": round(p95, 3),
            "time_run_us": round(run_time(per_rank), 3),
            "algbw_gbps": round(algbw_gbps(case.size_bytes, median), 6),
            "busbw_gbps": round(busbw_gbps(case.op, case.size_bytes, median,
                                           case.group_size), 6),
            "wrong": None if any(w is None for w in wrongs) else sum(wrongs)}
        if case.calls_per_inference is not None:
            row["calls_per_inference"] = case.calls_per_inference
        rows.append(row)
        samples += [{"op": case.op.value, "size_bytes": case.size_bytes, "dtype": case.dtype,
                     "group_size": case.group_size, "iteration": it,
                     "time_us": round(float(t), 3)} for it, t in enumerate(times)]
    return rows, samples


def node_ids(hosts: list[str], ranks_per_node: int | None) -> list[int]:
    """Each rank's node: by --ranks-per-node (consecutive ranks) or by the host it ran on."""
    if ranks_per_node is not None:
        return [r // ranks_per_node for r in range(len(hosts))]
    order = list(dict.fromkeys(hosts))
    return [order.index(h) for h in hosts]


def case_level(case: Case, nodes: list[int]) -> str:
    """intra when every pair that talks in the case is on one node, else inter. Groups are
    the first group_size ranks; sendrecv pairs each rank with the next (a ring), stream pairs
    as Case.stream_peer says."""
    n = case.group_size
    if case.op == SweepOp.SENDRECV:
        pairs = [(r, (r + 1) % n) for r in range(n)]
    elif case.op == SweepOp.STREAM:
        pairs = [(r, p[1]) for r in range(n) if (p := case.stream_peer(r)) and p[0]]
    else:
        pairs = [(0, r) for r in range(1, n)]
    return "inter" if any(nodes[a] != nodes[b] for a, b in pairs) else "intra"


def write_sweep(cases: list[Case], pattern: Pattern | None, backend: Any,
                args: argparse.Namespace, gathered: list[tuple[str, list[Any]]],
                ) -> dict[str, Any]:
    from microbench.results.store import base_meta, csv_text, json_text, write_run_or_keep

    rows, samples = sweep_rows(cases, gathered)
    hosts = [host for host, _ in gathered]
    columns = COLUMNS + (["calls_per_inference"] if pattern is not None else [])
    nodes = node_ids(hosts, args.ranks_per_node)
    if len(set(nodes)) > 1:  # placement matters: say each row's level
        columns.append("level")
        for row, case in zip(rows, cases, strict=True):
            row["level"] = case_level(case, nodes)
    head = {"kind": "sweep", "backend": backend.name, "transport": backend.transport,
            "device": backend.device, "world_size": backend.world_size,
            "iterations": args.iters, "warmup": args.warmup,
            "allreduce_algo": getattr(args, "allreduce_algo", None) or "library"}
    from microbench.ranks import cpus

    where = cpus.placement(hosts, backend.device)
    from microbench.results.store import print_standin_line
    print_standin_line("sweep")  # the output's first line: no GPU was touched
    text = cpus.warning("sweep", where)
    if text:
        print(text)
    meta: dict[str, Any] = {
        **base_meta(args.argv), **head, "hosts": hosts, **where, "launcher": args.launcher,
        "versions": backend.versions(), "check": args.check, "timeout_s": args.timeout,
        "source": "pattern" if pattern is not None else "sizes",
        "ranks_per_node": args.ranks_per_node, "nodes": len(set(nodes)),
        "ops": list(dict.fromkeys(c.op.value for c in cases)),
        "sizes": sorted({c.size_bytes for c in cases}),
        "dtypes": sorted({c.dtype for c in cases})}
    if pattern is not None:
        meta["pattern"] = pattern_summary(pattern)
    wrongs = [r["wrong"] for r in rows]
    summary = {**head, "wrong": None if None in wrongs else sum(wrongs), "rows": rows}
    files = {"meta.json": json_text(meta), "sweep.csv": csv_text(rows, columns),
             "samples.csv": csv_text(samples, SAMPLE_COLUMNS), "summary.json": json_text(summary)}
    label = args.label or default_label(pattern, backend, head["allreduce_algo"])
    folder, error = write_run_or_keep(args.out, label, files)
    print(sweep_table(rows, head, hosts, pattern is not None))
    print(f"results: {folder}")
    from microbench.results.store import gpu_standin
    return {**{k: v for k, v in summary.items() if k != "rows"},
            # the rows are in summary.json and sweep.csv: the last line stays short
            "cases": len(rows), "results_dir": str(folder) if folder is not None else None,
            **({"gpu_standin": True} if gpu_standin() else {}),
            "write_error": error, "kept_dir": folder}


def default_label(pattern: Pattern | None, backend: Any, algo: str = "library") -> str:
    """...-ring (etc.) when --allreduce-algo is not the library's own."""
    suffix = "" if algo == "library" else f"-{algo}"
    if pattern is None:
        return f"sweep-{backend.name}-{backend.transport}-w{backend.world_size}{suffix}"
    lay = pattern.layout
    return (f"sweep-{pattern.model.name.split('/')[-1]}-tp{lay.tp}pp{lay.pp}-"
            f"{backend.name}-{backend.transport}{suffix}")


def sweep_table(rows: list[dict[str, Any]], head: dict[str, Any], hosts: list[str],
                with_calls: bool) -> str:
    """nccl-tests' layout: one block per collective, sizes down the page."""
    from microbench.sweep.cases import RUN_CALLS

    lines = [f"# infercomm sweep: {head['backend']} ({head['transport']}) on {head['device']}, "
             f"{head['world_size']} ranks on {len(set(hosts))} host(s); {head['iterations']} "
             f"timed calls after {head['warmup']} warm-up; all-reduce: "
             f"{head.get('allreduce_algo', 'library')}; time = median of the slowest "
             f"rank's, run = a call's share of {RUN_CALLS} back to back (what predict fits), "
             "GB/s = 1e9 bytes/s"]
    header = ["size", "count", "type", "time(us)", "p5(us)", "p95(us)", "run(us)", "algbw(GB/s)",
              "busbw(GB/s)", "#wrong"] + (["calls/inference"] if with_calls else [])
    for op in dict.fromkeys(r["op"] for r in rows):
        for n in sorted({r["group_size"] for r in rows if r["op"] == op}):
            block = [r for r in rows if r["op"] == op and r["group_size"] == n]
            body = [[f"{r['size_bytes']} ({format_bytes(r['size_bytes'])})", str(r["count"]),
                     r["dtype"], f"{r['time_us']:.2f}", f"{r['time_p5_us']:.2f}",
                     f"{r['time_p95_us']:.2f}", f"{r['time_run_us']:.2f}",
                     f"{r['algbw_gbps']:.4f}",
                     f"{r['busbw_gbps']:.4f}",
                     "N/A" if r["wrong"] is None else str(r["wrong"])]
                    + ([f"{r['calls_per_inference']:,}"] if with_calls else [])
                    for r in block]
            lines += ["", f"# {op} over {n} ranks",
                      render_table(header, body, right_align=set(header) - {"type"})]
    return "\n".join(lines)
