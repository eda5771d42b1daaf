"""The regression gate across runs: six replays of one configuration (tests/data/compare-drift,
made back to back on this 2-core shared machine by scripts/compare-drift-runs.sh: llama-3.2-1b
TP2 over MPI, prompt 32, decode 16, -n 20), the same runs with every time doubled (copies made
here by rewriting each iterations.csv with its times x 2; not new measurements), bimodal
samples, and what differs between the sides."""

import csv
import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from microbench.analysis.hierarchy import between_run_cv, hierarchical_ratio
from microbench.analysis.spread import bimodality_coefficient, shape_flags
from tests.conftest import last_json

DATA = Path(__file__).resolve().parent / "data" / "compare-drift"
RUNS = sorted(DATA.iterdir())
SAMPLES = Path(__file__).resolve().parent.parent / "results" / "examples" / "samples"
MPI_REPLAY = next(SAMPLES.glob("*-replay-llama-3.2-1b-tp2-mpi"))


def times_doubled(run: Path, dest: Path) -> Path:
    """A copy of a run whose iterations.csv has every *_us figure x 2 (the rest as it was)."""
    shutil.copytree(run, dest)
    with open(run / "iterations.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(dest / "iterations.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: repr(float(v) * 2) if k.endswith("_us") and v else v
                             for k, v in r.items()})
    return dest


def test_the_six_runs_drift():
    # What the gate must survive: the runs' prefill medians (us), read from the files, run
    # 4 at 7586.6 and run 6 at 9923.5: 9923.5 / 7586.6 = 1.308 apart; each run's CV 2-4%.
    tables = [list(csv.DictReader((run / "iterations.csv").read_text().splitlines()))
              for run in RUNS]
    medians = [float(np.median([float(r["prefill_us"]) for r in t])) for t in tables]
    assert len(RUNS) == 6 and all(len(t) == 20 for t in tables)
    assert max(medians) / min(medians) == pytest.approx(1.308, abs=0.001)


def test_no_ordered_pair_of_identical_runs_is_a_regression(cli):
    statuses = {}
    for a, b in itertools.permutations(RUNS, 2):
        status, out, _ = cli("compare", str(a), str(b))
        statuses[(a.name, b.name)] = status
        line = last_json(out)
        assert line["regressions"] == [] and line["differences"] == {"B": []}
        # one run a side: never "same" (the drift is unknown), never a regression here
        assert {m["label"] for m in line["metrics"]} <= {"inconclusive: 3 runs a side"}
    assert set(statuses.values()) == {3}, statuses  # 30 ordered pairs, none exit 1


def test_three_against_three_is_not_a_regression(cli):
    # Interleaved halves, as the schedule takes them: runs 1,3,5 against 2,4,6.
    status, out, _ = cli("compare", "-A", *map(str, RUNS[0::2]), "-B", *map(str, RUNS[1::2]))
    line = last_json(out)
    assert status != 1 and line["regressions"] == []
    for m in line["metrics"]:
        assert (m["runs_a"], m["runs_b"], m["drift_allowed"]) == (3, 3, None)
        assert m["ci_low"] < 1 < m["ci_high"]  # run 6 on side B widens it past 1
        assert m["between_run_cv_b"] > m["between_run_cv_a"]
    # Halves in time order (1,2,3 against 4,5,6) hold 1 too.
    status, out, _ = cli("compare", "-A", *map(str, RUNS[:3]), "-B", *map(str, RUNS[3:]))
    assert status != 1 and last_json(out)["regressions"] == []


def test_the_same_runs_doubled_are_a_regression(cli, tmp_path):
    doubled = [times_doubled(r, tmp_path / r.name) for r in RUNS]
    for a, b in itertools.product(RUNS, doubled):  # 36 pairs, a run and its own copy too
        status, out, err = cli("compare", str(a), str(b))
        line = last_json(out)
        assert status == 1, (a.name, b.name, err)
        assert line["regressions"] == ["prefill_us", "decode_step_us", "e2e_us"]
    status, out, err = cli("compare", "-A", *map(str, RUNS[0::2]), "-B",
                           *map(str, doubled[1::2]))
    assert status == 1, err
    line = last_json(out)
    assert [m["verdict"] for m in line["metrics"]] == ["regression"] * 3
    # (2 x 8121.1, 2 x 7586.6, 2 x 9923.5 us pooled) / (7795.1, 7590.6, 7641.7): about 2.1
    prefill = line["metrics"][0]
    assert 1.9 < prefill["ratio"] < 2.3 and prefill["ci_low"] > 1.05


def test_hierarchical_bootstrap_on_constant_runs():
    # Runs of constant samples: a resample's pooled median is the median of the drawn runs'
    # values. A = runs at 100, 100, 100; B = runs at 100, 100, 130 (one drifted run): the
    # pooled median of B is 100 (40 of 60 samples), ratio 1. B* draws run 3 at least twice in
    # 7 of 27 draws (3 x 2 / 27 + 1 / 27 = 7 / 27 = 26%), then its median is 130: the
    # 97.5th percentile is 1.3, the 2.5th 1.0.
    a = [np.full(20, 100.0)] * 3
    b = [np.full(20, 100.0), np.full(20, 100.0), np.full(20, 130.0)]
    assert hierarchical_ratio(a, b) == pytest.approx((1.0, 1.0, 1.3))
    # CV of the medians 100, 100, 130: mean 110, sample std sqrt((100 + 100 + 400) / 2) =
    # 17.32; 17.32 / 110 = 0.1575
    assert between_run_cv(b) == pytest.approx(0.15746, abs=1e-5)
    assert between_run_cv(b[:1]) is None


def test_bimodal_and_high_cv_samples_are_named():
    # b = (G1^2 + 1) / (G2 + 3 (n-1)^2 / ((n-2)(n-3))), G1 = g1 sqrt(n(n-1)) / (n-2),
    # G2 = (n-1) / ((n-2)(n-3)) ((n+1) g2 + 6), g1 = m3 / m2^1.5, g2 = m4 / m2^2 - 3.
    # Two equal spikes 100 and 200, n = 20: m3 = 0, m4 / m2^2 = 50^4 / 50^4 = 1, g2 = -2;
    # G2 = 19 / 306 x (21 x -2 + 6) = -2.2353; 3 x 19^2 / 306 = 3.5392; b = 1 / 1.3039 =
    # 0.7669 > 5/9, the largest gap leaves 10 of 20 on each side; CV = 50 / 150 = 33% > 20%.
    two = np.array([100.0] * 10 + [200.0] * 10)
    assert bimodality_coefficient(two) == pytest.approx(0.7669, abs=1e-4)
    assert shape_flags("B", two) == ["B bimodal (b=0.77)", "B CV 33%"]
    # 1..20 evenly: m2 = (20^2 - 1) / 12 = 33.25, m4 = 399 x 1193 / 240 = 1983.4, m4 / m2^2
    # = 1.794, g2 = -1.206; G2 = 19 / 306 x (21 x -1.206 + 6) = -1.2000; b = 1 / (3.5392 -
    # 1.2000) = 0.4275: one broad mode, not two.
    assert bimodality_coefficient(np.arange(1.0, 21.0)) == pytest.approx(0.4275, abs=1e-4)
    assert not any("bimodal" in f for f in shape_flags("A", np.arange(1.0, 21.0)))
    # Nine at 100 and one at 102: d = -0.2 (x9), 1.8; m2 = 0.36, m3 = 0.576, m4 = 1.0512;
    # g1 = 0.576 / 0.216 = 2.6667, G1 = 2.6667 x sqrt(90) / 8 = 3.1623 (G1^2 = 10); g2 =
    # 1.0512 / 0.1296 - 3 = 5.1111, G2 = 9 / 56 x (11 x 5.1111 + 6) = 10.0; b = 11 / (10 +
    # 3 x 81 / 56) = 11 / 14.339 = 0.7671 > 5/9, but one sample beyond the gap is an outlier.
    one = np.array([100.0] * 9 + [102.0])
    assert bimodality_coefficient(one) == pytest.approx(0.7671, abs=1e-4)
    assert shape_flags("A", one) == []  # and CV 0.6%
    assert bimodality_coefficient(one[:9]) is None  # fewer than 10 samples


def test_what_differs_is_named_in_table_markdown_and_json(cli, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(MPI_REPLAY, other)
    meta = json.loads((other / "meta.json").read_text())
    meta["environment"].update(MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM="ring", NCCL_ALGO="Tree",
                               UCX_TLS="tcp,self", FI_PROVIDER="tcp", OMPI_MCA_pml="ob1",
                               SLURM_JOB_ID="7")  # the last steers no library: not named
    meta["versions"]["mpi_library"] = "MPICH Version:      4.3.0"
    meta["hosts"] = ["n1", "n2"]
    (other / "meta.json").write_text(json.dumps(meta))
    status, out, err = cli("compare", str(MPI_REPLAY), str(other), "--inconclusive-ok")
    assert status == 0, err
    found = {d["what"]: (d["a"], d["b"]) for d in last_json(out)["differences"]["B"]}
    # the banners in words ("MPICH Version:      5.0.2" in meta.json)
    assert found == {"MPI library": ("MPICH 5.0.2", "MPICH 4.3.0"),
                     "hosts": ("vm", "n1,n2"), "nodes": ("1", "2"),
                     "FI_PROVIDER": ("(unset)", "tcp"),
                     "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": ("(unset)", "ring"),
                     "NCCL_ALGO": ("(unset)", "Tree"), "OMPI_MCA_pml": ("(unset)", "ob1"),
                     "UCX_TLS": ("(unset)", "tcp,self")}
    assert "what differs, A -> B:" in out
    assert "  MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM: (unset) -> ring" in out
    status, out, _ = cli("compare", str(MPI_REPLAY), str(other), "--format", "markdown")
    assert "| what | A | B |" in out and "| NCCL_ALGO | (unset) | Tree |" in out


def test_one_node_slower_than_two_is_suspect(cli, tmp_path):
    # The backwards interconnect comparison: one node 2x slower than two, MPICH with its
    # default shared-memory all-reduce. Named with the likely cause; exit 3, not a silent 0.
    one = tmp_path / "one"
    two = tmp_path / "two"
    times_doubled(MPI_REPLAY, one)
    shutil.copytree(MPI_REPLAY, two)
    for run, nodes in ((one, "1"), (two, "2")):
        meta = json.loads((run / "meta.json").read_text())
        meta["environment"].update(SLURM_NNODES=nodes, MPIR_CVAR_CH4_NETMOD="ofi")
        (run / "meta.json").write_text(json.dumps(meta))
    (one / "ops.csv").unlink()  # op times were not doubled; compare the phases only
    (two / "ops.csv").unlink()
    status, out, err = cli("compare", str(one), str(two))
    line = last_json(out)
    assert status == 3 and line["regressions"] == []
    assert [m["verdict"] for m in line["metrics"]] == ["faster"] * 3  # 0.5 < 1 / 1.4
    assert len(line["warnings"]) == 1
    warning = line["warnings"][0]
    assert warning.startswith("suspect: A on 1 node(s) is slower than B on 2")
    assert "MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM=mpir" in warning and warning in err
    # With the recipe set on the one-node side, the cause is no longer that: said generally.
    meta = json.loads((one / "meta.json").read_text())
    meta["environment"]["MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM"] = "mpir"
    (one / "meta.json").write_text(json.dumps(meta))
    status, out, _ = cli("compare", str(one), str(two))
    assert status == 3 and "intra-node traffic off shared memory" in last_json(out)["warnings"][0]
    # A one-node side with more ranks than CPUs (replay records it): that is named first.
    meta.update(host_cpus=2, ranks_on_host=4, oversubscribed=True)
    (one / "meta.json").write_text(json.dumps(meta))
    status, out, _ = cli("compare", str(one), str(two))
    assert status == 3 and "likely cause: 4 ranks on 2 CPUs" in last_json(out)["warnings"][0]


def test_verdict_words_are_the_same_in_compare_markdown_and_report(cli, tmp_path):
    doubled = times_doubled(RUNS[1], tmp_path / "doubled")
    for b, words in ((RUNS[1], "inconclusive: 3 runs a side"), (doubled, "regression")):
        _, table, _ = cli("compare", str(RUNS[0]), str(b))
        _, md, _ = cli("compare", str(RUNS[0]), str(b), "--format", "markdown")
        html = tmp_path / f"{b.name}.html"
        status, _, err = cli("report", str(RUNS[0]), str(b), "-o", str(html))
        assert status == 0, err
        assert {m["label"] for m in last_json(table)["metrics"]} == {words}
        assert f"  {words}  " in table and f"| {words} |" in md
        assert html.read_text().count(f"<td>{words}</td>") == 3  # prefill, decode step, e2e


@pytest.mark.parametrize(("argv", "said"), [
    (["-A", str(RUNS[0])], "-A RUN... and -B RUN... go together"),
    (["-B", str(RUNS[0])], "-A RUN... and -B RUN... go together"),
    ([str(RUNS[2]), "-A", str(RUNS[0]), "-B", str(RUNS[1])], "not both"),
    ([str(RUNS[0]), str(RUNS[1]), "--drift", "-1"], "--drift -1.0 must be zero or more"),
    ([str(RUNS[0]), str(RUNS[1]), "--drift", "nan"], "--drift nan must be zero or more"),
    ([str(RUNS[0]), str(RUNS[1]), "--threshold", "inf"], "--threshold inf must be zero"),
    (["-A", str(RUNS[0]), str(RUNS[0]), "-B", str(RUNS[1])], "the same folder, on side A"),
])
def test_bad_sides_are_one_line_exit_2(cli, argv, said):
    status, out, err = cli("compare", *argv)
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert said in err and "Traceback" not in err


def test_sweeps_two_runs_a_side(cli, tmp_path):
    # The committed MPI sweep and a copy with every time x 1.02 on side A (two runs of the
    # baseline), copies x 2 and x 2.04 on side B: ratio about 2 for every (op, size); each
    # regresses but where the samples spread so widely (CV over 20%, named) that 10 of them
    # cannot decide (the 8 B and 32 B all-gathers of this sweep, CV 50% and 43%).
    from tests.test_compare import slowed_copy

    sweep = next(SAMPLES.glob("*-sweep-mpi-mpi-host-w2"))
    a2 = slowed_copy(sweep, tmp_path / "a2", 1.02, ("samples.csv",))
    b1 = slowed_copy(sweep, tmp_path / "b1", 2.0, ("samples.csv",))
    b2 = slowed_copy(sweep, tmp_path / "b2", 2.04, ("samples.csv",))
    status, out, err = cli("compare", "-A", str(sweep), str(a2), "-B", str(b1), str(b2))
    assert status == 1, err
    line = last_json(out)
    assert len(line["metrics"]) == 40  # 4 ops x 10 sizes
    for m in line["metrics"]:
        assert 1.9 < m["ratio"] < 2.1 and (m["runs_a"], m["runs_b"]) == (2, 2)
        assert m["regression"] or (m["verdict"] == "inconclusive"
                                   and any("CV" in f for f in m["flags"]))
    assert len(line["regressions"]) >= 38


def test_report_leaves_out_the_same_run_with_a_note(cli, tmp_path):
    html = tmp_path / "r.html"
    status, _, err = cli("report", str(RUNS[0]), str(RUNS[0]), "-o", str(html))
    assert status == 0, err
    text = html.read_text()
    # the folder given twice: one name, told apart by a count (report's run_labels)
    assert "#2 not compared with drift-1 (mpi-host, MPICH 5.0.2) (00:18:43) #1: the same folder" \
        in text and "<td>same</td>" not in text
