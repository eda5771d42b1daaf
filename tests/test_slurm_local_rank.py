"""`srun -N 1 -n 2 --mpi=pmi2` on the real local Slurm: each task's local rank, recorded.

Slurm's pmi2 plugin gives a task PMI_RANK and PMI_SIZE but no MPI_LOCALRANKID (that is Hydra's;
SchedMD/slurm src/plugins/mpi/pmi2/mpi_pmi2.c @ 084787c0), so the local rank must come from
SLURM_LOCALID: 0 and 1 for the two tasks of one node, not 0 for both.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.replay_helpers import last_json, tiny_model
from tests.slurm_cluster import slurm_cluster  # noqa: F401

pytestmark = pytest.mark.slurm


def test_srun_pmi2_tasks_record_their_own_local_rank(slurm_cluster, tmp_path):  # noqa: F811
    cmd = ["srun", "--kill-on-bad-exit=1", "-N", "1", "-n", "2", "--mpi=pmi2",
           sys.executable, "-m", "microbench", "replay", "--model", tiny_model(tmp_path),
           "--tp", "2", "--prompt", "8", "--decode", "2", "--backend", "mpi", "--device", "cpu",
           "-n", "1", "-w", "0", "--timeout", "60", "--out", str(tmp_path / "res")]
    proc = subprocess.run(cmd, env=slurm_cluster, capture_output=True, text=True, timeout=180,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((Path(last_json(proc.stdout)["results_dir"]) / "meta.json").read_text())
    assert meta["launcher"] == "pmi"
    assert meta["local_ranks"] == [
        # a CPU replay captures no CUDA graphs: graphs 0 on each rank
        {"rank": 0, "local_rank": 0, "from": "SLURM_LOCALID", "gpu": None, "graphs": 0},
        {"rank": 1, "local_rank": 1, "from": "SLURM_LOCALID", "gpu": None, "graphs": 0}]
