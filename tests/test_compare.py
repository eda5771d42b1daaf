"""`infercomm compare`: the bootstrap interval and verdicts on hand-made samples, and the CLI
on the committed sample runs (results/examples/samples, real 2-rank CPU runs)."""

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from microbench.analysis.compare import bootstrap_ratio, compare_samples, verdict
from tests.conftest import last_json

SAMPLES = Path(__file__).resolve().parent.parent / "results" / "examples" / "samples"


def sample_run(pattern: str) -> Path:
    found = sorted(SAMPLES.glob(pattern))
    assert len(found) == 1, (pattern, found)
    return found[0]


MPI_REPLAY = sample_run("*-replay-llama-3.2-1b-tp2-mpi")
GLOO_REPLAY = sample_run("*-replay-llama-3.2-1b-tp2-torch")
MPI_SWEEP = sample_run("*-sweep-mpi-mpi-host-w2")
GLOO_SWEEP = sample_run("*-sweep-torch-gloo-w2")


def slowed_copy(run: Path, dest: Path, factor: float, files: tuple[str, ...]) -> Path:
    """A copy of a run folder with every *_us figure of `files` multiplied by `factor`."""
    shutil.copytree(run, dest)
    for name in files:
        with open(dest / name, newline="") as f:
            rows = list(csv.DictReader(f))
        with open(dest / name, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            for r in rows:
                writer.writerow({k: repr(float(v) * factor) if k.endswith("_us") and v else v
                                 for k, v in r.items()})
    return dest


def test_constant_samples_give_an_exact_interval():
    # Every resample of five 100s has median 100, of five 130s median 130: the interval
    # collapses to the ratio 130/100 = 1.3.
    ratio, low, high = bootstrap_ratio(np.full(5, 100.0), np.full(5, 130.0))
    assert (ratio, low, high) == pytest.approx((1.3, 1.3, 1.3))
    c = compare_samples("B", "e2e_us", np.full(5, 100.0), np.full(5, 130.0), threshold=0.05)
    assert c.verdict == "slower" and c.regression  # 1.3 > 1 + 0.05
    # 104/100 = 1.04: slower beyond doubt, but within a 5% threshold, so no regression.
    c = compare_samples("B", "e2e_us", np.full(5, 100.0), np.full(5, 104.0), threshold=0.05)
    assert c.verdict == "slower" and not c.regression
    c = compare_samples("B", "e2e_us", np.full(5, 100.0), np.full(5, 90.0), threshold=0.05)
    assert c.verdict == "faster" and not c.regression


def test_verdict_reads_the_interval():
    assert verdict(0.90, 0.99) == "faster"  # all of it below 1
    assert verdict(1.01, 1.20) == "slower"  # all of it above 1
    assert verdict(0.99, 1.01) == "same"  # 1 inside: cannot tell


def test_bootstrap_is_seeded():
    rng = np.random.default_rng(7)
    a, b = rng.normal(100, 10, 20), rng.normal(110, 10, 20)
    assert bootstrap_ratio(a, b) == bootstrap_ratio(a, b)


def test_a_run_against_itself_is_the_same(cli):
    status, out, err = cli("compare", str(MPI_REPLAY), str(MPI_REPLAY))
    assert status == 0, err
    line = last_json(out)
    assert line["regressions"] == [] and line["kind"] == "replay"
    # Both runs were made with --timing op, so the op kinds (allreduce, gather) come too.
    names = [m["metric"] for m in line["metrics"]]
    assert names == ["prefill_us", "decode_step_us", "e2e_us", "allreduce_us", "gather_us"]
    for m in line["metrics"]:
        assert m["ratio"] == 1.0 and m["ci_low"] <= 1.0 <= m["ci_high"]
        assert m["verdict"] == "same"


def test_a_copy_slowed_by_30_percent_regresses(cli, tmp_path):
    slow = slowed_copy(MPI_REPLAY, tmp_path / "slow", 1.3, ("iterations.csv", "ops.csv"))
    status, out, err = cli("compare", str(MPI_REPLAY), str(slow))
    assert status == 1
    line = last_json(out)
    e2e = next(m for m in line["metrics"] if m["metric"] == "e2e_us")
    assert e2e["ratio"] == pytest.approx(1.3)  # every sample x 1.3, so the median too
    assert e2e["verdict"] == "slower" and e2e["regression"]
    assert "e2e_us" in line["regressions"]
    assert len(err.strip().splitlines()) == 1 and "regression" in err and "e2e_us" in err
    # A 35% threshold forgives it: 1.3 is not > 1 + 0.35.
    status, out, _ = cli("compare", str(MPI_REPLAY), str(slow), "--threshold", "0.35")
    assert status == 0 and last_json(out)["regressions"] == []


def test_a_slowed_sweep_regresses(cli, tmp_path):
    slow = slowed_copy(MPI_SWEEP, tmp_path / "slow", 1.3, ("samples.csv",))
    status, out, err = cli("compare", str(MPI_SWEEP), str(slow), "--format", "markdown")
    assert status == 1, err
    assert "| metric | run | A median | median | ratio | 95% CI | verdict |" in out
    line = last_json(out)
    assert line["kind"] == "sweep" and line["regressions"]
    # One metric per (op, size): 4 ops x 10 sizes (8 B x 4^k up to 2 MiB).
    assert len(line["metrics"]) == 40


def test_runs_that_measured_different_things_are_refused(cli, tmp_path):
    status, out, err = cli("compare", str(MPI_REPLAY), str(MPI_SWEEP))
    assert status == 2 and out == ""
    assert err.strip().endswith("kind differs: replay in A, sweep in B")
    other = tmp_path / "other"
    shutil.copytree(MPI_REPLAY, other)
    meta = json.loads((other / "meta.json").read_text())
    meta["pattern"]["workload"]["decode"] = 32
    (other / "meta.json").write_text(json.dumps(meta))
    status, _, err = cli("compare", str(MPI_REPLAY), str(other))
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert err.strip().endswith("workload.decode differs: 16 in A, 32 in B")
    fewer = tmp_path / "fewer"
    shutil.copytree(MPI_SWEEP, fewer)
    rows = (fewer / "samples.csv").read_text().splitlines()
    (fewer / "samples.csv").write_text("\n".join(r for r in rows if ",8,bf16," not in r) + "\n")
    status, _, err = cli("compare", str(MPI_SWEEP), str(fewer))
    assert status == 2 and "size_bytes differs" in err


def test_libraries_side_by_side_with_predictions(cli):
    # gloo as the baseline, MPI beside it; the MPI sweep's fits predict the pattern.
    status, out, err = cli("compare", str(GLOO_REPLAY), str(MPI_REPLAY), "--sweep",
                           str(MPI_SWEEP))
    assert status == 0, err  # MPI is faster here: no regression
    line = last_json(out)
    assert all(m["predicted_us"] > 0 for m in line["metrics"])
    assert "predicted" in out.splitlines()[3]


def test_bad_compare_input(cli, tmp_path):
    status, _, err = cli("compare", str(MPI_REPLAY))
    assert status == 2 and "at least two runs" in err
    status, _, err = cli("compare", str(MPI_REPLAY), str(tmp_path))
    assert status == 2 and "is not a run folder" in err
    status, _, err = cli("compare", str(GLOO_SWEEP), str(MPI_SWEEP), "--threshold", "-1")
    assert status == 2 and "--threshold -1.0 must be zero or more" in err


def test_runs_from_before_the_engine_options_compare_with_new_ones(cli, tmp_path):
    # The committed samples recorded the engine as {name, eager, max_batched_tokens,
    # control_plane}; a run made now also records gpu, nccl_only, model_runner, sp and
    # max_num_seqs. At their defaults they are the same engine; a changed one is not.
    newer = tmp_path / "newer"
    shutil.copytree(MPI_REPLAY, newer)
    meta = json.loads((newer / "meta.json").read_text())
    assert "gpu" not in meta["pattern"]["engine"]
    meta["pattern"]["engine"].update(gpu="h100", nccl_only=False, model_runner=None, sp=False,
                                     max_num_seqs=None)
    (newer / "meta.json").write_text(json.dumps(meta))
    status, _, err = cli("compare", str(MPI_REPLAY), str(newer))
    assert status == 0, err
    meta["pattern"]["engine"]["gpu"] = "b200"
    (newer / "meta.json").write_text(json.dumps(meta))
    status, _, err = cli("compare", str(MPI_REPLAY), str(newer))
    assert status == 2 and err.strip().endswith("engine.gpu differs: h100 in A, b200 in B")
