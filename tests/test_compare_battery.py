"""compare under issue 34's battery: many runs a side checked in linear time (fault 8), runs
of different workloads refused rather than read as one measurement (fault 9), and a meta.json
whose keys have the wrong JSON types refused in one line (fault 12).

The runs are copies of tests/data/compare-drift (six replays of llama-3.2-1b TP2, prompt 32,
decode 16) whose meta.json is rewritten here: the recorded command line of a workload replay,
or a key of the wrong type. Not new measurements."""

import json
import shutil
import time
from pathlib import Path

import pytest

from microbench.analysis.compare import check_sides
from microbench.argtypes import UsageError
from microbench.results.runs import RunFolder

DATA = Path(__file__).resolve().parent / "data" / "compare-drift"
RUNS = sorted(DATA.iterdir())


def rewritten(run: Path, dest: Path, **changes) -> Path:
    """A copy of `run` whose meta.json has `changes` applied (argv_extra: words appended to
    argv; pattern_<key>: a key of meta.pattern; any other: a top-level key)."""
    shutil.copytree(run, dest)
    meta = json.loads((run / "meta.json").read_text())
    for key, value in changes.items():
        if key == "argv_extra":
            meta["argv"] += value
        elif key.startswith("pattern_"):
            meta["pattern"][key.removeprefix("pattern_")] = value
        else:
            meta[key] = value
    (dest / "meta.json").write_text(json.dumps(meta))
    return dest


def test_many_runs_a_side_are_checked_in_linear_time(tmp_path):
    # fault 8: every pair was checked for being one run (its files read pairwise): 300 runs a
    # side took 24 s, 1,000 a side gave no answer in 180 s (2,000 x 1,999 / 2 = 2 million
    # pairs). 1,000 folders a side here, each meta.json distinct by its label.
    meta = json.loads((RUNS[0] / "meta.json").read_text())
    runs = []
    for i in range(2000):
        folder = tmp_path / f"r{i}"
        folder.mkdir()
        (folder / "meta.json").write_text(json.dumps({**meta, "argv": [*meta["argv"], str(i)]}))
        runs.append(RunFolder(folder, {**meta, "argv": [*meta["argv"], str(i)]}, None))
    start = time.monotonic()
    check_sides(runs[:1000], runs[1000:])
    assert time.monotonic() - start < 20  # about 0.3 s here, alone
    # A copy is still found among them: B's last run made a byte copy of A's 6th.
    shutil.rmtree(runs[-1].path)
    shutil.copytree(runs[5].path, runs[-1].path)
    with pytest.raises(UsageError, match=r"r5 and .*r1999 are copies of one run, on both "):
        check_sides(runs[:1000], runs[1000:])


@pytest.mark.parametrize("a_extra, b_extra, words", [
    ([], ["--requests", "w.jsonl", "--step-time-ms", "30"],
     "workload differs: one batch in A, a request workload (--requests) in B"),
    (["--requests", "w.jsonl", "--step-time-ms", "30"],
     ["--requests", "w.jsonl", "--step-time-ms", "20"],
     "--step-time-ms differs: 30 in A, 20 in B"),
    ([], ["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 3}',
          "--acceptance-length", "2"],
     '--speculative-config differs: not given in A, {"method": "eagle", '
     '"num_speculative_tokens": 3} in B'),
])
def test_runs_of_different_workloads_are_refused(cli, tmp_path, a_extra, b_extra, words):
    # fault 9: pattern.workload holds a workload's longest prompt and output only, so these
    # read as one measurement ("what differs: nothing recorded") and got a verdict.
    a = rewritten(RUNS[0], tmp_path / "a", argv_extra=a_extra)
    b = rewritten(RUNS[1], tmp_path / "b", argv_extra=b_extra)
    status, out, err = cli("compare", str(a), str(b))
    assert status == 2 and out == "" and "Traceback" not in err, err
    assert f"did not measure what {a} did: {words}" in err, err


def test_runs_whose_calls_differ_are_refused(cli, tmp_path):
    # Another request file under the same options issues other calls: the recorded calls per
    # inference differ (1,234 is not the 544 of the six runs).
    a = rewritten(RUNS[0], tmp_path / "a")
    b = rewritten(RUNS[1], tmp_path / "b", pattern_calls_per_inference=1234)
    recorded = json.loads((a / "meta.json").read_text())["pattern"]["calls_per_inference"]
    status, _, err = cli("compare", str(a), str(b))
    assert status == 2 and f"the calls differ: {recorded:,} calls per inference in A, 1,234 in B" \
        in err, err


@pytest.mark.parametrize("key, value, words", [
    ("environment", ["NCCL_PROTO=LL"], "environment is a JSON list, not an object"),
    ("versions", "5.0.2", "versions is a JSON string, not an object"),
    ("hosts", "vm", "hosts is a JSON string, not a list of host names"),
    ("hosts", [1, 2], "hosts holds a value that is not a host name"),
])
def test_a_meta_json_of_wrong_types_is_one_line(cli, tmp_path, key, value, words):
    # fault 12: each was an AttributeError traceback in compare (differences.facts).
    a = rewritten(RUNS[0], tmp_path / "a")
    b = rewritten(RUNS[1], tmp_path / "b", **{key: value})
    for command in (["compare", str(a), str(b)], ["report", str(b), "-o",
                                                     str(tmp_path / "r.html")]):
        status, out, err = cli(*command)
        assert status == 2 and out == "" and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1 and words in err, err
    assert not (tmp_path / "r.html").exists()


def shortened(run: Path, dest: Path, rows: int, factor: float = 1.0) -> Path:
    """A copy of `run` keeping its first `rows` timed iterations, every *_us time x factor
    (meta.json's iterations set to match)."""
    import csv
    shutil.copytree(run, dest)
    with open(run / "iterations.csv", newline="") as f:
        kept = list(csv.DictReader(f))[:rows]
    with open(dest / "iterations.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(kept[0]), lineterminator="\n")
        writer.writeheader()
        for r in kept:
            writer.writerow({k: repr(float(v) * factor) if k.endswith("_us") and v else v
                             for k, v in r.items()})
    meta = json.loads((run / "meta.json").read_text())
    (dest / "meta.json").write_text(json.dumps({**meta, "iterations": rows}))
    return dest


def test_few_samples_decide_only_far_from_one(cli, tmp_path):
    # newcomer: the README's replay (-n 3) could never be compared: under 5 samples a run
    # every metric was inconclusive, even at x4. Now an interval wholly beyond x2 (after the
    # x1.4 drift allowance of one run a side) decides, flagged; one near 1 does not.
    a = shortened(RUNS[0], tmp_path / "a", 3)
    b = shortened(RUNS[1], tmp_path / "b", 3, factor=4.0)
    status, out, err = cli("compare", str(a), str(b))
    line = json.loads(out.strip().splitlines()[-1])
    assert status == 1, err
    for m in line["metrics"]:
        # runs 1 and 2 are within 1.31x of each other (test_compare_runs): x4 puts the
        # widened interval above 4 / 1.31 / 1.4 = 2.2 > 2
        assert m["verdict"] == "regression" and m["ci_low"] > 2, m
        assert "few samples (3 a run): decided as the interval lies beyond x2" in m["flags"]
    c = shortened(RUNS[1], tmp_path / "c", 3, factor=1.2)
    status, out, _ = cli("compare", str(a), str(c))
    line = json.loads(out.strip().splitlines()[-1])
    assert status == 3 and {m["verdict"] for m in line["metrics"]} == {"inconclusive"}
