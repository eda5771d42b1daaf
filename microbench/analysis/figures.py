"""Figures from result tables: each function takes rows (lists of dicts) and returns a
matplotlib Figure. Nothing here reads files or runs anything.

matplotlib is imported inside each function, so `microbench` works without it; figures are
built with the object API on an Agg canvas (no pyplot, no global state, no display).
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

Rows = Sequence[dict[str, Any]]
PHASES = (("prefill_us", "prefill (TTFT share)"), ("decode_step_us", "decode step (TPOT share)"),
          ("e2e_us", "end to end"))


def _figure(width: float = 8.0, height: float = 4.0) -> "Figure":
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)  # Agg, whatever backend pyplot users have chosen
    return fig


def _log_bytes_axis(ax: "Axes", axis: str = "x") -> None:
    from matplotlib.ticker import FuncFormatter

    from microbench.views.textfmt import format_bytes
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=2)
    fmt = FuncFormatter(lambda v, _: format_bytes(v).replace(".00", ""))
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_formatter(fmt)


def phase_times(rows: Rows) -> "Figure":
    """rows: {label, METRIC: median, METRIC_p5, METRIC_p95} for each of PHASES, per run."""
    fig = _figure(10, 3.6)
    axes = fig.subplots(1, len(PHASES))
    labels = [r["label"] for r in rows]
    for ax, (key, name) in zip(axes, PHASES, strict=True):
        med = np.array([r.get(key) or 0.0 for r in rows]) / 1e3
        low = np.array([r.get(f"{key}_p5", r.get(key)) or 0.0 for r in rows]) / 1e3
        high = np.array([r.get(f"{key}_p95", r.get(key)) or 0.0 for r in rows]) / 1e3
        ax.bar(range(len(rows)), med, color=[f"C{i}" for i in range(len(rows))],
               yerr=[med - low, high - med], capsize=4)
        ax.set_xticks(range(len(rows)), labels)
        ax.set_title(name)
        ax.set_ylabel("ms (median, p5-p95)")
    fig.suptitle("Communication time of one inference (slowest rank)")
    return fig


def op_kind_times(rows: Rows) -> "Figure":
    """rows: {label, kind, time_us} - time per inference spent in each op kind."""
    fig = _figure()
    ax = fig.subplots()
    labels = list(dict.fromkeys(r["label"] for r in rows))
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        values = [next((r["time_us"] / 1e3 for r in rows
                        if r["label"] == label and r["kind"] == k), 0.0) for k in kinds]
        ax.bar(np.arange(len(kinds)) + i * width, values, width, label=label)
    ax.set_xticks(np.arange(len(kinds)) + width * (len(labels) - 1) / 2, kinds)
    ax.set_ylabel("ms per inference (median)")
    ax.set_title("Time per op kind (each kind's slowest rank)")
    ax.legend()
    return fig


def message_histogram(rows: Rows, title: str = "") -> "Figure":
    """rows: {op, bytes, count} - pattern rows; bars of calls per inference by size (log2)."""
    fig = _figure()
    ax = fig.subplots()
    sizes = np.array([max(1, r["bytes"]) for r in rows], dtype=float)
    edges = 2.0 ** np.arange(np.floor(np.log2(sizes.min())), np.ceil(np.log2(sizes.max())) + 2)
    bottom = np.zeros(len(edges) - 1)
    for kind in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == kind]
        counts, _ = np.histogram([max(1, r["bytes"]) for r in mine], bins=edges,
                                 weights=[r["count"] for r in mine])
        ax.bar(edges[:-1], counts, width=np.diff(edges), bottom=bottom, align="edge",
               label=kind, edgecolor="white")
        bottom += counts
    _log_bytes_axis(ax)
    ax.set_yscale("log")
    ax.set_ylim(bottom=0.8)  # a bar of one call stays visible on the log scale
    ax.set_xlabel("bytes per call (one rank's input)")
    ax.set_ylabel("calls per inference (all stages)")
    ax.set_title("Message sizes" + (f": {title}" if title else ""))
    ax.legend()
    return fig


def volume_by_layout(rows: Rows, title: str = "") -> "Figure":
    """rows: {layout, KIND: bytes, ...} - one inference's volume, stacked by op kind."""
    fig = _figure()
    ax = fig.subplots()
    kinds = [k for k in dict.fromkeys(k for r in rows for k in r if k != "layout")
             if any(r.get(k) for r in rows)]
    bottom = np.zeros(len(rows))
    for kind in kinds:
        values = np.array([float(r.get(kind, 0)) for r in rows]) / 2**20
        ax.bar([r["layout"] for r in rows], values, bottom=bottom, label=kind)
        bottom += values
    ax.set_ylabel("MiB per inference, every call once")
    ax.set_title("Volume by layout" + (f": {title}" if title else ""))
    ax.legend()
    return fig


def volume_vs_decode(rows: Rows, title: str = "") -> "Figure":
    """rows: {layout, decode, volume_bytes} - how volume grows with the output length."""
    fig = _figure()
    ax = fig.subplots()
    for layout in dict.fromkeys(r["layout"] for r in rows):
        mine = sorted((r for r in rows if r["layout"] == layout), key=lambda r: r["decode"])
        ax.plot([r["decode"] for r in mine], [r["volume_bytes"] / 2**20 for r in mine],
                marker="o", label=layout)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("output tokens Sd")
    ax.set_ylabel("MiB per inference")
    ax.set_title("Volume vs decode length" + (f": {title}" if title else ""))
    ax.legend()
    return fig


def _sweep_lines(ax: "Axes", rows: Rows, key: str, band: bool) -> None:
    series = dict.fromkeys((r["label"], r["op"], r["group_size"]) for r in rows)
    for i, (label, op, n) in enumerate(series):
        mine = sorted((r for r in rows if (r["label"], r["op"], r["group_size"]) ==
                       (label, op, n)), key=lambda r: r["size_bytes"])
        x = [r["size_bytes"] for r in mine]
        ax.plot(x, [r[key] for r in mine], marker=".", color=f"C{i % 10}",
                label=f"{op} n={n}, {label}")
        if band:
            ax.fill_between(x, [r["time_p5_us"] for r in mine],
                            [r["time_p95_us"] for r in mine], color=f"C{i % 10}", alpha=0.15)


def _outside_legend(ax: "Axes") -> None:
    # Curves of several libraries fill the plot area; the legend goes beside it.
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _sweep_vs_size(rows: Rows, column: str, ylabel: str, title: str, band: bool) -> "Figure":
    fig = _figure(11, 4.5)
    ax = fig.subplots()
    _sweep_lines(ax, rows, column, band=band)
    _log_bytes_axis(ax)
    ax.set_yscale("log")
    ax.set_xlabel("size (nccl-tests convention)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _outside_legend(ax)
    return fig


def sweep_latency(rows: Rows) -> "Figure":
    """rows: sweep.csv rows plus `label` (the library); median with a p5-p95 band."""
    return _sweep_vs_size(rows, "time_us", "time per call, us (slowest rank)",
                          "Latency vs size", band=True)


def sweep_busbw(rows: Rows) -> "Figure":
    return _sweep_vs_size(rows, "busbw_gbps", "bus bandwidth, GB/s", "Bus bandwidth vs size",
                          band=False)


def ratios(rows: Rows) -> "Figure":
    """rows: {label, ratio, ci_low, ci_high, verdict} - run / baseline with its 95% CI."""
    fig = _figure(8, max(2.5, 0.3 * len(rows) + 1.2))
    ax = fig.subplots()
    y = np.arange(len(rows))[::-1]
    colours = {"faster": "C2", "slower": "C3", "regression": "C3", "same": "C7",
               "inconclusive": "C1"}
    for yi, r in zip(y, rows, strict=True):
        ax.errorbar(r["ratio"], yi, xerr=[[r["ratio"] - r["ci_low"]], [r["ci_high"] - r["ratio"]]],
                    fmt="o", capsize=3, color=colours.get(r["verdict"], "C0"))
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(y, [r["label"] for r in rows], fontsize="small")
    ax.set_xscale("log")
    ax.set_xlabel("median ratio to the baseline (95% bootstrap interval); < 1 is faster")
    ax.set_title("Run vs baseline")
    return fig


def predicted_vs_measured(rows: Rows) -> "Figure":
    """rows: {label, predicted_us, measured_us} - one pair of bars per metric."""
    fig = _figure()
    ax = fig.subplots()
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["predicted_us"] / 1e3 for r in rows], 0.4, label="predicted")
    ax.bar(x + 0.2, [(r["measured_us"] or 0) / 1e3 for r in rows], 0.4, label="measured")
    ax.set_xticks(x, [r["label"] for r in rows], rotation=30, ha="right", fontsize="small")
    ax.set_yscale("log")
    ax.set_ylabel("ms (median)")
    ax.set_title("Predicted from the sweep vs measured by the replay")
    ax.legend()
    return fig


def plan_layouts(rows: Rows, title: str = "") -> "Figure":
    """rows: {layout, predicted_e2e_us, measured: [{label, e2e_us}]} - a bar per layout, a
    marker per measured replay."""
    fig = _figure()
    ax = fig.subplots()
    x = np.arange(len(rows))
    ax.bar(x, [r["predicted_e2e_us"] / 1e3 for r in rows], 0.6, label="predicted",
           color="#9bb7d4")
    shown = False
    for i, r in enumerate(rows):
        for m in r["measured"]:
            ax.plot(i, m["e2e_us"] / 1e3, "D", color="black",
                    label=None if shown else "measured (replay)")
            ax.annotate(m["label"], (i, m["e2e_us"] / 1e3), textcoords="offset points",
                        xytext=(6, 0), fontsize="small")
            shown = True
    ax.set_xticks(x, [r["layout"] for r in rows])
    values = [r["predicted_e2e_us"] for r in rows] + [m["e2e_us"] for r in rows
                                                      for m in r["measured"]]
    positive = [v / 1e3 for v in values if v > 0]
    if positive and len(positive) == len(values):
        ax.set_yscale("log")
    elif positive:  # replicas with no communication at all: 0 stays on the axis
        ax.set_yscale("symlog", linthresh=min(positive))
    ax.set_ylabel("end to end, ms (communication only)")
    ax.set_title("Layouts" + (f": {title}" if title else ""))
    ax.legend()
    return fig
