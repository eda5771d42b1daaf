"""Faults injected on purpose, for the tests that prove a failing rank ends the run.

INFERCOMM_FAULT (unset in real runs) names one:
  kill:RANK:STEP     rank RANK kills itself (SIGKILL) during its STEP-th step
  hang:RANK:STEP     rank RANK stops issuing calls during its STEP-th step
  corrupt:RANK       rank RANK adds 1 to the first element of every input it fills in --check
  corrupt:RANK:TEXT  the same, only for the calls whose tag contains TEXT (e.g. dispatch)
  stall:RANK         rank RANK blocks in a C call that holds the GIL before opening its backend,
                     as MPI_Init does when a peer aborted (only the sentinel can end it)
Nothing is added to the replay path when it is unset.
"""

import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable

from patterns.errors import shown

FAULT_VAR = "INFERCOMM_FAULT"


def injected_note() -> str:
    """The line that says a failure was injected: INFERCOMM_FAULT left set in a user's shell
    made real runs fail with nothing saying why."""
    return (f"infercomm: note: {FAULT_VAR}={shown(os.environ.get(FAULT_VAR, ''), 60)} is set: "
            "the test suite's injected fault; unset it for a real run\n")


def _spec(rank: int) -> list[str] | None:
    raw = os.environ.get(FAULT_VAR, "")
    parts = raw.split(":")
    if len(parts) < 2 or not parts[1].isdigit() or int(parts[1]) != rank:
        return None
    return parts


def corrupts_inputs(rank: int, tag: str = "") -> bool:
    spec = _spec(rank)
    if spec is None or spec[0] != "corrupt":
        return False
    text = ":".join(spec[2:])
    return text in tag


def step_fault(rank: int) -> tuple[int, Callable[[], None]] | None:
    """(step number, call to add to that step) for a kill or hang fault on this rank."""
    spec = _spec(rank)
    if spec is None or spec[0] not in ("kill", "hang") or len(spec) != 3:
        return None
    if spec[0] == "kill":
        return int(spec[2]), lambda: (_said(), os.kill(os.getpid(), signal.SIGKILL))
    return int(spec[2]), lambda: (_said(), time.sleep(3600))


def _said() -> None:
    """Under a launcher other than `--nproc` (which says it once, ranks/launch.py), the rank
    that injects a fault says so first."""
    if not os.environ.get("INFERCOMM_LAUNCH_DIR"):  # notes.LAUNCH_DIR_VAR
        sys.stderr.write(injected_note())
        sys.stderr.flush()


def startup_stall(rank: int) -> None:
    """Block for an hour inside libc's sleep with the GIL held, if a stall fault names `rank`.

    ctypes.PyDLL keeps the GIL during the call (CDLL would release it), so the watchdog thread
    cannot run either: the state of a rank stuck in MPI_Init.
    """
    spec = _spec(rank)
    if spec is not None and spec[0] == "stall":
        _said()
        ctypes.PyDLL(None).sleep(3600)
