"""Run folders as pandas tables (`microbench.results.load`), every reader refusing damaged
files in one line with exit status 2, and one decode_step_us from replay to compare, report
and predict."""

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from microbench.argtypes import UsageError
from microbench.results import load
from tests.conftest import last_json
from tests.replay_helpers import infercomm, tiny_model

SAMPLES = Path(__file__).resolve().parent.parent / "results" / "examples" / "samples"
REPLAY = next(SAMPLES.glob("*-replay-llama-3.2-1b-tp2-mpi"))
SWEEP = next(SAMPLES.glob("*-sweep-mpi-mpi-host-w2"))


def test_load_gives_dataframes_with_numbers_as_numbers():
    run = load(REPLAY)
    assert run.kind == "replay"
    # iterations.csv of the sample run: 5 timed inferences (meta "iterations": 5), 8 columns.
    assert run.iterations.shape == (5, 8)
    assert run.iterations["decode_us"].dtype == np.float64
    assert run.iterations["decode_us"].iloc[0] == 9135.352  # its first row, as written
    # ops.csv: 544 calls per inference (summary.json) x 5 inferences x 2 ranks = 5440 rows.
    assert len(run.ops) == 5440 and run.ops["rank"].tolist()[:1] == [0]
    assert run.samples is None and run.sweep is None
    # meta flattened: nested keys joined with dots.
    assert run.meta["pattern.workload.decode_steps"] == 15
    assert run.meta["pattern.layout.tp"] == 2 and run.meta["kind"] == "replay"
    assert run.meta_frame.shape[0] == 1
    sweep = load(SWEEP)
    # 4 ops x 10 sizes = 40 rows in sweep.csv; 10 timed calls each in samples.csv.
    assert len(sweep.sweep) == 40 and len(sweep.samples) == 400
    assert sweep.sweep["size_bytes"].dtype == np.int64 and sweep.iterations is None


def test_load_imports_pandas_only_when_called():
    import subprocess
    import sys
    code = ("import sys, microbench.results; assert 'pandas' not in sys.modules; "
            f"microbench.results.load({str(SWEEP)!r}); assert 'pandas' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _copy(tmp_path: Path, run: Path) -> Path:
    dest = tmp_path / run.name
    shutil.copytree(run, dest)
    return dest


def _rewrite(name: str, change: Callable[[str], str]) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        path = folder / name
        path.write_text(change(path.read_text()))
    return apply


def _cut_header(text: str) -> str:
    return text.split("\n")[0][:26]  # "iteration,prefill_us,decod": cut, no rows


def _blank_value(text: str) -> str:
    lines = text.splitlines()
    cells = lines[2].split(",")
    cells[2] = ""  # decode_us of the second row
    lines[2] = ",".join(cells)
    return "\n".join(lines) + "\n"


def _cut_row(text: str) -> str:
    return text[:text.rindex("\n", 0, len(text) - 1) + 12]  # the last row cut after 11 chars


def _bytes(folder: Path) -> None:
    (folder / "meta.json").write_bytes(b'{"kind": "replay", "backend": "caf\xe9"}')


# Each damage, and a piece of what the one-line error must say besides the file's name.
REPLAY_DAMAGE = {
    "header cut": (_rewrite("iterations.csv", _cut_header), "iterations.csv",
                   "no column decode_us, e2e_us"),
    "row without a value": (_rewrite("iterations.csv", _blank_value), "iterations.csv",
                            "line 3 has no decode_us value"),
    "last row cut": (_rewrite("iterations.csv", _cut_row), "iterations.csv",
                     "line 6 has no decode_us value"),
    "a word for a time": (_rewrite("ops.csv", lambda t: t.replace(",334.069\n", ",fast\n")),
                          "ops.csv", "line 2: time_us is 'fast', not a number"),
    "meta a list": (_rewrite("meta.json", lambda t: json.dumps([json.loads(t)])),
                    "meta.json", "a JSON list, not an object"),
    "meta not UTF-8": (_bytes, "meta.json", "not UTF-8"),
    "meta without its pattern": (
        _rewrite("meta.json", lambda t: json.dumps({k: v for k, v in json.loads(t).items()
                                                    if k != "pattern"})),
        "meta.json", "no 'pattern'"),
    "decode steps a string": (_rewrite("meta.json", lambda t: t.replace(
        '"decode_steps": 15', '"decode_steps": "15"')), "meta.json",
        "pattern.workload.decode_steps is '15', not an integer"),
}


@pytest.mark.parametrize("damage", list(REPLAY_DAMAGE))
def test_compare_refuses_a_damaged_replay(cli, tmp_path, damage):
    apply, filename, says = REPLAY_DAMAGE[damage]
    bad = _copy(tmp_path, REPLAY)
    apply(bad)
    status, out, err = cli("compare", str(REPLAY), str(bad))
    assert status == 2 and out == "", out
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(bad / filename) in err and says in err, err
    # The same damage stops predict --against and report, naming the same file.
    status, out, err = cli("predict", "--sweep", str(SWEEP), "--against", str(bad))
    assert status == 2 and out == "" and str(bad / filename) in err
    pytest.importorskip("matplotlib")  # report and plot need it before reading runs
    status, out, err = cli("report", str(bad), "-o", str(tmp_path / "r.html"))
    assert status == 2 and str(bad / filename) in err and says in err
    assert not (tmp_path / "r.html").exists()


SWEEP_DAMAGE = {
    "a word in sweep.csv": (_rewrite("sweep.csv", lambda t: t.replace(",29.572,", ",n/a,")),
                            "sweep.csv", "line 2: time_us is 'n/a', not a number"),
    "nan in samples.csv": (_rewrite("samples.csv", lambda t: t.replace(",34.297\n", ",nan\n")),
                           "samples.csv", "line 2: time_us is 'nan', not a number"),
    "a negative time": (_rewrite("sweep.csv", lambda t: t.replace(",29.572,", ",-29.572,")),
                        "sweep.csv", "line 2: time_us is -29.572; it cannot be negative"),
    "a size of 8.5 bytes": (_rewrite("samples.csv", lambda t: t.replace(
        "allreduce,8,bf16,2,0,", "allreduce,8.5,bf16,2,0,")), "samples.csv",
        "line 2: size_bytes is '8.5', not an integer"),
    "header only": (_rewrite("samples.csv", lambda t: t.split("\n")[0] + "\n"),
                    "samples.csv", "a header and no rows"),
}


@pytest.mark.parametrize("damage", list(SWEEP_DAMAGE))
def test_compare_and_predict_refuse_a_damaged_sweep(cli, tmp_path, damage):
    apply, filename, says = SWEEP_DAMAGE[damage]
    bad = _copy(tmp_path, SWEEP)
    apply(bad)
    command = (("compare", str(SWEEP), str(bad)) if filename == "samples.csv" else
               ("predict", "--sweep", str(bad), "--against", str(REPLAY)))
    status, out, err = cli(*command)
    assert status == 2 and out == "", out
    assert len(err.strip().splitlines()) == 1
    assert str(bad / filename) in err and says in err, err


def test_ops_must_belong_to_the_timed_inferences(cli, tmp_path):
    # ops.csv rows of an inference that iterations.csv does not have (5 rows: 0..4).
    bad = _copy(tmp_path, REPLAY)
    _rewrite("ops.csv", lambda t: t.replace("\n0,0,0,prefill,0,0,", "\n9,0,0,prefill,0,0,", 1))(bad)
    status, out, err = cli("compare", str(REPLAY), str(bad))
    assert status == 2 and out == ""
    assert str(bad / "ops.csv") in err and "iteration 9" in err and "5 timed" in err


def test_load_raises_usage_error_not_a_traceback(tmp_path):
    bad = _copy(tmp_path, REPLAY)
    (bad / "iterations.csv").write_text("")
    run = load(bad)  # meta.json is sound; the table is read (and refused) on first use
    with pytest.raises(UsageError, match=r"iterations\.csv: empty"):
        _ = run.iterations


def test_one_decode_step_figure_from_replay_to_compare_report_predict(cli, tmp_path):
    # A real 2-rank replay with step timing (so the per-step spread exists and differs from
    # the per-inference figure); its summary's decode_step_us must be what compare, report
    # and predict compute from the files it wrote: decode_us / 7 steps (decode 8 -> 7 decode
    # steps), median over the 3 timed inferences.
    model = tiny_model(tmp_path)
    proc, _ = infercomm("replay", "--model", model, "--tp", "2", "--prompt", "8", "--decode",
                        "8", "--backend", "torch", "-n", "3", "-w", "1", "--timing", "step",
                        "--out", str(tmp_path / "res"), "--timeout", "60")
    assert proc.returncode == 0, proc.stderr
    line = last_json(proc.stdout)
    run = Path(line["results_dir"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["decode_step_us"] == line["decode_step_us"]
    # By hand from iterations.csv (decode_us rounded to 3 decimals there, so within 1e-3).
    frame = load(run).iterations
    by_hand = float(np.median(frame["decode_us"] / 7))
    assert line["decode_step_us"] == pytest.approx(by_hand, abs=1e-3)
    assert frame["decode_step_mean_us"].tolist() == pytest.approx(
        (frame["decode_us"] / 7).tolist(), abs=1e-3)
    # 3 samples a run cannot decide anything (exit 3); the medians are what is checked here.
    # compare refuses a run against itself, so B is a copy with its times doubled.
    from tests.test_compare import slowed_copy

    other = slowed_copy(run, tmp_path / "doubled", 2.0, ("iterations.csv",))
    status, out, err = cli("compare", str(run), str(other), "--inconclusive-ok")
    assert status == 0, err
    compared = next(m for m in last_json(out)["metrics"] if m["metric"] == "decode_step_us")
    assert compared["a_median_us"] == pytest.approx(line["decode_step_us"], abs=1e-3)
    status, out, err = cli("predict", "--sweep", str(SWEEP), "--against", str(run))
    assert status == 0, err
    measured = last_json(out)["measured"]["decode_step_us"]
    assert measured == pytest.approx(line["decode_step_us"], abs=1e-3)
    from microbench.analysis.report import phase_rows
    from microbench.results.runs import load_run
    reported = phase_rows([("A", load_run(run))])[0]["decode_step_us"]
    assert reported == pytest.approx(line["decode_step_us"], abs=1e-3)
