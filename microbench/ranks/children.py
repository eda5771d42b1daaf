"""Jobs started one after another by a command that waits for each: a settings grid's runs
(tuning/env_grid.py) and scripts/interleave.py's. Whatever ends that command ends its job.

Each run is its own `infercomm` process, a launcher with its ranks. Ended by Ctrl-C, `kill` or
a closed terminal, the command passes the signal on to the run in progress, whose launcher
ends its ranks as it does when it is stopped itself (ranks/launch.py), and waits for it. Killed
by SIGKILL, which nothing can catch, the command cannot pass anything on: the kernel sends the
run SIGTERM when its parent dies (PR_SET_PDEATHSIG, set in the child before exec), with the
same effect. So no run goes on alone, writing a run folder that nothing lists or a traceback
into a pipe nobody reads.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from microbench.argtypes import UsageError
from microbench.ranks.notes import process_start
from patterns.errors import shown

# Every signal whose default ends a process and that a user or a job manager sends to stop it
# (SIGQUIT: Ctrl-\; SIGUSR1/SIGUSR2: batch systems' warnings; SIGALRM: timers). SIGPIPE is a
# closed stdout, found where output is written.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                signal.SIGUSR2, signal.SIGALRM)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# A launcher told to stop ends its ranks within 10 s (SIGTERM, 5 s, SIGKILL, 5 s).
END_SECONDS = 15.0
# Set in a job's environment: it checks its input as ever, then ends (status 0) where it would
# start its ranks (ranks/launch.py spawn_local). A grid asks this of its first setting before
# running any, so bad input is one line and nothing runs. Its value names the grid ("PID:START",
# check_only_value), so a value left in a user's shell, which would make every replay and
# sweep end measuring nothing, is refused instead.
CHECK_ONLY_VAR = "INFERCOMM_CHECK_ONLY"


def check_only_value() -> str:
    """CHECK_ONLY_VAR's value for the children of this process."""
    return f"{os.getpid()}:{process_start(os.getpid())}"


def check_only() -> bool:
    """Whether this job was asked by its parent, a grid, only to check its input; a
    CHECK_ONLY_VAR that no parent set for it is refused (UsageError)."""
    given = os.environ.get(CHECK_ONLY_VAR)
    if not given:
        return False
    parent = os.getppid()
    if given == f"{parent}:{process_start(parent)}":
        return True
    raise UsageError(f"{CHECK_ONLY_VAR} is set ({shown(given, 40)!r}), which only a settings "
                     "grid (--env) sets for its own input check: with it, nothing would be "
                     f"measured; unset it (unset {CHECK_ONLY_VAR})")


class Stopped(Exception):
    """The command got one of STOP_SIGNALS (Ctrl-C, `kill`, `timeout`, a closed terminal)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def how(self) -> str:
        """"interrupted" for Ctrl-C, else "got SIGTERM" and the like."""
        if self.signum == signal.SIGINT:
            return "interrupted"
        return f"got {signal.Signals(self.signum).name}"


class StopGuard:
    """While inside `with StopGuard() as guard:`, the first of STOP_SIGNALS raises Stopped,
    and every later one is ignored.

    A stop is heard once because the clean-up it starts must not be cut short: a second
    Ctrl-C, or the SIGTERM the kernel sends a child as its parent dies (PR_SET_PDEATHSIG)
    beside the one that parent's own killer sent, came while the first one's clean-up was
    replacing the handlers and raised out of it with a traceback (a CI run of
    tests/test_compare_interleaved.py). The handler marks the stop before it raises, so no
    bytecode runs between the first signal and the guard's deafness. After a stop the signals
    stay ignored when the guard is left (the process is ending; its clean-up is bounded, see
    END_SECONDS); otherwise the previous handlers come back."""

    def __init__(self) -> None:
        self.stopped: int | None = None  # the signal that stopped us
        self._deaf = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopGuard:
        self._previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *_exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, signal.SIG_IGN if self.stopped is not None else handler)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self._deaf:
            return
        self.stopped, self._deaf = signum, True
        raise Stopped(signum)

    def deafen(self) -> None:
        """Ignore stop signals from here on without a stop: a clean-up after the work ended
        well (ending ranks already gone, removing a folder) is quick and must run whole."""
        self._deaf = True


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Keep STOP_SIGNALS pending in this thread meanwhile: around starting a child, so that a
    stop never lands between the fork and the caller holding the child's handle (the child
    would run on, ended by nobody: a grid's second run outlived the grid so and printed its
    launcher's line after the grid's last). Assign the child inside the block: a pending stop
    is raised once the block is left. The child unblocks them before exec (die_with_parent).
    """
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def die_with_parent(parent_pid: int, keep_held: bool = False) -> Callable[[], None]:
    """Run in a child before exec: SIGTERM it when its parent dies (even by SIGKILL).

    The kernel sends it when the parent's thread that forked the child exits; callers fork
    from their main thread, which lives as long as they do. The stop signals the parent held
    while starting it (signals_held) are the child's again, or stay held through exec with
    `keep_held` (a rank, which takes them once it can end by them: ranks/rank_stop.py)."""
    def setup() -> None:
        if not keep_held:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(128 + signal.SIGTERM)
    return setup


@dataclass
class Finished:
    status: int  # as a shell says it: 128+N for signal N
    stdout: str


def run_child(cmd: list[str], env: dict[str, str] | None = None) -> Finished:
    """Run `cmd` to its end with its stdout captured (its stderr is ours).

    A stop signal (STOP_SIGNALS) meanwhile is passed on to it; once it has ended (or been
    killed END_SECONDS later) Stopped is raised. OSError when `cmd` cannot be started."""
    proc: subprocess.Popen[bytes] | None = None
    captured: list[bytes] = []
    reader: threading.Thread | None = None
    with StopGuard():
        try:
            # its own process group: a terminal's Ctrl-C reaches this command only, which
            # passes it on once, so the child hears it once
            with signals_held():
                proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, process_group=0,
                                        preexec_fn=die_with_parent(os.getpid()))
            stream = proc.stdout
            assert stream is not None
            reader = threading.Thread(target=lambda: captured.append(stream.read()),
                                      daemon=True)
            reader.start()
            status = proc.wait()
        except Stopped as stopped:
            if proc is not None:
                _end(proc, stopped.signum)
            raise
        finally:
            # not deafened: a stop while the ended child's output is read still reaches the
            # caller as Stopped, which stops the jobs after it (none is left to end)
            if reader is not None:
                reader.join(timeout=5)
    return Finished(128 - status if status < 0 else status,
                    b"".join(captured).decode(errors="replace"))


def _end(proc: subprocess.Popen[bytes], signum: int) -> None:
    """Pass `signum` on to the child's process group; SIGKILL it if it outlives END_SECONDS."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)
    try:
        proc.wait(timeout=END_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
