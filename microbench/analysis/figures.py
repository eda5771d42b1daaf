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


HEADROOM = 1.18  # linear axes end this far above the tallest bar, whisker or marker


def _top(ax: "Axes", highest: float, log: bool = False) -> None:
    """Room above the tallest artist (a marker, whisker or label is never cut at the top)."""
    if highest > 0:
        ax.set_ylim(top=highest * (3.0 if log else HEADROOM))


def _legend_below(fig: "Figure", ax: "Axes", ncols: int) -> None:
    # run names are long ("mpi-host, MPICH 5.0.2"): a key under the plots, not x tick labels
    handles, names = ax.get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=max(1, min(ncols, 3)),
               fontsize="small")


def phase_times(rows: Rows) -> "Figure":
    """rows: {label, METRIC: median, METRIC_p5, METRIC_p95} for each of PHASES, per run."""
    fig = _figure(10, 3.6 + 0.25 * ((len(rows) + 2) // 3))
    axes = fig.subplots(1, len(PHASES))
    for ax, (key, name) in zip(axes, PHASES, strict=True):
        med = np.array([r.get(key) or 0.0 for r in rows]) / 1e3
        low = np.array([r.get(f"{key}_p5", r.get(key)) or 0.0 for r in rows]) / 1e3
        high = np.array([r.get(f"{key}_p95", r.get(key)) or 0.0 for r in rows]) / 1e3
        for i, r in enumerate(rows):
            ax.bar(i, med[i], color=f"C{i % 10}", yerr=[[med[i] - low[i]], [high[i] - med[i]]],
                   capsize=4, label=r["label"])
        ax.set_xticks([])
        _top(ax, float(high.max(initial=0.0)))
        ax.set_ylim(bottom=0)
        ax.set_title(name)
        ax.set_ylabel("ms (median, p5-p95)")
    _legend_below(fig, axes[0], len(rows))
    fig.suptitle("Communication time of one inference (slowest rank)")
    return fig


def op_kind_times(rows: Rows) -> "Figure":
    """rows: {label, kind, time_us} - time per inference spent in each op kind."""
    fig = _figure()
    ax = fig.subplots()
    labels = list(dict.fromkeys(r["label"] for r in rows))
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    width = 0.8 / max(1, len(labels))
    highest = 0.0
    for i, label in enumerate(labels):
        values = [next((r["time_us"] / 1e3 for r in rows
                        if r["label"] == label and r["kind"] == k), 0.0) for k in kinds]
        ax.bar(np.arange(len(kinds)) + i * width, values, width, label=label)
        highest = max(highest, *values)
    ax.set_xticks(np.arange(len(kinds)) + width * (len(labels) - 1) / 2, kinds)
    _top(ax, highest)
    ax.set_ylabel("ms per inference (median)")
    ax.set_title("Time per op kind (each kind's slowest rank)")
    _legend_below(fig, ax, len(labels))
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
    _top(ax, float(bottom.max(initial=0.0)), log=True)  # room for the legend above the bars
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
    for x, total in enumerate(bottom):  # a layout with no traffic still shows its 0
        ax.annotate(f"{total:.3g} MiB" if total else "0 (no communication)", (x, total),
                    textcoords="offset points", xytext=(0, 3), ha="center", fontsize="small")
    _top(ax, float(bottom.max(initial=0.0)))
    ax.set_ylabel("MiB per inference, every call once")
    ax.set_title("Bus volume by layout" + (f": {title}" if title else ""))
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
    """rows: {label, ratio, ci_low, ci_high, verdict} - run / baseline with its 95% CI. Labels
    "METRIC: RUN / BASELINE" that all name one pair say it once, in the title."""
    fig = _figure(9, max(2.5, 0.3 * len(rows) + 1.4))
    ax = fig.subplots()
    y = np.arange(len(rows))[::-1]
    colours = {"faster": "C2", "slower": "C3", "regression": "C3", "same": "C7",
               "inconclusive": "C1"}
    for yi, r in zip(y, rows, strict=True):
        ax.errorbar(r["ratio"], yi, xerr=[[r["ratio"] - r["ci_low"]], [r["ci_high"] - r["ratio"]]],
                    fmt="o", capsize=3, color=colours.get(r["verdict"], "C0"))
    ax.axvline(1.0, color="black", linewidth=0.8)
    pairs = {str(r["label"]).partition(": ")[2] for r in rows}
    one_pair = len(pairs) == 1 and "" not in pairs
    ax.set_yticks(y, [str(r["label"]).partition(": ")[0] if one_pair else r["label"]
                      for r in rows], fontsize="small")
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xscale("log")
    ax.set_xlabel("ratio of medians, 95% bootstrap interval (< 1 faster)")
    ax.set_title("Run vs baseline" + (f": {pairs.pop()}" if one_pair else ""),
                 fontsize="medium")
    return fig


def predicted_vs_measured(rows: Rows) -> "Figure":
    """rows: {run, metric, predicted_us, measured_us} - measured / predicted per metric, a bar
    per run, and the 1.0 line where the prediction is exact. Rows with nothing measured or a
    prediction of 0 have no ratio and are left out."""
    fig = _figure(9, 4.2)
    ax = fig.subplots()
    shown = [r for r in rows if r.get("measured_us") is not None and r["predicted_us"] > 0]
    metrics = list(dict.fromkeys(r["metric"] for r in shown))
    runs = list(dict.fromkeys(r["run"] for r in shown))
    width = 0.8 / max(1, len(runs))
    highest, lowest = 1.0, 1.0
    for i, run in enumerate(runs):
        mine = {r["metric"]: r["measured_us"] / r["predicted_us"] for r in shown
                if r["run"] == run}
        x = [j + i * width for j, m in enumerate(metrics) if m in mine]
        values = [mine[m] for m in metrics if m in mine]
        ax.bar(x, values, width, color=f"C{i % 10}", label=run)
        for xi, v in zip(x, values, strict=True):
            ax.annotate(f"{v:.2f}", (xi, v), textcoords="offset points", xytext=(0, 2),
                        ha="center", fontsize="x-small")
        highest, lowest = max(highest, *values), min(lowest, *values)
    ax.axhline(1.0, color="black", linewidth=1.0, linestyle="--", label="exact (1.0)")
    ax.set_xticks(np.arange(len(metrics)) + width * (len(runs) - 1) / 2, metrics,
                  rotation=20, ha="right")
    if highest > 5 * lowest:  # x0.8 and x30 in one figure: ratios on a log axis
        ax.set_yscale("log")
        ax.set_ylim(lowest / 1.5, highest * 3.0)
    else:
        ax.set_ylim(0, highest * HEADROOM)
    ax.set_ylabel("measured / predicted (medians)")
    ax.set_title("Replay measured against the sweep's prediction; above 1 slower than predicted")
    _legend_below(fig, ax, len(runs) + 1)
    return fig


def plan_layouts(rows: Rows, title: str = "") -> "Figure":
    """rows: {layout, predicted_e2e_us, measured: [{label, e2e_us}]} - a bar per layout, a
    marker per measured replay, each bar's value written above it. A layout with no
    communication (replicas of a dense model) prices at 0: the axis is then linear, so its 0
    sits on the axis and is said in words, not lost below a log axis."""
    from microbench.views.textfmt import format_us
    fig = _figure()
    ax = fig.subplots()
    x = np.arange(len(rows))
    predicted = [r["predicted_e2e_us"] / 1e3 for r in rows]
    ax.bar(x, predicted, 0.6, label="predicted", color="#9bb7d4")
    measured = [(i, m) for i, r in enumerate(rows) for m in r["measured"]]
    for k, (i, m) in enumerate(measured):
        ax.plot(i, m["e2e_us"] / 1e3, "D", color=f"C{k % 10}", label=f"measured: {m['label']}")
    values = predicted + [m["e2e_us"] / 1e3 for _, m in measured]
    log = min(values, default=0.0) > 0 and max(values) > 100 * min(values)
    if log:
        ax.set_yscale("log")
    for i, (r, v) in enumerate(zip(rows, predicted, strict=True)):
        ax.annotate(format_us(r["predicted_e2e_us"]) if v else "0: no communication",
                    (i, v if v or log else 0.0), textcoords="offset points", xytext=(0, 3),
                    ha="center", fontsize="small")
    ax.set_xticks(x, [r["layout"] for r in rows])
    if not log:
        ax.set_ylim(bottom=0)
    _top(ax, max(values, default=0.0), log=log)
    ax.set_ylabel("end to end, ms (communication only)")
    ax.set_title("Layouts" + (f": {title}" if title else ""))
    _legend_below(fig, ax, 1 + len(measured))
    return fig
