"""Settings grids (`--env`) under the faults of issue 34: a grid ended by a signal ends the run
in progress (1), a grid too large is refused before a combination is built (2), and a grid
whose setting fails or delivers wrong data is kept, said, and never names that setting best
(3). Real launches: two ranks over gloo, faults injected through the grid's own --env.
"""

import json
import os
import resource
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import last_json
from tests.replay_helpers import tiny_model
from tests.test_launcher import kill_leftovers, wait_gone, wait_started

# grid + launcher + its reaper + 2 ranks + their 2 sentinels
GRID_STARTED = 7


def grid_replay(tmp_path: Path, *extra: str, decode: str = "4") -> list[str]:
    return [sys.executable, "-m", "microbench", "replay", "--nproc", "2", "--backend", "torch",
            "--device", "cpu", "--model", tiny_model(tmp_path), "--tp", "2", "--prompt", "8",
            "--decode", decode, "-n", "1", "-w", "0", "--out", str(tmp_path / "o"), *extra]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_ending_a_grid_ends_the_run_in_progress(tmp_path, sig):
    # Fault 1: the grid died, its launcher and ranks ran on for minutes, then wrote a run
    # folder no grid listed (and a BrokenPipe traceback). A decode of 200,000 steps outlasts
    # the test by far.
    marker = uuid.uuid4().hex
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "INFERCOMM_TEST_RUN": marker,
           "TMPDIR": str(tmp_path / "tmp")}
    grid = subprocess.Popen(grid_replay(tmp_path, "--env", "INFERCOMM_GRID_TEST=a,b",
                                        decode="200000"),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_started(marker, GRID_STARTED, grid)
        grid.send_signal(sig)
        _out, err = grid.communicate(timeout=30)  # stderr closes once the launcher has ended
        assert wait_gone(marker, 10) == [], f"processes of the grid left after {sig.name}"
        assert not list((tmp_path / "o").glob("2*")), "a run of a stopped grid was written"
        assert "Traceback" not in err, err
        # The launcher is told to stop, by the grid or (SIGKILL) by the kernel: its own line.
        assert "infercomm: got SIGTERM; ended every rank" in err, err
        if sig == signal.SIGTERM:
            assert grid.returncode == 128 + 15, err  # SIGTERM is 15
            assert ("infercomm replay: got SIGTERM; ended the run with "
                    "INFERCOMM_GRID_TEST=a (run 1 of 2)") in err, err
            assert "no run of the grid finished; nothing kept" in err
    finally:
        kill_leftovers(marker)
        grid.kill()
        grid.communicate()


def _address_space(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_a_ten_by_ten_grid_is_refused_before_any_combination_is_built(tmp_path):
    # Fault 2: 10 variables of 10 values made all 10^10 combinations, then ran out of memory.
    # Under a 2 GiB address space (plenty for the command itself) the old code ends in a
    # MemoryError traceback within seconds instead of a refusal.
    envs = [a for i in range(10) for a in ("--env", f"V{i}=" + ",".join(map(str, range(10))))]
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "microbench", "sweep", *envs, "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OMP_NUM_THREADS": "1",
                               "OPENBLAS_NUM_THREADS": "1"},
                          preexec_fn=_address_space(2 << 30), check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    # 10 values to each of 10 variables: 10^10 = 10,000,000,000 combinations
    assert proc.stderr == ("infercomm sweep: error: --env makes 10,000,000,000 combinations "
                           "(10 x 10 x 10 x 10 x 10 x 10 x 10 x 10 x 10 x 10 values), more "
                           "than 64; give fewer values\n")
    assert time.monotonic() - started < 30 and not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def wrong_data_grid(tmp_path_factory) -> subprocess.CompletedProcess:
    """A grid whose first setting delivers wrong data: rank 1 corrupts its inputs
    (faults.py), so --check fails there only."""
    tmp_path = tmp_path_factory.mktemp("grid")
    return subprocess.run(grid_replay(tmp_path, "--check", "--env",
                                      "INFERCOMM_FAULT=corrupt:1,none"),
                          capture_output=True, text=True, timeout=240, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_a_setting_with_wrong_data_is_never_best(wrong_data_grid):
    # Fault 3: best.csv named, unflagged, a setting whose run failed --check.
    proc = wrong_data_grid
    assert proc.returncode == 1, proc.stderr[-2000:]  # a run's data was wrong
    assert "not ranked: INFERCOMM_FAULT=corrupt:1 (--check found wrong data)" in proc.stdout
    summary = last_json(proc.stdout)
    assert (summary["runs"], summary["not_ranked"], summary["complete"]) == (2, 1, True)
    grid = json.loads((Path(summary["results_dir"]) / "grid.json").read_text())
    assert grid["not_ranked"] == ["INFERCOMM_FAULT=corrupt:1"]
    assert [r["check_failed"] for r in grid["runs"]] == [True, False]
    # replay's three phases, each won by the only setting with right data
    assert [(r["metric"], r["best"]) for r in grid["best"]] == [
        (m, "INFERCOMM_FAULT=none") for m in ("prefill_us", "decode_step_us", "e2e_us")]
    assert "corrupt:1" not in (Path(summary["results_dir"]) / "best.csv").read_text()


def test_a_grid_whose_setting_fails_keeps_and_names_what_finished(tmp_path):
    # Fault 3: a failing setting left no grid.json or best.csv and named no run kept. Rank 1
    # of the second setting kills itself in its second step (faults.py): SIGKILL, 137.
    proc = subprocess.run(grid_replay(tmp_path, "--env", "INFERCOMM_FAULT=none,kill:1:2"),
                          capture_output=True, text=True, timeout=240, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 128 + 9, proc.stderr[-2000:]  # the failed run's status
    summary = last_json(proc.stdout)
    assert (summary["runs"], summary["complete"]) == (1, False)
    folder = Path(summary["results_dir"])
    grid = json.loads((folder / "grid.json").read_text())
    assert (grid["complete"], grid["runs_planned"]) == (False, 2)
    assert grid["ended"] == {"setting": "INFERCOMM_FAULT=kill:1:2", "exit_status": 137,
                             "results_dir": None}
    (kept,) = [r["results_dir"] for r in grid["runs"]]
    assert Path(kept, "meta.json").is_file() and (folder / "best.csv").is_file()
    assert (f"kept the partial grid at {folder} with the 1 run that finished: {kept}"
            in proc.stderr), proc.stderr
    assert "(partial: 1 of 2 runs)" in proc.stdout


SWEEP = next((Path(__file__).resolve().parent.parent / "results" / "examples"
              / "samples").glob("*-sweep-*"))


@pytest.mark.parametrize("command", [
    ["report", "{grid}", "-o", "{tmp}/r.html"], ["plot", "{grid}", "-o", "{tmp}/figures"],
    ["compare", "-A", "{grid}", "-B", "{run}"],
    ["predict", "--sweep", str(SWEEP), "--against", "{grid}"]])
def test_a_grid_folder_given_as_a_run_names_its_runs(cli, wrong_data_grid, tmp_path, command):
    # A newcomer's first hour: a grid's folder was "not a run folder (no meta.json)".
    grid = Path(last_json(wrong_data_grid.stdout)["results_dir"])
    runs = [r["results_dir"] for r in json.loads((grid / "grid.json").read_text())["runs"]]
    status, out, err = cli(*[a.format(grid=grid, run=runs[1], tmp=tmp_path) for a in command])
    assert status == 2 and out == "", err
    assert err == (f"infercomm {command[0]}: error: '{grid}' is a settings grid (grid.json, "
                   "best.csv), not a run folder; pass one of its 2 runs, or two to compare "
                   f"settings: {runs[0]} {runs[1]}\n")
    assert not any(tmp_path.iterdir())
