"""The best setting of a grid: per sweep (op, size, dtype, group) or per replay phase.

For each metric the settings are ranked by the median of their pooled samples (the slowest
rank's time of each timed call or inference). The best is the lowest; its margin is the
runner-up's median over the best's (1.25: the runner-up takes 25% longer), with the 95%
interval and the verdict of the gate (analysis/compare.py: hierarchical bootstrap over the
runs of each setting, widened by the drift allowance when a setting has one run). A verdict
"faster" means the best beats the runner-up beyond the interval; "inconclusive" says what
would decide it (--env-runs, -n).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from microbench.analysis.compare import DRIFT, THRESHOLD, compare_sides, verdict_label
from microbench.analysis.sameness import run_metrics
from microbench.results.runs import load_run
from microbench.views.textfmt import render_table

COLUMNS = ["metric", "best", "best_us", "runner_up", "runner_up_us", "margin", "ci_low",
           "ci_high", "verdict", "settings"]


def best_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per metric the runs share: the best setting, its margin and interval.

    A setting any of whose runs failed --check is not ranked: its times are of wrong data."""
    wrong = {r["setting"] for r in runs if r.get("check_failed")}
    runs = [r for r in runs if r["setting"] not in wrong]
    samples: dict[str, dict[str, list[np.ndarray]]] = {}
    for run in runs:
        for metric, values in run_metrics(load_run(run["results_dir"])).items():
            samples.setdefault(metric, {}).setdefault(run["setting"], []).append(values)
    settings = list(dict.fromkeys(r["setting"] for r in runs))
    rows = []
    for metric, by_setting in samples.items():
        if set(by_setting) != set(settings):
            continue
        ranked = sorted(settings, key=lambda s: float(np.median(np.concatenate(by_setting[s]))))
        best = ranked[0]
        row: dict[str, Any] = {"metric": metric, "best": best,
                               "best_us": round(float(np.median(np.concatenate(
                                   by_setting[best]))), 3), "settings": len(settings)}
        if len(ranked) > 1:
            second = ranked[1]
            c = compare_sides(second, metric, by_setting[best], by_setting[second],
                              THRESHOLD, DRIFT)
            row.update(runner_up=second, runner_up_us=round(c.b_median_us, 3),
                       margin=round(c.ratio, 4), ci_low=round(c.ci_low, 4),
                       ci_high=round(c.ci_high, 4), verdict=_verdict(c))
        rows.append(row)
    return rows


def _verdict(c: Any) -> str:
    """The gate's verdict on the runner-up against the best, said of the best."""
    word = verdict_label(c)
    if c.verdict in ("slower", "regression"):
        return "best beyond doubt"
    return word


def grid_table(rows: list[dict[str, Any]]) -> str:
    header = ["metric", "best setting", "best (us)", "runner-up", "margin", "95% interval",
              "verdict"]
    body = [[r["metric"], r["best"], f"{r['best_us']:.2f}", r.get("runner_up", "-"),
             f"{r['margin']:.3f}" if "margin" in r else "-",
             f"{r['ci_low']:.3f}-{r['ci_high']:.3f}" if "ci_low" in r else "-",
             r.get("verdict", "-")] for r in rows]
    return render_table(header, body, right_align={"best (us)", "margin"})


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def not_ranked(runs: list[dict[str, Any]]) -> list[str]:
    """The settings whose data was wrong (a run failed --check), in the grid's order."""
    return list(dict.fromkeys(r["setting"] for r in runs if r.get("check_failed")))


def write_grid(command: str, args: argparse.Namespace, runs: list[dict[str, Any]],
               label: str, planned: int, ended: dict[str, Any] | None = None
               ) -> dict[str, Any]:
    """The grid's folder, table and summary; `ended` says how a partial grid stopped (the
    setting whose run failed or was stopped), None when every run of `planned` finished."""
    from microbench.results.store import base_meta, csv_text, json_text, write_run_or_keep

    rows = best_rows(runs)
    wrong = not_ranked(runs)
    grid = {**base_meta(args.argv), "kind": "grid", "command": command,
            "env_runs": args.env_runs, "complete": ended is None, "runs_planned": planned,
            "ended": ended, "not_ranked": wrong, "runs": runs, "best": rows}
    folder, error = write_run_or_keep(args.out, label, {
        "grid.json": json_text(grid), "best.csv": csv_text(rows, COLUMNS)})
    settings = len({r["setting"] for r in runs})
    partial = "" if ended is None else f" (partial: {len(runs)} of {planned} runs)"
    from microbench.results.store import print_standin_line
    print_standin_line(f"{command} grid")
    print(f"# infercomm {command} grid: {_count(len(runs), 'run')} of "
          f"{_count(settings, 'setting')}{partial}; "
          "margin = runner-up / best (medians of the slowest rank's samples), interval and "
          "verdict as `infercomm compare` reads them")
    print(grid_table(rows))
    for setting in wrong:
        print(f"not ranked: {setting} (--check found wrong data)")
    print(f"results: {folder}")
    if ended is not None:
        kept = ", ".join(str(r["results_dir"]) for r in runs)
        sys.stderr.write(f"infercomm {command}: kept the partial grid at {folder} with the "
                         f"{_count(len(runs), 'run')} that finished: {kept}\n")
    if error is not None:
        from microbench.results.store import write_error_message

        sys.stderr.write(write_error_message(command, args.out, error, folder))
    from microbench.results.store import gpu_standin
    return {"kind": "grid", "command": command, "settings": settings,
            "runs": len(runs), "metrics": len(rows), "complete": ended is None,
            "not_ranked": len(wrong), "results_dir": str(folder) if folder is not None else None,
            **({"gpu_standin": True} if gpu_standin() else {})}
