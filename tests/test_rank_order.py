"""validate --rank-order: a job numbered as Megatron-Core numbers ranks by default
(patterns/rank_order.py; the engine's own trace is judged in tests/test_real_engine_megatron)."""

import pytest

from patterns import Layout
from patterns.rank_order import job_rank, layout_rank


def test_megatron_default_order_puts_pp_outermost():
    # TP2 x PP2 x DP2. Megatron's default: job rank = (stage * 2 + dp) * 2 + tp; infercomm's
    # layout: (dp * 2 + stage) * 2 + tp. Job rank 2 is (stage 0, dp 1, tp 0): layout rank
    # (1 * 2 + 0) * 2 + 0 = 4; job rank 4 is (stage 1, dp 0, tp 0): layout rank 2.
    layout = Layout(tp=2, pp=2, dp=2)
    plays = [layout_rank(layout, r, "tp-dp-pp") for r in range(8)]
    assert plays == [0, 1, 4, 5, 2, 3, 6, 7]
    assert [job_rank(layout, r, "tp-dp-pp") for r in plays] == list(range(8))


@pytest.mark.parametrize("layout", [Layout(tp=2, pp=2), Layout(tp=2, dp=4), Layout(pp=4)])
def test_the_orders_agree_where_dp_or_pp_is_one(layout):
    ranks = range(layout.world_size)
    assert [layout_rank(layout, r, "tp-dp-pp") for r in ranks] == list(ranks)
    assert [job_rank(layout, r, "tp-dp-pp") for r in ranks] == list(ranks)


def test_an_unknown_rank_order_is_refused(cli, tmp_path):
    trace = tmp_path / "rank0.json"
    trace.write_text('{"traceEvents": []}')
    status, out, err = cli("validate", "--trace", str(trace), "--engine", "megatron", "--model",
                           "llama-3.1-8b", "--tp", "2", "--pp", "2", "--dp", "2", "--prompt",
                           "8", "--decode", "2", "--rank-order", "pp-dp-tp")
    assert status == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--rank-order" in lines[0] and "tp-dp-pp" in lines[0], lines
