"""A request workload over DP ranks for people and tools: how its requests reached the ranks,
the global steps with each rank's step in them (its own, a dummy forward or idle batch, the
wave's tail), per rank its steps and calls, and per request the communication under its
TTFT and TPOT on its own rank (patterns/workload/dp_pattern.py)."""

import json
from typing import Any

from microbench.views.textfmt import format_bytes, plural
from microbench.views.workload import MAX_TEXT_ROWS, _calls, _pct_row, span
from patterns.errors import shown
from patterns.ops import Step
from patterns.tiled import weighted_ops
from patterns.workload.dp_pattern import DUMMY, IDLE, DPWorkloadPattern, dp_figures
from patterns.workload.metrics import PERCENTILES, RequestFigures, percentile, summary

MAX_RANK_COLUMNS = 8  # ranks shown side by side in the table; json and csv carry every one
ROUTING_WORDS = {"least-loaded": "the fewest requests in flight (vLLM's DP load balancer)",
                 "round-robin": "request i to DP rank i mod dp"}


class Sizes:
    """Calls and bytes of each distinct step, found once."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[int, int, Step]] = {}

    def of(self, step: Step) -> tuple[int, int]:
        hit = self.seen.get(id(step))
        if hit is None:
            nbytes = sum(op.bytes * n for op, n in weighted_ops(step.ops))
            hit = self.seen[id(step)] = (len(step.ops), nbytes, step)
        return hit[0], hit[1]


def _kind(p: DPWorkloadPattern, d: int, k: int) -> str:
    g = p.timeline.segments[k] if p.timeline else None
    assert g is not None
    if g.items[d] >= 0:
        return p.rank_schedules[d].segments[g.items[d]].shape.phase.value
    if g.tail and p.filler == DUMMY:
        return "tail"
    return p.filler  # dummy, idle or none


def rank_rows(p: DPWorkloadPattern, sizes: Sizes) -> list[dict[str, Any]]:
    assert p.timeline is not None
    out = []
    for d in range(p.layout.dp):
        counts = {"own": 0, "dummy": 0, "tail": 0}
        calls = nbytes = 0
        for k, g in enumerate(p.timeline.segments):
            kind = _kind(p, d, k)
            counts["tail" if kind == "tail" else "own" if g.items[d] >= 0 else "dummy"] += g.repeat
            c, b = sizes.of(p.rank_steps[d][k])
            calls += c * g.repeat
            nbytes += b * g.repeat
        out.append({"dp_rank": d, "requests": sum(1 for r in p.rank_of if r == d),
                    "own_steps": counts["own"],
                    f"{p.filler}_steps": counts["dummy"], "wave_tail_steps": counts["tail"],
                    "calls": calls, "bytes": nbytes})
    return out


def step_rows(p: DPWorkloadPattern, sizes: Sizes) -> list[dict[str, Any]]:
    assert p.timeline is not None
    rows = []
    for k, g in enumerate(p.timeline.segments):
        ranks = []
        for d in range(p.layout.dp):
            i = g.items[d]
            shape = p.rank_schedules[d].segments[i].shape if i >= 0 else None
            graph = p.rank_graphs[d][k]
            calls, nbytes = sizes.of(p.rank_steps[d][k])
            ranks.append({"kind": _kind(p, d, k), "tokens": shape.tokens if shape else 0,
                          "padded_tokens": graph.tokens, "graph": graph.graph,
                          "prefill_seqs": shape.prefill_seqs if shape else 0,
                          "decode_seqs": shape.decode_seqs if shape else 0,
                          "calls": calls, "bytes": nbytes})
        rows.append({"first_step": g.start, "repeat": g.repeat, "sync": g.sync,
                     "wave_tail": g.tail and p.filler == DUMMY, "ranks": ranks})
    return rows


def figures(p: DPWorkloadPattern, sizes: Sizes) -> dict[str, list[RequestFigures]]:
    return {"bytes": dp_figures(p, lambda d, k: sizes.of(p.rank_steps[d][k])[1]),
            "calls": dp_figures(p, lambda d, k: sizes.of(p.rank_steps[d][k])[0])}


def dp_summary(p: DPWorkloadPattern, sizes: Sizes,
               per: dict[str, list[RequestFigures]]) -> dict[str, Any]:
    assert p.timeline is not None
    tail = [g for g in p.timeline.segments if g.tail and p.filler == DUMMY]
    tail_calls = sum(sizes.of(p.rank_steps[0][p.timeline.segments.index(g)])[0] * g.repeat
                     for g in tail) if tail else 0
    last = p.timeline.segments[-1] if p.timeline.segments else None
    return {"requests": len(p.requests), "source": p.source, "engine": p.engine,
            "dp": p.layout.dp, "dp_routing": p.routing,
            "lockstep": p.filler if p.lockstep else "none",
            "step_time_ms": round(p.rank_schedules[0].step_time_s * 1e3, 6),
            "steps": p.timeline.steps, "segments": len(p.timeline.segments),
            "clock_steps": last.clock + last.repeat if last else 0,
            "waves": p.timeline.waves, "wave_tail_steps": sum(g.repeat for g in tail),
            "wave_tail_calls": tail_calls,
            "ttft_bytes": summary(per["bytes"])["ttft"],
            "tpot_bytes": summary(per["bytes"])["tpot"],
            "ttft_calls": summary(per["calls"])["ttft"],
            "tpot_calls": summary(per["calls"])["tpot"],
            "decode_bytes_per_token": {f"p{q}": percentile(
                [f.tpot * f.decode_steps / (r.output - 1) for r, f in
                 zip(p.requests, per["bytes"], strict=True) if f.tpot is not None], q)
                for q in PERCENTILES}}


def dp_document(p: DPWorkloadPattern) -> dict[str, Any]:
    sizes = Sizes()
    per = figures(p, sizes)
    requests = [{"arrival_s": r.arrival_s, "prompt": r.prompt, "output": r.output,
                 "dp_rank": d, "waited_steps": b.waited_steps, "ttft_steps": b.ttft_steps,
                 "ttft_bytes": b.ttft, "ttft_calls": c.ttft, "decode_steps": b.decode_steps,
                 "tpot_bytes": b.tpot, "tpot_calls": c.tpot}
                for r, d, b, c in zip(p.requests, p.rank_of, per["bytes"], per["calls"],
                                      strict=True)]
    return {**dp_summary(p, sizes, per), "model": p.model.name, "tp": p.layout.tp,
            "ep": p.layout.ep, "dp_ranks": rank_rows(p, sizes), "step_rows": step_rows(p, sizes),
            "per_request": requests}


def _cell(rank: dict[str, Any]) -> str:
    kind = rank["kind"]
    if kind in (DUMMY, IDLE, "tail"):
        return f"{'dummy' if kind == 'tail' else kind} {rank['padded_tokens']}"
    if kind == "none":
        return "-"
    return f"{kind} {rank['tokens']}->{rank['padded_tokens']}"


def dp_text(p: DPWorkloadPattern) -> tuple[str, dict[str, Any]]:
    sizes = Sizes()
    per = figures(p, sizes)
    s = dp_summary(p, sizes, per)
    ranks = rank_rows(p, sizes)
    lay = p.layout
    filler = {DUMMY: "a dummy forward", IDLE: "an idle batch"}.get(p.filler)
    lines = [f"workload: {plural(s['requests'], 'request')} from {shown(p.source, 120)} on "
             f"{p.engine}, {p.model.name} tp{lay.tp} dp{lay.dp}{' ep' if lay.ep else ''}, "
             + (f"step time {s['step_time_ms']} ms" if s["step_time_ms"] else
                "every request arriving at 0"),
             f"requests: prompt {span(r.prompt for r in p.requests)} tokens, output "
             f"{span(r.output for r in p.requests)} tokens",
             f"routing: {p.routing}, {ROUTING_WORDS[p.routing]}: "
             + ", ".join(f"DP rank {r['dp_rank']} {r['requests']:,}" for r in ranks[:8])
             + (", ..." if len(ranks) > 8 else ""),
             f"steps: {s['steps']:,} global ({plural(s['segments'], 'run')}), "
             + (f"every DP rank in each, its own or {filler}" if filler else
                "the DP ranks independent replicas (no call between them)")
             + (f"; {plural(s['waves'], 'wave')}" if p.wave else "")]
    if p.wave:
        lines.append(f"wave tail: {s['wave_tail_steps']:,} dummy forwards, "
                     f"{s['wave_tail_calls']:,} calls a rank (every rank idle until the "
                     "wave's sync every 32 steps finds no request unfinished)")
    if filler:
        lines.append(f"{p.filler} steps beside others' work: " + ", ".join(
            f"DP rank {r['dp_rank']} {r[f'{p.filler}_steps']:,}" for r in ranks[:8])
            + (", ..." if len(ranks) > 8 else ""))
    shown_ranks = min(lay.dp, MAX_RANK_COLUMNS)
    head = f"{'steps':>13} {'wave':>9} " + " ".join(f"{'DP rank ' + str(d):>18}"
                                                      for d in range(shown_ranks))
    lines += ["", head + ("  ..." if lay.dp > shown_ranks else "")]
    rows = step_rows(p, sizes)
    for r in rows[:MAX_TEXT_ROWS]:
        first, end = r["first_step"], r["first_step"] + r["repeat"] - 1
        where = f"{first}" if first == end else f"{first}-{end}"
        cells = " ".join(f"{_cell(x):>18}" for x in r["ranks"][:shown_ranks])
        wave = "+".join(w for w, on in (("tail", r["wave_tail"]), ("sync", r["sync"])) if on)
        lines.append(f"{where:>13} {wave:>9} {cells}")
    if len(rows) > MAX_TEXT_ROWS:
        lines.append(f"  ... {len(rows) - MAX_TEXT_ROWS} more runs (--format json lists all)")
    others = {DUMMY: "dummy", IDLE: "idle"}.get(p.filler, "none")
    lines += ["", f"{'':<12}{'requests':>10}{'own steps':>11}{others:>8}{'tail':>7}"
                  f"{'calls':>14}{'bytes sent':>14}"]
    for r in ranks:
        lines.append(f"{'DP rank ' + str(r['dp_rank']):<12}{r['requests']:>10,}"
                     f"{r['own_steps']:>11,}{r[f'{p.filler}_steps']:>8,}"
                     f"{r['wave_tail_steps']:>7,}{r['calls']:>14,}"
                     f"{format_bytes(r['bytes']):>14}")
    lines += ["", "per request (its own DP rank; TTFT: its prefill-chunk steps summed; TPOT: "
              "per decode step)", f"  {'':<30}" + "".join(f"{'p' + str(q):>14}"
                                                          for q in PERCENTILES),
              _pct_row("TTFT bytes", s["ttft_bytes"], format_bytes),
              _pct_row("TTFT calls", s["ttft_calls"], _calls),
              _pct_row("TPOT bytes per step", s["tpot_bytes"], format_bytes),
              _pct_row("TPOT calls per step", s["tpot_calls"], _calls)]
    return "\n".join(lines), s


def print_dp_workload(p: DPWorkloadPattern, fmt: str) -> int:
    if fmt == "json":
        print(json.dumps(dp_document(p), separators=(",", ":")))
        return 0
    if fmt == "csv":
        sizes = Sizes()
        print("first_step,repeat,sync,wave_tail,dp_rank,kind,tokens,padded_tokens,graph,"
              "prefill_seqs,decode_seqs,calls,bytes")
        for r in step_rows(p, sizes):
            for d, x in enumerate(r["ranks"]):
                print(",".join(str(v) for v in (r["first_step"], r["repeat"], r["sync"],
                                                r["wave_tail"], d, *x.values())))
        return 0
    text, s = dp_text(p)
    print(text)
    print(json.dumps({"engine": p.engine, "model": p.model.name, "tp": p.layout.tp,
                      "dp": p.layout.dp, "ep": p.layout.ep, "requests": s["requests"],
                      "steps": s["steps"], "dp_routing": p.routing,
                      "wave_tail_steps": s["wave_tail_steps"],
                      "ttft_bytes_p50": s["ttft_bytes"]["p50"],
                      "tpot_bytes_p50": s["tpot_bytes"]["p50"]}, separators=(",", ":")))
    return 0
