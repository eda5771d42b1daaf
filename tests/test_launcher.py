"""The `--nproc` launcher and its ranks end together, and failures are named (issue 9, 1-3).

Every process of a run carries the test's marker in its environment (mpiexec and its proxy
pass the environment on), so a scan of /proc/*/environ finds the launcher, mpiexec, the
proxy, the ranks and their sentinels, whoever their parent is.
"""

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

from tests.replay_helpers import infercomm, last_json, needs_mpi, tiny_model

BACKENDS = ["torch", pytest.param("mpi", marks=needs_mpi)]
# Processes of a started run: launcher + 2 ranks + 2 sentinels (torch);
# launcher + mpiexec + its proxy + 2 ranks + 2 sentinels (mpi).
STARTED = {"torch": 5, "mpi": 7}


def run_processes(marker: str) -> list[int]:
    """Pids of live processes whose environment holds `marker`."""
    found = []
    needle = f"INFERCOMM_TEST_RUN={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found


def kill_leftovers(marker: str) -> None:
    for pid in run_processes(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start_long_replay(tmp_path: Path, backend: str, marker: str,
                      *extra: str) -> subprocess.Popen:
    """The issue's command shape: setsid, a decode far longer than the test, -n 1 -w 0."""
    model = tiny_model(tmp_path)
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "INFERCOMM_TEST_RUN": marker,
           "TMPDIR": str(tmp_path / "tmp")}
    return subprocess.Popen(
        ["setsid", sys.executable, "-m", "microbench", "replay", "--nproc", "2", "--backend",
         backend, "--device", "cpu", "--model", model, "--tp", "2", "--prompt", "16",
         "--decode", "200000", "-n", "1", "-w", "0", "--out", str(tmp_path / "o"), *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_started(marker: str, count: int, launcher: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while len(run_processes(marker)) < count:
        assert launcher.poll() is None, launcher.communicate()
        assert time.monotonic() < deadline, "the ranks did not start in 60 s"
        time.sleep(0.2)
    time.sleep(1.0)  # ranks past start-up, into the replay


@contextlib.contextmanager
def started_replay(tmp_path: Path, backend: str,
                   *extra: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """A long replay (start_long_replay) once its ranks have started: the launcher and the
    marker its processes carry. However the test ends, none of them outlives it."""
    marker = uuid.uuid4().hex
    launcher = start_long_replay(tmp_path, backend, marker, *extra)
    try:
        wait_started(marker, STARTED[backend], launcher)
        yield launcher, marker
    finally:
        kill_leftovers(marker)
        launcher.kill()
        launcher.communicate()


def wait_gone(marker: str, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := run_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killing_the_launcher_ends_every_process_of_the_run(tmp_path, backend, sig):
    with started_replay(tmp_path, backend) as (launcher, marker):
        launcher.send_signal(sig)  # setsid execs python in place: this is the launcher
        launcher.wait(timeout=10)
        left = wait_gone(marker, 10)
        assert left == [], f"processes of the run left 10 s after {sig.name}: {left}"
        assert not list((tmp_path / "o").glob("2*")), "nobody reads a run that was stopped"
        # The launcher's notes folder goes too, without waiting for a later run: after
        # SIGKILL the launcher's reaper removes it (mpiexec kills the ranks' sentinels).
        deadline = time.monotonic() + 5
        while list(Path(tmp_path / "tmp").glob("infercomm-launch-*")):
            assert time.monotonic() < deadline, "the launch folder outlived its launcher"
            time.sleep(0.1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ctrl_c_prints_one_line_exits_130_and_ends_every_rank(tmp_path, backend):
    with started_replay(tmp_path, backend) as (launcher, marker):
        os.killpg(launcher.pid, signal.SIGINT)  # a terminal's Ctrl-C: the foreground group
        _out, err = launcher.communicate(timeout=15)
        assert launcher.returncode == 130  # 128 + SIGINT(2), as a shell reports it
        assert err.splitlines() == ["infercomm: interrupted; ended every rank"], err
        assert wait_gone(marker, 10) == []


@needs_mpi
def test_a_rank_killed_under_mpi_is_named_with_its_signal(tmp_path):
    model = tiny_model(tmp_path)
    proc, _ = infercomm("replay", "--model", model, "--tp", "2", "--prompt", "8", "--decode",
                        "1000", "-n", "1", "-w", "0", "--backend", "mpi", "--device", "cpu",
                        "--out", str(tmp_path), env={"INFERCOMM_FAULT": "kill:1:3"})
    assert proc.returncode == 128 + 9, proc.stderr  # SIGKILL is 9
    assert ("infercomm: error: rank 1 (pid " in proc.stderr
            and "was killed by signal SIGKILL; mpiexec ended the other ranks" in proc.stderr)
    assert "exit status 9" not in proc.stderr
    assert "BAD TERMINATION" not in proc.stdout  # MPICH's banner stays off stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_check_failure_says_the_data_was_wrong(tmp_path, backend):
    model = tiny_model(tmp_path)
    proc, _ = infercomm("replay", "--model", model, "--tp", "2", "--prompt", "8", "--decode",
                        "4", "-n", "1", "-w", "0", "--backend", backend, "--device", "cpu",
                        "--out", str(tmp_path), "--check", env={"INFERCOMM_FAULT": "corrupt:1"})
    assert proc.returncode == 1
    assert "--check found wrong data" in proc.stderr
    assert "ended with exit status 1" not in proc.stderr  # not a crash
    assert last_json(proc.stdout)["wrong"] > 0  # stdout still ends with the JSON line


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def rank_pids(marker: str, rank: int) -> list[int]:
    """The rank processes themselves (not their sentinels), found by RANK/PMI_RANK."""
    found = []
    for pid in run_processes(marker):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        cmd = _cmdline(pid)
        if ("microbench" in cmd and "replay" in cmd and "--nproc" not in cmd
                and (f"RANK={rank}".encode() in environ
                     or f"PMI_RANK={rank}".encode() in environ)):
            found.append(pid)
    return found


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stopped_rank_ends_the_run_with_124_within_its_timeout(tmp_path, backend):
    # Fault battery item 15: SIGSTOP of a rank with --timeout 10 ended in 10 s but exited 137
    # (its sentinel's SIGKILL); no progress is 124.
    with started_replay(tmp_path, backend, "--timeout", "4") as (launcher, marker):
        (stopped,) = rank_pids(marker, 1)
        os.kill(stopped, signal.SIGSTOP)
        _out, err = launcher.communicate(timeout=30)
        assert launcher.returncode == 124, err
        assert "made no progress" in err and "Traceback" not in err
        assert wait_gone(marker, 10) == []


@needs_mpi
def test_killing_mpis_process_manager_proxy_ends_every_rank(tmp_path):
    # Fault battery item 9: SIGKILL of hydra_pmi_proxy left the ranks running for 50 s (they
    # then wrote a run folder), and the launcher said "signal 127" for mpiexec's status 255.
    # MPI runs the tiny model's 200,000 steps in about 2 s: 100 inferences outlast the test.
    with started_replay(tmp_path, "mpi", "-n", "100", "--timing", "inference") as (launcher,
                                                                                 marker):
        (proxy,) = [p for p in run_processes(marker)
                    if _cmdline(p)[0].endswith("hydra_pmi_proxy")]
        os.kill(proxy, signal.SIGKILL)
        _out, err = launcher.communicate(timeout=20)
        assert launcher.returncode != 0 and "signal 127" not in err, err
        assert "Traceback" not in err
        assert wait_gone(marker, 10) == []
        assert not list((tmp_path / "o").glob("2*")), "a run whose job failed was written"


def test_ucx_errors_on_mpiexecs_stdout_go_to_stderr(capfd):
    # Fault battery item 15: a rank killed during MPI start-up put two UCX ERROR lines on
    # stdout, after which the last line was no longer the JSON object. The line below has
    # UCX's log layout (openucx/ucx src/ucs/debug/log.c: UCS_LOG_TIME_FMT "[%lu.%06lu]",
    # UCS_LOG_PROC_DATA_FMT "[%s:%-5d:%d]", UCS_LOG_FILE_FMT "%16s:%-4u",
    # UCS_LOG_METADATA_FMT "%-4s %-5s" with "UCX" and the level name).
    import io

    from microbench.ranks.mpi_output import MpiBanner
    ucx = (b"[1763942400.123456] [vm:4242 :0]     ucp_worker.c:1863 UCX  ERROR "
           b"uct_iface_open(posix/memory) failed: Shared memory error\n")
    stream = io.BytesIO(b"replay table\n" + ucx + b'{"backend":"mpi"}\n')
    MpiBanner().forward(stream)
    out, err = capfd.readouterr()
    assert out.splitlines() == ["replay table", '{"backend":"mpi"}']
    assert err == ucx.decode()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_stop_signal_does_not_break_the_first_ones_clean_up(tmp_path, backend):
    # A CI run: interleave was SIGKILLed, its launcher got SIGTERM twice (its parent's death,
    # PR_SET_PDEATHSIG, and a second), and the second raised out of the first one's clean-up
    # with a traceback. Two signals at once here: SIGTERM, then SIGHUP before it is handled.
    with started_replay(tmp_path, backend) as (launcher, marker):
        launcher.send_signal(signal.SIGTERM)
        launcher.send_signal(signal.SIGHUP)
        _out, err = launcher.communicate(timeout=20)
        assert "Traceback" not in err, err
        # The first signal handled is the one reported (Linux hands pending signals over
        # lowest number first, so either may come first); the other is ignored.
        assert launcher.returncode in (128 + signal.SIGTERM, 128 + signal.SIGHUP), err
        name = signal.Signals(launcher.returncode - 128).name
        assert err.splitlines() == [f"infercomm: got {name}; ended every rank"], err
        assert wait_gone(marker, 10) == []


GUARDED = """
import os, signal
from microbench.ranks.children import StopGuard, Stopped
both = {signal.SIGTERM, signal.SIGHUP}
with StopGuard() as guard:
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, both)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGHUP)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, both)  # both pending: handled one by one
        print("not stopped")
    except Stopped as stopped:
        total = 0
        for i in range(200_000):  # a clean-up long enough for the second handler to run in
            total += i
        print("cleaned up after", stopped.signum, total)
print("left the guard", signal.getsignal(signal.SIGTERM) == signal.SIG_IGN)
"""


def test_a_stop_guard_raises_once_and_stays_deaf_after_a_stop(tmp_path):
    proc = subprocess.run([sys.executable, "-c", GUARDED], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.split()[3]
    assert first in (str(int(signal.SIGHUP)), str(int(signal.SIGTERM))), proc.stdout
    assert proc.stdout.splitlines() == [f"cleaned up after {first} {sum(range(200_000))}",
                                        "left the guard True"], proc.stdout
