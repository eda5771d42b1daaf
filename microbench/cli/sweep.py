"""`infercomm sweep`: time each collective over a range of sizes, in nccl-tests' vocabulary."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from microbench.argtypes import UsageError, byte_size, positive_int, run_label
from microbench.cli.pattern_args import add_pattern_arguments, pattern_from_args
from microbench.ranks import dist, launch
from microbench.ranks.failures import report_rank_failure
from microbench.replay.run_args import (
    add_run_arguments,
    check_out_dir,
    check_out_for_rank,
    resolve_device,
    strip_nproc,
)
from microbench.sweep.busbw import SweepOp, algbw_gbps, busbw_gbps
from microbench.views.pattern import pattern_summary
from microbench.views.textfmt import format_bytes, render_table
from patterns import ConfigError, Pattern, canonical_dtype

if TYPE_CHECKING:  # the sweep's timing imports numpy: only a rank needs it, not --help
    from microbench.sweep.cases import Case

EXAMPLES = """\
examples:
  infercomm sweep --op allreduce,allgather -b 8 -e 128M -f 2         (2 local ranks)
  infercomm sweep --op sendrecv --sizes 8K,1M --backend mpi -c
  infercomm sweep --from-pattern --model llama-3.1-8b --tp 2 --prompt 128 --decode 128
  srun -N 2 --ntasks-per-node 4 infercomm sweep --op allreduce -b 8 -e 1G -f 2

--dtype is bf16 unless given (fp16, fp32); with --from-pattern, the pattern's.
size follows nccl-tests: the larger of a rank's send and receive buffers (allgather's
output, reducescatter's input), count the elements one rank passes to the library.
"""

COLUMNS = ["op", "size_bytes", "count", "dtype", "group_size", "time_us", "time_p5_us",
           "time_p95_us", "time_run_us", "algbw_gbps", "busbw_gbps", "wrong"]
SAMPLE_COLUMNS = ["op", "size_bytes", "dtype", "group_size", "iteration", "time_us"]
DEFAULT_MIN, DEFAULT_MAX, DEFAULT_FACTOR = 8, 32 << 20, 2


def op_list(text: str) -> list[SweepOp]:
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    known = ", ".join(SweepOp)
    if "kvtransfer" in names:  # a KV transfer, not a collective: microbench/sweep/kv_transfer.py
        if names != ["kvtransfer"]:
            raise argparse.ArgumentTypeError("--op kvtransfer is swept on its own run")
        return ["kvtransfer"]  # type: ignore[list-item]
    if not names:
        raise argparse.ArgumentTypeError(f"no op given; use one or more of {known}")
    for name in names:
        if name not in SweepOp.__members__.values():
            raise argparse.ArgumentTypeError(f"unknown op {name!r}; use one or more of {known}")
    return list(dict.fromkeys(SweepOp(n) for n in names))


def size_list(text: str) -> list[int]:
    return [byte_size(t) for t in text.split(",") if t.strip()]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sweep", help="time collectives over a range of message sizes (like nccl-tests)",
        description="Time each collective at each size: barrier, -w warm-up calls, -n timed "
                    "calls; per call the slowest rank's time; median, p5, p95, algorithm and "
                    "bus bandwidth as nccl-tests defines them.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep = parser.add_argument_group("sweep")
    sweep.add_argument("--op", type=op_list, default=None,
                       help=f"comma-separated: {', '.join(SweepOp)}, or kvtransfer alone "
                            "(default allreduce; with "
                            "--from-pattern, every op of the pattern)")
    sweep.add_argument("-b", "--minbytes", type=byte_size, default=None,
                       help="smallest size, e.g. 8, 8K, 1M (default 8)")
    sweep.add_argument("-e", "--maxbytes", type=byte_size, default=None,
                       help="largest size (default 32M)")
    sweep.add_argument("-f", "--stepfactor", type=positive_int, default=None,
                       help="multiply the size by this much each step (default 2)")
    sweep.add_argument("--sizes", type=size_list, default=None,
                       help="explicit comma-separated sizes instead of -b -e -f, e.g. 8K,1M")
    sweep.add_argument("--from-pattern", action="store_true",
                       help="the distinct messages of a pattern (give the pattern options), "
                            "each over a group of its size: the first group_size ranks")
    sweep.add_argument("--ranks-per-node", type=positive_int, default=None, metavar="N",
                       help="placement: ranks 0..N-1 on the first node, N..2N-1 on the next "
                            "(default: the hosts the ranks ran on); each row's `level` says "
                            "whether its group stays on one node (intra) or spans nodes "
                            "(inter), and with N below the world every op is also swept over "
                            "the first N ranks, on one node")
    sweep.add_argument("--label", default=None, type=run_label,
                       help="run folder label (default sweep-BACKEND-TRANSPORT-wWORLD)")
    add_pattern_arguments(parser, required=False)
    add_run_arguments(parser)
    from microbench.cli.kv_args import add_kv_replay_arguments, add_kv_sweep_arguments
    add_kv_replay_arguments(parser)
    add_kv_sweep_arguments(parser)
    from microbench.algorithms.args import add_algo_arguments
    add_algo_arguments(parser)
    from microbench.tuning.env_grid import add_env_arguments
    add_env_arguments(parser)
    parser.set_defaults(run=run)


def _pattern(args: argparse.Namespace) -> Pattern | None:
    given_range = any(v is not None for v in (args.minbytes, args.maxbytes, args.stepfactor))
    if args.from_pattern:
        # a workload (--requests) brings its own prompts and outputs
        needed = ("model",) if getattr(args, "requests", None) else ("model", "prompt", "decode")
        missing = [f"--{n}" for n in needed if getattr(args, n) is None]
        if missing:
            raise UsageError(f"--from-pattern needs {', '.join(missing)} (the pattern options)")
        if given_range or args.sizes is not None:
            raise UsageError("--from-pattern takes its sizes from the pattern; drop -b/-e/-f "
                             "and --sizes")
        return pattern_from_args(args)
    if args.model is not None or args.prompt is not None or args.decode is not None:
        raise UsageError("--model, --prompt and --decode describe a pattern; add "
                         "--from-pattern to sweep its message sizes")
    if given_range and args.sizes is not None:
        raise UsageError("give sizes by -b/-e/-f or by --sizes, not both")
    if args.sizes is not None and not args.sizes:
        raise UsageError("--sizes is empty; write sizes like 8K,1M")
    return None


def cases_for(args: argparse.Namespace, pattern: Pattern | None,
              world: int) -> tuple[list[Case], list[str]]:
    """The cases this run measures at this world size; raises UsageError when it cannot."""
    from microbench.sweep.cases import geometric_sizes, pattern_cases, size_cases

    if pattern is not None:
        cases = pattern_cases(pattern)
        if not cases:
            raise UsageError("the pattern issues no communication (tp=1, pp=1); give --tp "
                             "or --pp")
        if args.op is not None:
            cases = [c for c in cases if c.op in args.op]
            if not cases:
                ops = sorted({c.op.value for c in pattern_cases(pattern)})
                raise UsageError(f"the pattern has none of --op {','.join(args.op)}; it "
                                 f"issues {', '.join(ops)}")
        largest = max(c.group_size for c in cases)
        if largest > world:
            raise UsageError(f"the pattern's groups need {largest} ranks but the world has "
                             f"{world}; start {largest} or more")
        skipped: list[str] = []
    else:
        dtype = canonical_dtype(args.dtype or "bf16")
        sizes = args.sizes or geometric_sizes(
            args.minbytes if args.minbytes is not None else DEFAULT_MIN,
            args.maxbytes if args.maxbytes is not None else DEFAULT_MAX,
            args.stepfactor or DEFAULT_FACTOR)
        ops = args.op or [SweepOp.ALLREDUCE]
        cases, skipped = size_cases(ops, sizes, dtype, world)
        rpn = getattr(args, "ranks_per_node", None)
        if rpn is not None and rpn < world:
            # Streams over the world pair ranks a node apart, so that each pair crosses.
            cases = [replace(c, stride=rpn) if c.op == SweepOp.STREAM else c for c in cases]
            if rpn >= 2:  # the same ops within one node
                cases += size_cases(ops, sizes, dtype, rpn)[0]
        if not cases:
            raise UsageError(f"every size is smaller than one element per rank: "
                             f"{'; '.join(skipped)}")
    for p2p in (SweepOp.SENDRECV, SweepOp.STREAM):
        if any(c.op == p2p for c in cases) and world < 2:
            raise UsageError(f"{p2p} needs at least 2 ranks; start 2 or more")
    return cases, skipped


def _check_memory(args: argparse.Namespace, cases: list[Case], ranks_here: int) -> None:
    """Host buffers of the largest case on every rank of this host, before any rank starts."""
    from microbench.replay.footprint import available_host_bytes
    from microbench.replay.run_args import buffers_on_cpu
    from microbench.sweep.footprint import check_sweep_fits

    if buffers_on_cpu(args.device, args.backend):
        check_sweep_fits(cases, ranks_here, available_host_bytes())


def check_backend(args: argparse.Namespace) -> None:
    """replay's backend refusals (nccl without CuPy or on CPUs, ...); a sweep issues every
    call eagerly and times each one, so it asks for no CUDA graph."""
    from microbench.replay.run_args import check_backend_options

    check_backend_options(argparse.Namespace(**{**vars(args), "graph": "none",
                                                "timing": "op"}))


def run(args: argparse.Namespace) -> int:
    if args.env:  # a settings grid: one sweep per combination (tuning/env_grid.py)
        from microbench.tuning.env_grid import run_grid
        return run_grid("sweep", args)
    if args.op == ["kvtransfer"]:
        from microbench.sweep.kv_transfer import run_kv_sweep
        return run_kv_sweep(args)
    pattern = _pattern(args)  # bad input ends here, before any process or file
    check_backend(args)
    env = dist.detect()
    if args.nproc is not None or env is None:
        from microbench.sweep.cases import pattern_cases

        default = max([2] + [c.group_size for c in pattern_cases(pattern)]
                      if pattern is not None else [2])
        nproc = args.nproc or default
        from microbench.algorithms.args import check_algo_options
        check_algo_options(args, nproc)  # hierarchical: nodes of --ranks-per-node
        _check_memory(args, cases_for(args, pattern, nproc)[0], nproc)
        check_out_dir(args.out)
        return launch.spawn_local(nproc, args.backend, strip_nproc(args.argv))
    cases, skipped = cases_for(args, pattern, env.world_size)
    check_out_for_rank(args.out, env.rank)
    from microbench.replay.footprint import ranks_on_this_host
    _check_memory(args, cases, ranks_on_this_host())
    args.launcher = env.launcher
    return run_rank(cases, skipped, pattern, env, args)


def run_rank(cases: list[Case], skipped: list[str], pattern: Pattern | None,
             env: dist.DistEnv, args: argparse.Namespace) -> int:
    from microbench.backends import open_backend
    from microbench.ranks.watchdog import Watchdog
    from microbench.sweep.cases import Sweeper

    watchdog = Watchdog(args.timeout, env.rank, command="sweep").start()
    try:
        device = resolve_device(args.device, args.backend)  # CuPy's count for nccl
        if device == "cuda":  # the rank's GPU, before MPI_Init (ranks/device.py)
            from microbench.ranks.device import select_device
            select_device(env, args.backend)
        backend = open_backend(args.backend, env=env, device=device, timeout=args.timeout,
                               staging=args.mpi_staging)
        from microbench.algorithms.args import wrap
        backend = wrap(backend, args)
        watchdog.where = "group creation"
        sizes = sorted({c.group_size for c in cases})
        groups = {n: backend.new_group(f"first{n}", list(range(n))) for n in sizes}
        sweeper = Sweeper(backend, groups, watchdog)
        results = sweeper.run(cases, args.warmup, args.iters, args.check,
                              progress=backend.rank == 0)
        watchdog.where = "collecting results"
        gathered = backend.allgather_object((socket.gethostname(), results))
        wrong = sum(w or 0 for _, rank_results in gathered for _, w in rank_results)
        if backend.rank == 0:
            for note in skipped:
                sys.stderr.write(f"infercomm sweep: skipped {note}\n")
            last = write_sweep(cases, pattern, backend, args, gathered)
            error, kept = last.pop("write_error"), last.pop("kept_dir")
            print(json.dumps(last, separators=(",", ":")), flush=True)
            if error is not None:
                from microbench.results.store import WRITE_ERROR_EXIT_STATUS, write_error_message
                sys.stderr.write(write_error_message("sweep", args.out, error, kept))
                backend.close()
                return WRITE_ERROR_EXIT_STATUS
        backend.close()
        return 1 if wrong else 0
    except (UsageError, ConfigError):
        raise
    except Exception as err:  # a peer's failure surfaces here as a library error
        status = report_rank_failure("sweep", env.rank, err)
        from microbench.ranks.teardown import destructors_may_block, exit_now
        if destructors_may_block(args.backend, locals().get("device")):
            watchdog.stop()
            exit_now(status)  # communicators' destructors could wait for ever (as replay)
        return status
    finally:
        watchdog.stop()


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
            "iterations": args.iters, "warmup": args.warmup}
    from microbench.ranks import cpus

    where = cpus.placement(hosts, backend.device)
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
    label = args.label or default_label(pattern, backend)
    folder, error = write_run_or_keep(args.out, label, files)
    print(sweep_table(rows, head, hosts, pattern is not None))
    print(f"results: {folder}")
    return {**{k: v for k, v in summary.items() if k != "rows"},
            # the rows are in summary.json and sweep.csv: the last line stays short
            "cases": len(rows), "results_dir": str(folder) if folder is not None else None,
            "write_error": error, "kept_dir": folder}


def default_label(pattern: Pattern | None, backend: Any) -> str:
    if pattern is None:
        return f"sweep-{backend.name}-{backend.transport}-w{backend.world_size}"
    lay = pattern.layout
    return (f"sweep-{pattern.model.name.split('/')[-1]}-tp{lay.tp}pp{lay.pp}-"
            f"{backend.name}-{backend.transport}")


def sweep_table(rows: list[dict[str, Any]], head: dict[str, Any], hosts: list[str],
                with_calls: bool) -> str:
    """nccl-tests' layout: one block per collective, sizes down the page."""
    from microbench.sweep.cases import RUN_CALLS

    lines = [f"# infercomm sweep: {head['backend']} ({head['transport']}) on {head['device']}, "
             f"{head['world_size']} ranks on {len(set(hosts))} host(s); {head['iterations']} "
             f"timed calls after {head['warmup']} warm-up; time = median of the slowest "
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
