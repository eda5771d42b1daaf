"""`infercomm sweep`: time each collective over a range of sizes, in nccl-tests' vocabulary."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from microbench.argtypes import UsageError, byte_size, positive_int, run_label
from microbench.options.pattern_args import add_pattern_arguments, pattern_from_args
from microbench.ranks import dist, launch
from microbench.ranks.failures import report_rank_failure
from microbench.replay.run_args import (
    add_run_arguments,
    check_out_dir,
    check_out_for_rank,
    resolve_device,
    strip_nproc,
)
from microbench.sweep.busbw import SweepOp
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
    from microbench.options.pattern_args import refuse_pattern_options
    refuse_pattern_options(args)
    if given_range and args.sizes is not None:
        raise UsageError("give sizes by -b/-e/-f or by --sizes, not both")
    if args.sizes is not None and not args.sizes:
        raise UsageError("--sizes is empty; write sizes like 8K,1M")
    return None


def refuse_unused_options(args: argparse.Namespace) -> None:
    """The replay and KV options a sweep would ignore: --with-collectives (replay --disagg's)
    always, the KV transfer's unless --op kvtransfer."""
    if args.with_collectives:
        raise UsageError("--with-collectives acts with replay --disagg; a sweep does not take it")
    kv = [flag for flag, value, default in (
        ("--kv-descriptors", args.kv_descriptors, None),
        ("--kv-direction", args.kv_direction, "read"),
        ("--kv-transport", args.kv_transport, None),
        ("--nixl-progress-thread", args.nixl_progress_thread, False),
        ("--mooncake-protocol", args.mooncake_protocol, None),
        ("--mooncake-host", args.mooncake_host, None)) if value != default]
    if kv and args.op != ["kvtransfer"]:
        raise UsageError(f"{', '.join(kv)} act{'s' if len(kv) == 1 else ''} only with --op "
                         f"kvtransfer; drop {'it' if len(kv) == 1 else 'them'} or sweep --op "
                         "kvtransfer")


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
    # a settings grid: one sweep per combination (tuning/env_grid.py)
    if args.env or args.env_runs is not None:
        from microbench.tuning.env_grid import run_grid
        return run_grid("sweep", args)
    refuse_unused_options(args)
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
        watchdog.check = getattr(backend, "async_error", None)  # NCCL's async errors, as replay
        from microbench.algorithms.args import wrap
        from microbench.sweep.output import write_sweep

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
        backend.close()  # every rank, before rank 0 writes (as replay: no barrier on a disk)
        watchdog.stop()
        if backend.rank == 0:
            for note in skipped:
                sys.stderr.write(f"infercomm sweep: skipped {note}\n")
            last = write_sweep(cases, pattern, backend, args, gathered)
            error, kept = last.pop("write_error"), last.pop("kept_dir")
            print(json.dumps(last, separators=(",", ":")), flush=True)
            if error is not None:
                from microbench.results.store import WRITE_ERROR_EXIT_STATUS, write_error_message
                sys.stderr.write(write_error_message("sweep", args.out, error, kept))
                return WRITE_ERROR_EXIT_STATUS
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
