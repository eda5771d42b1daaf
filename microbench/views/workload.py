"""A workload pattern for people and tools: its steps (token count, CUDA graph, calls and
bytes of one rank) and, per request, the communication under its TTFT and TPOT."""

import json
from collections.abc import Iterable
from typing import Any

from microbench.argtypes import UsageError
from microbench.views.textfmt import format_bytes, plural
from patterns.errors import shown
from patterns.workload.metrics import (
    PERCENTILES,
    RequestFigures,
    percentile,
    request_figures,
    summary,
)
from patterns.workload.steps import WorkloadPattern

MAX_TEXT_ROWS = 40  # step rows printed in the table; json and csv carry every one


def step_calls(p: WorkloadPattern, i: int) -> int:
    return len(p.segment_steps[i].ops)


def step_bytes(p: WorkloadPattern, i: int) -> int:
    return sum(op.bytes for op in p.segment_steps[i].ops)


def step_rows(p: WorkloadPattern) -> list[dict[str, Any]]:
    assert p.schedule is not None
    rows = []
    for i, (seg, graph) in enumerate(zip(p.schedule.segments, p.step_graphs, strict=True)):
        rows.append({"first_step": seg.start, "repeat": seg.repeat, "phase": seg.shape.phase.value,
                     "tokens": seg.shape.tokens, "padded_tokens": graph.tokens,
                     "graph": graph.graph, "prefill_tokens": seg.shape.prefill_tokens,
                     "prefill_seqs": seg.shape.prefill_seqs,
                     "decode_seqs": seg.shape.decode_seqs,
                     "calls": step_calls(p, i), "bytes": step_bytes(p, i)})
    return rows


def figures(p: WorkloadPattern) -> dict[str, list[RequestFigures]]:
    assert p.schedule is not None
    return {"bytes": request_figures(p.schedule, lambda i: step_bytes(p, i)),
            "calls": request_figures(p.schedule, lambda i: step_calls(p, i))}


def workload_summary(p: WorkloadPattern,
                     per: dict[str, list[RequestFigures]] | None = None) -> dict[str, Any]:
    """`per`: figures(p) where the caller has them already (10^6 requests: seconds each)."""
    assert p.schedule is not None
    s = p.schedule
    per = per or figures(p)
    return {"requests": len(s.spans), "source": p.source, "engine": p.engine,
            "step_time_ms": round(s.step_time_s * 1e3, 6), "steps": s.steps,
            "segments": len(s.segments), "clock_steps": s.clock_steps,
            "speculative": p.spec or None,
            "ttft_bytes": summary(per["bytes"])["ttft"],
            "tpot_bytes": summary(per["bytes"])["tpot"],
            "ttft_calls": summary(per["calls"])["ttft"],
            "tpot_calls": summary(per["calls"])["tpot"],
            "decode_bytes_per_token": {f"p{q}": percentile(per_token(p, per["bytes"]), q)
                                       for q in PERCENTILES}}


def per_token(p: WorkloadPattern, figs: list[RequestFigures]) -> list[float]:
    """Decode communication per output token after the first: TPOT's per step, times the
    steps, over the tokens they yield (several a step under speculative decoding)."""
    return [f.tpot * f.decode_steps / (r.output - 1)
            for r, f in zip(p.requests, figs, strict=True) if f.tpot is not None]


def workload_document(p: WorkloadPattern) -> dict[str, Any]:
    per = figures(p)
    requests = [{"arrival_s": r.arrival_s, "prompt": r.prompt, "output": r.output,
                 "waited_steps": b.waited_steps, "ttft_steps": b.ttft_steps,
                 "ttft_bytes": b.ttft, "ttft_calls": c.ttft,
                 "decode_steps": b.decode_steps, "tpot_bytes": b.tpot, "tpot_calls": c.tpot,
                 # per output token after the first: with speculation a step yields several
                 "decode_bytes_per_token": (b.tpot * b.decode_steps / (r.output - 1)
                                            if b.tpot is not None else None)}
                for r, b, c in zip(p.requests, per["bytes"], per["calls"], strict=True)]
    return {**workload_summary(p, per), "model": p.model.name, "tp": p.layout.tp,
            "step_rows": step_rows(p), "per_request": requests}


def _calls(value: float) -> str:
    """A percentile of call counts over requests, as a count: interpolated between two
    requests it can fall between counts (315.9), which no request issued."""
    return f"{value:,.0f}"


def span(values: Iterable[int]) -> str:
    """'200..3000', or '128' when every request has the same."""
    lo, hi = minmax(values)
    return f"{lo:,}" if lo == hi else f"{lo:,}..{hi:,}"


def minmax(values: Iterable[int]) -> tuple[int, int]:
    lo = hi = None
    for v in values:
        lo = v if lo is None or v < lo else lo
        hi = v if hi is None or v > hi else hi
    assert lo is not None and hi is not None
    return lo, hi


def _pct_row(name: str, values: dict[str, float | None], fmt: Any) -> str:
    cells = [fmt(values[f"p{q}"]) if values[f"p{q}"] is not None else "-" for q in PERCENTILES]
    return f"  {name:<30}" + "".join(f"{c:>14}" for c in cells)


def workload_text(p: WorkloadPattern, s: dict[str, Any] | None = None) -> str:
    s = s or workload_summary(p)
    rows = step_rows(p)
    lines = [f"workload: {plural(s['requests'], 'request')} from {shown(p.source, 120)} on "
             f"{p.engine}, {p.model.name} tp{p.layout.tp}, step time {s['step_time_ms']} ms"
             + (f", speculative {p.spec}" if p.spec else ""),
             f"requests: prompt {span(r.prompt for r in p.requests)} tokens, output "
             f"{span(r.output for r in p.requests)} tokens",
             f"steps: {s['steps']:,} issued ({plural(s['segments'], 'run')} of equal steps), "
             f"{s['clock_steps']:,} steps of clock", "",
             f"{'steps':>17} {'phase':>8} {'tokens':>7} {'padded':>7} {'graph':>9} "
             f"{'prefill':>8} {'decodes':>8} {'calls':>6} {'bytes/rank':>11}"]
    for r in rows[:MAX_TEXT_ROWS]:
        first, last = r["first_step"], r["first_step"] + r["repeat"] - 1
        where = f"{first}" if first == last else f"{first}-{last}"
        lines.append(f"{where:>17} {r['phase']:>8} {r['tokens']:>7} {r['padded_tokens']:>7} "
                     f"{r['graph']:>9} {r['prefill_seqs']:>8} {r['decode_seqs']:>8} "
                     f"{r['calls']:>6} {format_bytes(r['bytes']):>11}")
    if len(rows) > MAX_TEXT_ROWS:
        lines.append(f"  ... {len(rows) - MAX_TEXT_ROWS} more runs (--format json lists all)")
    lines += ["", "per request (one rank; TTFT: its prefill-chunk steps summed; TPOT: per "
              "decode step)", f"  {'':<30}" + "".join(f"{'p' + str(q):>14}" for q in PERCENTILES),
              _pct_row("TTFT bytes", s["ttft_bytes"], format_bytes),
              _pct_row("TTFT calls", s["ttft_calls"], _calls),
              _pct_row("TPOT bytes per step", s["tpot_bytes"], format_bytes),
              _pct_row("TPOT calls per step", s["tpot_calls"], _calls),
              _pct_row("decode bytes per output token", s["decode_bytes_per_token"],
                       format_bytes)]
    return "\n".join(lines)


def print_workload(p: WorkloadPattern, fmt: str, steps: bool = False) -> int:
    if steps:  # one batch's ordered calls; a workload's steps are its table's rows
        raise UsageError("--steps lists one batch's ordered calls; a workload's steps are the "
                         "rows of its table (--format json: step_rows); drop --steps")
    if fmt == "json":
        print(json.dumps(workload_document(p), separators=(",", ":")))
        return 0
    if fmt == "csv":
        rows = step_rows(p)
        print(",".join(rows[0]))
        for r in rows:
            print(",".join(str(v) for v in r.values()))
        return 0
    s = workload_summary(p)
    print(workload_text(p, s))
    print(json.dumps({"engine": p.engine, "model": p.model.name, "tp": p.layout.tp,
                      "requests": s["requests"], "steps": s["steps"],
                      "ttft_bytes_p50": s["ttft_bytes"]["p50"],
                      "tpot_bytes_p50": s["tpot_bytes"]["p50"]}, separators=(",", ":")))
    return 0
