"""How a rank says that a communication call failed: one line, then a non-zero exit."""

import contextlib
import os
import signal
import sys

from microbench.ranks import notes

# A rank whose stdout's reader went away (`replay | head -1`) ends with the status a shell
# gives a writer killed by SIGPIPE, quietly; its launcher ends the run the same way.
CLOSED_STDOUT_STATUS = 128 + signal.SIGPIPE


def report_rank_failure(command: str, rank: int, err: BaseException) -> int:
    """Write `infercomm COMMAND: error: rank R: Type: first line` and return exit status 1.

    A peer that died or hung surfaces as the library's own error on the others (gloo's
    connection reset, a timeout); its first line says which, the rest is the library's trace.
    Under a `--nproc` launcher, where a peer has already ended, nothing is written: the
    launcher names that rank, and this error only follows from it (a gloo rank 0 given
    Ctrl-C put its peer's "Connection closed by peer" beside the launcher's line).
    """
    if isinstance(err, BrokenPipeError):
        with contextlib.suppress(OSError):  # the interpreter's last flush then says nothing
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return CLOSED_STDOUT_STATUS
    if notes.a_peer_ended():
        return 1
    text = str(err).strip()
    first_line = text.splitlines()[0][:300] if text else ""
    sys.stderr.write(f"infercomm {command}: error: rank {rank}: {type(err).__name__}: "
                     f"{first_line}{_hint(err)}\n")
    return 1


def _hint(err: BaseException) -> str:
    """What MPI's terse classes usually mean here: MPICH reports a buffer it could not map or
    register (ulimit -v, a full /dev/shm) as "Other MPI error"."""
    if type(err).__module__.startswith("mpi4py") and (
            "Other MPI error" in str(err) or "out of memory" in str(err).lower()):
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        limit = ("" if soft == resource.RLIM_INFINITY
                 else f"; this process may map at most {soft / (1 << 30):.1f} GiB (ulimit -v)")
        return (" (MPI could not allocate or map a buffer: host memory, /dev/shm or the "
                f"address-space limit{limit})")
    return ""
