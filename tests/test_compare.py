"""`infercomm compare`: the bootstrap interval and verdicts on hand-made samples, and the CLI
on the committed sample runs (results/examples/samples, real 2-rank CPU runs)."""

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from microbench.analysis.compare import (
    compare_samples,
    iterations_needed,
    verdict,
)
from microbench.analysis.hierarchy import hierarchical_ratio
from microbench.argtypes import UsageError
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


def bootstrap_ratio(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    return hierarchical_ratio([a], [b])  # one run a side: the within-run bootstrap


def test_constant_samples_give_an_exact_interval():
    # Every resample of five 100s has median 100, of five 130s median 130: the interval
    # collapses to the ratio 130/100 = 1.3.
    ratio, low, high = bootstrap_ratio(np.full(5, 100.0), np.full(5, 130.0))
    assert (ratio, low, high) == pytest.approx((1.3, 1.3, 1.3))
    # With no drift allowed (--drift 0) the interval is read as it is:
    c = compare_samples("B", "e2e_us", np.full(5, 100.0), np.full(5, 130.0), 0.05, drift=0)
    assert c.verdict == "regression" and c.regression  # 1.3 > 1 + 0.05
    # 104/100 = 1.04: slower beyond doubt, but within a 5% threshold, so no regression.
    c = compare_samples("B", "e2e_us", np.full(5, 100.0), np.full(5, 104.0), 0.05, drift=0)
    assert c.verdict == "slower" and not c.regression
    c = compare_samples("B", "e2e_us", np.full(5, 100.0), np.full(5, 90.0), 0.05, drift=0)
    assert c.verdict == "faster" and not c.regression
    # One run a side with the default drift 0.40: [1.3 / 1.4, 1.3 x 1.4] = [0.929, 1.82]
    # holds 1, so a 30% slowdown of one run could be drift: inconclusive, 3 runs a side.
    c = compare_samples("B", "e2e_us", np.full(5, 100.0), np.full(5, 130.0), 0.05)
    assert (c.ci_low, c.ci_high) == pytest.approx((1.3 / 1.4, 1.3 * 1.4))
    assert c.verdict == "inconclusive" and c.runs_needed == 3 and c.drift_allowed == 0.4
    # x1.5: [1.5 / 1.4, 2.1] = [1.071, 2.1] is clear of 1 and 1.5 > 1.05: a regression.
    c = compare_samples("B", "e2e_us", np.full(5, 100.0), np.full(5, 150.0), 0.05)
    assert c.verdict == "regression" and c.ci_low == pytest.approx(1.5 / 1.4)


def test_verdict_reads_the_interval():
    assert verdict(0.90, 0.99) == "faster"  # all of it below 1
    assert verdict(1.01, 1.20) == "slower"  # all of it above 1
    # 1 inside and within [1/1.05, 1.05] = [0.952, 1.05]: any difference is below 5%.
    assert verdict(0.99, 1.01) == "same"
    # 1 inside but reaching past 1.05 (or below 0.952): a 20% regression is as likely as
    # none, so the samples cannot decide (the ratio of 29 with [0.34, 44.7]).
    assert verdict(0.99, 1.20) == "inconclusive"
    assert verdict(0.34, 44.7) == "inconclusive"
    assert verdict(0.94, 1.01) == "inconclusive"  # 0.94 < 1/1.05
    # A wider threshold decides it: [0.99, 1.20] lies within [1/1.25, 1.25] = [0.8, 1.25].
    assert verdict(0.99, 1.20, threshold=0.25) == "same"


def test_iterations_that_would_decide():
    # Widths scale as 1/sqrt(n), worked in log(ratio); n' = n / (0.95 k)^2, rounded up.
    # Ratio 1, interval [1/1.2, 1.2], t = 0.05, 10 samples: both sides log 1.2 = 0.18232,
    # the band log 1.05 = 0.04879, k = 0.04879 / 0.18232 = 0.26761 (to fit the band: same);
    # n' = 10 / (0.95 x 0.26761)^2 = 10 / 0.064633 = 154.7 -> 155.
    assert iterations_needed(1.0, 1 / 1.2, 1.2, 0.05, 10) == 155
    # Ratio e^0.1 with [e^-0.1, e^0.3]: the lower side 0.2 must shrink below 0.1 (slower):
    # k = 0.5, n' = 10 / (0.95 x 0.5)^2 = 10 / 0.225625 = 44.3 -> 45.
    assert iterations_needed(np.exp(0.1), np.exp(-0.1), np.exp(0.3), 0.05, 10) == 45
    # The case: ratio 29 in [0.34, 44.7] from 3 samples: log 29 = 3.3673 over
    # log(29 / 0.34) = 4.4461 -> k = 0.75737, n' = 3 / (0.95 x 0.75737)^2 = 5.79 -> 6.
    assert iterations_needed(29.0, 0.34, 44.7, 0.05, 3) == 6
    # A ratio of exactly 1 at threshold 0 is never decided.
    assert iterations_needed(1.0, 0.99, 1.01, 0.0, 10) is None


def test_few_or_wide_samples_are_inconclusive_never_same():
    # Medians 300 and 300 (ratio 1), but each sample spreads from 100 to 500: the interval
    # holds 1 and reaches far past 1.05 both ways.
    a = np.array([100.0, 200, 300, 400, 500])
    c = compare_samples("B", "e2e_us", a, a[::-1].copy(), threshold=0.05)
    assert c.ratio == 1.0 and c.ci_low < 1 / 1.05 and c.ci_high > 1.05
    assert c.verdict == "inconclusive" and not c.regression
    assert c.runs_needed == 3  # one run a side: the drift between runs must be measured
    # One sample each: a bootstrap interval of a single point says nothing of the spread.
    c = compare_samples("B", "e2e_us", np.array([100.0]), np.array([130.0]), threshold=0.05)
    # (here [1.3, 1.3] widened by the drift: [1.3 / 1.4, 1.3 x 1.4])
    assert (c.ci_low, c.ci_high) == pytest.approx((1.3 / 1.4, 1.82))
    assert c.verdict == "inconclusive" and c.iterations_needed == 5  # MIN_SAMPLES
    with pytest.raises(UsageError, match="no positive finite samples"):
        compare_samples("B", "e2e_us", a, np.array([np.nan] * 5), threshold=0.05)


def test_bootstrap_is_seeded():
    rng = np.random.default_rng(7)
    a, b = rng.normal(100, 10, 20), rng.normal(110, 10, 20)
    assert bootstrap_ratio(a, b) == bootstrap_ratio(a, b)


def test_a_run_against_itself_is_refused(cli, tmp_path):
    # The same folder on both sides, or a byte-for-byte copy of it, is one run: every ratio
    # would read 1.000 and say nothing of drift. Refused as bad input, exit 2, one line.
    status, out, err = cli("compare", str(MPI_REPLAY), str(MPI_REPLAY))
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "are the same folder, on both sides" in err
    copy = tmp_path / "copy"
    shutil.copytree(MPI_REPLAY, copy)
    status, _, err = cli("compare", "-A", str(MPI_REPLAY), "-B", str(copy))
    assert status == 2 and "are copies of one run, on both sides" in err
    status, _, err = cli("compare", "-A", str(MPI_REPLAY), str(copy), "-B", str(GLOO_REPLAY))
    assert status == 2 and "are copies of one run, on side A" in err


def test_one_run_a_side_is_inconclusive_below_the_drift(cli, tmp_path):
    # x1.3 on every sample: beyond doubt within the run, but within the drift allowed between
    # single runs (x1.4): inconclusive, exit 3, and stderr says the spread is unknown.
    slow = slowed_copy(MPI_REPLAY, tmp_path / "slow", 1.3, ("iterations.csv", "ops.csv"))
    status, out, err = cli("compare", str(MPI_REPLAY), str(slow))
    assert status == 3, err
    line = last_json(out)
    e2e = next(m for m in line["metrics"] if m["metric"] == "e2e_us")
    assert e2e["ratio"] == pytest.approx(1.3)  # every sample x 1.3, so the median too
    assert e2e["label"] == "inconclusive: 3 runs a side" and e2e["drift_allowed"] == 0.4
    assert "drift between runs is unknown" in err and "3 or more runs a side" in err
    assert "drift A/B" in out and "unknown/unknown" in out
    # --drift 0 reads the within-run interval alone: a regression (the old gate).
    status, out, err = cli("compare", str(MPI_REPLAY), str(slow), "--drift", "0")
    assert status == 1 and "e2e_us" in last_json(out)["regressions"]
    assert "regression beyond 0.05" in err


def test_a_copy_slowed_twofold_regresses(cli, tmp_path):
    slow = slowed_copy(MPI_REPLAY, tmp_path / "slow", 2.0, ("iterations.csv", "ops.csv"))
    status, out, err = cli("compare", str(MPI_REPLAY), str(slow))
    assert status == 1
    line = last_json(out)
    e2e = next(m for m in line["metrics"] if m["metric"] == "e2e_us")
    assert e2e["ratio"] == pytest.approx(2.0) and e2e["verdict"] == "regression"
    assert "e2e_us" in line["regressions"]
    assert "regression beyond 0.05" in err and "e2e_us" in err
    # A threshold of 1.5 forgives it: 2.0 is not > 1 + 1.5.
    status, out, _ = cli("compare", str(MPI_REPLAY), str(slow), "--threshold", "1.5")
    assert status != 1 and last_json(out)["regressions"] == []


def test_markdown_to_a_file(cli, tmp_path):
    slow = slowed_copy(MPI_REPLAY, tmp_path / "slow", 2.0, ("iterations.csv", "ops.csv"))
    md = tmp_path / "ci" / "compare.md"
    status, out, err = cli("compare", str(MPI_REPLAY), str(slow), "--format", "markdown",
                           "-o", str(md))
    assert status == 1, err  # the regression still decides the exit status
    text = md.read_text()
    assert text.startswith("### infercomm compare")
    assert ("| metric | run | A median | median | ratio | 95% CI | verdict | drift A/B | "
            "shape |") in text
    assert "| e2e_us | B |" in text and "| regression |" in text
    assert "{" not in text  # the JSON line stays on stdout
    assert "| metric |" not in out
    line = last_json(out)
    assert line["output"] == str(md) and "e2e_us" in line["regressions"]
    status, out, err = cli("compare", str(MPI_REPLAY), str(slow), "-o", str(tmp_path))
    assert status == 2 and out == "" and "name the file" in err


def test_a_slowed_sweep_regresses(cli, tmp_path):
    slow = slowed_copy(MPI_SWEEP, tmp_path / "slow", 2.0, ("samples.csv",))
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
    # a run against a copy of itself: some metric may be inconclusive on 5 samples, which is
    # not what this test is about
    status, _, err = cli("compare", "--inconclusive-ok", str(MPI_REPLAY), str(newer))
    assert status == 0, err
    meta["pattern"]["engine"]["gpu"] = "b200"
    (newer / "meta.json").write_text(json.dumps(meta))
    status, _, err = cli("compare", str(MPI_REPLAY), str(newer))
    assert status == 2 and err.strip().endswith("engine.gpu differs: h100 in A, b200 in B")
