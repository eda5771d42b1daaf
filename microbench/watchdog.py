"""Ends a rank that stops making progress, so a failed or hung peer never hangs the run.

MPI calls have no timeout of their own; a rank blocked in one would wait forever for a peer
that died. The replay loop counts finished steps; this thread ends the process when the count
has not moved for `timeout` seconds. A step is a few calls, so this bounds every call too.
"""

import os
import sys
import threading
import time

TIMEOUT_EXIT_STATUS = 124  # as timeout(1)


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

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        seen, since = self.steps, time.monotonic()
        poll = min(1.0, self.timeout / 4)
        while not self._done.wait(poll):
            now = time.monotonic()
            if self.steps != seen:
                seen, since = self.steps, now
            elif now - since > self.timeout:
                sys.stderr.write(
                    f"infercomm {self.command}: error: rank {self.rank}: no progress for "
                    f"{self.timeout:g} s during {self.where}; a rank failed or hung, "
                    "ending the run\n")
                sys.stderr.flush()
                os._exit(TIMEOUT_EXIT_STATUS)
