"""Options every measuring command shares (replay, sweep), and the checks they need before
any rank starts."""

import argparse
import os
import tempfile
from pathlib import Path

from microbench.argtypes import (
    UsageError,
    folder_path,
    non_negative_int,
    positive_float,
    positive_int,
)
from microbench.replay.graphs import resolve_mode

BACKENDS = ("torch", "mpi", "nccl")
# Names users reach for that are a backend with a device, not a backend of their own.
ALIASES = {"gloo": "gloo is --backend torch --device cpu (torch.distributed over gloo)",
           "cuda": "for GPUs give --backend torch (or nccl) --device cuda",
           "openmpi": "Open MPI and MPICH are both --backend mpi (mpi4py)",
           "mpich": "Open MPI and MPICH are both --backend mpi (mpi4py)"}


def backend_name(text: str) -> str:
    if text.lower() in ALIASES:
        raise argparse.ArgumentTypeError(ALIASES[text.lower()])
    return text


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Options every measuring command shares (replay, sweep)."""
    group = parser.add_argument_group("run")
    group.add_argument("--backend", type=backend_name, choices=BACKENDS, default="torch",
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
    group.add_argument("--timeout", type=positive_float, default=120.0,
                       help="seconds without progress after which every rank ends "
                            "(default 120)")
    group.add_argument("--nproc", type=positive_int, default=None,
                       help="start N local ranks (default: tp*pp when no launcher started "
                            "this process)")
    group.add_argument("--mpi-staging", action="store_true",
                       help="mpi with --device cuda: copy through host buffers around each "
                            "call (recorded in the results)")
    group.add_argument("--out", type=folder_path, default="infercomm-results",
                       help="results folder (default infercomm-results/, outside tracked "
                            "folders)")


def resolve_device(requested: str, backend: str = "torch") -> str:
    if requested != "auto":
        if requested == "cuda" and not _cuda_available(backend):
            raise UsageError("--device cuda asked for, but no CUDA device is visible; "
                             "use --device cpu")
        return requested
    if _cuda_available(backend):
        return "cuda"
    from microbench.ranks.device import refuse_gpu_job_without_gpu
    refuse_gpu_job_without_gpu(backend)  # a job that asked for GPUs and sees none
    return "cpu"


def buffers_on_cpu(requested: str, backend: str) -> bool:
    """Whether a run's buffers will be host memory: --device cpu, or auto on a host without
    a GPU driver (found without importing torch, which costs seconds to the launcher)."""
    if requested != "auto":
        return requested == "cpu"
    if not any(Path(p).exists() for p in ("/proc/driver/nvidia/gpus", "/dev/nvidiactl",
                                          "/dev/kfd")):
        return True
    return resolve_device(requested, backend) == "cpu"


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
    # A folder can exist and still refuse files (permissions, a read-only or full disk): find
    # out now, not after the whole replay.
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".infercomm-probe-") as probe:
            probe.write(b"probe")  # a full disk may still create an empty file
            probe.flush()
    except OSError as err:
        raise UsageError(f"--out {out!r} is not writable ({err.strerror}); pass a writable "
                         "folder") from None


def check_out_for_rank(out: str, rank: int) -> None:
    """Every rank a launcher started checks --out before start-up: a refusal on rank 0 alone
    would leave the others waiting for it in MPI's or gloo's start-up until --timeout.

    Rank 0, the writer, creates and probes it; the others only look (their node may not see
    rank 0's folder yet), refusing what exists and cannot be written, on a read-only file
    system or without permission, as rank 0 will."""
    if rank == 0:
        check_out_dir(out)
        return
    path = Path(out).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {out!r} is not a folder ({path} is a file); pass a writable "
                         "folder")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out!r} is not writable ({path} refuses new files); pass a "
                         "writable folder")


def check_backend_options(args: argparse.Namespace, world: int | None = None) -> None:
    """Refusals that need no rank (one line, exit 2, before any process starts)."""
    from microbench.algorithms.args import check_algo_options
    check_algo_options(args, world)  # --allreduce-algo hierarchical against --ranks-per-node
    if args.backend == "nccl":
        from microbench.backends.nccl_backend import require_cupy
        require_cupy()
        if args.device == "cpu":
            raise UsageError("the nccl backend runs on CUDA devices only; drop --device cpu "
                             "or use --backend torch")
        if not _cuda_available("nccl"):  # said once here, not by every rank started
            raise UsageError("--backend nccl needs a CUDA device and CuPy sees none here; on "
                             "CPUs use --backend torch --device cpu (gloo) or --backend mpi")
    device = args.device
    if args.mpi_staging:
        if args.backend != "mpi":
            raise UsageError(f"--mpi-staging applies to --backend mpi, not {args.backend}; "
                             "drop it")
        if resolve_device(device, args.backend) != "cuda":
            raise UsageError("--mpi-staging copies device buffers through the host, and these "
                             "buffers are on the CPU already; drop it or use --device cuda")
    if args.graph == "decode" and device == "auto":
        device = resolve_device(device, args.backend)  # a CPU-only machine: refuse here
    from microbench.ranks.device import gpus_asked
    if device == "auto" and gpus_asked():  # a GPU job that sees no GPU: refused before start
        resolve_device(device, args.backend)
    resolve_mode(args.graph, args.backend, device, args.timing)
    if device == "cuda":  # no GPU here: said once, not by every rank the launcher starts
        resolve_device(device, args.backend)
