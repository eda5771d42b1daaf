"""Replay of a request workload: each measured step's time handed to the requests it serves.

Per step the slowest rank's duration, median over the timed inferences (one inference =
every scheduled step of the workload once); per request the sum over the steps of its
prefill chunks (communication under its TTFT) and the mean over its decode steps (under its
TPOT); p50 / p90 / p99 over requests, as `patterns.workload.metrics` takes them. The run
folder gets workload_steps.csv and workload_requests.csv.

Over DP ranks (patterns/workload/dp_pattern.py) a request's steps are the global steps of
its own rank's view. Ranks that step together wait for each other in every step: its time
is the slowest rank's of them all, dummy forwards and idle batches included; independent
replicas each time their own steps (the slowest rank of that DP rank). The wave's tails
(vLLM) are summed apart (`wave_tail_us`).
"""

from typing import Any

import numpy as np

from microbench.replay.aggregate import step_durations
from microbench.replay.replayer import RankSamples
from microbench.views.textfmt import format_us, plural
from patterns.ops import Phase
from patterns.pattern import Pattern
from patterns.workload.metrics import PERCENTILES, percentile


def _decode_mask(schedule: Any) -> np.ndarray:
    mask = np.zeros(schedule.steps, dtype=bool)
    for seg in schedule.segments:
        if seg.shape.phase == Phase.DECODE:
            mask[seg.start:seg.start + seg.repeat] = True
    return mask


def _request_rows(requests: Any, schedule: Any, per_step: np.ndarray) -> list[dict[str, Any]]:
    """Per request of `schedule` (its spans in the steps of `per_step`): TTFT and TPOT."""
    cum = np.concatenate([[0.0], np.cumsum(per_step)])
    decode = _decode_mask(schedule)
    cum_d = np.concatenate([[0.0], np.cumsum(np.where(decode, per_step, 0.0))])
    n_d = np.concatenate([[0], np.cumsum(decode)])
    rows = []
    for r, span in zip(requests, schedule.spans, strict=True):
        a, b = span.prefill
        c, d = span.decode
        tpot = None
        if schedule.decode_in_mixed and d > c:
            tpot = float(cum[d] - cum[c]) / (d - c)
        elif not schedule.decode_in_mixed and d > c and n_d[d] > n_d[c]:
            tpot = float(cum_d[d] - cum_d[c]) / float(n_d[d] - n_d[c])
        rows.append({"arrival_s": r.arrival_s, "prompt": r.prompt, "output": r.output,
                     "ttft_steps": b - a, "ttft_comm_us": _round(float(cum[b] - cum[a])),
                     "tpot_comm_us": _round(tpot)})
    return rows


def _dp_rows(pattern: Any, ranks: list[RankSamples]) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Per global step its time (module doc: the slowest rank's of all when the ranks step
    together, else each DP rank's own), and per request its row, on its rank's view."""
    durations = [step_durations(r) for r in ranks]
    lay = pattern.layout
    per_rank = []
    for d in range(lay.dp):
        mine = durations if pattern.lockstep else [
            t for r, t in zip(ranks, durations, strict=True) if lay.dp_rank_of(r.rank) == d]
        per_rank.append(np.median(np.max(mine, axis=0), axis=0))
    rows: list[list[dict[str, Any]]] = []
    for d, view in enumerate(pattern.views):
        mine = [r for r, k in zip(pattern.requests, pattern.rank_of, strict=True) if k == d]
        rows.append(_request_rows(mine, view, per_rank[d]))
    out, seen = [], [0] * lay.dp
    for d in pattern.rank_of:
        out.append({**rows[d][seen[d]], "dp_rank": d})
        seen[d] += 1
    return np.max(per_rank, axis=0), out


def workload_times(pattern: Pattern, ranks: list[RankSamples],
                   files: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The per-request figures of a workload replay; None for any other pattern. With
    `files`, adds workload_steps.csv (per run of equal steps: tokens and the median step
    time) and workload_requests.csv (per request: its figures) to the run's files."""
    schedule = getattr(pattern, "schedule", None)
    if schedule is None:
        return None
    if ranks[0].level == "inference":
        return {"note": "per-request figures need --timing step or op"}
    dp = hasattr(pattern, "views")  # requests over DP ranks
    if dp:
        per_step, requests = _dp_rows(pattern, ranks)
    else:
        per_step = np.median(np.max([step_durations(r) for r in ranks], axis=0), axis=0)
    if per_step.size != schedule.steps:  # the plan and the schedule disagree: a bug
        raise AssertionError(f"{per_step.size} timed steps for {schedule.steps} scheduled")
    if not dp:
        requests = _request_rows(pattern.requests, schedule, per_step)
    if files is not None:
        from microbench.results.store import csv_text
        steps = [{"first_step": seg.start, "repeat": seg.repeat,
                  "phase": seg.shape.phase.value, "tokens": seg.shape.tokens,
                  "padded_tokens": graph.tokens, "graph": graph.graph,
                  "step_us_median": _round(float(np.median(
                      per_step[seg.start:seg.start + seg.repeat])))}
                 for seg, graph in zip(schedule.segments, pattern.step_graphs, strict=True)]
        files["workload_steps.csv"] = csv_text(steps)
        files["workload_requests.csv"] = csv_text(requests)
    ttft = [q["ttft_comm_us"] for q in requests]
    tpot = [q["tpot_comm_us"] for q in requests if q["tpot_comm_us"] is not None]
    out = {"requests": len(schedule.spans), "steps": schedule.steps,
           "ttft_comm_us": {f"p{p}": _round(percentile(ttft, p)) for p in PERCENTILES},
           "tpot_comm_us": {f"p{p}": _round(percentile(tpot, p)) for p in PERCENTILES},
           "step_us_median": _round(float(np.median(per_step)))}
    if dp:
        tail = [g for g in pattern.timeline.segments if g.tail and pattern.wave]
        out.update(dp=pattern.layout.dp, dp_routing=pattern.routing,
                   wave_tail_steps=sum(g.repeat for g in tail),
                   wave_tail_us=_round(float(sum(per_step[g.start:g.start + g.repeat].sum()
                                                 for g in tail))))
    return out


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def workload_lines(figures: dict[str, Any]) -> list[str]:
    if "note" in figures:
        return [f"workload: {figures['note']}"]
    head = "".join(f"{'p' + str(p):>12}" for p in PERCENTILES)
    lines = ["(a workload's prefill chunks and decodes share steps: the rows above take its "
             "first steps as the prefill; read the figures per request below)",
             f"per request ({plural(figures['requests'], 'request')}, "
             f"{plural(figures['steps'], 'step')}; each step's slowest rank, median over "
             "inferences):", f"{'':<34}{head}"]
    for key, name in (("ttft_comm_us", "communication under TTFT"),
                      ("tpot_comm_us", "communication per TPOT step")):
        cells = "".join(f"{'-' if v is None else format_us(v):>12}"
                        for v in figures[key].values())
        lines.append(f"{name:<34}{cells}")
    if "dp" in figures:
        lines.append(f"DP: {figures['dp']} ranks, requests routed {figures['dp_routing']}; "
                     f"the waves' tails: {plural(figures['wave_tail_steps'], 'dummy forward')},"
                     f" {format_us(figures['wave_tail_us'])} of communication in all")
    return lines
