"""Issue 42's battery, signals: every signal ends every process of a run within seconds, in
one line with the status 128+N, no traceback, nothing left in /dev/shm or TMPDIR. Real
launchers, real ranks (gloo and the mpich wheel's mpiexec), real signals; each run's
processes found by the marker in their environment (tests/test_launcher.py)."""

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.replay_helpers import infercomm, needs_mpi, tiny_model
from tests.test_launcher import (
    _cmdline,
    kill_leftovers,
    rank_pids,
    run_processes,
    start_long_replay,
    started_replay,
    wait_gone,
)
from tests.test_mpi_launcher_faults import mapped_mpich_files

STOP_WITHIN = 20  # seconds: a launcher ends its ranks within 10 (SIGTERM, 5 s, SIGKILL, 5 s)


def mpich_files() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith(("mpich_shm_", "mpich_vci_"))}


def ours(marker: str, names: set[str]) -> set[str]:
    """Of `names` (files under /dev/shm), those a rank of the run maps or holds open."""
    found = set()
    for pid in [*rank_pids(marker, 0), *rank_pids(marker, 1)]:
        with contextlib.suppress(OSError):
            text = Path(f"/proc/{pid}/maps").read_text()
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
            found |= {n for n in names if n in text or any(n in link for link in links)}
    return found


def roles(marker: str) -> dict[str, list[int]]:
    """The run's processes by role: launcher, reaper, mpiexec, proxy, sentinel, rank."""
    found: dict[str, list[int]] = {}
    for pid in run_processes(marker):
        cmd = _cmdline(pid)
        role = ("reaper" if "-S" in cmd and "-c" in cmd
                else "sentinel" if "microbench.ranks.sentinel" in cmd
                else "proxy" if cmd and cmd[0].endswith("hydra_pmi_proxy")
                else "mpiexec" if cmd and cmd[0].endswith("mpiexec")
                else "launcher" if "--nproc" in cmd else "rank")
        found.setdefault(role, []).append(pid)
    return found


def left_in_tmp(tmp_path: Path, seconds: float = 5) -> list[Path]:
    deadline = time.monotonic() + seconds
    while (left := list((tmp_path / "tmp").glob("infercomm-launch-*"))) and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@contextlib.contextmanager
def segments_watched() -> Iterator[set[str]]:
    """The MPICH files the run made (filled in as the test finds them); each removed at the
    end if the run left it, so a failing test leaves nothing either."""
    made: set[str] = set()
    try:
        yield made
    finally:
        for name in made:
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{name}")


@needs_mpi
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGUSR1])
def test_a_stop_signal_to_an_mpi_rank_0_ends_every_rank_at_once(tmp_path, sig):
    # SIGINT: rank 0 waited in MPI_Finalize for its peers, which ran on until --timeout (120
    # s, 4 of 4 tries) and the run ended as a no-progress timeout naming rank 1. SIGUSR1:
    # MPICH took it at MPI_Init and nothing happened at all.
    with started_replay(tmp_path, "mpi") as (launcher, marker):
        (rank0,) = rank_pids(marker, 0)
        os.kill(rank0, sig)
        try:
            _out, err = launcher.communicate(timeout=STOP_WITHIN)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run went on {STOP_WITHIN} s after {sig.name} to rank 0")
        assert launcher.returncode == 128 + sig, err
        (line,) = err.splitlines()
        assert line.startswith(f"infercomm: error: rank 0 (pid {rank0} on "), err
        assert line.endswith(f") was killed by signal {sig.name}; mpiexec ended the other "
                             "ranks"), err
        assert wait_gone(marker, 10) == []
        assert left_in_tmp(tmp_path) == []


def test_sigint_to_a_gloo_rank_in_its_start_up_is_one_line(tmp_path):
    # A rank interrupted while it imported printed KeyboardInterrupt's traceback, and its
    # peer's "Connection closed by peer" followed the launcher's line.
    marker = uuid.uuid4().hex
    launcher = start_long_replay(tmp_path, "torch", marker)
    try:
        deadline = time.monotonic() + 60
        while not (rank0 := rank_pids(marker, 0)):
            assert time.monotonic() < deadline and launcher.poll() is None
            time.sleep(0.01)
        os.kill(rank0[0], signal.SIGINT)  # at once: the rank is still starting
        _out, err = launcher.communicate(timeout=STOP_WITHIN)
        assert launcher.returncode == 130, err  # 128 + SIGINT (2)
        assert err.splitlines() == ["infercomm: rank 0 was ended by SIGINT; ended every rank"]
        assert wait_gone(marker, 10) == []
    finally:
        kill_leftovers(marker)
        launcher.kill()
        launcher.communicate()


@pytest.mark.parametrize("everyone", [False, True], ids=["launcher", "every-process"])
def test_sigusr1_ends_a_run_in_one_line_and_leaves_no_folder(tmp_path, everyone):
    # SIGUSR1 (a batch system's warning) killed the launcher silently (status -10); sent to
    # every process of the run at once it killed the reaper too, and the launch folder stayed.
    with started_replay(tmp_path, "torch") as (launcher, marker):
        for pid in run_processes(marker) if everyone else [launcher.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        _out, err = launcher.communicate(timeout=STOP_WITHIN)
        assert launcher.returncode == 128 + signal.SIGUSR1, err
        assert err.splitlines() == ["infercomm: got SIGUSR1; ended every rank"], err
        assert wait_gone(marker, 10) == []
        assert left_in_tmp(tmp_path) == []


@needs_mpi
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_killing_or_stopping_the_reaper_then_killing_the_launcher_leaves_nothing(tmp_path,
                                                                              sig):
    # Folder and segment stayed: the reaper was dead (or stopped, and it stayed, stopped, for
    # ever), and mpiexec killed the ranks' sentinels.
    with started_replay(tmp_path, "mpi") as (launcher, marker):
        (reaper,) = roles(marker)["reaper"]
        os.kill(reaper, sig)
        time.sleep(0.5)
        launcher.kill()
        launcher.communicate()
        assert wait_gone(marker, 15) == []
        assert left_in_tmp(tmp_path) == []


@needs_mpi
def test_a_run_killed_whole_at_once_leaves_no_segment(tmp_path):
    # SIGKILL of every process (or SIGSTOP of all, then SIGKILL) left the 2 MB segment: nobody
    # was left to remove it. Now its name goes once every rank maps it. (The launch folder of
    # such a run can only go with the next launcher, which removes those of dead launchers.)
    with segments_watched() as made, started_replay(tmp_path, "mpi") as (_launcher, marker):
        made.update(Path(name.removesuffix(" (deleted)")).name
                    for r in (0, 1) for pid in rank_pids(marker, r)
                    for name in mapped_mpich_files(pid))
        assert made, "no MPICH file mapped by the run's ranks"
        for pid in run_processes(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert wait_gone(marker, 10) == []
        assert sorted(mpich_files() & made) == []


@needs_mpi
@pytest.mark.parametrize("target, sig", [("launcher", signal.SIGTERM),
                                         ("rank 0", signal.SIGINT), ("rank 0", signal.SIGUSR1)])
def test_a_stop_while_mpi_init_makes_its_segment_leaves_none(tmp_path, target, sig):
    # 5 of 5 tries left /dev/shm/mpich_shm_*: MPI_Init makes it before the rank can note it,
    # and SIGTERM (to the launcher, which passes it on) or SIGINT (to the rank) ended the rank
    # there; a SIGUSR1 held there reached MPICH's handler and the run went on (3 of 3). The
    # test stops the run the moment a rank holds a new MPICH file.
    marker = uuid.uuid4().hex
    before = mpich_files()
    launcher = start_long_replay(tmp_path, "mpi", marker)
    with segments_watched() as made:
        try:
            deadline = time.monotonic() + 60
            while not made:
                made.update(ours(marker, mpich_files() - before))
                assert time.monotonic() < deadline and launcher.poll() is None
                time.sleep(0.001)
            if target == "launcher":
                launcher.send_signal(sig)
            else:
                for pid in rank_pids(marker, 0):
                    os.kill(pid, sig)
            _out, err = launcher.communicate(timeout=STOP_WITHIN)
            # A peer inside MPI_Init may crash when this rank vanishes before its own MPI_Init
            # (MPICH/UCX: SIGSEGV, 1 of 30 runs), and Hydra then names the crash: either way
            # the run ended, in one line.
            assert launcher.returncode == 128 + sig or (
                target != "launcher" and "was killed by signal SIGSEGV" in err), err
            assert len(err.splitlines()) == 1 and "Traceback" not in err, err
            assert wait_gone(marker, 10) == []
            time.sleep(0.5)  # the reaper's poll
            assert sorted(mpich_files() & made) == [], "the run's segment was left"
            assert left_in_tmp(tmp_path) == []
        finally:
            kill_leftovers(marker)
            launcher.kill()
            launcher.communicate()


@needs_mpi
def test_injected_faults_are_named_when_a_run_fails(tmp_path):
    # INFERCOMM_FAULT left set in a shell made real runs fail with nothing saying why.
    model = tiny_model(tmp_path)
    proc, _ = infercomm("replay", "--model", model, "--tp", "2", "--prompt", "8", "--decode",
                        "40", "-n", "1", "-w", "0", "--backend", "mpi", "--device", "cpu",
                        "--out", str(tmp_path), env={"INFERCOMM_FAULT": "kill:1:3"})
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "infercomm: note: INFERCOMM_FAULT=kill:1:3 is set: the test suite's injected fault; "
        "unset it for a real run"), proc.stderr


def test_a_stray_check_only_variable_is_refused(tmp_path):
    # INFERCOMM_CHECK_ONLY (a grid's own) left set: replay and sweep exited 0 having measured
    # and printed nothing, and a grid under it ended in a traceback.
    model = tiny_model(tmp_path)
    base = ["replay", "--model", model, "--tp", "2", "--prompt", "8", "--decode", "2", "-n",
            "1", "-w", "0", "--backend", "torch", "--device", "cpu", "--out", str(tmp_path)]
    for argv in (base, ["sweep", "--nproc", "2", "--backend", "torch", "--device", "cpu",
                        "-e", "1K", "--out", str(tmp_path)],
                 [*base, "--env", "INFERCOMM_GRID_TEST=a,b"]):
        proc, _ = infercomm(*argv, env={"INFERCOMM_CHECK_ONLY": "1"})
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        assert proc.stderr.splitlines() == [
            f"infercomm {argv[0]}: error: INFERCOMM_CHECK_ONLY is set ('1'), which only a "
            "settings grid (--env) sets for its own input check: with it, nothing would be "
            "measured; unset it (unset INFERCOMM_CHECK_ONLY)"], proc.stderr
    assert not list(tmp_path.glob("2*"))


def test_ctrl_c_to_a_grid_with_check_ends_its_run_and_says_so_once(tmp_path):
    # A grid of two checked settings given Ctrl-C (its whole foreground group) while its
    # first run goes: the run's launcher ends its ranks, the grid says which run it ended.
    marker = uuid.uuid4().hex
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "INFERCOMM_TEST_RUN": marker,
           "TMPDIR": str(tmp_path / "tmp")}
    grid = subprocess.Popen(
        [sys.executable, "-m", "microbench", "replay", "--nproc", "2", "--backend", "torch",
         "--device", "cpu", "--model", tiny_model(tmp_path), "--tp", "2", "--prompt", "8",
         "--decode", "200000", "-n", "1", "-w", "0", "--check", "--out", str(tmp_path / "o"),
         "--env", "INFERCOMM_GRID_TEST=a,b"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not rank_pids(marker, 1):
            assert time.monotonic() < deadline and grid.poll() is None, grid.communicate()
            time.sleep(0.1)
        time.sleep(1.0)
        os.killpg(grid.pid, signal.SIGINT)
        _out, err = grid.communicate(timeout=STOP_WITHIN)
        assert grid.returncode == 130, err
        assert "Traceback" not in err, err
        assert err.splitlines()[-2:] == [
            "infercomm replay: interrupted; ended the run with INFERCOMM_GRID_TEST=a (run 1 "
            "of 2)", "infercomm replay: no run of the grid finished; nothing kept"], err
        assert wait_gone(marker, 10) == []
        assert left_in_tmp(tmp_path) == []
    finally:
        kill_leftovers(marker)
        grid.kill()
        grid.communicate()


def test_killing_an_interleaves_run_ends_interleave_at_once(tmp_path):
    # The battery's interleave took 150 s to end after its run's launcher was killed.
    marker = uuid.uuid4().hex
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "INFERCOMM_TEST_RUN": marker,
           "TMPDIR": str(tmp_path / "tmp")}
    prefix = f"{sys.executable} -m microbench"
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, str(repo / "scripts" / "interleave.py"), "-k", "1", "--out",
         str(tmp_path / "ab"), "--a", prefix, "--b", prefix, "--", "replay", "--nproc", "2",
         "--backend", "torch", "--device", "cpu", "--model", tiny_model(tmp_path), "--tp",
         "2", "--prompt", "8", "--decode", "200000", "-n", "1", "-w", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, cwd=repo)
    try:
        deadline = time.monotonic() + 60
        while not (found := roles(marker)).get("sentinel") or len(found["sentinel"]) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        launcher = [p for p in found["launcher"]
                    if "scripts/interleave.py" not in " ".join(_cmdline(p))]
        os.kill(launcher[0], signal.SIGKILL)
        _out, err = proc.communicate(timeout=STOP_WITHIN)
        assert proc.returncode == 128 + signal.SIGKILL, err
        assert err.splitlines()[-1] == "interleave: a-1 failed (exit 137); stopping; runs " \
                                       "kept: none", err
        assert wait_gone(marker, 10) == []
        assert left_in_tmp(tmp_path) == []
        assert not (tmp_path / "ab").exists()  # nothing kept: no half-made --out either
    finally:
        kill_leftovers(marker)
        proc.kill()
        proc.communicate()
