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
    got = {(r["tp"], r["pp"]): r for r in doc["layouts"] if r["dp"] == 1}
    # Every dp x tp x pp = 4 of a dense model; dp > 1 is independent replicas.
    assert [(r["tp"], r["pp"], r["dp"]) for r in doc["layouts"]] == [
        (1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1)]
    assert all(r["ep"] is False for r in doc["layouts"])
    assert [r["best"] for r in doc["layouts"]] == [True] + [False] * 5
    replicas = {(r["tp"], r["pp"]): r for r in doc["layouts"] if r["dp"] > 1}
    # DP4 x TP1: a replica of one rank issues no call (vllm-v0 at tp 1, pp 1): 0.
    assert (replicas[(1, 1)]["e2e_us"], replicas[(1, 1)]["volume_bytes"]) == (0, 0)
    # DP2 x PP2: one replica is a PP2 pipeline: stage 0 sends 2 (gap 1, latency 2) arriving
    # at 2 and 3; stage 1 recvs at max(1, 2) = 2 and max(3, 3) = 3: 3 a step, 12 in all.
    assert (replicas[(1, 2)]["decode_step_us"], replicas[(1, 2)]["e2e_us"]) == (3, 12)
    # DP2 x TP2: a replica is TP2 over 2 ranks (no scaling): 9 allreduces (10) and a gather
    # (20) a step = 110, 440 in all; the volume is both replicas' (2 x a TP2 one).
    assert (replicas[(2, 1)]["decode_step_us"], replicas[(2, 1)]["e2e_us"]) == (110, 440)
    assert any("independent replicas" in n for n in doc["notes"])
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
    assert "floors, not a prediction" in doc["scope"]
    assert any("scaled from the sweep's 2 ranks" in n for n in doc["notes"])


def test_each_floor_says_how_much_of_it_is_communication(cli, tmp_path):
    status, out, err = _plan(cli, tmp_path, "--format", "json")
    assert status == 0, err
    layouts = {(r["tp"], r["pp"], r["dp"]): r for r in json.loads(out)["layouts"]}
    # TP4 (test_every_layout_priced_and_sorted): 330 us of calls a step, and its compute floor
    # beside them; DP4 x TP1 issues no call: none of its floors is communication
    tp4 = layouts[(4, 1, 1)]
    assert tp4["tpot_comm_share"] == round(330 / (330 + tp4["compute_decode_step_us"]), 4)
    assert tp4["e2e_comm_share"] == round(1320 / (1320 + tp4["compute_e2e_us"]), 4)
    assert 0.99 < tp4["tpot_comm_share"] < 1  # the tiny model's compute is under a us
    assert layouts[(1, 1, 4)]["e2e_comm_share"] == 0
    status, out, err = _plan(cli, tmp_path / "text")
    assert status == 0, err
    assert "comm share" in out.splitlines()[4]  # the table's header
    assert ": communication is 0% of it)" in out  # the best, DP4, issues no call


def test_budgets(cli, tmp_path):
    # TPOT budget 0.1 ms = 100 us: DP4's 0, DP2 x PP2's 3 and PP4's 9 us steps meet it.
    status, out, err = _plan(cli, tmp_path, "--budget-tpot-ms", "0.1", "--format", "json")
    assert status == 0, err
    assert [r["meets_budget"] for r in json.loads(out)["layouts"]] == [True] * 3 + [False] * 3
    # TTFT budget 0.005 ms = 5 us on the tiny MoE model (tests/test_plan_ep.py) with
    # vllm-v0, which refuses --ep: only its dp 1 layouts are priced, and none has a prefill
    # that short (PP2's is 3 x 0 + the chain of sends, TP's 10 us allreduces); the fastest
    # is still marked best, and the table says none meets it.
    from tests.test_plan_ep import moe_model
    tmp_path.joinpath("b").mkdir()
    sweep = fake_sweep(tmp_path / "b" / "sweep", FLAT)
    status, out, err = cli("plan", "--model", moe_model(tmp_path / "b"), "--sweep",
                           str(sweep), *PLAN, "--budget-ttft-ms", "0.005")
    assert status == 0, err
    assert "no layout meets the budget" in out and "floors, not a prediction" in out
    assert "left out: tp=2 pp=1 dp=2 ep: engine vllm-v0 does not model --ep" in out


def test_csv_and_bad_input(cli, tmp_path):
    status, out, err = _plan(cli, tmp_path, "--format", "csv")
    assert status == 0, err
    lines = out.strip().splitlines()
    assert lines[0] == ("tp,pp,dp,ep,prefill_us,decode_step_us,e2e_us,compute_prefill_us,"
                        "compute_decode_step_us,compute_e2e_us,ttft_floor_us,tpot_floor_us,"
                        "e2e_floor_us,ttft_comm_share,tpot_comm_share,e2e_comm_share,"
                        "volume_bytes,meets_budget,crosses_nodes,"
                        "weight_bytes_per_gpu,kv_cache_bytes_per_gpu,"
                        "activation_bytes_per_gpu,overhead_bytes_per_gpu,"
                        "max_model_len_kv_bytes_per_gpu,kv_capacity_tokens,max_concurrency,"
                        "fits_memory,best")
    assert len(lines) == 7  # the header and 6 layouts
    # 4 GPUs at 2 a node span nodes, and the sweep has no rows across nodes.
    sweep = fake_sweep(tmp_path / "sweep2", FLAT)
    status, out, err = cli("plan", "--model", tiny_model(tmp_path), "--sweep", str(sweep),
                           *[a if a != "4" or i != 3 else "2" for i, a in enumerate(PLAN)])
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "span nodes" in err and "--sweep-inter" in err
    status, _, err = _plan(cli, tmp_path / "x", "--budget-tpot-ms", "-1")
    assert status == 2 and "--budget-tpot-ms -1.0 must be a positive number" in err
    # 1000 ranks of the tiny MoE model (tests/test_plan_ep.py; a dense model always has its
    # dp 1000 replicas): tp in 1, 2, 4 (4 heads) and dp x tp in 1, 2, 4 (4 experts) leave
    # pp >= 250 > 2 layers.
    from tests.test_plan_ep import moe_model
    status, out, err = cli("plan", "--model", moe_model(tmp_path), "--sweep", str(sweep),
                           *PLAN, "--gpus", "1000", "--gpus-per-node", "1000")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert ("no layout of 1000 ranks suits tinymoe: tp must divide num_attention_heads(4) and "
            "pp = 1000/(dp x tp) must be at most num_hidden_layers(2), and with ep dp x tp "
            "must divide num_local_experts(4)") in err


def test_a_layout_wider_than_a_node_uses_the_inter_sweep(cli, tmp_path):
    # 4 GPUs, 2 a node: TP4 spans both nodes; PP4's hops 1 -> 2 cross; TP2 x PP2 keeps each
    # TP group on its node and its hop crosses.
    inter = fake_sweep(tmp_path / "inter", {k: (10 * a, b) for k, (a, b) in FLAT.items()})
    sweep = fake_sweep(tmp_path / "sweep", FLAT)
    argv = [a if a != "4" or i != 3 else "2" for i, a in enumerate(PLAN)]
    status, out, err = cli("plan", "--model", tiny_model(tmp_path), "--sweep", str(sweep),
                           "--sweep-inter", str(inter), *argv, "--format", "json")
    assert status == 0, err
    layouts = json.loads(out)["layouts"]
    got = {(r["tp"], r["pp"]): r for r in layouts if r["dp"] == 1}
    assert all(r["crosses_nodes"] for r in got.values())
    # TP4 over two nodes: 9 x 300 + 600 = 3300 a step (the inter fits x 3 for 4 ranks).
    assert got[(4, 1)]["decode_step_us"] == 3300
    # DP2 x TP2: rank = dp_rank x 2 + tp_rank, so each replica's TP group is one node's two
    # ranks: intra fits, 110 a step as on one node (test above); DP2 x PP2 likewise.
    replicas = {(r["tp"], r["pp"]): r for r in layouts if r["dp"] == 2}
    assert not any(r["crosses_nodes"] for r in replicas.values())
    assert replicas[(2, 1)]["decode_step_us"] == 110
    assert replicas[(1, 2)]["decode_step_us"] == 3
