"""`infercomm replay`: run a pattern's calls on real ranks and measure their time."""

import argparse
import json
import socket
from pathlib import Path
from typing import Any

from microbench import dist, faults, launch
from microbench.argtypes import UsageError, non_negative_int, positive_int
from microbench.failures import report_rank_failure
from microbench.graphs import MODES, resolve_mode
from microbench.pattern_args import add_pattern_arguments, pattern_from_args
from microbench.pattern_view import pattern_document, title
from microbench.replay import LEVELS, RankSamples, Replayer
from patterns import ConfigError, Pattern

EXAMPLES = """\
launch:
  infercomm replay --model llama-3.1-8b --tp 2 --prompt 128 --decode 128      (2 local ranks)
  mpiexec -n 4 infercomm replay --backend mpi --model llama-3.1-8b --tp 2 --pp 2 ...
  torchrun --nproc-per-node 4 -m microbench replay --model llama-3.1-8b --tp 4 ...
  srun -N 2 --ntasks-per-node 4 infercomm replay --model llama-3.1-70b --tp 8 ...
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "replay", help="replay a pattern's calls on real ranks and time them",
        description="Issue every call of one inference's pattern, in order, with its shapes, "
                    "dtype and groups, and no model compute; time the prefill, each decode "
                    "step and the whole inference.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pattern_arguments(parser)
    add_run_arguments(parser)
    parser.add_argument("--timing", choices=LEVELS, default="step",
                        help="marks per inference, per step (default) or per call")
    parser.add_argument("--graph", choices=MODES, default=None,
                        help="decode: capture each decode step in a CUDA graph and replay it, "
                             "prefill eager, as vLLM does (default on CUDA for torch and nccl, "
                             "except with --timing op); none: every call eager")
    parser.add_argument("--label", default=None,
                        help="run folder label (default replay-MODEL-tpTppP-BACKEND)")
    parser.set_defaults(run=run)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Options every measuring command shares (replay, sweep)."""
    group = parser.add_argument_group("run")
    group.add_argument("--backend", choices=("torch", "mpi", "nccl"), default="torch",
                       help="torch (NCCL on GPUs, gloo on CPUs), mpi (mpi4py) or nccl (NCCL "
                            "through CuPy, without torch.distributed)")
    group.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                       help="buffers on cpu or cuda (default: cuda when available)")
    group.add_argument("-n", "--iters", type=positive_int, default=10,
                       help="timed iterations (default 10)")
    group.add_argument("-w", "--warmup", type=non_negative_int, default=2,
                       help="warm-up iterations, not timed (default 2)")
    group.add_argument("-c", "--check", action="store_true",
                       help="issue every call once more with known data and count wrong "
                            "elements (exit 1 if any)")
    group.add_argument("--timeout", type=float, default=120.0,
                       help="seconds without progress after which every rank ends "
                            "(default 120)")
    group.add_argument("--nproc", type=positive_int, default=None,
                       help="start N local ranks (default: tp*pp when no launcher started "
                            "this process)")
    group.add_argument("--mpi-staging", action="store_true",
                       help="mpi with --device cuda: copy through host buffers around each "
                            "call (recorded in the results)")
    group.add_argument("--out", default="results", help="results folder (default results/)")


def resolve_device(requested: str, backend: str = "torch") -> str:
    if requested != "auto":
        if requested == "cuda" and not _cuda_available(backend):
            raise UsageError("--device cuda asked for, but no CUDA device is visible; "
                             "use --device cpu")
        return requested
    return "cuda" if _cuda_available(backend) else "cpu"


def _cuda_available(backend: str = "torch") -> bool:
    """Whether the library behind `backend` sees a CUDA device: CuPy for nccl (which works
    beside a CPU build of torch), torch for the others (their device buffers are torch's)."""
    if backend == "nccl":
        try:
            import cupy
            return int(cupy.cuda.runtime.getDeviceCount()) > 0
        except Exception:  # no CuPy, no driver or no device: CuPy raises its own errors
            return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def strip_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def check_out_dir(out: str) -> None:
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--out {out!r} cannot be created ({err.strerror}); pass a writable "
                         "folder") from None
    if not path.is_dir():
        raise UsageError(f"--out {out!r} is not a folder; pass a writable folder")


def check_backend_options(args: argparse.Namespace) -> None:
    """Refusals that need no rank (one line, exit 2, before any process starts)."""
    if args.backend == "nccl":
        from microbench.backends.nccl_backend import require_cupy
        require_cupy()
        if args.device == "cpu":
            raise UsageError("the nccl backend runs on CUDA devices only; drop --device cpu "
                             "or use --backend torch")
    device = args.device
    if args.graph == "decode" and device == "auto":
        device = resolve_device(device, args.backend)  # a CPU-only machine: refuse here
    resolve_mode(args.graph, args.backend, device, args.timing)


def run(args: argparse.Namespace) -> int:
    pattern = pattern_from_args(args)  # bad input ends here, before any process or file
    check_backend_options(args)
    env = dist.detect()
    if args.nproc is not None or env is None:
        nproc = args.nproc or pattern.layout.world_size
        pattern.layout.check_world_size(nproc)
        check_out_dir(args.out)
        return launch.spawn_local(nproc, args.backend, strip_nproc(args.argv))
    pattern.layout.check_world_size(env.world_size)
    args.launcher = env.launcher
    return run_rank(pattern, env, args)


def run_rank(pattern: Pattern, env: dist.DistEnv, args: argparse.Namespace) -> int:
    from microbench.backends import open_backend
    from microbench.plan import build_plan
    from microbench.watchdog import Watchdog

    watchdog = Watchdog(args.timeout, env.rank).start()
    faults.startup_stall(env.rank)
    try:
        device = resolve_device(args.device, args.backend)
        args.graph = resolve_mode(args.graph, args.backend, device, args.timing)
        backend = open_backend(args.backend, env=env, device=device, timeout=args.timeout,
                               staging=args.mpi_staging)
        watchdog.where = "group creation"
        plan = build_plan(pattern, backend)
        replayer = Replayer(plan, backend, args.timing, watchdog, args.graph)
        marks = replayer.run(args.warmup, args.iters, progress=backend.rank == 0)
        wrong = replayer.check() if args.check else None
        watchdog.where = "collecting results"
        samples = RankSamples(backend.rank, plan.stage, socket.gethostname(), args.timing,
                              marks, replayer.prefill_mark, replayer.step_marks, wrong)
        kinds = ([op.op.kind.value for run in plan.runs for _ in range(run.repeat)
                  for op in run.ops] if args.timing == "op" else [])
        gathered = backend.allgather_object((samples, kinds))
        status = 0
        if backend.rank == 0:
            from microbench.replay_results import write_replay
            summary = write_replay(pattern, plan, backend, args, gathered)
            print(json.dumps(summary["last_line"], separators=(",", ":")))
            status = 1 if summary["last_line"]["wrong"] else 0
        else:
            status = 1 if any(s.wrong for s, _ in gathered) else 0
        backend.close()
        return status
    except (UsageError, ConfigError):
        raise
    except Exception as err:  # a peer's failure surfaces here as a library error
        return report_rank_failure("replay", env.rank, err)
    finally:
        watchdog.stop()


def default_label(pattern: Pattern, backend: str) -> str:
    lay = pattern.layout
    return f"replay-{pattern.model.name.split('/')[-1]}-tp{lay.tp}pp{lay.pp}-{backend}"


def header_title(pattern: Pattern) -> str:
    return "replay: " + title(pattern)


def pattern_summary(pattern: Pattern) -> dict[str, Any]:
    doc = pattern_document(pattern)
    return {k: doc[k] for k in ("model", "layout", "workload", "engine", "volume_bytes",
                                "calls_per_inference", "rows")}
