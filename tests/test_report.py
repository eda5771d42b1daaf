"""`infercomm report` and `plot` on the committed sample runs (never rerun), and the volume
table behind the volume-by-layout figure checked against DESIGN.md's formulas."""

import base64
import json
import re
import shutil
from pathlib import Path

import pytest

from microbench.analysis import figures
from microbench.analysis.report import volume_rows
from patterns import Layout, Workload, generate, resolve_model
from tests.conftest import last_json

pytest.importorskip("matplotlib")

SAMPLES = Path(__file__).resolve().parent.parent / "results" / "examples" / "samples"
RUNS = [str(next(SAMPLES.glob(p))) for p in ("*-replay-llama-3.2-1b-tp2-torch",
                                             "*-replay-llama-3.2-1b-tp2-mpi",
                                             "*-sweep-torch-gloo-w2", "*-sweep-mpi-mpi-host-w2")]
FIGURES = ["phase_times", "op_kind_times", "message_sizes_A", "volume_by_layout_A",
           "volume_vs_decode_A", "sweep_latency", "sweep_busbw", "ratios",
           "predicted_vs_measured", "plan_layouts"]
PNG = b"\x89PNG\r\n\x1a\n"


def test_report_is_one_self_contained_page(cli, tmp_path):
    out = tmp_path / "report.html"
    status, stdout, err = cli("report", *RUNS, "--sweep", RUNS[3], "-o", str(out))
    assert status == 0, err
    assert last_json(stdout)["figures"] == FIGURES
    page = out.read_text()
    images = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert len(images) == len(FIGURES)
    assert all(base64.b64decode(i).startswith(PNG) and len(i) > 10_000 for i in images)
    # Nothing to fetch: no external links, scripts or style sheets.
    assert "http" not in page and "<script" not in page and "<link" not in page
    assert "<style>" in page and "Run vs baseline" in page and "Predicted vs measured" in page
    # The plan page: the three layouts of 2 ranks as `plan` lists them (dp 1: tp 1, 2; then
    # dp 2, two replicas with no communication), the two TP2 replays measured beside TP2,
    # none beside PP2 or DP2; the gloo replay (A) read against the MPI sweep is said.
    assert "Layouts (plan)" in page
    rows = re.findall(r"<tr><td>llama-3.2-1b, 2 ranks[^<]*</td><td>(\w+)</td>(.*?)</tr>", page)
    assert [layout for layout, _ in rows] == ["PP2", "TP2", "DP2"]
    assert rows[0][1].endswith("<td>-</td>") and rows[2][1].endswith("<td>-</td>")
    assert re.search(r"<td>A [0-9.]+ ms, B [0-9.]+ ms</td>$", rows[1][1])
    assert "A: the sweep ran with backend mpi and the replay with torch" in page


def test_plot_writes_the_same_figures(cli, tmp_path):
    status, stdout, err = cli("plot", *RUNS, "--sweep", RUNS[3], "-o", str(tmp_path / "f"))
    assert status == 0, err
    files = last_json(stdout)["files"]
    assert [Path(f).stem for f in files] == FIGURES
    for f in files:
        data = Path(f).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000


def test_a_single_sweep_gives_its_curves_only(cli, tmp_path):
    status, stdout, err = cli("plot", RUNS[2], "-o", str(tmp_path))
    assert status == 0, err
    assert [Path(f).stem for f in last_json(stdout)["files"]] == ["sweep_latency",
                                                                  "sweep_busbw"]


def test_figures_take_tables_and_return_figures():
    fig = figures.phase_times([{"label": "A", "prefill_us": 1000.0, "decode_step_us": 50.0,
                                "e2e_us": 2000.0}])
    assert len(fig.axes) == 3 and all(ax.patches for ax in fig.axes)
    fig = figures.ratios([{"label": "e2e_us B/A", "ratio": 1.2, "ci_low": 1.1, "ci_high": 1.3,
                           "verdict": "slower"}])
    assert fig.axes[0].get_yticklabels()[0].get_text() == "e2e_us B/A"


def test_volume_by_layout_follows_the_design_formulas():
    # DESIGN.md "Volume", llama-3.2-1b (h=2048, L=16, V=128256), Sp=32, Sd=16, bf16 (b=2):
    # TP2 allreduce (2L+1)(Sp+Sd-1) h b 2(t-1)/t = 33 x 47 x 2048 x 2 x 1 = 6,352,896 B;
    # TP2 gather Sd (V/t) b = 16 x 64128 x 2 = 2,052,096 B;
    # PP2 send (p-1) 2 (Sp+Sd-1) h b = 1 x 2 x 47 x 2048 x 2 = 385,024 B.
    pattern = generate("vllm-v0", resolve_model("llama-3.2-1b"), Layout(tp=2),
                       Workload(prompt=32, decode=16))
    by_layout, by_decode = volume_rows(pattern)
    rows = {r["layout"]: r for r in by_layout}
    assert set(rows) == {"PP2", "TP2"}
    assert rows["TP2"]["allreduce"] == 6_352_896 and rows["TP2"]["gather"] == 2_052_096
    assert rows["PP2"]["send"] == 385_024 and rows["PP2"]["allreduce"] == 0
    at_16 = {r["layout"]: r["volume_bytes"] for r in by_decode if r["decode"] == 16}
    assert at_16 == {"TP2": 6_352_896 + 2_052_096, "PP2": 385_024}


def test_report_needs_run_folders(cli, tmp_path):
    status, _, err = cli("report", str(tmp_path), "-o", str(tmp_path / "r.html"))
    assert status == 2 and "is not a run folder" in err
    status, _, err = cli("report", RUNS[0], "--sweep", RUNS[1], "-o", str(tmp_path / "r.html"))
    assert status == 2 and "a replay run; pass a sweep run" in err


def test_a_replay_whose_config_moved_still_reports(cli, tmp_path):
    # The pattern of a replay is rebuilt from its recorded command line; a config.json that
    # is gone costs its pattern figures (said on stderr), not the report.
    moved = tmp_path / "moved"
    shutil.copytree(RUNS[1], moved)
    meta = json.loads((moved / "meta.json").read_text())
    meta["argv"][meta["argv"].index("--model") + 1] = str(tmp_path / "gone" / "config.json")
    (moved / "meta.json").write_text(json.dumps(meta))
    status, stdout, err = cli("report", str(moved), "-o", str(tmp_path / "r.html"))
    assert status == 0, err
    assert last_json(stdout)["figures"] == ["phase_times", "op_kind_times"]
    assert "no pattern figures" in err and "does not exist" in err


def test_a_sweep_lacking_an_op_is_a_note_not_a_failure(cli, tmp_path):
    # The TP2 replay issues all-reduces and a gather; a sweep of all-reduces alone cannot
    # price the gather, so its prediction is left out with the sweep to run, page written.
    from tests.test_predict import fake_sweep
    sweep = fake_sweep(tmp_path / "sweep", {"allreduce": (10.0, 0.0)})
    out = tmp_path / "report.html"
    status, stdout, err = cli("report", RUNS[1], "--sweep", str(sweep), "-o", str(out))
    assert status == 0, err
    page = out.read_text()
    assert "A: not predicted: the sweep has no gather over 2 ranks" in page
    assert "predicted_vs_measured" not in last_json(stdout)["figures"]
