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
FIGURES = ["phase_times", "op_kind_times", "message_sizes_1", "volume_by_layout_1",
           "volume_vs_decode_1", "sweep_latency", "sweep_busbw", "ratios",
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
    # none beside PP2 or DP2; the gloo replay read against the MPI sweep is said. Runs are
    # named by what they were (transport, library and version), not lettered.
    assert "Layouts (plan)" in page
    rows = re.findall(r"<tr><td>llama-3.2-1b, 2 ranks[^<]*</td><td>(\w+)</td>(.*?)</tr>", page)
    assert [layout for layout, _ in rows] == ["PP2", "TP2", "DP2"]
    assert rows[0][1].endswith("<td>-</td>") and rows[2][1].endswith("<td>-</td>")
    assert re.search(r"<td>gloo, torch 2.13.0\+cpu [0-9.]+ ms, mpi-host, MPICH 5.0.2 [0-9.]+ ms"
                     r"</td>$", rows[1][1])
    assert ("gloo, torch 2.13.0+cpu: the sweep ran with backend mpi and the replay with torch"
            in page)
    assert "MPICH Version" not in page
    # The page of several runs says in its title what they share (replays and sweeps share
    # only their host here), then every run by name, with its kind where kinds mix.
    title = re.search(r"<title>(.*?)</title>", page).group(1)
    assert title == ("hosts vm | 4 runs: replay gloo, torch 2.13.0+cpu vs replay mpi-host, "
                     "MPICH 5.0.2 vs sweep gloo, torch 2.13.0+cpu vs sweep mpi-host, MPICH "
                     "5.0.2"), title


def test_a_comparison_page_is_titled_by_what_its_runs_share(cli, tmp_path):
    out = tmp_path / "report.html"
    status, _, err = cli("report", *RUNS[:2], "-o", str(out))
    assert status == 0, err
    title = re.search(r"<title>(.*?)</title>", out.read_text()).group(1)
    # the two sample replays: llama-3.2-1b TP2 under vllm-v0, prompt 32, decode 16, 5
    # iterations each (their meta.json); torch/gloo and MPICH differ, so they are the names
    assert title == ("llama-3.2-1b (vllm-v0) | TP2 PP1 | prompt 32, decode 16, batch 1, bf16 "
                     "| 5 iterations | hosts vm | 2 runs: gloo, torch 2.13.0+cpu vs mpi-host, "
                     "MPICH 5.0.2"), title


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
    # The TP2 replay issues all-reduces and a gather; a sweep of sendrecv alone cannot
    # price the all-reduces (nothing stands in for one: analysis/fits.py SUBSTITUTES), so
    # its prediction is left out with the sweep to run, page written.
    from tests.test_predict import fake_sweep
    sweep = fake_sweep(tmp_path / "sweep", {"sendrecv": (10.0, 0.0)})
    out = tmp_path / "report.html"
    status, stdout, err = cli("report", RUNS[1], "--sweep", str(sweep), "-o", str(out))
    assert status == 0, err
    page = out.read_text()
    assert "mpi-host, MPICH 5.0.2: not predicted: the sweep has no allreduce over 2 ranks" in page
    assert "predicted_vs_measured" not in last_json(stdout)["figures"]


def _built():
    from microbench.analysis.report import build
    from microbench.results.runs import load_run
    entries, tables = build([load_run(p) for p in RUNS], load_run(RUNS[3]), 0.05)
    return {e.name: e.figure for e in entries}, tables


def test_figures_name_runs_by_what_they_were():
    # A PNG shared alone says which run is which: transport, library and version, no letters
    # and no raw banner ("MPICH Version:      5.0.2" in meta.json becomes "MPICH 5.0.2").
    figs, tables = _built()
    names = ["gloo, torch 2.13.0+cpu", "mpi-host, MPICH 5.0.2"]
    assert [label for label, _ in tables["runs"]] == names * 2  # two replays, two sweeps
    for name in ("phase_times", "op_kind_times", "plan_layouts"):
        texts = [t.get_text() for leg in figs[name].legends for t in leg.get_texts()]
        assert all(n in " ".join(texts) for n in names), (name, texts)
    curves = [t.get_text() for t in figs["sweep_latency"].axes[0].get_legend().get_texts()]
    assert "allreduce n=2, mpi-host, MPICH 5.0.2" in curves
    every = [t.get_text() for f in figs.values() for t in f.findobj(
        lambda a: hasattr(a, "get_text"))]
    assert not any("Version" in t for t in every)
    assert not any(t.strip() in ("A", "B", "C", "D") for t in every)
    # the sample's plan: DP2 (two replicas of a dense model) prices at 0 and is said
    plan = figs["plan_layouts"].axes[0]
    assert [t.get_text() for t in plan.get_xticklabels()] == ["PP2", "TP2", "DP2"]
    assert plan.get_yscale() == "linear" and plan.texts[2].get_text() == "0: no communication"
    ratio = figs["ratios"].axes[0]
    assert ratio.get_title() == f"Run vs baseline: {names[1]} / {names[0]}"
    assert ratio.get_yticklabels()[0].get_text() == "prefill"


def test_figures_leave_room_above_the_tallest_mark():
    # phase_times: p95 whisker 3 ms is the top; the axis ends above it (3 x 1.18 = 3.54).
    fig = figures.phase_times([{"label": "x", "prefill_us": 2000.0, "prefill_us_p5": 1500.0,
                                "prefill_us_p95": 3000.0, "decode_step_us": 50.0,
                                "e2e_us": 2500.0}])
    assert fig.axes[0].get_ylim()[1] == pytest.approx(3.0 * figures.HEADROOM)
    # message sizes: 500 + 12 calls stacked in one bin; the log axis ends at 3 x 512.
    fig = figures.message_histogram([{"op": "allreduce", "bytes": 4096, "count": 500},
                                     {"op": "gather", "bytes": 4096, "count": 12}])
    assert fig.axes[0].get_ylim()[1] == pytest.approx(3 * 512)
    # volume: 1 MiB + 3 MiB stacked = 4 MiB on TP2; the axis ends above 4.
    fig = figures.volume_by_layout([{"layout": "TP2", "allreduce": 2**20, "gather": 3 * 2**20},
                                    {"layout": "PP2", "send": 2**19}])
    assert fig.axes[0].get_ylim()[1] > 4.0


def test_a_layout_with_no_communication_is_drawn_and_said():
    # DP2 of a dense model prices at 0: a linear axis from 0 (no symlog that draws nothing),
    # its bar's value said in words, every bar and marker below the top.
    rows = [{"layout": "PP2", "predicted_e2e_us": 140.0, "measured": []},
            {"layout": "TP2", "predicted_e2e_us": 23_000.0,
             "measured": [{"label": "mpi-host, MPICH 5.0.2", "e2e_us": 20_000.0}]},
            {"layout": "DP2", "predicted_e2e_us": 0.0, "measured": []}]
    ax = figures.plan_layouts(rows).axes[0]
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0
    assert ax.get_ylim()[1] > 23.0  # ms, the tallest bar
    said = {round(t.xy[0]): t.get_text() for t in ax.texts}
    assert said == {0: "140.0 us", 1: "23.000 ms", 2: "0: no communication"}
    # all positive and spread over 100x: log, each bar still above the axis' bottom
    rows[2]["predicted_e2e_us"] = 5.0
    ax = figures.plan_layouts(rows).axes[0]
    assert ax.get_yscale() == "log" and ax.get_ylim()[0] < 0.005 and ax.get_ylim()[1] > 23.0


def test_predicted_vs_measured_is_a_ratio_per_metric():
    # measured / predicted: 12,500 / 10,000 = 1.25 (prefill), 450 / 500 = 0.9 (decode step);
    # a metric with nothing measured has no bar.
    rows = [{"run": "r", "metric": "prefill", "predicted_us": 10_000.0, "measured_us": 12_500.0},
            {"run": "r", "metric": "decode step", "predicted_us": 500.0, "measured_us": 450.0},
            {"run": "r", "metric": "gather", "predicted_us": 80.0, "measured_us": None}]
    ax = figures.predicted_vs_measured(rows).axes[0]
    assert [p.get_height() for p in ax.patches] == pytest.approx([1.25, 0.9])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["prefill", "decode step"]
    assert [line.get_ydata()[0] for line in ax.lines] == [1.0]  # the reference line
    assert ax.get_ylim()[1] > 1.25 and "_us" not in ax.get_ylabel()


def test_predicted_vs_measured_of_the_sample_runs():
    # The MPI replay's median end to end is 20,050.539 us (iterations.csv); its bar is that
    # over the sweep's prediction, the same number the page's table prints.
    figs, tables = _built()
    row = next(r for r in tables["predicted"]
               if r["run"] == "mpi-host, MPICH 5.0.2" and r["metric"] == "end to end")
    assert row["measured_us"] == pytest.approx(20_050.539)
    ax = figs["predicted_vs_measured"].axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert pytest.approx(20_050.539 / row["predicted_us"]) in heights
