"""Shared-memory segments an MPI library leaves in /dev/shm when its ranks are killed.

MPICH keeps its intra-node queues in one /dev/shm/mpich_shm_<world id>_<node id> file (about
2 MB for 2 ranks here; pmodels/mpich src/mpid/ch4/shm/posix/posix_init.c names it, and
mpich_vci_* for more VCIs, with "mpich_shm_%x_%d"), mapped by every rank of the node and
removed in MPI_Finalize (MPL_initshm_freeall); a rank ended by a signal never gets there, so
every run ended by Ctrl-C, `kill` or a failing rank would leave one.

Only this run's own segments may go: /dev/shm is shared with every other job of the machine.
Each rank started by `--nproc` notes the segments it maps once MPI is up (a line "PATH INODE"
in the launcher's notes folder, ranks/notes.py); whoever removes that folder (the launcher at
its end, its reaper after a SIGKILL, a rank's sentinel when the launcher is gone) first removes
each noted segment that is still the same file (same inode and owner), never another's. A
segment removed while ranks still map it stays usable by them until they unmap it.

Standard library only, no package import: the launcher's reaper loads this file by its path
under `python -S`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

SHM = "/dev/shm"
PREFIXES = ("mpich_shm_", "mpich_vci_")


def mapped_segments(pid: str = "self") -> list[str]:
    """The MPI segments under /dev/shm that process `pid` maps, each once."""
    return list(_mapped(pid))


def _mapped(pid: str) -> dict[str, int]:
    """{path: inode} of the MPI segments `pid` maps, in the order they appear."""
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) < 6 or not fields[4].isdigit():
                    continue
                path = fields[5].strip()  # " (deleted)" once unlinked: no name to remove
                if (os.path.dirname(path) == SHM and os.path.basename(path).startswith(PREFIXES)
                        and not path.endswith(" (deleted)")):
                    found.setdefault(path, int(fields[4]))
    except OSError:
        pass
    return found


def note_segments(rank: int) -> None:
    """Under `--nproc`: tell the launcher which segments this rank maps (call after MPI_Init)."""
    folder = os.environ.get("INFERCOMM_LAUNCH_DIR")  # notes.LAUNCH_DIR_VAR
    if not folder:
        return
    lines = [f"{path} {inode}\n" for path, inode in _mapped("self").items()]
    # written even empty: the launcher reads it as the rank being past MPI_Init
    # OSError: the launcher is gone or its folder removed, so there is nobody to tell
    with contextlib.suppress(OSError):
        Path(folder, f"shm-{rank}").write_text("".join(lines))


def note_mapped_by(pids: list[int], folder: str | os.PathLike[str]) -> None:
    """Note the segments processes `pids` (live ranks) map, for the folder's removal: the
    launcher's, before it ends ranks that may be inside MPI_Init, where they have made their
    segment and not yet noted it."""
    lines = [f"{path} {inode}\n" for pid in pids for path, inode in _mapped(str(pid)).items()]
    if lines:
        with contextlib.suppress(OSError), open(Path(folder, "shm-launcher"), "a") as note:
            note.write("".join(lines))


def opened_by(pid: int) -> dict[str, int]:
    """{path: inode} of the MPI segments process `pid` holds open (MPICH keeps its segment's
    descriptor from MPL_initshm_open to MPI_Finalize): cheaper to read than its maps, so a
    launcher can look at its ranks while they start."""
    found: dict[str, int] = {}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            path = os.readlink(f"/proc/{pid}/fd/{fd}")
            if (os.path.dirname(path) == SHM and os.path.basename(path).startswith(PREFIXES)
                    and not path.endswith(" (deleted)")):
                found[path] = os.stat(f"/proc/{pid}/fd/{fd}").st_ino
        except OSError:
            continue
    return found


def note_opened(pids: list[int], folder: str | os.PathLike[str], seen: set[str]) -> None:
    """Note for the folder's removal the segments `pids` hold open that are not in `seen`
    (updated): the launcher's look at ranks inside MPI_Init, where they have made their
    segment and not yet noted it themselves; a rank ended there by its process manager
    (its peer died before MPI_Init) would leave it."""
    lines = []
    for pid in pids:
        for path, inode in opened_by(pid).items():
            if path not in seen:
                seen.add(path)
                lines.append(f"{path} {inode}\n")
    if lines:
        with contextlib.suppress(OSError), open(Path(folder, "shm-launcher"), "a") as note:
            note.write("".join(lines))


def unlink_mapped() -> list[str]:
    """Remove the names of the segments this process maps, once every rank of the node maps
    them (after a collective over the job): the memory stays the ranks' until they unmap it,
    and however the run then ends, even with every process killed at once, nothing of it is
    left in /dev/shm. MPICH opens them by name only in MPI_Init (MPL_initshm_open), and
    MPI_Finalize's removal of a name already gone is no error (measured: 4 ranks, world and
    split communicators, collectives and send/recv after the removal, exit 0)."""
    removed = []
    for path, inode in _mapped("self").items():
        with contextlib.suppress(OSError):
            if os.stat(path, follow_symlinks=False).st_ino == inode:  # still the one we map
                os.unlink(path)
                removed.append(path)
    return removed


def remove_noted(folder: str | os.PathLike[str]) -> list[str]:
    """Remove the segments the ranks noted in `folder` that are still theirs; the paths."""
    removed: list[str] = []
    for note in sorted(Path(folder).glob("shm-*")):
        try:
            lines = note.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            path, _, inode = line.rpartition(" ")
            if (os.path.dirname(path) != SHM or not os.path.basename(path).startswith(PREFIXES)
                    or not inode.isdigit()):
                continue  # not a line a rank wrote
            try:
                st = os.stat(path, follow_symlinks=False)
                if st.st_ino == int(inode) and st.st_uid == os.getuid():
                    os.unlink(path)
                    removed.append(path)
            except OSError:
                continue  # removed already (MPI_Finalize, another note of the same segment)
    return removed
