"""Serve the real engines' cases one after another, in the background of a test session
(tests/real_engine_serving.py starts it, niced, when the session has such tests).

    python tests/real_engine_runner.py FOLDER

FOLDER/jobs.json lists the jobs ({"argv", "cwd", "env", "timeout"}); job N's output
goes to FOLDER/N.log, its process id to FOLDER/N.pid while it runs, and its end to
FOLDER/N.done ({"rc", "seconds"}, written whole: a reader never sees half of it). A job runs
in a process group of its own (an engine's workers are in it), ended whole on its timeout
and when this runner is told to stop (SIGTERM, or its parent's end: PR_SET_PDEATHSIG).

Lowest priority takes more than nice 19 where the kernel groups tasks by session
(CONFIG_SCHED_AUTOGROUP, on by default): a nice value weighs only within its session's
group, and each group gets an equal share of the CPUs. Measured: jobs started in sessions
of their own took half the machine from the suite's tests (the MPI sweeps of
test_predict_replay 87 s instead of 33). So the runner starts a session of its own and
gives its group nice 19 (/proc/self/autogroup), its jobs stay in it, and the group of any
session a job starts (an engine server, a NIXL pair) is given nice 19 as well.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from real_engine_serving import descendants  # beside this file

_PR_SET_PDEATHSIG = 1
_running: subprocess.Popen | None = None


def _end_group(proc: subprocess.Popen) -> None:
    """End a job, every process of its group and every process below it (an engine server
    runs in a session of its own); SIGKILL where SIGTERM is not heard."""
    below = descendants(proc.pid)
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)
        for pid in below:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            continue
        if not any(Path(f"/proc/{pid}").exists() for pid in below):
            return
        time.sleep(1)


def _stop(signum: int, _frame: object) -> None:
    if _running is not None:
        _end_group(_running)
    os._exit(128 + signum)


def _lowest_priority_group(pid: int | str = "self") -> None:
    """Nice 19 for the scheduling group of `pid`'s session, where the kernel has one."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text("19")


def _autogroup(pid: int | str) -> str:
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().strip()
    except OSError:
        return ""


def _wait(proc: subprocess.Popen, timeout: float) -> int:
    """The job's exit status; every session it starts kept at the lowest priority."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            if time.monotonic() > deadline:
                raise
        for pid in descendants(os.getpid()):
            group = _autogroup(pid)
            if group and not group.endswith(" nice 19"):
                _lowest_priority_group(pid)


def _write_whole(path: Path, text: str) -> None:
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    part.rename(path)


def main(folder: Path) -> int:
    global _running
    # ended with the test session that started it, however that ends
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stop)
    if os.getppid() == 1:  # the session ended before the death signal was asked for
        return 0
    os.setsid()
    _lowest_priority_group()
    for number, job in enumerate(json.loads((folder / "jobs.json").read_text())):
        start = time.monotonic()
        with open(folder / f"{number}.log", "wb") as log:
            _running = subprocess.Popen(job["argv"], cwd=job["cwd"], env=job["env"],
                                        stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, process_group=0)
            (folder / f"{number}.pid").write_text(str(_running.pid))
            try:
                rc = _wait(_running, job["timeout"])
            except subprocess.TimeoutExpired:
                _end_group(_running)
                log.write(f"\nreal_engine_runner: ended after its {job['timeout']} s "
                          "timeout\n".encode())
                rc = -signal.SIGKILL
        _running = None
        _write_whole(folder / f"{number}.done",
                     json.dumps({"rc": rc, "seconds": round(time.monotonic() - start, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
