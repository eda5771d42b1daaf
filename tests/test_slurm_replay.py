"""`srun ... infercomm replay` and `sbatch slurm/replay.sbatch` on the real local two-node Slurm.

TP2xPP2 of the tiny model (see tests/test_replay.py for the per-rank call counts) on 4 tasks,
two on each fake node.
"""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.replay_helpers import last_json, read_csv, tiny_model
from tests.slurm_cluster import slurm_cluster, wait_for_job  # noqa: F401
from tests.test_replay import EXPECTED_CALLS

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[1]


def srun_replay(env: dict, tmp: Path, backend: str, mpi: str, *extra: str,
                kill_on_bad_exit: bool = True):
    # --kill-on-bad-exit=1, as in slurm/*.sbatch: a task that dies ends the step at once.
    cmd = ["srun", f"--kill-on-bad-exit={int(kill_on_bad_exit)}", "-N", "2", "-n", "4",
           f"--mpi={mpi}", sys.executable, "-m", "microbench", "replay",
           "--engine", "vllm-v0",  # EXPECTED_CALLS are V0's (tests/test_replay.py)
           "--model", tiny_model(tmp), "--tp", "2", "--pp", "2", "--prompt", "8",
           "--decode", "4", "--backend", backend, "--device", "cpu", "-n", "2", "-w", "1",
           "--timeout", "60", "--out", str(tmp / "res"), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180,
                          check=False)


@pytest.mark.parametrize("backend, mpi, launcher", [
    ("mpi", "pmi2", "pmi"),  # MPICH wired up by Slurm's PMI-2
    ("torch", "none", "slurm"),  # gloo: rank from SLURM_PROCID, rendezvous on the first node
])
def test_srun_two_nodes_tp2_pp2(slurm_cluster, tmp_path, backend, mpi, launcher):  # noqa: F811
    proc = srun_replay(slurm_cluster, tmp_path, backend, mpi, "--check", "--timing", "op")
    assert proc.returncode == 0, proc.stderr
    line = last_json(proc.stdout)
    assert (line["world_size"], line["wrong"]) == (4, 0)
    run = Path(line["results_dir"])
    meta = json.loads((run / "meta.json").read_text())
    assert meta["launcher"] == launcher
    assert meta["environment"]["SLURM_NTASKS"] == "4"
    if backend == "mpi":  # the cluster's task prolog chose it; the run records it
        assert meta["environment"]["MPIR_CVAR_CH4_NETMOD"] == "ofi"
    ops = read_csv(run / "ops.csv")
    for rank, kinds in EXPECTED_CALLS[(2, 2)].items():
        issued = Counter(r["op"] for r in ops if r["iteration"] == "0" and r["rank"] == str(rank))
        assert issued == kinds


def test_srun_without_pmi_is_refused_with_the_fix(slurm_cluster, tmp_path):  # noqa: F811
    # --mpi=none gives each MPICH task a world of 1 (tests/test_slurm_cluster.py shows it).
    # Without --kill-on-bad-exit, so that the first refusal does not cut the others short.
    proc = srun_replay(slurm_cluster, tmp_path, "mpi", "none", kill_on_bad_exit=False)
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("infercomm replay: error")]
    assert len(errors) == 4  # every task says it, once
    assert all("the launcher started 4 ranks (slurm variables) but MPI sees a world of 1; "
               "launch with srun --mpi=pmi2 for MPICH, --mpi=pmix for Open MPI or "
               "--mpi=cray_shasta for Cray MPICH" in e
               for e in errors)
    assert not (tmp_path / "res").exists() or not any((tmp_path / "res").iterdir())


def test_sbatch_replay_template(slurm_cluster, tmp_path):  # noqa: F811
    exports = {"INFERCOMM": f"{sys.executable} -m microbench", "MODEL": tiny_model(tmp_path),
               "PROMPT": "8", "DECODE": "4", "BACKEND": "mpi", "ITERS": "2", "WARMUP": "1",
               "OUT": str(tmp_path / "res"), "EXTRA_ARGS": "--check --timeout 60",
               "PYTHONPATH": str(REPO)}
    export_arg = "ALL," + ",".join(f"{k}={v}" for k, v in exports.items())
    submitted = subprocess.run(
        ["sbatch", "--parsable", "-N", "2", "--ntasks-per-node", "2", f"--export={export_arg}",
         f"--chdir={tmp_path}", str(REPO / "slurm" / "replay.sbatch")],
        env=slurm_cluster, capture_output=True, text=True, timeout=30, check=True)
    job = submitted.stdout.strip().split(";")[0]
    exit_code, state = wait_for_job(job, slurm_cluster, timeout=180)
    output = (tmp_path / f"infercomm-replay-{job}.out").read_text()
    assert (exit_code, state) == ("0:0", "COMPLETED"), output
    line = last_json(output)
    assert (line["world_size"], line["tp"], line["pp"], line["wrong"]) == (4, 2, 2, 0)
    summary = json.loads((Path(line["results_dir"]) / "summary.json").read_text())
    assert summary["iterations"] == 2 and summary["backend"] == "mpi"
