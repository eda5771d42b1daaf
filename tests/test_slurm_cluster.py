"""The local Slurm cluster behaves like a two-node cluster: placement, PMI, batch jobs.

These are the facts the replay relies on under srun: SLURM_PROCID/SLURM_NTASKS give rank and
world, `--mpi=pmi2` wires MPICH into one world, and `--mpi=none` silently does not.
"""

import subprocess
import sys
from collections import Counter

import pytest

from tests.slurm_cluster import slurm_cluster, wait_for_job  # noqa: F401

pytestmark = pytest.mark.slurm

TIMEOUT_S = 60
MPI_RANK_SIZE = "from mpi4py import MPI; c = MPI.COMM_WORLD; print(c.Get_rank(), c.Get_size())"


def srun(env: dict[str, str], *argv: str) -> list[str]:
    """Run `srun ARGV...`; return its stdout lines (one or more per task), sorted."""
    proc = subprocess.run(["srun", *argv], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr
    return sorted(proc.stdout.splitlines())


def test_two_tasks_on_each_node(slurm_cluster):  # noqa: F811
    lines = srun(slurm_cluster, "-N", "2", "-n", "4", "sh", "-c",
                 "echo $SLURM_PROCID $SLURM_NTASKS $SLURM_NODEID $SLURMD_NODENAME")
    tasks = [line.split() for line in lines]
    assert sorted(int(rank) for rank, *_ in tasks) == [0, 1, 2, 3]
    assert {world for _, world, *_ in tasks} == {"4"}
    assert Counter(name for *_, name in tasks) == {"n1": 2, "n2": 2}
    assert {(node_id, name) for _, _, node_id, name in tasks} == {("0", "n1"), ("1", "n2")}


def test_mpich_pmi2_one_world_across_nodes(slurm_cluster):  # noqa: F811
    lines = srun(slurm_cluster, "-N", "2", "-n", "4", "--mpi=pmi2",
                 sys.executable, "-c", MPI_RANK_SIZE)
    assert lines == ["0 4", "1 4", "2 4", "3 4"]


def test_task_prolog_picks_mpich_ofi_netmod_unless_the_user_chose(slurm_cluster):  # noqa: F811
    # UCX netmod addresses overflow Slurm's 1024-byte PMI-1 read (slurm/local-cluster.sh).
    show = ("sh", "-c", "echo $MPIR_CVAR_CH4_NETMOD")
    assert srun(slurm_cluster, "-N", "2", "-n", "2", *show) == ["ofi", "ofi"]
    chosen = slurm_cluster | {"MPIR_CVAR_CH4_NETMOD": "ucx"}
    assert srun(chosen, "-N", "2", "-n", "2", *show) == ["ucx", "ucx"]


def test_mpi_none_gives_singletons(slurm_cluster):  # noqa: F811
    # The failure mode the replay must detect: every task is rank 0 of a world of 1.
    lines = srun(slurm_cluster, "-N", "2", "-n", "4", "--mpi=none",
                 sys.executable, "-c", MPI_RANK_SIZE)
    assert lines == ["0 1"] * 4


@pytest.mark.parametrize(("status", "expected"), [(0, ("0:0", "COMPLETED")),
                                                  (3, ("3:0", "FAILED"))])
def test_sbatch_exit_code(slurm_cluster, tmp_path, status, expected):  # noqa: F811
    script = tmp_path / "job.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH -N 2 -n 2\nsrun hostname\nexit {status}\n")
    job_id = subprocess.run(
        ["sbatch", "--parsable", f"--chdir={tmp_path}", f"--output={tmp_path}/%j.out",
         str(script)], env=slurm_cluster, capture_output=True, text=True, timeout=TIMEOUT_S,
        check=True).stdout.strip().split(";")[0]
    assert wait_for_job(job_id, slurm_cluster, TIMEOUT_S) == expected
    assert len((tmp_path / f"{job_id}.out").read_text().splitlines()) == 2  # one line per node
