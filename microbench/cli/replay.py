"""`infercomm replay`: run a pattern's calls on real ranks and measure their time."""

import argparse
import json
import os
import resource
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from microbench.argtypes import UsageError, byte_size, run_label
from microbench.options.pattern_args import add_pattern_arguments, pattern_from_args
from microbench.ranks import dist, faults, launch, notes
from microbench.ranks.failures import report_rank_failure
from microbench.replay import LEVELS
from microbench.replay.graphs import MODES, resolve_mode
from microbench.replay.run_args import (
    add_run_arguments,
    buffers_on_cpu,
    check_backend_options,
    check_out_dir,
    check_out_for_rank,
    resolve_device,
    strip_nproc,
)
from microbench.views.textfmt import format_bytes
from patterns import ConfigError, Pattern

EXAMPLES = """\
launch:
  infercomm replay --model llama-3.1-8b --tp 2 --prompt 128 --decode 128      (2 local ranks)
  mpiexec -n 4 infercomm replay --backend mpi --model llama-3.1-8b --tp 2 --pp 2 ...
  torchrun --nproc-per-node 4 -m microbench replay --model llama-3.1-8b --tp 4 ...
  srun -N 2 --ntasks-per-node 4 infercomm replay --model llama-3.1-70b --tp 8 ...
"""


# -w 0 on a GPU: what the first timed inference then includes (N10 of the GPU re-review).
WARMUP_ZERO_ON_GPU = (
    "[infercomm] -w 0 on a GPU: the first timed inference includes one-time costs (torch's "
    "lazy P2P communicators, NCCL's runtime connection, each graph's first upload); use -w 1 "
    "or more for figures\n")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "replay", help="replay a pattern's calls on real ranks and time them",
        description="Issue every call of one inference's pattern, in order, with its shapes, "
                    "dtype and groups, and no model compute; time the prefill, each decode "
                    "step and the whole inference.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pattern_arguments(parser, required=False)
    parser.add_argument("--trace", nargs="+", default=None, metavar="FILE",
                        help="replay the calls of a trace (NCCL/RCCL logs or Kineto JSON, one "
                             "file per rank) in its order instead of a generated pattern; its "
                             "ranks must form a TP x PP layout")
    add_run_arguments(parser)
    parser.add_argument("--timing", choices=LEVELS, default="step",
                        help="marks per inference, per step (default) or per call")
    parser.add_argument("--graph", choices=MODES, default=None,
                        help="decode: capture each decode step in a CUDA graph and replay it, "
                             "prefill eager, as vLLM does (default on CUDA for torch and nccl, "
                             "except with --timing op or an --eager pattern; PP sends and "
                             "receives stay eager between the graphs); none: every call eager")
    parser.add_argument("--max-ops-csv", type=byte_size, default=1 << 30, metavar="SIZE",
                        help="--timing op: refuse to start when ops.csv would be larger "
                             "(default 1G; sizes like 500M, 4G)")
    parser.add_argument("--label", default=None, type=run_label,
                        help="run folder label (default replay-MODEL-tpTppP-BACKEND)")
    from microbench.cli.kv_args import add_kv_replay_arguments
    add_kv_replay_arguments(parser)
    from microbench.algorithms.args import add_algo_arguments
    add_algo_arguments(parser)
    from microbench.tuning.env_grid import add_env_arguments
    add_env_arguments(parser)
    parser.set_defaults(run=run)


def pattern_or_trace(args: argparse.Namespace) -> Pattern:
    """The generated pattern, or the trace's calls folded into one (`--trace`)."""
    named = [flag for flag, value in (("--model", args.model), ("--prompt", args.prompt),
                                      ("--decode", args.decode)) if value is not None]
    laid_out = [flag for flag, value in (("--tp", args.tp), ("--pp", args.pp)) if value != 1]
    laid_out += [flag for flag in ("--requests", "--speculative-config", "--step-time-ms")
                 if getattr(args, flag[2:].replace("-", "_"), None) is not None]
    if args.trace:
        # every pattern option, not only the layout's: --engine, --moe-backend, --connector
        # and the like were ignored, the trace replayed as if they were not given
        from microbench.options.disagg_args import refuse_disagg_options
        from microbench.options.pattern_args import given_pattern_options
        given = given_pattern_options(args)
        if given:
            raise UsageError("--trace replays the trace's own calls on its own layout; drop "
                             + ", ".join(given))
        refuse_disagg_options(args)  # --kv-transport and the KV transfer's other options
        from patterns.traces import read_traces
        from patterns.traces.to_pattern import trace_pattern
        return trace_pattern(read_traces(args.trace))
    if getattr(args, "requests", None) and args.model is not None:
        return pattern_from_args(args)  # a request workload: prompts and outputs are its own
    if len(named) < 3:
        missing = [f for f in ("--model", "--prompt", "--decode") if f not in named]
        if getattr(args, "requests", None):  # a workload gives prompts and outputs itself
            missing = ["--model"]
        raise UsageError(f"the following arguments are required: {', '.join(missing)} (or "
                         "--trace FILE... to replay a trace)")
    return pattern_from_args(args)


def run(args: argparse.Namespace) -> int:
    # a settings grid: one replay per combination (tuning/env_grid.py)
    if args.env or args.env_runs is not None:
        from microbench.tuning.env_grid import run_grid
        return run_grid("replay", args)
    if args.disagg is not None:  # prefill and decode ranks, and the KV transfer between
        from microbench.replay.kv_transfer import run_disagg
        return run_disagg(args)
    pattern = pattern_or_trace(args)  # bad input ends here, before any process or file
    from microbench.replay.graphs import eager_pattern_mode, p2p_algorithm_mode
    args.graph = eager_pattern_mode(pattern, args.graph)  # --eager: no graphs
    args.graph = p2p_algorithm_mode(args.backend, getattr(args, "allreduce_algo", None),
                                    args.graph)
    from microbench.replay.graphs import check_mixing
    check_mixing(pattern, args.graph if args.timing != "op" else "none", args.backend,
                 args.device)  # NCCL_GRAPH_MIXING_SUPPORT=0 and eager calls after graphs
    check_backend_options(args, pattern.layout.world_size)
    if args.timing == "op":
        rows, size = check_ops_size(pattern, args)
        here = dist.detect()
        started_by_us = notes.LAUNCHER_VAR in os.environ  # our launcher said it already
        if here is None or args.nproc is not None or (here.rank == 0 and not started_by_us):
            sys.stderr.write(f"[infercomm] --timing op: ops.csv will hold {rows:,} rows, "
                             f"about {format_bytes(size)}{op_events_note(pattern, args)}\n")
    env = dist.detect()
    if args.nproc is not None or env is None:
        nproc = args.nproc or pattern.layout.world_size
        pattern.layout.check_world_size(nproc)
        if args.timing == "op":
            from microbench.replay.disk_space import check_op_disk
            check_op_disk(pattern, list(range(nproc)), args.iters, size, args.out)
        if buffers_on_cpu(args.device, args.backend):  # every rank's buffers in host memory
            from microbench.replay.footprint import available_host_bytes, check_fits
            check_fits(pattern, list(range(nproc)), args.timing, args.warmup + args.iters,
                       available_host_bytes(), "host memory")
        check_out_dir(args.out)
        return launch.spawn_local(nproc, args.backend, strip_nproc(args.argv))
    pattern.layout.check_world_size(env.world_size)
    check_out_for_rank(args.out, env.rank)
    if args.timing == "op":
        from microbench.replay.disk_space import check_op_disk
        check_op_disk(pattern, [env.rank], args.iters, size, args.out)
    if buffers_on_cpu(args.device, args.backend):
        from microbench.replay.footprint import check_host_share, ranks_on_this_host
        check_host_share(pattern, env.rank, args.timing, args.warmup + args.iters,
                         ranks_on_this_host())
    args.launcher = env.launcher
    return run_rank(pattern, env, args)


def check_rank_fits(pattern: Pattern, rank: int, device: str, args: argparse.Namespace,
                    index: int = 0) -> None:
    """Refuse, before allocating, buffers that this rank's memory cannot hold: on a GPU, the
    free memory of the rank's own device `index` (selected already), less a reserve for the
    CUDA context and the NCCL communicators (ranks/device.py)."""
    from microbench.ranks.device import free_device_bytes, reserve_bytes
    from microbench.replay.footprint import available_host_bytes, check_fits

    iterations = args.warmup + args.iters
    if device == "cuda":
        free = free_device_bytes(args.backend, index)
        reserve, comms = reserve_bytes(pattern, rank)
        check_fits(pattern, [rank], "inference", 0, max(free - reserve, 0),
                   f"GPU {index} memory beyond a {format_bytes(reserve)} reserve for its "
                   f"context and {comms} NCCL communicators")
    check_fits(pattern, [rank], args.timing, iterations, available_host_bytes(), "host memory")


def _gather_ops(pattern: Pattern, replayer: Any, backend: Any,
                iterations: int) -> tuple[Path | None, OSError | None]:
    """Every rank sends its call times; rank 0 writes them to a temporary ops.csv."""
    from microbench.replay.op_samples import gather_to_csv

    path = None
    if backend.rank == 0:
        fd, name = tempfile.mkstemp(prefix="infercomm-ops-", suffix=".csv")
        os.close(fd)
        path = Path(name)
    try:
        error = gather_to_csv(pattern, replayer.op_file, backend.rank, iterations,
                              backend.allgather_object, path)
    finally:
        replayer.op_file.close()
    return path, error


def op_events_note(pattern: Pattern, args: argparse.Namespace) -> str:
    """--timing op on a GPU records one CUDA event per call (replay/timing.py CudaMarks, R14
    of the GPU review): say how many a rank creates up front, as they cost creation time and
    memory; nothing on CPUs or for MPI (host clock)."""
    if args.device == "cpu" or args.backend not in ("torch", "nccl"):
        return ""
    events = max(pattern.calls_per_inference(s) for s in range(pattern.layout.pp)) + 1
    return f"; on a GPU, {events:,} CUDA events a rank (one per call), created before the run"


def check_ops_size(pattern: Pattern, args: argparse.Namespace) -> tuple[int, int]:
    """(rows, bytes) ops.csv will have; refused above --max-ops-csv before anything runs."""
    from microbench.replay.op_samples import estimate

    rows, size = estimate(pattern, args.iters)
    if size > args.max_ops_csv:
        limit = format_bytes(args.max_ops_csv)
        raise UsageError(f"--timing op would write an ops.csv of {rows:,} rows, about "
                         f"{format_bytes(size)}, above --max-ops-csv {limit}; raise "
                         "--max-ops-csv, lower -n or --decode, or use --timing step")
    return rows, size


def run_rank(pattern: Pattern, env: dist.DistEnv, args: argparse.Namespace) -> int:
    import numpy as np

    from microbench.backends import open_backend
    from microbench.ranks.watchdog import Watchdog
    from microbench.replay.plan import build_plan
    from microbench.replay.replayer import RankSamples, Replayer

    if env.rank == 0:  # the rank that writes: an unwritable --out is bad input, found now
        check_out_dir(args.out)
    watchdog = Watchdog(args.timeout, env.rank).start()
    faults.startup_stall(env.rank)
    try:
        device = resolve_device(args.device, args.backend)
        args.graph = resolve_mode(args.graph, args.backend, device, args.timing)
        from microbench.ranks.device import select_device
        index = select_device(env, args.backend) if device == "cuda" else 0  # before MPI_Init
        if device == "cuda" and args.warmup == 0 and env.rank == 0:
            sys.stderr.write(WARMUP_ZERO_ON_GPU)
        check_rank_fits(pattern, env.rank, device, args, index)
        backend = open_backend(args.backend, env=env, device=device, timeout=args.timeout,
                               staging=args.mpi_staging)
        watchdog.check = getattr(backend, "async_error", None)  # NCCL's async errors
        from microbench.algorithms.args import wrap
        backend = wrap(backend, args)
        watchdog.where = "group creation"
        plan = build_plan(pattern, backend)
        replayer = Replayer(plan, backend, args.timing, watchdog, args.graph)
        marks = replayer.run(args.warmup, args.iters, progress=backend.rank == 0)
        wrong = replayer.check() if args.check else None
        if wrong:
            notes.note_wrong(env.rank, wrong)  # the launcher says "data wrong", not "crash"
        watchdog.where = "collecting results"
        op_level = args.timing == "op"
        samples = RankSamples(backend.rank, plan.stage, socket.gethostname(), args.timing,
                              marks, replayer.prefill_mark, replayer.step_marks, wrong,
                              np.array(replayer.kind_times) if op_level else None,
                              replayer.kind_calls if op_level else None, replayer.tail_mark)
        gathered = backend.allgather_object(samples)
        ops_csv, ops_error = (_gather_ops(pattern, replayer, backend, args.iters)
                              if op_level else (None, None))
        args.peak_rss_kib = backend.allgather_object(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux
        args.local_ranks = backend.allgather_object(  # each rank's placement, in meta.json
            {"rank": env.rank, "local_rank": env.local_rank, "from": env.local_var or None,
             "gpu": index if device == "cuda" else None, "graphs": len(plan.graphs)})
        from microbench.replay.graphs import release_graphs
        release_graphs(plan, backend)  # NCCL's destroy waits for graphs that captured it
        # Every rank closes before rank 0 writes: the close's barrier (nccl) would otherwise
        # hold the other ranks while rank 0 writes a large result, until their watchdogs end
        # them. Nothing is left to wait on a peer, so rank 0 writes without a watchdog.
        backend.close()
        watchdog.stop()
        status = 0
        if backend.rank == 0:
            from microbench.replay.output import write_replay
            try:
                summary = write_replay(pattern, plan, backend, args, gathered, ops_csv,
                                       ops_error)
            finally:
                if ops_csv is not None:
                    ops_csv.unlink(missing_ok=True)
            print(json.dumps(summary["last_line"], separators=(",", ":")), flush=True)
            status = 1 if summary["last_line"]["wrong"] else 0
            if summary["write_error"] is not None:
                from microbench.results.store import WRITE_ERROR_EXIT_STATUS, write_error_message
                sys.stderr.write(write_error_message("replay", args.out, summary["write_error"],
                                                     summary["kept_dir"]))
                status = WRITE_ERROR_EXIT_STATUS
        else:
            status = 1 if any(s.wrong for s in gathered) else 0
        return status
    except (UsageError, ConfigError):
        raise
    except Exception as err:  # a peer's failure surfaces here as a library error
        status = report_rank_failure("replay", env.rank, err)
        from microbench.ranks.teardown import destructors_may_block, exit_now
        if destructors_may_block(args.backend, locals().get("device")):
            watchdog.stop()
            exit_now(status)  # communicators' destructors could wait for ever
        return status
    finally:
        watchdog.stop()
