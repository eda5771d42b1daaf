"""Alpha-beta costs of the all-reduce algorithms, hand-computed, and plan --allreduce-algo."""

import json

import pytest

from microbench.analysis.algo_costs import AlgoFits, algo_cost, group_nodes, linear
from microbench.analysis.fits import Fit, Piece
from microbench.argtypes import UsageError

A, B = 10.0, 0.001  # alpha 10 us, beta 1 ns a byte
M = 1 << 20  # 1 MiB


def t(algo, n, nodes=None, inter=None):
    return algo_cost(algo, n, M, nodes, linear(A, B), inter)


def test_ring_is_2_p_minus_1_steps_of_m_over_p():
    # p = 4: 6 steps x (10 + 0.001 x 262144) = 6 x 272.144 = 1632.864 us
    c = t("ring", 4)
    assert c.time_us == pytest.approx(1632.864)
    assert (c.steps_intra, c.steps_inter, c.bytes_intra) == (6, 0, 6 * (M // 4))


def test_recursive_doubling_power_of_two_and_the_fold():
    # p = 8: log2 8 = 3 steps of m: 3 x (10 + 1048.576) = 3175.728 us
    assert t("recursive-doubling", 8).time_us == pytest.approx(3175.728)
    # p = 3 (p' = 2, r = 1): fold, one exchange, return: 3 x 1058.576 = 3175.728 us
    c = t("recursive-doubling", 3)
    assert c.time_us == pytest.approx(3175.728) and c.steps_intra == 3


def test_rabenseifner_2_log_p_steps_moving_2_p_minus_1_over_p():
    # p = 8: halving m/2, m/4, m/8 then doubling m/8, m/4, m/2:
    # 6 x 10 + 0.001 x 2 x (524288 + 262144 + 131072) = 60 + 1835.008 = 1895.008 us
    c = t("rabenseifner", 8)
    assert c.time_us == pytest.approx(1895.008)
    assert c.bytes_intra == 2 * (M // 2 + M // 4 + M // 8)  # 2 (p-1)/p m = 1835008


def test_hierarchical_local_ring_steps_and_log_n_steps_across():
    # 2 nodes of 4: 2 x 3 local steps of m/4 = 6 x 272.144 = 1632.864; across, log2 2 = 1
    # step of m/4 at alpha 100, beta 0.01: 100 + 2621.44 = 2721.44; total 4354.304 us
    nodes = [0, 0, 0, 0, 1, 1, 1, 1]
    c = t("hierarchical", 8, nodes, linear(100.0, 0.01))
    assert c.time_us == pytest.approx(4354.304)
    assert (c.steps_intra, c.steps_inter, c.bytes_inter) == (6, 1, M // 4)
    # flat ring over the same placement: 14 steps, 2 x 7 of them leave ranks 3 and 7 across
    # and the ring runs at its slowest link: every step waits for the crossing one
    assert t("ring", 8, nodes, linear(100.0, 0.01)).time_us > c.time_us


def test_group_nodes_and_unequal_nodes_refused():
    assert group_nodes(8, 4, True) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert group_nodes(4, 8, False) == [0, 0, 0, 0]
    assert group_nodes(3, 2, True) == [0, 0, 1]  # straddles one boundary
    sendrecv = Fit("sendrecv", 2, (Piece(0, 20.0, 0.002),), 0.0, 5, 8, 1 << 20)
    fits = AlgoFits({("sendrecv", 2): sendrecv}, "hierarchical", linear(A, B),
                    linear(A, B), 2)
    assert ("allreduce", 4) in fits and fits[("allreduce", 4)].time_us(M) > 0
    with pytest.raises(UsageError, match="same number"):
        fits[("allreduce", 3)]


def test_plan_prices_the_allreduce_as_each_algorithm(cli, tmp_path):
    from tests.test_plan import _plan

    def replica(algo):
        status, out, err = _plan(cli, tmp_path / algo, "--format", "json",
                                 "--allreduce-algo", algo)
        assert status == 0, err
        return next(r for r in json.loads(out)["layouts"] if (r["tp"], r["dp"]) == (2, 2))

    # tests/test_plan.py's flat fits: library all-reduce 10 us; sendrecv 4 us an iteration,
    # so one message 2 us. A TP2 replica issues 9 all-reduces and a gather (20 us) a step,
    # 4 steps: library 9 x 10 + 20 = 110 a step, 440 in all (as test_plan has it);
    # ring over 2 ranks: 2 steps of 2 us = 4: 9 x 4 + 20 = 56, 224 in all;
    # recursive doubling over 2: 1 step = 2: 9 x 2 + 20 = 38, 152 in all.
    for algo, step, e2e in (("library", 110, 440), ("ring", 56, 224),
                            ("recursive-doubling", 38, 152)):
        got = replica(algo)
        assert (got["decode_step_us"], got["e2e_us"]) == pytest.approx((step, e2e)), algo


def test_plan_algorithm_without_a_sendrecv_sweep_is_refused(cli, tmp_path):
    from tests.replay_helpers import tiny_model
    from tests.test_predict import fake_sweep

    sweep = fake_sweep(tmp_path / "sweep", {"allreduce": (10.0, 0.0)})
    status, out, err = cli("plan", "--model", tiny_model(tmp_path), "--sweep", str(sweep),
                           "--gpus", "2", "--gpus-per-node", "2", "--prompt", "8",
                           "--decode", "4", "--allreduce-algo", "ring")
    assert status == 2 and out == "" and "sendrecv" in err and len(err.splitlines()) == 1


def test_predict_prices_the_allreduce_as_the_algorithm(cli, tmp_path):
    from tests.replay_helpers import tiny_model
    from tests.test_plan import FLAT
    from tests.test_predict import fake_sweep

    sweep = fake_sweep(tmp_path / "sweep", FLAT)
    got = {}
    for algo in ("library", "ring"):
        status, out, err = cli("predict", "--sweep", str(sweep), "--model",
                               tiny_model(tmp_path), "--tp", "2", "--prompt", "8", "--decode",
                               "4", "--engine", "vllm-v0", "--allreduce-algo", algo)
        assert status == 0, err
        got[algo] = json.loads(out.strip().splitlines()[-1])["predicted"]["allreduce_us"]
    # 9 all-reduces a step, 4 steps (tests/test_plan.py): library 36 x 10 = 360 us;
    # ring over 2 ranks, 2 steps of one 2 us message (half the flat 4 us sendrecv): 36 x 4
    assert (got["library"], got["ring"]) == pytest.approx((360, 144))
