"""`infercomm plan`: every layout of N GPUs priced from a sweep, checked by hand on flat fits."""

import json

from tests.replay_helpers import tiny_model
from tests.test_predict import fake_sweep

# Flat lines (beta 0): every size takes alpha us. Groups of 4 are scaled from the sweep's 2
# ranks: 3 ring steps where it had 1, so alpha x 3.
FLAT = {"allreduce": (10.0, 0.0), "allgather": (30.0, 0.0), "gather": (20.0, 0.0),
        "sendrecv": (4.0, 0.0), "stream": (1.0, 0.0)}
PLAN = ["--gpus", "4", "--gpus-per-node", "4", "--prompt", "8", "--decode", "4",
        "--engine", "vllm-v0"]


def _plan(cli, tmp_path, *extra: str):
    tmp_path.mkdir(exist_ok=True)
    sweep = fake_sweep(tmp_path / "sweep", FLAT)
    return cli("plan", "--model", tiny_model(tmp_path), "--sweep", str(sweep), *PLAN, *extra)


def test_every_layout_priced_and_sorted(cli, tmp_path):
    status, out, err = _plan(cli, tmp_path, "--format", "json")
    assert status == 0, err
    doc = json.loads(out)
    got = {(r["tp"], r["pp"]): r for r in doc["layouts"]}
    assert [(r["tp"], r["pp"]) for r in doc["layouts"]] == [(1, 4), (2, 2), (4, 1)]
    assert all(r["dp"] == 1 and r["ep"] is False for r in doc["layouts"])
    assert [r["best"] for r in doc["layouts"]] == [True, False, False]
    # PP4 (tiny model, 1 layer a stage): latency 4 / 2 = 2 us, gap 1 us. Stage 0 sends 2 a
    # step; stages 1, 2 recv 2, send 2; stage 3 recvs 2. Prefill: sends at 0, 1 arrive 2, 3;
    # stage 1 recvs 2, 3, sends at 3, 4 (arrive 5, 6); stage 2 recvs 5, 6, sends (arrive 8,
    # 9); stage 3 ends at 9. plan takes the engine's order: each decode step starts on stage
    # 0 once stage 3 has ended the previous one, so it is the same chain of 9 (a replay,
    # without that dependency, would overlap the steps at 4 a step; test_predict.py):
    # 3 steps end at 9 + 27 = 36.
    pp4 = got[(1, 4)]
    assert (pp4["prefill_us"], pp4["decode_step_us"], pp4["e2e_us"]) == (9, 9, 36)
    # Volume: 6 sends a step (3 hops x 2), [8, 64] bf16 = 1024 B in the prefill, [1, 64] =
    # 128 B in each of 3 decode steps: 6 x 1024 + 3 x 6 x 128 = 8448 B.
    assert pp4["volume_bytes"] == 8448
    # TP2 x PP2: stage 0 5 allreduces (10) and 2 sends (gap 1, latency 2); stage 1 recv,
    # allgather (30), recv, allgather, 4 allreduces, gather (20). Prefill: stage 0 sends at
    # 50, 51 (arrive 52, 53); stage 1: recv 52, 82, recv max(83, 53) = 83, 113, 153, 173.
    # Each decode step starts on stage 0 at stage 1's end and repeats that chain: 173 a
    # step, 4 x 173 = 692 end to end.
    tp2pp2 = got[(2, 2)]
    assert (tp2pp2["prefill_us"], tp2pp2["decode_step_us"], tp2pp2["e2e_us"]) == (173, 173,
                                                                                 692)
    # TP4: 9 allreduces (10 x 3 = 30 over 4 ranks) and a gather (20 x 3 = 60) a step: 330,
    # 4 steps end to end.
    tp4 = got[(4, 1)]
    assert (tp4["prefill_us"], tp4["decode_step_us"], tp4["e2e_us"]) == (330, 330, 1320)
    assert "communication only" in doc["scope"]
    assert any("scaled from the sweep's 2 ranks" in n for n in doc["notes"])


def test_budgets(cli, tmp_path):
    # TPOT budget 0.1 ms = 100 us: only PP4's 9 us step meets it.
    status, out, err = _plan(cli, tmp_path, "--budget-tpot-ms", "0.1", "--format", "json")
    assert status == 0, err
    assert [r["meets_budget"] for r in json.loads(out)["layouts"]] == [True, False, False]
    # TTFT budget 0.005 ms = 5 us: no prefill is that short (PP4's is 9); the fastest is
    # still marked best, and the table says none meets it.
    status, out, err = _plan(cli, tmp_path / "b", "--budget-ttft-ms", "0.005")
    assert status == 0, err
    assert "no layout meets the budget" in out and "communication only" in out
    best = next(line for line in out.splitlines() if line.startswith("best"))
    assert best.split()[1:3] == ["1", "4"]


def test_csv_and_bad_input(cli, tmp_path):
    status, out, err = _plan(cli, tmp_path, "--format", "csv")
    assert status == 0, err
    lines = out.strip().splitlines()
    assert lines[0] == ("tp,pp,dp,ep,prefill_us,decode_step_us,e2e_us,volume_bytes,"
                        "meets_budget,crosses_nodes,best")
    assert len(lines) == 4
    # 4 GPUs at 2 a node span nodes, and the sweep has no rows across nodes.
    sweep = fake_sweep(tmp_path / "sweep2", FLAT)
    status, out, err = cli("plan", "--model", tiny_model(tmp_path), "--sweep", str(sweep),
                           *[a if a != "4" or i != 3 else "2" for i, a in enumerate(PLAN)])
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "span nodes" in err and "--sweep-inter" in err
    status, _, err = _plan(cli, tmp_path / "x", "--budget-tpot-ms", "-1")
    assert status == 2 and "--budget-tpot-ms -1.0 must be a positive number" in err
    # 1000 ranks: tp in 1, 2, 4 (4 heads) leaves pp >= 250 > 4 layers.
    status, out, err = _plan(cli, tmp_path / "y", "--gpus", "1000", "--gpus-per-node", "1000")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert ("no layout of 1000 ranks suits tiny: tp must divide num_attention_heads(4) and "
            "pp = 1000/tp must be at most num_hidden_layers(4)") in err


def test_a_layout_wider_than_a_node_uses_the_inter_sweep(cli, tmp_path):
    # 4 GPUs, 2 a node: TP4 spans both nodes; PP4's hops 1 -> 2 cross; TP2 x PP2 keeps each
    # TP group on its node and its hop crosses.
    inter = fake_sweep(tmp_path / "inter", {k: (10 * a, b) for k, (a, b) in FLAT.items()})
    sweep = fake_sweep(tmp_path / "sweep", FLAT)
    argv = [a if a != "4" or i != 3 else "2" for i, a in enumerate(PLAN)]
    status, out, err = cli("plan", "--model", tiny_model(tmp_path), "--sweep", str(sweep),
                           "--sweep-inter", str(inter), *argv, "--format", "json")
    assert status == 0, err
    got = {(r["tp"], r["pp"]): r for r in json.loads(out)["layouts"]}
    assert all(r["crosses_nodes"] for r in got.values())
    # TP4 over two nodes: 9 x 300 + 600 = 3300 a step (the inter fits x 3 for 4 ranks).
    assert got[(4, 1)]["decode_step_us"] == 3300
