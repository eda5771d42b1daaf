"""`--nproc N`: start N local ranks without a launcher (torch), or through the MPI library's
own mpiexec (mpi), and make sure that when one rank fails every rank ends."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from microbench.argtypes import UsageError
from microbench.ranks import faults, notes, rank_stop, shm
from microbench.ranks.children import (
    STOP_SIGNALS,
    StopGuard,
    Stopped,
    check_only,
    die_with_parent,
    signals_held,
)
from microbench.ranks.failures import CLOSED_STDOUT_STATUS
from microbench.ranks.mpi_output import MpiBanner, mpi_status, signal_name
from microbench.ranks.stopped import resume_stopped
from microbench.ranks.watchdog import TIMEOUT_EXIT_STATUS
from microbench.results.store import WRITE_ERROR_EXIT_STATUS

# After the first rank fails, the others get this long to report their own error.
GRACE_SECONDS = 5.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_mpiexec() -> str:
    """The mpiexec of the MPI that mpi4py was built against: the wheel puts it beside python.
    Without mpi4py every rank would fail at import after mpiexec started them: said here."""
    try:
        import mpi4py  # noqa: F401  (the package only: MPI itself starts in the ranks)
    except ImportError:
        raise UsageError("--backend mpi needs mpi4py in this Python: pip install "
                         "'infercomm[mpi]', or use --backend torch") from None
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise UsageError("no mpiexec found beside python or on PATH; install the mpi extra "
                         "(pip install 'infercomm[mpi]') or launch the ranks yourself")
    return found


def _is_open_mpi(mpiexec: str) -> bool:
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                             timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    text = out.stdout + out.stderr
    return "Open MPI" in text or "OpenRTE" in text or "prte" in text.lower()


def _base_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default; mpiexec sets none
    # A leftover launcher environment would make the children think they are already ranks.
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PMI_RANK", "PMI_SIZE", notes.LAUNCHER_VAR,
                "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID"):
        env.pop(var, None)
    return env


def mpi_command(nproc: int, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    mpiexec = find_mpiexec()
    env = _base_env()
    cmd = [mpiexec, "-n", str(nproc)]
    if _is_open_mpi(mpiexec):
        # Root is refused and more ranks than cores fail without these (cpu_stack_runbook 1).
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        env.setdefault("OMPI_MCA_pml", "ob1")
        env.setdefault("OMPI_MCA_btl", "self,sm")
        env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
        cmd.append("--oversubscribe")
    return [*cmd, sys.executable, "-m", "microbench", *argv], env


def spawn_local(nproc: int, backend: str, argv: list[str]) -> int:
    """Run `infercomm ARGV` as N local ranks; return the first failing rank's status, or 0.

    Whatever ends the launcher ends the ranks: SIGINT, SIGTERM and SIGHUP are caught and every
    rank is ended (exit 128+signal, one line); SIGKILL cannot be caught, so each rank's
    sentinel polls the launcher and ends its rank, and direct children get PDEATHSIG."""
    if check_only():  # a grid checking its input (ranks/children.py)
        if backend == "mpi":
            find_mpiexec()  # mpi4py and mpiexec are input too
        return 0
    folder = notes.new_launch_dir()
    reaper = Reaper(folder)
    env = _base_env()
    env.update({notes.LAUNCHER_VAR: notes.launcher_identity(),
                notes.LAUNCH_DIR_VAR: str(folder)})
    procs: list[subprocess.Popen] = []
    common: dict[str, Any] = {"process_group": 0, "preexec_fn": die_with_parent(os.getpid())}
    with StopGuard() as guard:
        try:
            status = _run_ranks(nproc, backend, argv, env, common, procs, folder, reaper)
            if status and os.environ.get(faults.FAULT_VAR):
                sys.stderr.write(faults.injected_note())
            return status
        except Stopped as stopped:
            guard.deafen()  # a closed stdout (SIGPIPE) is found, not signalled
            _end_all(procs, folder)
            if stopped.signum == signal.SIGPIPE:  # stdout closed (`| head`): quietly
                return 128 + stopped.signum
            sys.stderr.write(f"infercomm: {stopped.how}; ended every rank\n")
            return 128 + stopped.signum
        finally:
            guard.deafen()
            _end_all(procs, folder)
            notes.remove(folder)  # with what MPI left in /dev/shm (ranks/shm.py)
            reaper.end()


def _run_ranks(nproc: int, backend: str, argv: list[str], env: dict[str, str],
               common: dict[str, Any], procs: list[subprocess.Popen], folder: Path,
               reaper: "Reaper") -> int:
    """Start the ranks (appended to `procs` as they start, for the caller to end) and wait for
    them; the run's exit status."""
    if backend == "mpi":
        cmd, mpi_env = mpi_command(nproc, argv)
        env[rank_stop.HOLD_VAR] = "1"  # stops wait for MPI_Init (ranks/rank_stop.py)
        with signals_held():  # appended before a stop can be raised (children.signals_held)
            procs.append(subprocess.Popen(cmd, env={**mpi_env, **env},
                                          stdout=subprocess.PIPE, **common))
        banner = MpiBanner()
        reader = threading.Thread(target=banner.forward, args=(procs[0].stdout,), daemon=True)
        reader.start()
        status = _wait_all(procs, ["mpiexec"], folder,
                           _MpiWatch(procs[0].pid, banner, reaper, folder, nproc))
        reader.join(timeout=5)
        if banner.closed:
            raise Stopped(signal.SIGPIPE)
        if status and notes.stuck_ranks(folder):
            return _no_progress(status, folder)
        return mpi_status(status, banner, folder, procs[0].returncode)
    env.update(WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
               MASTER_ADDR=env.get("MASTER_ADDR") or "127.0.0.1",
               MASTER_PORT=str(master_port(env)))
    # a rank starts with the stop signals held, until it ends by them (ranks/rank_stop.py)
    rank_common = {**common, "preexec_fn": die_with_parent(os.getpid(), keep_held=True)}
    for r in range(nproc):
        with signals_held():
            procs.append(subprocess.Popen([sys.executable, "-m", "microbench", *argv],
                                          env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                                          **rank_common))
    return _no_progress(_wait_all(procs, [f"rank {r}" for r in range(nproc)], folder,
                                  reaper.keep), folder)


# Waits for the launcher to end, however it ends, and removes its notes folder and the MPI
# segments its ranks noted there (ranks/shm.py): a launcher killed by SIGKILL cannot, and
# under MPI its ranks' sentinels die with the ranks. Deaf to every signal that can be ignored
# (a `kill` of the run's processes, all at once, must not take it first); standard library
# only (-S: no site packages; shm.py is loaded by its path), so it starts in milliseconds.
_REAPER = """
import importlib.util, os, shutil, signal, sys, time
for signum in (1, 2, 3, 10, 12, 13, 14, 15):  # HUP INT QUIT USR1 USR2 PIPE ALRM TERM
    signal.signal(signum, signal.SIG_IGN)
pid, folder, shm_py = int(sys.argv[1]), sys.argv[2], sys.argv[3]
while True:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    except PermissionError:
        pass
    if not os.path.isdir(folder):
        sys.exit(0)
    time.sleep(0.2)
spec = importlib.util.spec_from_file_location("infercomm_shm", shm_py)
shm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shm)
shm.remove_noted(folder)
shutil.rmtree(folder, ignore_errors=True)
"""


class Reaper:
    """A process outside the run's process groups that removes `folder` once we are gone;
    started again when it is killed while the run goes on (`keep`, each poll), and ended by
    whoever removes the folder (`end`; notes.remove_launch_dir): a reaper someone stopped
    (SIGSTOP) would otherwise outlive the run."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None
        self.keep()

    def keep(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        with contextlib.suppress(OSError):
            self.proc = subprocess.Popen(
                [sys.executable, "-S", "-c", _REAPER, str(os.getpid()), str(self.folder),
                 shm.__file__], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)
            notes.note_reaper(self.folder, self.proc.pid)

    def end(self) -> None:
        """The folder is gone: so is the reaper's work (SIGKILL: it may be stopped)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()
                self.proc.wait(timeout=5)


def _no_progress(status: int, folder: Path) -> int:
    """124 when a rank made no progress for --timeout (its own message said so above),
    whatever ended it (its sentinel's SIGKILL) or its peers (a closed connection)."""
    stuck = notes.stuck_ranks(folder)
    if not status or not stuck:
        return status
    which = ", ".join(map(str, stuck))
    sys.stderr.write(f"infercomm: error: rank {which} made no progress within --timeout; "
                     "ended every rank\n")
    return TIMEOUT_EXIT_STATUS


def master_port(env: dict[str, str]) -> int:
    """The user's MASTER_PORT when set (respected, never replaced), else a free one."""
    given = env.get("MASTER_PORT")
    if not given:
        return free_port()
    if not given.isdigit() or not 0 < int(given) < 65536:
        raise UsageError(f"MASTER_PORT={given!r} is not a port number; set it to 1-65535 "
                         "or unset it to let --nproc pick a free port")
    return int(given)


class _MpiWatch:
    """Asked by _wait_all each poll under MPI: stdout closed ends the run (SIGPIPE, as a
    pipeline would); a stopped mpiexec or proxy is resumed (ranks/stopped.py)."""

    def __init__(self, mpiexec: int, banner: "MpiBanner", reaper: Reaper, folder: Path,
                 nproc: int) -> None:
        self.mpiexec, self.banner, self.reaper, self.last = mpiexec, banner, reaper, 0.0
        self.folder, self.nproc, self.segments = folder, nproc, set[str]()

    def __call__(self) -> None:
        self.reaper.keep()
        if self.banner.closed:
            raise Stopped(signal.SIGPIPE)
        if len(list(self.folder.glob("shm-[0-9]*"))) < self.nproc:  # ranks in MPI_Init
            shm.note_opened(notes.rank_pids(self.folder), self.folder, self.segments)
        if time.monotonic() - self.last < 0.5:
            return
        self.last = time.monotonic()
        for pid in resume_stopped(self.mpiexec):
            who = "mpiexec" if pid == self.mpiexec else "mpiexec's proxy"
            sys.stderr.write(f"infercomm: warning: {who} (pid {pid}) was stopped; resumed it, "
                             "as the run cannot end without it\n")


def _wait_all(procs: list[subprocess.Popen], names: list[str], folder: Path,
              watch: Callable[[], None] | None = None) -> int:
    failed_at: float | None = None
    status = 0
    while True:
        if watch is not None:
            watch()
        for name, p in zip(names, procs, strict=True):
            code = p.poll()
            if code not in (None, 0) and failed_at is None and status == 0:
                status = _exit_status(code)
                wrong = notes.wrong_by_rank(folder)
                if code == 1 and wrong:
                    # Every call completed; the data was wrong. The other ranks end on their
                    # own once rank 0 has written the results: no grace period, no kill.
                    sys.stderr.write(check_failed_message(wrong))
                    continue
                if code == WRITE_ERROR_EXIT_STATUS:
                    continue  # rank 0 measured, said where the run went; the others end well
                if code == CLOSED_STDOUT_STATUS:
                    raise Stopped(signal.SIGPIPE)  # rank 0's stdout closed: quietly, as MPI
                failed_at = time.monotonic()
                if name == "mpiexec":
                    continue  # described once its output is read (mpi_status)
                if -code in STOP_SIGNALS:
                    # someone ended this rank: the others' errors would only follow from it,
                    # so they are ended now, without waiting for them to say so
                    sys.stderr.write(f"infercomm: {name} was ended by "
                                     f"{signal_name(-code)}; ended every rank\n")
                    return status
                others = "; ending the other ranks" if len(procs) > 1 else ""
                sys.stderr.write(f"infercomm: error: {name} ended with "
                                 f"{_describe(code)}{others}\n")
        if all(p.poll() is not None for p in procs):
            return status
        if failed_at is not None and time.monotonic() - failed_at > GRACE_SECONDS:
            return status
        time.sleep(0.05)


def _end_all(procs: list[subprocess.Popen], folder: Path) -> None:
    """SIGTERM each child's process group (a rank; mpiexec, its proxies and their ranks), then
    SIGKILL what is left after 5 s. Before each, the MPI segments the live ranks map are
    noted, for the folder's removal: a rank killed inside MPI_Init never noted its own."""
    alive = [p for p in procs if p.poll() is None]
    shm.note_mapped_by(notes.rank_pids(folder), folder)
    for p in alive:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for p in alive:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
    if any(p.poll() is None for p in alive):
        shm.note_mapped_by(notes.rank_pids(folder), folder)
    for p in alive:
        _signal_group(p, signal.SIGKILL)  # stragglers in the group, and a leader that hung
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)  # process_group=0 made the child the leader of group p.pid


def check_failed_message(wrong: dict[int, int]) -> str:
    where = ", ".join(f"rank {r}: {n:,}" for r, n in wrong.items() if n)
    total = sum(wrong.values())
    what = "wrong element" if total == 1 else "wrong elements"
    return (f"infercomm: error: --check found wrong data ({where} {what}): every call "
            f"completed but delivered wrong values; the results are kept\n")


def _exit_status(code: int) -> int:
    return 128 - code if code < 0 else code  # a signal -N reads as 128+N, as in a shell


def _describe(code: int) -> str:
    if code < 0:
        return f"signal {signal_name(-code)}"
    return f"exit status {code}"
