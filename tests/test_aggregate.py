"""Rank-max figures from synthetic marks, checked by hand."""

import numpy as np
import pytest

from microbench.replay import aggregate
from microbench.replay.replayer import RankSamples


def samples(rank: int, marks: list[list[float]], prefill_mark: int, level: str = "step"):
    steps = list(range(1, len(marks[0]))) if level == "step" else []
    return RankSamples(rank, 0, "h", level, np.array(marks, dtype=float), prefill_mark, steps,
                       None)


def test_slowest_rank_per_inference_and_per_step():
    # Step level, 1 prefill step + 2 decode steps, 2 inferences, 2 ranks.
    # rank 0 marks: [0, 10, 15, 30] and [0, 12, 14, 16]
    # rank 1 marks: [0, 11, 13, 20] and [0, 9, 20, 22]
    r0 = samples(0, [[0, 10, 15, 30], [0, 12, 14, 16]], prefill_mark=1)
    r1 = samples(1, [[0, 11, 13, 20], [0, 9, 20, 22]], prefill_mark=1)
    figures = aggregate.per_iteration([r0, r1], prefill_steps=1)
    assert figures["prefill_us"].tolist() == [11, 12]
    assert figures["e2e_us"].tolist() == [30, 22]
    # decode = end - end of prefill: rank 0: 20, 4; rank 1: 9, 13 -> max 20, 13
    assert figures["decode_us"].tolist() == [20, 13]
    # step durations rank 0: [10,5,15], [12,2,2]; rank 1: [11,2,7], [9,11,2]
    # rank-max decode steps: [5,15] and [11,2]
    assert figures["decode_steps_us"].tolist() == [[5, 15], [11, 2]]
    head = aggregate.headline(figures, decode_steps=2)
    assert head["prefill_us"] == 11.5 and head["e2e_us"] == 26
    # decode_step_us (results/metrics.py): rank-max decode / steps per inference, 20/2 = 10
    # and 13/2 = 6.5, median 8.25 (the median of the single steps 5, 15, 11, 2 would be 8.0).
    assert head["decode_step_us"] == 8.25
    # p99 of the single steps 2, 5, 11, 15: 11 + 0.97 x (15 - 11) = 14.88 (linear).
    assert head["decode_step_p99_us"] == pytest.approx(14.88)
    rows = aggregate.iteration_rows(figures, decode_steps=2)
    assert [r["decode_step_mean_us"] for r in rows] == [10, 6.5]
    assert rows[0]["decode_step_median_us"] == 10 and rows[1]["decode_step_max_us"] == 11


def test_inference_level_has_no_p99():
    r0 = samples(0, [[0, 4, 10]], prefill_mark=1, level="inference")
    figures = aggregate.per_iteration([r0], prefill_steps=1)
    head = aggregate.headline(figures, decode_steps=3)
    assert head["decode_step_us"] == 2.0 and head["decode_step_p99_us"] is None


def test_by_op_kind_takes_the_slowest_rank():
    # Op level, 3 calls: marks are cumulative; call times rank 0 [1,2,3], rank 1 [2,1,1].
    r0 = samples(0, [[0, 1, 3, 6]], prefill_mark=1, level="op")
    r1 = samples(1, [[0, 2, 3, 4]], prefill_mark=1, level="op")
    kinds = [["allreduce", "allreduce", "gather"], ["allreduce", "allreduce", "gather"]]
    by_op = aggregate.by_op_kind([r0, r1], kinds)
    assert by_op == {"allreduce": {"calls": 2, "time_us": 3.0},
                     "gather": {"calls": 1, "time_us": 3.0}}
