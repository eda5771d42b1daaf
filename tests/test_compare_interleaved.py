"""scripts/interleave.py: K runs of A and K of B taken in turn (A B A B), then compare on them.

Two environments of one MPI library (the mpich wheel): MPICH's intra-node all-reduce
algorithm set by MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM to recursive_doubling on side A and ring
on side B, fp32 so that MPICH's own sum runs. What is asserted is the schedule and what the
comparison records and names, not which algorithm wins on a shared 2-core machine.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
