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
MPI ranks are not its children, so only something beside each rank can end it. Under any
launcher it kills the rank when the rank is orphaned: its parent (a process manager's proxy)
died, which ends the job whatever the rank is doing.

It holds none of the rank's output descriptors. A process manager takes a rank's closed stdout
and stderr for its end: MPICH's Hydra, with a sentinel still holding those of a rank killed by
SIGKILL, first killed the other ranks and then named one of them in its banner as the rank
that failed (8 of 30 runs of a two-rank job on this 2-core VM, under load; 0 of 30 with no
descriptor held). So, where the rank's stderr can be opened again through /proc (a pipe, a
terminal, a file), the sentinel's stderr is /dev/null and it opens the rank's only to say why
it ends the rank (SAY = "rank"); otherwise (a socket) it inherits the rank's stderr as before
(SAY = "inherited", the default).

    python -m microbench.ranks.sentinel PID TIMEOUT RANK COMMAND [SAY]
"""

import contextlib
import os
import select
import signal
import sys
import time

from microbench.ranks import notes, shm
from microbench.ranks.children import STOP_SIGNALS
from microbench.ranks.watchdog import REOPEN_FLAGS, no_progress_message

LAUNCHER_POLL_SECONDS = 0.5


def watch(fd: int, pid: int, timeout: float, rank: int, command: str,
          launcher: str | None = None, via_rank: bool = False) -> None:
    """Read heartbeats from `fd` until end of file, or kill the rank when they stop, or when
    the `--nproc` launcher (`launcher`, "PID:START") is gone."""
    where = "start-up"
    pending = b""
    say = (lambda message: _say(message, pid)) if via_rank else _say
    last_beat = time.monotonic()
    parent = parent_of(pid)
    while True:
        left = last_beat + timeout - time.monotonic()
        wait = min(left, LAUNCHER_POLL_SECONDS)
        ready, _, _ = select.select([fd], [], [], max(wait, 0.0))
        if launcher and not notes.launcher_alive(launcher):
            say(f"infercomm {command}: error: rank {rank}: its launcher (pid "
                f"{launcher.partition(':')[0]}) ended; ending the rank\n")
            _kill(pid)
            notes.remove_launch_dir()
            return
        now = parent_of(pid)
        if parent is not None and now is not None and now != parent:
            # Orphaned: the process that started the rank (MPICH's hydra_pmi_proxy, Open
            # MPI's prted, slurmstepd, torchrun's agent) is gone, and with it the job; the
            # rank would run on alone and write results of a job that failed.
            say(f"infercomm {command}: error: rank {rank}: the process that started it "
                f"(pid {parent}) ended; ending the rank\n")
            _kill(pid)
            return
        if not ready:
            if time.monotonic() - last_beat < timeout:
                continue  # woke up to look at the launcher
            say(no_progress_message(command, rank, timeout, where,
                                    "the interpreter is stuck in a library call"))
            notes.note_stuck(rank)
            _kill(pid)
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


def _kill(pid: int) -> None:
    """SIGKILL the rank, first noting the MPI segments it maps for the launch folder's
    removal (a rank stuck in MPI_Init has made its segment but not noted it)."""
    folder = os.environ.get(notes.LAUNCH_DIR_VAR)
    if folder:
        shm.note_mapped_by([pid], folder)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _say(message: str, rank_pid: int | None = None) -> None:
    """Write to the rank's stderr: through /proc given the rank's pid, else to our own (the
    rank's, inherited). It may be a pipe to a process manager that died, or one nobody reads
    (non-blocking: the message is one line, under the pipe's atomic size), so a write that
    fails is dropped: the rank must still be ended."""
    with contextlib.suppress(OSError):
        if rank_pid is None:
            sys.stderr.write(message)
            sys.stderr.flush()
            return
        fd = os.open(f"/proc/{rank_pid}/fd/2", REOPEN_FLAGS)
        try:
            os.write(fd, message.encode())
        finally:
            os.close(fd)


def parent_of(pid: int) -> int | None:
    """The parent pid of `pid` from /proc (Linux); None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the
    # last ')'.
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 else None


def main(argv: list[str]) -> int:
    pid, timeout, rank, command = int(argv[0]), float(argv[1]), int(argv[2]), argv[3]
    # Stop signals are the rank's (this process is in a session of its own, but a `kill` of
    # every process of the run reaches it too): it ends with the rank, through end of file,
    # and outlives it long enough to remove the launch folder if the launcher is gone.
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    via_rank = len(argv) > 4 and argv[4] == "rank"
    watch(sys.stdin.fileno(), pid, timeout, rank, command,
          os.environ.get(notes.LAUNCHER_VAR) or None, via_rank)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
