"""What ranks started by `--nproc` tell their launcher, and how they know it still runs.

The launcher exports two variables to every rank it starts (directly, or through mpiexec):
- INFERCOMM_LAUNCHER: "PID:START" of the launcher (START is field 22 of /proc/PID/stat, so a
  recycled pid is not mistaken for it). The rank's sentinel polls it and ends the rank when
  the launcher is gone, whatever signal ended it (SIGKILL included, which nothing can catch).
- INFERCOMM_LAUNCH_DIR: a private folder where each rank leaves small notes: its pid (so an
  MPI failure reported by pid is named by rank), the wrong elements its --check found (so
  the launcher says the data was wrong, not that a rank crashed), and that it made no progress
  (so the run ends with 124, not with the signal that ended the stuck rank).
Outside `--nproc` neither is set and nothing here does anything.
"""

import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path

from microbench.ranks import shm

LAUNCHER_VAR = "INFERCOMM_LAUNCHER"
LAUNCH_DIR_VAR = "INFERCOMM_LAUNCH_DIR"


def process_start(pid: int) -> str | None:
    """Start time of a live process (clock ticks since boot); None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the name may hold spaces and parentheses
    state, start = fields[0], fields[19]  # fields 3 and 22 of proc(5)
    return None if state in ("Z", "X") else start


def launcher_identity() -> str:
    """This process as a launcher: "PID:START"."""
    pid = os.getpid()
    return f"{pid}:{process_start(pid)}"


def launcher_alive(identity: str) -> bool:
    pid, _, start = identity.partition(":")
    return pid.isdigit() and process_start(int(pid)) == start


def _note(name: str, text: str) -> None:
    folder = os.environ.get(LAUNCH_DIR_VAR)
    if folder:
        # OSError: the launcher is gone or its folder removed, so there is nobody to tell
        with contextlib.suppress(OSError):
            (Path(folder) / name).write_text(text)


def note_rank(rank: int) -> None:
    _note(f"pid-{os.getpid()}", str(rank))


def note_wrong(rank: int, wrong: int) -> None:
    _note(f"wrong-{rank}", str(wrong))


def note_stuck(rank: int) -> None:
    """The rank made no progress for --timeout and is ended (by its watchdog or sentinel):
    the run's status is then 124, whatever the peers' errors or the kill's signal say."""
    _note(f"stuck-{rank}", str(rank))


def stuck_ranks(folder: Path) -> list[int]:
    return sorted(int(p.name[6:]) for p in folder.glob("stuck-*") if p.name[6:].isdigit())


def new_launch_dir() -> Path:
    """A notes folder for this launcher, after removing those of launchers that are gone
    (a launcher killed by SIGKILL cannot remove its own, and under MPI its ranks may be
    killed with their sentinels before these can)."""
    base = Path(tempfile.gettempdir())
    for stale in base.glob("infercomm-launch-*"):
        try:
            owner = (stale / "launcher").read_text()
        except OSError:
            continue  # being created, or not ours
        if not launcher_alive(owner):
            remove(stale)
    folder = Path(tempfile.mkdtemp(prefix="infercomm-launch-"))
    (folder / "launcher").write_text(launcher_identity())
    return folder


def note_reaper(folder: Path, pid: int) -> None:
    """The launcher's reaper ("PID:START"), for whoever removes the folder to end it."""
    with contextlib.suppress(OSError):
        (folder / "reaper").write_text(f"{pid}:{process_start(pid)}")


def remove_launch_dir() -> None:
    """Remove the launcher's notes folder (a launcher killed by SIGKILL cannot), and end its
    reaper, which has nothing left to do (and outlived the run when it was stopped)."""
    folder = os.environ.get(LAUNCH_DIR_VAR)
    if folder and Path(folder).name.startswith("infercomm-launch-"):
        with contextlib.suppress(OSError, ValueError):
            reaper = (Path(folder) / "reaper").read_text()
            if launcher_alive(reaper):  # the same process: pid and start time
                os.kill(int(reaper.partition(":")[0]), signal.SIGKILL)
        remove(Path(folder))


def remove(folder: Path) -> None:
    """Remove a notes folder, and first the MPI segments its ranks noted (ranks/shm.py)."""
    shm.remove_noted(folder)
    shutil.rmtree(folder, ignore_errors=True)


def rank_pids(folder: Path) -> list[int]:
    """The pids of the ranks that noted themselves (note_rank)."""
    return sorted(int(p.name[4:]) for p in folder.glob("pid-*") if p.name[4:].isdigit())


def a_peer_ended() -> bool:
    """Under a `--nproc` launcher: whether a rank other than this one has ended."""
    folder = os.environ.get(LAUNCH_DIR_VAR)
    if not folder:
        return False
    return any(process_start(pid) is None for pid in rank_pids(Path(folder))
               if pid != os.getpid())


def rank_of_pid(folder: Path, pid: int) -> int | None:
    try:
        return int((folder / f"pid-{pid}").read_text())
    except (OSError, ValueError):
        return None


def wrong_by_rank(folder: Path) -> dict[int, int]:
    found = {}
    for path in folder.glob("wrong-*"):
        try:
            found[int(path.name[6:])] = int(path.read_text())
        except ValueError:
            continue
    return dict(sorted(found.items()))
