"""How a rank ends when it is told to stop, whoever tells it: at once, by the signal.

A stop signal ends a rank as the kernel ends any process (its default action), and the rank's
launcher says so in one line with the status 128+N (ranks/launch.py, ranks/mpi_output.py).
Two things stood in the way:

- Python turns SIGINT into KeyboardInterrupt, which unwinds the rank through its `finally`
  blocks and, at exit, MPI_Finalize, which waits for peers still inside a collective: an MPI
  rank 0 given Ctrl-C waited so until its peers' --timeout (120 s) and the run ended as their
  no-progress timeout, naming them; a gloo rank interrupted during its imports printed a
  traceback. A rank takes SIGINT's default action instead (`take_default_stops`), from the
  first line of `python -m microbench` under a `--nproc` launcher, and from its watchdog's
  start under any other.
- MPI_Init makes MPICH's /dev/shm segment before the rank can note it for removal
  (ranks/shm.py): a rank ended there left it (5 of 5 tries). `held()` keeps the stop signals
  pending while MPI starts and the segment is noted; the watchdog's thread never takes them
  (watchdog.py), so they wait for this thread. A rank of the `--nproc` MPI launcher holds
  them from its first line (HOLD_VAR) until then (`release`): ended before its own MPI_Init,
  it left its peer inside MPI_Init with the segment made, and mpiexec ended that peer before
  anything noted it (2 of 8 tries). MPICH and UCX take SIGUSR1 and SIGHUP at MPI_Init
  (MPICH's notice of a failed process, unused under mpiexec's default clean-up, and UCX's
  debug dump): the rank takes them back (`reclaim`) before it lets them in, so they end it
  as they end any process (a SIGUSR1 held there reached MPICH's handler: the run went on).
"""

import contextlib
import os
import signal
from collections.abc import Iterator

from microbench.ranks.children import STOP_SIGNALS
from microbench.ranks.notes import LAUNCH_DIR_VAR

# Set by the `--nproc` launcher for its MPI ranks: they hold the stop signals until MPI_Init
# is done and its segment noted (mpi_backend.py calls release()).
HOLD_VAR = "INFERCOMM_HOLD_STOPS_TO_MPI_INIT"


def at_start() -> None:
    """First thing in `python -m microbench`: a rank a `--nproc` launcher started stops by
    default from here on (the launcher started it with the stop signals held, so one sent
    during the interpreter's own start is taken now), an MPI rank once MPI is up."""
    if os.environ.get(LAUNCH_DIR_VAR):
        take_default_stops()
        if os.environ.get(HOLD_VAR):
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def take_default_stops() -> None:
    """SIGINT ends this process by the signal, as every other stop signal does; held ones
    are let in, unless this is an MPI rank that holds them to its MPI_Init (HOLD_VAR)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if not os.environ.get(HOLD_VAR):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def release() -> None:
    """MPI is up and its segment noted: the stop signals (one held meanwhile) end the rank."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """The stop signals wait meanwhile (in this thread; see the module's note)."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def reclaim() -> None:
    """After MPI_Init: SIGUSR1 and SIGHUP end the rank again (MPICH and UCX took them)."""
    for signum in (signal.SIGUSR1, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
