"""The srun path measures what it claims, on the local two-node Slurm (slurm/local-cluster.sh).

- One node: MPICH under `srun --mpi=pmi2` with the cluster's recipe (task prolog:
  MPIR_CVAR_CH4_NETMOD=ofi, MPIR_CVAR_NOLOCAL=0) keeps its two ranks on shared memory; the run
  records it (versions.mpi_node_ranks 2, mpi_shm "on"). The same sweep with
  MPIR_CVAR_NOLOCAL=1 sends the call through OFI's tcp provider and records that; compare names
  the difference. The measured 128 KiB all-reduce of both is printed.
- slurm/interconnect.sbatch: one node (shared memory) against two (the network), RUNS
  interleaved, orders one node before two and raises no suspect warning.
Both fake nodes are this host: "two nodes" is the netmod over loopback TCP.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.replay_helpers import last_json
from tests.slurm_cluster import slurm_cluster, wait_for_job  # noqa: F401

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[1]


def srun_sweep(env: dict[str, str], out: Path, label: str) -> dict:
    cmd = ["srun", "--kill-on-bad-exit=1", "-N", "1", "-n", "2", "--mpi=pmi2",
           sys.executable, "-m", "microbench", "sweep", "--op", "allreduce", "--sizes", "128K",
           "--backend", "mpi", "-n", "100", "-w", "5", "--out", str(out), "--label", label]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return last_json(proc.stdout)


def test_one_node_keeps_shared_memory(slurm_cluster, tmp_path, capsys):  # noqa: F811
    env = {**slurm_cluster, "PYTHONPATH": str(REPO)}
    env.pop("MPIR_CVAR_CH4_NETMOD", None)
    env.pop("MPIR_CVAR_NOLOCAL", None)  # the task prolog sets these three
    env.pop("MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM", None)
    shm = srun_sweep(env, tmp_path, "shm")
    net = srun_sweep({**env, "MPIR_CVAR_NOLOCAL": "1"}, tmp_path, "netmod")
    metas = [json.loads((Path(r["results_dir"]) / "meta.json").read_text()) for r in (shm, net)]
    facts = [(m["environment"].get("MPIR_CVAR_CH4_NETMOD"), m["versions"]["mpi_netmod"],
              m["versions"]["mpi_shm"], m["versions"]["mpi_node_ranks"]) for m in metas]
    assert facts == [("ofi", "ofi", "on", 2), ("ofi", "ofi", "off (MPIR_CVAR_NOLOCAL)", 1)]
    assert metas[0]["environment"]["MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM"] == "mpir"
    times = [json.loads((Path(r["results_dir"]) / "summary.json").read_text()) for r in
             (shm, net)]
    figures = [next(row["time_us"] for row in t["rows"] if row["size_bytes"] == 131072)
               for t in times]
    with capsys.disabled():
        print(f"\n128 KiB all-reduce, 2 ranks on one Slurm node (srun --mpi=pmi2, OFI netmod): "
              f"{figures[0]:.1f} us on shared memory, {figures[1]:.1f} us through the netmod "
              f"(MPIR_CVAR_NOLOCAL=1)")
    _, out, _ = _compare(Path(shm["results_dir"]), Path(net["results_dir"]), env)
    found = {d["what"]: (d["a"], d["b"]) for d in last_json(out)["differences"]["B"]}
    assert found["MPI shared memory"] == ("on", "off (MPIR_CVAR_NOLOCAL)")
    assert found["MPI ranks on node 0"] == ("2", "1")
    assert found["MPIR_CVAR_NOLOCAL"] == ("0", "1")


def _compare(a: Path, b: Path, env: dict[str, str]) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "microbench", "compare", str(a), str(b)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def test_interconnect_orders_one_node_before_two(slurm_cluster, tmp_path, capsys):  # noqa: F811
    exports = {"INFERCOMM": f"{sys.executable} -m microbench", "MODEL": "llama-3.2-1b",
               "TP": "2", "PP": "1", "PROMPT": "32", "DECODE": "4", "BACKEND": "mpi",
               "ITERS": "5", "WARMUP": "1", "RUNS": "2", "OUT": str(tmp_path / "res"),
               "PYTHONPATH": str(REPO)}
    export_arg = "ALL," + ",".join(f"{k}={v}" for k, v in exports.items())
    submitted = subprocess.run(
        ["sbatch", "--parsable", "-N", "2", "--ntasks-per-node", "2", f"--export={export_arg}",
         f"--chdir={tmp_path}", str(REPO / "slurm" / "interconnect.sbatch")],
        env=slurm_cluster, capture_output=True, text=True, timeout=30, check=True)
    job = submitted.stdout.strip().split(";")[0]
    exit_code, _ = wait_for_job(job, slurm_cluster, timeout=280)
    output = (tmp_path / f"infercomm-interconnect-{job}.out").read_text()
    # compare's status: 0, or 1 (two nodes slower than one beyond the threshold), or 3
    assert exit_code in ("0:0", "1:0", "3:0"), output
    # sbatch merges stderr into the output, after compare's JSON line
    line = json.loads([ln for ln in output.splitlines() if ln.startswith('{"baseline"')][-1])
    assert len(line["sides"]["A"]) == len(line["sides"]["B"]) == 2
    labels = [Path(p).name.split("Z-", 1)[1] for p in [*line["sides"]["A"],
                                                        *line["sides"]["B"]]]
    assert labels == ["one-node-1", "one-node-2", "two-nodes-1", "two-nodes-2"]
    assert line["warnings"] == [], line["warnings"]  # no "one node slower than two"
    found = {d["what"]: (d["a"], d["b"]) for d in line["differences"]["B"]}
    assert found["nodes"] == ("1", "2") and found["MPI ranks on node 0"] == ("2", "1")
    e2e = next(m for m in line["metrics"] if m["metric"] == "e2e_us")
    with capsys.disabled():
        print(f"\ninterconnect.sbatch: end to end one node {e2e['a_median_us']:.0f} us, two "
              f"nodes {e2e['b_median_us']:.0f} us (x{e2e['ratio']:.2f}, {e2e['label']})")
    assert e2e["ratio"] > 1, output  # two nodes are the slower side


def test_compare_libraries_interleaves_two_environments(slurm_cluster, tmp_path):  # noqa: F811
    # Two "installations" as environment scripts of one MPI: MPICH's intra-node all-reduce
    # algorithm recursive_doubling (A) and ring (B).
    cvar = "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM"
    for side, value in (("a", "recursive_doubling"), ("b", "ring")):
        (tmp_path / f"env-{side}.sh").write_text(f"export {cvar}={value}\n")
    exports = {"INFERCOMM": f"{sys.executable} -m microbench", "MODEL": "llama-3.2-1b",
               "TP": "2", "PP": "1", "PROMPT": "8", "DECODE": "4", "BACKEND": "mpi",
               "ITERS": "5", "WARMUP": "1", "RUNS": "2", "OUT": str(tmp_path / "res"),
               "ENV_A": str(tmp_path / "env-a.sh"), "ENV_B": str(tmp_path / "env-b.sh"),
               "PYTHONPATH": str(REPO)}
    export_arg = "ALL," + ",".join(f"{k}={v}" for k, v in exports.items())
    submitted = subprocess.run(
        ["sbatch", "--parsable", "-N", "1", "--ntasks-per-node", "2", f"--export={export_arg}",
         f"--chdir={tmp_path}", str(REPO / "slurm" / "compare-libraries.sbatch")],
        env=slurm_cluster, capture_output=True, text=True, timeout=30, check=True)
    job = submitted.stdout.strip().split(";")[0]
    exit_code, _ = wait_for_job(job, slurm_cluster, timeout=280)
    output = (tmp_path / f"infercomm-compare-libraries-{job}.out").read_text()
    assert exit_code in ("0:0", "1:0", "3:0"), output
    line = json.loads([ln for ln in output.splitlines() if ln.startswith('{"baseline"')][-1])
    labels = [Path(p).name.split("Z-", 1)[1] for p in [*line["sides"]["A"],
                                                        *line["sides"]["B"]]]
    assert labels == ["a-1", "a-2", "b-1", "b-2"]
    created = [json.loads((Path(p) / "meta.json").read_text())["created_utc"]
               for pair in zip(line["sides"]["A"], line["sides"]["B"], strict=True)
               for p in pair]
    assert created == sorted(created)  # a-1, b-1, a-2, b-2: taken in turn
    assert line["differences"] == {"B": [{"what": cvar, "a": "recursive_doubling",
                                          "b": "ring"}]}
