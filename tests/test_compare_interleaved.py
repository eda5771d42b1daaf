"""scripts/interleave.py: K runs of A and K of B taken in turn (A B A B), then compare on them.

Two environments of one MPI library (the mpich wheel): MPICH's intra-node all-reduce
algorithm set by MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM to recursive_doubling on side A and ring
on side B, fp32 so that MPICH's own sum runs. What is asserted is the schedule and what the
comparison records and names, not which algorithm wins on a shared 2-core machine.
"""

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.replay_helpers import tiny_model
from tests.test_launcher import kill_leftovers, wait_gone, wait_started

REPO = Path(__file__).resolve().parents[1]
INFERCOMM = f"{sys.executable} -m microbench"
CVAR = "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM"


@pytest.mark.mpi
def test_two_environments_interleaved(tmp_path):
    argv = [sys.executable, str(REPO / "scripts" / "interleave.py"), "-k", "2",
            "--out", str(tmp_path),
            "--a", f"env {CVAR}=recursive_doubling {INFERCOMM}",
            "--b", f"env {CVAR}=ring {INFERCOMM}",
            "--", "replay", "--model", "llama-3.2-1b", "--tp", "2", "--prompt", "8",
            "--decode", "4", "-n", "5", "-w", "1", "--backend", "mpi", "--nproc", "2",
            "--dtype", "fp32"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO,
                          check=False)
    assert proc.returncode in (0, 1, 3), proc.stderr  # compare's verdict, whichever it is
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["schedule"] == ["a-1", "b-1", "a-2", "b-2"]
    assert last["compare_status"] == proc.returncode
    # Each run recorded the setting it ran under, and ran in the order of the schedule.
    runs = [Path(p) for pair in zip(last["a"], last["b"], strict=True) for p in pair]
    metas = [json.loads((r / "meta.json").read_text()) for r in runs]
    assert [m["environment"][CVAR] for m in metas] == ["recursive_doubling", "ring"] * 2
    created = [m["created_utc"] for m in metas]
    assert created == sorted(created)
    # How MPICH carried it (backends/mpi_transport.py): the wheel's first netmod ("MPICH
    # Device: ch4:ucx ofi") unless the environment picks one; both ranks on one node, shm on.
    netmod = os.environ.get("MPIR_CVAR_CH4_NETMOD", "ucx")
    assert {(m["versions"]["mpi_netmod"], m["versions"]["mpi_shm"],
             m["versions"]["mpi_node_ranks"]) for m in metas} == {(netmod, "on", 2)}
    # compare took two runs a side and names the one difference.
    summary = last["compare"]
    assert summary["sides"] == {"A": last["a"], "B": last["b"]}
    assert summary["differences"] == {"B": [{"what": CVAR, "a": "recursive_doubling",
                                             "b": "ring"}]}
    assert {(m["runs_a"], m["runs_b"], m["drift_allowed"]) for m in summary["metrics"]} == {
        (2, 2, None)}
    assert f"  {CVAR}: recursive_doubling -> ring" in proc.stdout


def interleave(tmp_path: Path, a: str, b: str, *command: str) -> list[str]:
    return [sys.executable, str(REPO / "scripts" / "interleave.py"), "-k", "2", "--out",
            str(tmp_path / "ab"), "--a", a, "--b", b, "--", *command]


@pytest.mark.parametrize(("a", "status", "words"), [
    ("/nonexistent/infercomm", 127, "a-1: cannot run '/nonexistent/infercomm' (No such file "
                                    "or directory); give a command prefix that runs infercomm"),
    ("true", 1, "a-1 ended without a JSON last line naming its run folder (results_dir): "
              "give a command prefix that runs infercomm"),
    ("false", 1, "a-1 failed (exit 1)")])
def test_a_side_that_fails_is_one_line_and_a_json_last_line(tmp_path, a, status, words):
    # Fault 12: a side that could not start or printed no JSON ended in a traceback.
    proc = subprocess.run(interleave(tmp_path, a, INFERCOMM, "replay"), capture_output=True,
                          text=True, timeout=60, cwd=REPO, check=False)
    assert proc.returncode == status and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1] == f"interleave: {words}; stopping; runs kept: none"
    assert json.loads(proc.stdout.splitlines()[-1]) == {
        "schedule": [], "a": [], "b": [], "complete": False, "status": status}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_ending_interleave_ends_the_run_in_progress(tmp_path, sig):
    # Faults 1 and 12: Ctrl-C gave a KeyboardInterrupt traceback, and SIGKILL left the run
    # in progress (launcher and ranks) running for minutes. Ctrl-C reaches the whole
    # foreground group; SIGKILL reaches interleave alone. 200,000 decode steps outlast the
    # test by far.
    marker = uuid.uuid4().hex
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "INFERCOMM_TEST_RUN": marker,
           "TMPDIR": str(tmp_path / "tmp")}
    argv = interleave(tmp_path, INFERCOMM, INFERCOMM, "replay", "--nproc", "2", "--backend",
                      "torch", "--device", "cpu", "--model", tiny_model(tmp_path), "--tp", "2",
                      "--prompt", "8", "--decode", "200000", "-n", "1", "-w", "0")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, cwd=REPO)
    try:
        # interleave + launcher + its reaper + 2 ranks + their 2 sentinels
        wait_started(marker, 7, proc)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        assert wait_gone(marker, 10) == [], f"processes of the run left after {sig.name}"
        assert not list((tmp_path / "ab").rglob("meta.json")), "a stopped run was written"
        assert "Traceback" not in err, err
        if sig == signal.SIGINT:
            assert proc.returncode == 130, err  # 128 + SIGINT (2)
            assert "infercomm: interrupted; ended every rank" in err  # the launcher's line
            assert err.splitlines()[-1] == ("interleave: interrupted; ended the run in "
                                            "progress; runs kept: none")
            assert json.loads(out.splitlines()[-1])["status"] == 130
        else:
            assert "infercomm: got SIGTERM; ended every rank" in err  # PR_SET_PDEATHSIG
    finally:
        kill_leftovers(marker)
        proc.kill()
        proc.communicate()
