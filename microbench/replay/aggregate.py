"""From every rank's marks to the figures of each inference: the slowest rank's.

Prefill is the communication share of time-to-first-token, a decode step that of
time-per-output-token; statistics are derived from the raw samples, never averaged twice.
"""

from typing import Any

import numpy as np

from microbench.replay.replayer import RankSamples
from microbench.results.metrics import decode_step_us


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


def _median(values: np.ndarray) -> float | None:
    return float(np.median(values)) if values.size else None


def step_durations(samples: RankSamples) -> np.ndarray:
    """[iterations, steps] durations of each step on one rank (step and op levels)."""
    ends = samples.marks[:, samples.step_marks]
    starts = np.concatenate([np.zeros((ends.shape[0], 1)), ends[:, :-1]], axis=1)
    return ends - starts


def _own_end(r: RankSamples) -> np.ndarray:
    """Where the inference's own steps end on a rank: before vLLM's DP wave tail."""
    return r.marks[:, -1 if r.tail_mark is None else r.tail_mark]


def per_iteration(ranks: list[RankSamples], prefill_steps: int) -> dict[str, np.ndarray]:
    """Rank-max figures of each timed inference. Where vLLM's DP ranks run a wave's tail
    after the inference (Phase.WAVE_TAIL), e2e and decode end where the inference's own
    steps do, and `wave_tail_us` is the tail's own time."""
    e2e = np.max([_own_end(r) for r in ranks], axis=0)
    prefill = np.max([r.marks[:, r.prefill_mark] for r in ranks], axis=0)
    decode = np.max([_own_end(r) - r.marks[:, r.prefill_mark] for r in ranks], axis=0)
    figures = {"prefill_us": prefill, "decode_us": decode, "e2e_us": e2e}
    tail = ranks[0].tail_mark is not None
    if tail:
        figures["wave_tail_us"] = np.max([r.marks[:, -1] - _own_end(r) for r in ranks],
                                         axis=0)
    if ranks[0].level != "inference":
        steps = np.max([step_durations(r) for r in ranks], axis=0)
        own = ranks[0].tail_mark if tail else steps.shape[1]
        figures["decode_steps_us"] = steps[:, prefill_steps:own]
    return figures


def iteration_rows(figures: dict[str, np.ndarray], decode_steps: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(len(figures["e2e_us"])):
        row: dict[str, Any] = {"iteration": i,
                               "prefill_us": round(float(figures["prefill_us"][i]), 3),
                               "decode_us": round(float(figures["decode_us"][i]), 3),
                               "e2e_us": round(float(figures["e2e_us"][i]), 3)}
        if "wave_tail_us" in figures:
            row["wave_tail_us"] = round(float(figures["wave_tail_us"][i]), 3)
        if decode_steps:
            # The inference's sample of decode_step_us (results/metrics.py).
            row["decode_step_mean_us"] = round(
                float(decode_step_us(figures["decode_us"][i], decode_steps)), 3)
        steps = figures.get("decode_steps_us")
        if steps is not None and decode_steps:
            # The spread of its single steps (each step's slowest rank).
            row.update(decode_step_median_us=round(float(np.median(steps[i])), 3),
                       decode_step_p99_us=round(float(np.percentile(steps[i], 99)), 3),
                       decode_step_max_us=round(float(steps[i].max()), 3))
        rows.append(row)
    return rows


def headline(figures: dict[str, np.ndarray], decode_steps: int) -> dict[str, float | None]:
    """Medians over timed inferences; decode_step_us as results/metrics.py defines it, its
    p99 over every single step (step and op timing only)."""
    steps = figures.get("decode_steps_us")
    per_inference = (decode_step_us(figures["decode_us"], decode_steps) if decode_steps
                     else np.array([]))
    step_p99 = _pct(steps.ravel(), 99) if steps is not None else None
    head = {"prefill_us": _median(figures["prefill_us"]),
            "decode_us": _median(figures["decode_us"]),
            "decode_step_us": _median(per_inference), "decode_step_p99_us": step_p99,
            "e2e_us": _median(figures["e2e_us"]),
            "e2e_p5_us": _pct(figures["e2e_us"], 5), "e2e_p95_us": _pct(figures["e2e_us"], 95)}
    if "wave_tail_us" in figures:  # vLLM's DP wave after the inference, timed apart
        head["wave_tail_us"] = _median(figures["wave_tail_us"])
    return head


def op_times(samples: RankSamples) -> np.ndarray:
    """[iterations, calls] duration of each call on one rank (op level)."""
    return np.diff(samples.marks, axis=1)


def by_op_kind(ranks: list[RankSamples], kinds_by_rank: list[list[str]]) -> dict[str, Any]:
    """Per op kind: calls per inference and time per inference (median; slowest rank)."""
    kinds = sorted({k for ks in kinds_by_rank for k in ks})
    result = {}
    for kind in kinds:
        per_rank = []
        calls = 0
        for samples, rank_kinds in zip(ranks, kinds_by_rank, strict=True):
            mask = np.array([k == kind for k in rank_kinds], dtype=bool)
            calls = max(calls, int(mask.sum()))
            per_rank.append(op_times(samples)[:, mask].sum(axis=1))
        per_iteration_max = np.max(per_rank, axis=0)
        result[kind] = {"calls": calls, "time_us": _median(per_iteration_max)}
    return result
