"""Ends a rank that stops making progress, so a failed or hung peer never hangs the run.

MPI calls have no timeout of their own; a rank blocked in one would wait forever for a peer
that died. The replay loop counts finished steps; this thread ends the process when the count
has not moved for `timeout` seconds. A step is a few calls, so this bounds every call too.

A thread needs the GIL to run, and a library call may block while holding it (MPI_Init does,
inside `from mpi4py import MPI`). So the thread also sends a heartbeat to a small sentinel
process (microbench/sentinel.py), which ends the rank when the heartbeats stop.
"""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from microbench.ranks import notes, rank_stop
from microbench.ranks.children import STOP_SIGNALS

TIMEOUT_EXIT_STATUS = 124  # as timeout(1)
# How the rank's stderr is opened again through /proc to write one line: at its end (a file),
# never waiting on a full pipe, and never taking a terminal as the opener's controlling one.
REOPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_NOCTTY


def no_progress_message(command: str, rank: int, timeout: float, where: str,
                        detail: str = "") -> str:
    """The one line every way of ending a stuck rank prints."""
    during = f"{where} ({detail})" if detail else where
    return (f"infercomm {command}: error: rank {rank}: no progress for {timeout:g} s during "
            f"{during}; a rank failed or hung, ending the run\n")


def stderr_reopens() -> bool:
    """Whether our stderr can be opened again through /proc (a pipe, a terminal, a file can;
    a socket cannot), as the sentinel opens it to write."""
    try:
        fd = os.open("/proc/self/fd/2", REOPEN_FLAGS)
    except OSError:
        return False
    os.close(fd)
    return True


class Watchdog:
    def __init__(self, timeout: float, rank: int, command: str = "replay") -> None:
        self.timeout = timeout
        self.rank = rank
        self.command = command
        self.steps = 0  # bumped by the replay loop; read here
        self.where = "start-up"
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="infercomm-watchdog",
                                        daemon=True)
        self._sentinel: subprocess.Popen[bytes] | None = None
        # Asked each poll for a library's asynchronous error (NCCL: a broken link or a dead
        # peer, ncclCommGetAsyncError), reported at once instead of as no progress.
        self.check: Callable[[], str | None] | None = None

    def start(self) -> "Watchdog":
        # Before any backend is opened: forking after MPI or CUDA initialisation is unsafe.
        notes.note_rank(self.rank)  # lets a --nproc launcher name this rank by its pid
        rank_stop.take_default_stops()  # a stop signal ends the rank at once, under any launcher
        # The sentinel holds none of our output descriptors where it can reach our stderr
        # through /proc: a process manager takes our closed output for our end (sentinel.py).
        via_rank = stderr_reopens()
        self._sentinel = subprocess.Popen(
            [sys.executable, "-m", "microbench.ranks.sentinel", str(os.getpid()),
             f"{self.timeout:g}", str(self.rank), self.command,
             "rank" if via_rank else "inherited"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL if via_rank else None, close_fds=True,
            # its own session: signals meant for the rank's process group (a process
            # manager's, a launcher's) leave it, so it outlives the rank and sees it end
            start_new_session=True)
        with rank_stop.held():  # the thread is born with them held (see _watch)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        if self._sentinel is not None:
            self._close_sentinel(self._sentinel)
            self._sentinel = None

    @staticmethod
    def _close_sentinel(sentinel: "subprocess.Popen[bytes]") -> None:
        if sentinel.stdin is not None:
            with contextlib.suppress(OSError):
                sentinel.stdin.close()  # end of file: the sentinel exits
        try:
            sentinel.wait(timeout=5)
        except subprocess.TimeoutExpired:
            sentinel.kill()

    def _heartbeat(self) -> None:
        sentinel = self._sentinel
        if sentinel is None or sentinel.stdin is None:
            return
        try:
            sentinel.stdin.write(self.where.replace("\n", " ").encode() + b"\n")
            sentinel.stdin.flush()
        except OSError:  # the sentinel is gone; the thread still guards the rank
            self._sentinel = None

    def _watch(self) -> None:
        # Stop signals are the main thread's: held here, they wait for it where it holds them
        # (MPI_Init: ranks/rank_stop.py) instead of ending the process from this thread.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        seen, since = self.steps, time.monotonic()
        poll = min(1.0, self.timeout / 4)
        self._heartbeat()
        while not self._done.wait(poll):
            self._heartbeat()
            error = self.check() if self.check is not None else None
            if error:
                sys.stderr.write(f"infercomm {self.command}: error: rank {self.rank}: "
                                 f"{error} (during {self.where})\n")
                sys.stderr.flush()
                os._exit(1)  # not ncclCommAbort: destroy would wait for live graphs
            now = time.monotonic()
            if self.steps != seen:
                seen, since = self.steps, now
            elif now - since > self.timeout:
                sys.stderr.write(no_progress_message(self.command, self.rank, self.timeout,
                                                     self.where))
                sys.stderr.flush()
                notes.note_stuck(self.rank)
                os._exit(TIMEOUT_EXIT_STATUS)
