"""How much memory a replay will take, known from the pattern before anything is allocated.

A batch or a sequence far beyond the machine would otherwise fail inside an allocation after
the ranks have started (or swap the machine to a halt): say so up front, with the figures.
"""

import os
import resource
from pathlib import Path

from microbench.argtypes import UsageError
from microbench.replay.plan import buffer_bytes
from microbench.views.textfmt import format_bytes
from patterns import Pattern

# A CPU mark is a Python int in a preallocated list (28-byte int + 8-byte slot), and each
# timed inference keeps its marks as float64 (8 bytes).
MARK_BYTES, SAMPLE_BYTES = 36, 8


def marks_per_inference(pattern: Pattern, rank: int, timing: str) -> int:
    runs = pattern.runs_of_rank(rank)
    if timing == "op":
        return 1 + sum(len(run.step.ops) * run.repeat for run in runs)
    if timing == "step":
        return 1 + sum(run.repeat for run in runs)
    return 3


def rank_bytes(pattern: Pattern, rank: int, timing: str, iterations: int) -> tuple[int, int]:
    """(buffer bytes, timing bytes) of one rank. --timing op marks every call of one
    inference, then keeps its step marks only (each call's time goes to disk)."""
    marks = marks_per_inference(pattern, rank, timing)
    kept = marks_per_inference(pattern, rank, "step") if timing == "op" else marks
    return buffer_bytes(pattern, rank), marks * MARK_BYTES + kept * SAMPLE_BYTES * iterations


def _meminfo_available() -> int | None:
    """MemAvailable of /proc/meminfo (Linux); None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_host_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), or less when an address-space limit (ulimit -v)
    leaves this process less room to map; None where neither can be read."""
    available = _meminfo_available()
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return available
    room = max(soft - _mapped_bytes(), 0)
    return room if available is None else min(available, room)


def _mapped_bytes() -> int:
    """VmSize of this process: what an address-space limit counts."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def check_fits(pattern: Pattern, ranks: list[int], timing: str, iterations: int,
               available: int | None, where: str) -> None:
    """Refuse (UsageError) when the buffers and timing marks of `ranks` exceed `available`."""
    if available is None:
        return
    buffers = timing_bytes = 0
    for rank in ranks:
        b, t = rank_bytes(pattern, rank, timing, iterations)
        buffers, timing_bytes = buffers + b, timing_bytes + t
    need = buffers + timing_bytes
    if need > available:
        count = f"{len(ranks)} ranks" if len(ranks) > 1 else f"rank {ranks[0]}"
        raise UsageError(
            f"the replay needs about {format_bytes(need)} of {where} for {count} (buffers "
            f"{format_bytes(buffers)}, timing marks {format_bytes(timing_bytes)}) but "
            f"{format_bytes(available)} are available; lower --batch, --prompt, --decode or -n")


# Ranks a launcher put on this host, from the first of its variables that is set.
_LOCAL_COUNT_VARS = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                     "SLURM_NTASKS_PER_NODE")


def ranks_on_this_host(environ: dict[str, str] | None = None) -> int:
    """How many ranks share this host's memory (1 when no launcher says)."""
    env = os.environ if environ is None else environ
    for var in _LOCAL_COUNT_VARS:
        value = env.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def check_host_share(pattern: Pattern, rank: int, timing: str, iterations: int,
                     ranks_here: int) -> None:
    """A launched rank's check of host memory: its own buffers counted once for every rank
    on the host, since each checking its own alone would let them together take twice what
    there is (a 12.5 GiB share each of 23 GiB, on 2 ranks)."""
    available = available_host_bytes()
    if available is None or ranks_here <= 1:
        check_fits(pattern, [rank], timing, iterations, available, "host memory")
        return
    buffers, marks = rank_bytes(pattern, rank, timing, iterations)
    need = (buffers + marks) * ranks_here
    if need > available:
        raise UsageError(
            f"the replay needs about {format_bytes(need)} of host memory for the {ranks_here} "
            f"ranks on this host (rank {rank}: buffers {format_bytes(buffers)}, timing marks "
            f"{format_bytes(marks)}, each) but {format_bytes(available)} are available; lower "
            "--batch, --prompt, --decode or -n, or place fewer ranks a host")
