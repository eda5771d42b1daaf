"""A stopped process manager (SIGSTOP of mpiexec or of its proxy) must not hang the run.

The ranks run on while mpiexec is stopped, but their output (rank 0's table and JSON line)
reaches the launcher through the proxy and mpiexec, and only mpiexec's exit tells the
launcher the job is over: a launcher waiting on a stopped mpiexec waited forever, and the
run's output was lost. The launcher owns mpiexec and its proxies, which have no work of their
own to pause, so it resumes them (SIGCONT) and says so. A stopped rank is not resumed: its
sentinel ends it when --timeout passes without progress (ranks/sentinel.py), exit 124.
"""

import contextlib
import os
import signal
from pathlib import Path


def _state_and_parent(pid: int) -> tuple[str, int] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the name may hold spaces and parentheses
    return fields[0], int(fields[1])  # fields 3 and 4 of proc(5)


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            got = _state_and_parent(int(entry.name))
            if got is not None and got[1] == pid:
                found.append(int(entry.name))
    return found


def resume_stopped(mpiexec: int) -> list[int]:
    """SIGCONT `mpiexec` and each of its children (the proxies) that is stopped; their pids."""
    resumed = []
    for pid in [mpiexec, *_children(mpiexec)]:
        got = _state_and_parent(pid)
        if got is not None and got[0] == "T":  # stopped by a signal
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGCONT)
                resumed.append(pid)
    return resumed
