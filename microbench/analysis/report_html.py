"""The report as one self-contained HTML page: its tables, and its figures inlined as PNG
(the tables and figures themselves: `report.py`)."""

import base64
import html
import io
import re
from typing import Any

from microbench.analysis.compare import verdict_label
from microbench.analysis.heading import run_heading, runs_heading
from microbench.analysis.report import Entry
from microbench.results.runs import RunFolder
from microbench.views.textfmt import format_bytes, format_us


def png_bytes(figure: Any) -> bytes:
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return out.getvalue()


CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}td,th{border:1px solid #ccc;
padding:3px 8px;text-align:left}th{background:#f3f3f3}td.n{text-align:right}
figure{margin:1.5em 0}img{max-width:100%}figcaption{color:#555;font-size:0.9em}
code{background:#f3f3f3;padding:0 3px}"""


def _cell(value: Any) -> str:
    """Numbers (and times, ratios, intervals) right-aligned, text left-aligned."""
    text = str(value)
    numeric = bool(re.fullmatch(r"[\[\-+]?[\d.,]+(?:, [\d.,]+\])?\s*[a-zA-Z%]{0,3}", text))
    return f"<td class='n'>{html.escape(text)}</td>" if numeric else f"<td>{html.escape(text)}</td>"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(c) for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _us(value: Any) -> str:
    return "-" if value is None else format_us(float(value))


def _ratio(row: dict[str, Any]) -> str:
    if row["measured_us"] is None or not row["predicted_us"]:
        return "-"
    return f"{row['measured_us'] / row['predicted_us']:.2f}"


def render_html(entries: list[Entry], tables: dict[str, Any]) -> str:
    runs: list[tuple[str, RunFolder]] = tables["runs"]
    # one run: the page says what ran (model, layout, workload, versions, hosts) in its title
    # several: what they share, then the runs by name
    head = html.escape(run_heading(runs[0][1]) if len(runs) == 1 else
                       runs_heading([run for _, run in runs], [label for label, _ in runs]))
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{head}"
             f"</title><style>{CSS}</style></head><body><h1>{head}</h1>",
             "<h2>Runs</h2>",
             _table(["", "folder", "kind", "backend", "created (UTC)", "git"],
                    [[label, run.name, run.kind, run.describe(),
                      run.meta.get("created_utc", ""), run.meta.get("git_commit") or ""]
                     for label, run in runs])]
    if "phases" in tables:
        parts.append("<h2>Communication of one inference</h2>")
        parts.append(_table(["run", "prefill", "decode step", "end to end"],
                            [[r["label"], _us(r.get("prefill_us")),
                              _us(r.get("decode_step_us")), _us(r.get("e2e_us"))]
                             for r in tables["phases"]]))
    if "kv_transfers" in tables:
        parts.append("<h2>KV transfer of one request</h2>")
        parts.append(_table(["run", "layouts", "connector", "transport", "bytes", "median",
                             "p5", "p95"],
                            [[r["label"], str(r["disagg"]), str(r["connector"]),
                              str(r["kv_transport"]), format_bytes(float(r["bytes"] or 0)),
                              _us(r["median_us"]), _us(r["p5_us"]), _us(r["p95_us"])]
                             for r in tables["kv_transfers"]]))
    if "comparisons" in tables:
        parts.append("<h2>Run vs baseline</h2>")
        parts.append(_table(["metric", "baseline", "run", "ratio", "95% CI", "verdict"],
                            [[c["label"], _us(c["a_median_us"]), _us(c["b_median_us"]),
                              f"{c['ratio']:.3f}", f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}]",
                              verdict_label(c)]
                             for c in tables["comparisons"]]))
    if "predicted" in tables:
        parts.append("<h2>Predicted vs measured</h2>")
        parts.append(_table(["run", "metric", "predicted", "measured", "measured / predicted"],
                            [[r["run"], r["metric"], _us(r["predicted_us"]),
                              _us(r["measured_us"]), _ratio(r)] for r in tables["predicted"]]))
    if "plan" in tables:
        parts.append("<h2>Layouts (plan)</h2>")
        parts.append("<p>Communication only: the floor under TTFT and TPOT that no kernel "
                     "removes. Predicted in the replay's order, so measured replays can be "
                     "read against it.</p>")
        parts.append(_table(["pattern", "layout", "prefill", "decode step", "end to end",
                             "measured end to end"],
                            [[r["group"], r["layout"], _us(r["predicted_prefill_us"]),
                              _us(r["predicted_decode_step_us"]), _us(r["predicted_e2e_us"]),
                              ", ".join(f"{m['label']} {_us(m['e2e_us'])}"
                                        for m in r["measured"]) or "-"]
                             for r in tables["plan"]]))
    for note in tables["notes"]:
        parts.append(f"<p>Note: {html.escape(note)}</p>")
    parts.append("<h2>Figures</h2>")
    for e in entries:
        data = base64.b64encode(png_bytes(e.figure)).decode("ascii")
        parts.append(f"<figure><img alt='{html.escape(e.title)}' src='data:image/png;base64,"
                     f"{data}'><figcaption><b>{html.escape(e.title)}.</b> "
                     f"{html.escape(e.caption)}</figcaption></figure>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
