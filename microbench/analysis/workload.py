"""predict and plan over a request workload: each scheduled step priced from a sweep, and per
request the predicted communication under its TTFT and TPOT (p50 / p90 / p99).

A workload runs at pp 1 on one replica (patterns/workload/steps.py), so a step's
communication is its calls back to back on one stage: the sum of their fitted times, as
`analysis.predict.simulate` adds them at pp 1. The step time that turns arrivals into steps
is the user's `--step-time-ms`; predict prices communication only and does not supply it.
"""

import json
from pathlib import Path
from typing import Any

from microbench.analysis.costs import Costs
from microbench.analysis.fits import Topology
from microbench.views.textfmt import format_us, plural
from patterns.ops import Phase
from patterns.pattern import Pattern
from patterns.workload.metrics import PERCENTILES, request_figures, summary


def step_times_us(pattern: Any, topology: Topology) -> list[float]:
    """Predicted communication of one step of each segment of the schedule."""
    costs = Costs(pattern, topology)
    return [sum(costs.of(0, 0, op).busy_us for op in step.ops)
            for step in pattern.segment_steps]


def predict_workload(pattern: Pattern, topology: Topology) -> dict[str, Any] | None:
    """Per-request figures of a workload pattern; None for any other pattern. Over DP
    ranks: analysis/dp_workload.py."""
    schedule = getattr(pattern, "schedule", None)
    if schedule is None:
        return None
    if hasattr(pattern, "rank_steps"):
        from microbench.analysis.dp_workload import predict_dp_workload
        return predict_dp_workload(pattern, topology)  # type: ignore[arg-type]
    per_step = step_times_us(pattern, topology)
    figs = request_figures(schedule, lambda i: per_step[i])
    pct = summary(figs)
    total = sum(t * seg.repeat for t, seg in zip(per_step, schedule.segments, strict=True))
    return {"requests": len(schedule.spans), "steps": schedule.steps,
            "all_steps_us": round(total, 3),
            "ttft_comm_us": {k: _r(v) for k, v in pct["ttft"].items()},
            "tpot_comm_us": {k: _r(v) for k, v in pct["tpot"].items()}}


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def measured_workload(replay_dir: Path) -> dict[str, Any] | None:
    """The per-request figures a workload replay measured (its summary.json), if any."""
    try:
        summary = json.loads((replay_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    w = summary.get("workload")
    return w if isinstance(w, dict) and "ttft_comm_us" in w else None


def workload_lines(w: dict[str, Any], measured: dict[str, Any] | None = None) -> list[str]:
    head = "".join(f"{'p' + str(p):>12}" for p in PERCENTILES)
    lines = [f"per request ({plural(w['requests'], 'request')}, {plural(w['steps'], 'step')}, "
             f"all steps {format_us(w['all_steps_us'])} of communication):",
             f"{'':<46}{head}"]
    for key, name in (("ttft_comm_us", "communication under TTFT"),
                      ("tpot_comm_us", "communication per TPOT step")):
        sides = [("predicted", w)] + ([("measured", measured)] if measured else [])
        for side, figures in sides:
            label = f"{name}, {side}" if measured else name
            lines.append(f"{label:<46}" + "".join(
                f"{'-' if v is None else format_us(v):>12}" for v in figures[key].values()))
    if "dp" in w:
        lines.append(f"DP: {w['dp']} ranks, requests routed {w['dp_routing']}; the waves' "
                     f"tails: {plural(w['wave_tail_steps'], 'dummy forward')}, "
                     f"{format_us(w['wave_tail_us'])} of communication")
    return lines


def kv_tokens(pattern: Pattern) -> int:
    """Tokens a DP rank caches at its fullest: a batch's B x (Sp + Sd) (the largest DP
    rank's under --dp-batches); a workload's peak over its steps of the prompt and output of
    every request admitted and not yet finished (each counted at its full length)."""
    schedule = getattr(pattern, "schedule", None)
    if schedule is None:
        w = pattern.workload
        return max(w.dp_batches or (w.batch,)) * (w.prompt + w.decode)
    if hasattr(pattern, "rank_steps"):  # over DP ranks: the fullest rank's
        from microbench.analysis.dp_workload import dp_kv_tokens
        return dp_kv_tokens(pattern)  # type: ignore[arg-type]
    events: dict[int, int] = {}
    for span, request in zip(schedule.spans, pattern.requests, strict=True):
        start = span.prefill[0]
        end = max(span.prefill[1], span.decode[1])
        size = request.prompt + request.output
        events[start] = events.get(start, 0) + size
        events[end] = events.get(end, 0) - size
    peak = held = 0
    for step in sorted(events):
        held += events[step]
        peak = max(peak, held)
    return peak


def prefill_budget(pattern: Pattern) -> int | None:
    """The tokens a prefill step takes under chunked prefill, read off the engine's steps:
    the first prefill step's T of a replica that prefills in several steps (its first chunk
    is a whole budget: vLLM captures the budget itself as a graph size, so T is not padded);
    None where every replica prefills in one step."""
    # each distinct replica once: a dense model's dp replicas are one object repeated, and
    # walking them all made a plan's cost grow with the GPUs
    for stages in {id(r): r for r in pattern.replicas()}.values():
        prefill = [run for run in stages[0] if run.phase == Phase.PREFILL]
        if sum(run.repeat for run in prefill) > 1:
            return prefill[0].step.tokens
    return None


def plan_figures(pattern: Pattern, topology: Topology, prefill: float, step: float,
                 predicted: dict[str, float], gpu: str,
                 ) -> tuple[float, float, dict[str, float], tuple[float, float, float]]:
    """What `plan` ranks a layout by, and the compute floors of the same three figures
    (analysis/compute.py). Over a workload (--requests): the p90 over requests of the
    communication under TTFT and per TPOT step, all its steps' communication end to end,
    and the floors of the same (each step's own floor, summed and averaged alike); any other
    pattern keeps its prefill, decode step and end to end, with the floors of its batch."""
    from microbench.analysis.compute import compute_floor, step_floor_us
    model, layout = pattern.model, pattern.layout
    dtype = pattern.workload.dtype or model.default_dtype
    w = predict_workload(pattern, topology)
    if w is None:
        work = pattern.workload
        batch = max(work.dp_batches or (work.batch,))
        floor = compute_floor(model, layout, dtype, gpu, batch, work.prompt, work.decode,
                              prefill_budget(pattern))
        return prefill, step, predicted, (
            floor.prefill_us, floor.decode_step_us,
            floor.prefill_us + work.decode_steps * floor.decode_step_us)
    requests = pattern.requests
    context = sum(r.prompt + r.output / 2 for r in requests) / len(requests)
    schedule = pattern.schedule
    per_step = []
    for seg in schedule.segments:
        shape = seg.shape
        chunk = shape.prefill_tokens / shape.prefill_seqs if shape.prefill_seqs else 0
        per_step.append(step_floor_us(model, layout, dtype, gpu, shape.prefill_tokens,
                                      shape.prefill_tokens * chunk / 2,
                                      shape.decode_seqs * shape.decode_tokens, context))
    pct = summary(request_figures(schedule, lambda i: per_step[i]))
    total = sum(t * seg.repeat for t, seg in zip(per_step, schedule.segments, strict=True))
    return (w["ttft_comm_us"]["p90"] or 0.0, w["tpot_comm_us"]["p90"] or 0.0,
            {**predicted, "e2e_us": w["all_steps_us"]},
            (pct["ttft"]["p90"] or 0.0, pct["tpot"]["p90"] or 0.0, total))
