"""The MPI `--nproc` launcher under the faults of issue 34: MPICH's /dev/shm segment of a run
ended by a signal is removed, another job's never (7); a stopped mpiexec neither hangs the
launcher nor loses the run's table (6); a closed stdout ends the run quietly (12). Real
mpiexec, real ranks, real signals."""

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from microbench.ranks.sentinel import parent_of
from tests.conftest import last_json
from tests.replay_helpers import needs_mpi, tiny_model
from tests.test_launcher import (
    kill_leftovers,
    rank_pids,
    run_processes,
    started_replay,
    wait_gone,
)

pytestmark = needs_mpi


@contextlib.contextmanager
def decoy_segment():
    """A file named as MPICH names its segments, as another job on the machine would hold."""
    path = Path("/dev/shm") / f"mpich_shm_{uuid.uuid4().hex[:8]}_0"
    path.write_bytes(b"\0" * 4096)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def mapped_mpich_files(pid: int) -> set[str]:
    """The /dev/shm/mpich_* files `pid` maps, named as /proc/PID/maps names them: with
    " (deleted)" after a name already removed."""
    with contextlib.suppress(OSError):
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        return {line.split(None, 5)[5] for line in lines
                if len(line.split(None, 5)) == 6 and "/dev/shm/mpich_" in line}
    return set()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_run_ended_by_a_signal_leaves_no_segment_of_its_own(tmp_path, sig):
    # Fault 7: every MPI run ended by a signal left its 2 MB mpich_shm_* in /dev/shm. Issue
    # 42: under load a SIGTERM found it still there (a rank that had not yet noted it), so a
    # run's segment loses its name as soon as every rank maps it: the ranks map it deleted.
    with decoy_segment() as other, started_replay(tmp_path, "mpi") as (launcher, marker):
        mapped = {s for r in (0, 1) for p in rank_pids(marker, r)
                  for s in mapped_mpich_files(p)}
        assert mapped and all(s.endswith(" (deleted)") for s in mapped), mapped
        ours = sorted(s.removesuffix(" (deleted)") for s in mapped)
        assert str(other) not in ours
        launcher.send_signal(sig)
        launcher.wait(timeout=20)
        assert wait_gone(marker, 15) == []
        deadline = time.monotonic() + 5  # after SIGKILL: the sentinels' or reaper's turn
        while any(Path(s).exists() for s in ours) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [s for s in ours if Path(s).exists()] == [], "the run's segment was left"
        assert other.exists(), "another job's segment was removed"


def _is_job_mpiexec(pid: int) -> bool:
    """mpiexec -n 2 ... (not the `mpiexec --version` the launcher asks first)."""
    with contextlib.suppress(OSError):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return argv[0].endswith(b"mpiexec") and argv[1:2] == [b"-n"]
    return False


def test_a_stopped_mpiexec_is_resumed_and_the_run_reported(tmp_path):
    # Fault 6: SIGSTOP of mpiexec made the launcher wait forever after the ranks ended, and
    # the table and the JSON line (which pass through mpiexec) never came.
    marker = uuid.uuid4().hex
    env = {**os.environ, "OMP_NUM_THREADS": "1", "INFERCOMM_TEST_RUN": marker}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "microbench", "replay", "--nproc", "2", "--backend", "mpi",
         "--device", "cpu", "--model", tiny_model(tmp_path), "--tp", "2", "--prompt", "8",
         "--decode", "4", "-n", "3", "-w", "0", "--out", str(tmp_path / "o")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        # the launcher's child: Hydra forks before it execs its proxy, and the fork carries
        # mpiexec's command line for a moment (two were found once)
        while not (found := [p for p in run_processes(marker) if _is_job_mpiexec(p)
                             and parent_of(p) == launcher.pid]):
            assert launcher.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        (mpiexec,) = found
        os.kill(mpiexec, signal.SIGSTOP)
        out, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 0, err
        assert f"mpiexec (pid {mpiexec}) was stopped; resumed it" in err, err
        summary = last_json(out)  # the JSON line came through the resumed mpiexec
        assert Path(summary["results_dir"], "meta.json").is_file()
        assert "prefill" in out  # and the table before it
        assert wait_gone(marker, 10) == []
    finally:
        kill_leftovers(marker)
        launcher.kill()
        launcher.communicate()


def test_a_closed_stdout_ends_the_run_quietly(tmp_path):
    # Fault 12: the launcher's stdout closed (`| head -0`) ended in a BrokenPipe traceback
    # from the thread forwarding mpiexec's output.
    marker = uuid.uuid4().hex
    env = {**os.environ, "OMP_NUM_THREADS": "1", "INFERCOMM_TEST_RUN": marker}
    read, write = os.pipe()
    os.close(read)  # nobody will read: the first write gets EPIPE
    try:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "microbench", "replay", "--nproc", "2", "--backend", "mpi",
             "--device", "cpu", "--model", tiny_model(tmp_path), "--tp", "2", "--prompt", "8",
             "--decode", "4", "-n", "3", "-w", "0", "--out", str(tmp_path / "o")],
            env=env, stdout=write, stderr=subprocess.PIPE, text=True, start_new_session=True)
    finally:
        os.close(write)
    try:
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 128 + 13, err  # SIGPIPE is 13, as a shell pipeline
        assert "Traceback" not in err and "BrokenPipe" not in err, err
        assert wait_gone(marker, 10) == []
    finally:
        kill_leftovers(marker)
        launcher.kill()
        launcher.communicate()
