"""sweep/replay --env: a settings grid over two MPICH all-reduce algorithms, its best-setting
table reproduced from the runs' own files, and the gate comparing two runs of the grid."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from microbench.tuning.env_grid import child_argv, combinations, env_spec
from tests.conftest import last_json
from tests.replay_helpers import infercomm, tiny_model

CVAR = "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM"  # MPICH 5.0.2: ring, recursive_doubling, ...


def test_specs_and_combinations():
    assert env_spec("NCCL_PROTO=LL,Simple") == ("NCCL_PROTO", ["LL", "Simple"])
    combos = combinations([("A", ["1", "2"]), ("B", ["x", "y", "z"])])
    assert len(combos) == 6 and combos[0] == {"A": "1", "B": "x"}  # 2 x 3, A slowest
    assert child_argv(["sweep", "--env", "A=1,2", "--env-runs", "2", "--label", "x", "-c"]) == [
        "sweep", "-c"]


@pytest.mark.parametrize(("flag", "words"), [
    ("NCCL_PROTO", "write NAME=v1,v2"), ("1X=a", "write NAME=v1,v2"),
    ("NCCL_PROTO=LL,", "an empty value")])
def test_bad_env_is_one_line_exit_2(tmp_path, flag, words):
    proc, _ = infercomm("sweep", "--env", flag, "--out", str(tmp_path))
    assert proc.returncode == 2 and words in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2 and "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.mpi
def test_grid_over_two_mpich_allreduce_algorithms_at_decode_sizes(tmp_path):
    model = tiny_model(tmp_path)
    out = tmp_path / "runs"
    # the pattern's decode all-reduce (hidden 64 x 1 token x bf16 = 128 B) and prefill's
    proc, _ = infercomm("sweep", "--backend", "mpi", "--from-pattern", "--model", model,
                        "--tp", "2", "--prompt", "8", "--decode", "4", "--op", "allreduce",
                        "-n", "8", "-w", "1", "-c",
                        "--env", f"{CVAR}=recursive_doubling,ring",
                        "--env", "MPIR_CVAR_DEVICE_COLLECTIVES=none", "--out", str(out),
                        timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = last_json(proc.stdout)
    assert summary["settings"] == 2 and summary["runs"] == 2
    folder = Path(summary["results_dir"])
    grid = json.loads((folder / "grid.json").read_text())
    settings = [r["setting"] for r in grid["runs"]]
    assert settings == [f"{CVAR}=recursive_doubling", f"{CVAR}=ring"]
    # each run's meta.json records the variables it ran with
    for run in grid["runs"]:
        meta = json.loads((Path(run["results_dir"]) / "meta.json").read_text())
        assert meta["environment"][CVAR] == run["env"][CVAR]
        assert meta["environment"]["MPIR_CVAR_DEVICE_COLLECTIVES"] == "none"
    # the table, reproduced from each run's samples.csv
    medians: dict[str, dict[str, float]] = {}
    for run in grid["runs"]:
        with open(Path(run["results_dir"]) / "samples.csv") as f:
            rows = list(csv.DictReader(f))
        for size in {r["size_bytes"] for r in rows}:
            times = [float(r["time_us"]) for r in rows if r["size_bytes"] == size]
            assert len(times) == 8  # -n 8
            medians.setdefault(size, {})[run["setting"]] = float(np.median(times))
    with open(folder / "best.csv") as f:
        best = list(csv.DictReader(f))
    assert len(best) == len(medians) >= 1
    for row in best:
        size = next(s for s in medians if row["metric"].startswith("allreduce ")
                    and _bytes(row["metric"]) == int(s))
        by_setting = medians[size]
        winner = min(by_setting, key=by_setting.get)
        loser = max(by_setting, key=by_setting.get)
        assert row["best"] == winner and row["runner_up"] == loser
        assert float(row["best_us"]) == pytest.approx(by_setting[winner], abs=1e-3)
        margin = by_setting[loser] / by_setting[winner]
        assert float(row["margin"]) == pytest.approx(margin, rel=1e-3)
        # the interval of one run a side is the bootstrap's widened by the 1.4x drift
        assert float(row["ci_low"]) <= margin <= float(row["ci_high"])
        assert float(row["ci_high"]) / float(row["ci_low"]) > 1.4 ** 2
    # the gate compares two settings: the two runs of the grid, naming the variable
    a, b = (r["results_dir"] for r in grid["runs"])
    proc, _ = infercomm("compare", "-A", a, "-B", b, "--out", str(tmp_path / "cmp"))
    # exit 0 same/faster, 1 regression, 3 inconclusive (one run a side: the drift allowance)
    assert proc.returncode in (0, 1, 3), proc.stderr[-2000:]
    assert CVAR in proc.stdout


def _bytes(metric: str) -> int:
    # "allreduce 128 B bf16 n=2" / "allreduce 8.00 KiB bf16 n=2" (results/runs.sweep_key_name)
    number, unit = metric.split()[1:3]
    return int(float(number) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20}[unit])
