"""A process beside each rank that ends it when its interpreter is stuck inside a library call.

The watchdog (microbench/watchdog.py) is a thread, so it runs only when it can take the GIL. A
library call that blocks while holding the GIL stops it as well. Seen in CI: under
`srun --mpi=pmi2`, one MPICH rank aborted during the address exchange of MPI_Init and the others
waited in MPI_Init, which mpi4py runs at import with the GIL held, until the job was cancelled.

This process is started by the watchdog before any backend is opened. It expects a heartbeat
line on its stdin from the watchdog thread every poll, holding the rank's current phase. When
no line comes for `timeout` seconds, the interpreter is stuck: it prints the watchdog's message
and kills the rank. At end of file (the rank ended, however it ended) it exits. It imports
nothing heavy, so it starts in tens of milliseconds.

Under `--nproc` it also polls the launcher twice a second and kills the rank when the launcher
is gone (microbench/ranks/notes.py): a launcher killed by SIGKILL can end nobody itself, and
MPI ranks are not its children, so only something beside each rank can end it.

    python -m microbench.ranks.sentinel PID TIMEOUT RANK COMMAND
"""

import os
import select
import signal
import sys
import time

from microbench.ranks import notes
from microbench.ranks.watchdog import no_progress_message

LAUNCHER_POLL_SECONDS = 0.5


def watch(fd: int, pid: int, timeout: float, rank: int, command: str,
          launcher: str | None = None) -> None:
    """Read heartbeats from `fd` until end of file, or kill the rank when they stop, or when
    the `--nproc` launcher (`launcher`, "PID:START") is gone."""
    where = "start-up"
    pending = b""
    last_beat = time.monotonic()
    while True:
        left = last_beat + timeout - time.monotonic()
        wait = min(left, LAUNCHER_POLL_SECONDS) if launcher else left
        ready, _, _ = select.select([fd], [], [], max(wait, 0.0))
        if launcher and not notes.launcher_alive(launcher):
            sys.stderr.write(f"infercomm {command}: error: rank {rank}: its launcher (pid "
                             f"{launcher.partition(':')[0]}) ended; ending the rank\n")
            sys.stderr.flush()
            os.kill(pid, signal.SIGKILL)
            notes.remove_launch_dir()
            return
        if not ready:
            if time.monotonic() - last_beat < timeout:
                continue  # woke up to look at the launcher
            sys.stderr.write(no_progress_message(command, rank, timeout, where,
                                                 "the interpreter is stuck in a library call"))
            sys.stderr.flush()
            os.kill(pid, signal.SIGKILL)
            return
        chunk = os.read(fd, 4096)
        if not chunk:
            if launcher and not notes.launcher_alive(launcher):
                notes.remove_launch_dir()  # the rank ended with its killed launcher
            return
        last_beat = time.monotonic()
        lines = (pending + chunk).split(b"\n")
        pending = lines[-1]
        if len(lines) > 1:
            where = lines[-2].decode(errors="replace")


def main(argv: list[str]) -> int:
    pid, timeout, rank, command = int(argv[0]), float(argv[1]), int(argv[2]), argv[3]
    # Terminal signals meant for the rank's process group (Ctrl-C) are the rank's to handle;
    # this process ends with it through end of file.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(sys.stdin.fileno(), pid, timeout, rank, command,
          os.environ.get(notes.LAUNCHER_VAR) or None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
