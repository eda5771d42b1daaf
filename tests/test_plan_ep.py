"""`plan` and `predict` with data and expert parallelism: a tiny MoE model on 4 GPUs, its
DP x EP layouts listed beside the TP x PP ones, a DP2-EP pattern's dispatch and combine priced
by hand from synthetic sweeps, and an EP group across two nodes on the inter-node fits."""

import json
from pathlib import Path

import pytest

from tests.conftest import last_json
from tests.test_predict import fake_sweep

# 4 experts, top-2, 2 layers, both MoE (Mixtral-style config.json): EP groups of 1, 2 or 4
# ranks divide the experts.
MOE_CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 1000,
              "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 256,
              "torch_dtype": "bfloat16", "_name_or_path": "tinymoe", "model_type": "mixtral",
              "num_local_experts": 4, "num_experts_per_tok": 2}
# Flat lines: every size takes alpha us; groups of 4 are scaled from the sweep's 2 ranks
# (3 ring steps where it had 1): alpha x 3.
FLAT = {"allreduce": (10.0, 0.0), "allgather": (30.0, 0.0), "reducescatter": (40.0, 0.0),
        "gather": (20.0, 0.0), "broadcast": (6.0, 0.0), "sendrecv": (4.0, 0.0),
        "stream": (1.0, 0.0)}


def moe_model(folder: Path) -> str:
    path = folder / "moe.json"
    path.write_text(json.dumps(MOE_CONFIG))
    return str(path)


def test_plan_lists_dp_ep_layouts_beside_tp_pp(cli, tmp_path):
    sweep = fake_sweep(tmp_path / "sweep", FLAT)
    status, out, err = cli("plan", "--model", moe_model(tmp_path), "--sweep", str(sweep),
                           "--gpus", "4", "--gpus-per-node", "4", "--prompt", "8",
                           "--decode", "4", "--engine", "vllm", "--format", "json")
    assert status == 0, err
    doc = json.loads(out)
    rows = {(r["dp"], r["tp"], r["pp"], r["ep"]): r for r in doc["layouts"]}
    # dp 1 without EP (tp x pp), and every dp x tp > 1 with EP; PP4 > 2 layers is refused.
    assert set(rows) == {(1, 2, 2, False), (1, 4, 1, False), (1, 2, 2, True),
                         (1, 4, 1, True), (2, 1, 2, True), (2, 2, 1, True), (4, 1, 1, True)}
    assert doc["refused"] == ["tp=1 pp=4 dp=1: pp(4) exceeds num_hidden_layers(2) of tinymoe; "
                              "use pp <= 2"]
    e2e = [r["e2e_us"] for r in doc["layouts"]]
    assert e2e == sorted(e2e) and doc["layouts"][0]["best"]
    assert sum(r["best"] for r in doc["layouts"]) == 1
    # DP4 x EP4 (vLLM V1, patterns/moe.py): a step is the gloo DP all-reduce over 4 ranks
    # (10 x 3 = 30) and per MoE layer 3 dispatch all-gathers (30 x 3 = 90 each) and a combine
    # reduce-scatter (40 x 3 = 120): 30 + 2 x (270 + 120) = 810; 4 steps = 3240.
    dp4 = rows[(4, 1, 1, True)]
    assert (dp4["prefill_us"], dp4["decode_step_us"], dp4["e2e_us"]) == (810, 810, 3240)
    # DP2 x TP2 x EP4 (sequence-parallel MoE): DP all-reduce over 2 ranks 10; TP all-reduces
    # of embed_tokens and 2 o_proj 3 x 10 = 30; dispatch over the EP group of 4 ranks:
    # 6 all-gathers x 90 = 540 and 2 reduce-scatters x 120 = 240; TP all-gathers (2
    # sequence-parallel, 1 logits) 3 x 30 = 90: 910 a step.
    dp2tp2 = rows[(2, 2, 1, True)]
    assert (dp2tp2["decode_step_us"], dp2tp2["e2e_us"]) == (910, 3640)
    # DP2 x PP2 x EP2: stage 0: DP all-reduce 10, 3 all-gathers 90 -> 100, reduce-scatter
    # 40 -> 140, 4 sends (vLLM's PP metadata, its size and its pickled bytes, then the 2
    # tensors; gap 1, latency 2: arrive 142, 143, 144, 145) -> 144, the pp broadcast 6 ->
    # 150. Stage 1: DP all-reduce 10, recvs end max(11, 142) = 142, 143, 144, 145, 3
    # all-gathers 235, reduce-scatter 275, broadcast 281. Each decode step begins once
    # stage 1 is done: the same chain, 281 a step, 4 x 281 = 1124.
    dp2pp2 = rows[(2, 1, 2, True)]
    assert (dp2pp2["prefill_us"], dp2pp2["decode_step_us"], dp2pp2["e2e_us"]) == (281, 281,
                                                                                 1124)
    assert any("runs on gloo (CPU) in the engine" in n for n in doc["notes"])


def _predict(cli, sweep: Path, model: str, *extra: str) -> dict:
    status, out, err = cli("predict", "--sweep", str(sweep), "--engine", "vllm",
                           "--model", model, "--prompt", "8", "--decode", "3", *extra)
    assert status == 0, err
    return last_json(out)


def test_predict_dp2_ep_dispatch_and_combine_by_hand(cli, tmp_path):
    sweep = fake_sweep(tmp_path / "sweep", {"allreduce": (10.0, 0.0),
                                            "allgather": (5.0, 0.01),
                                            "reducescatter": (7.0, 0.01)})
    doc = _predict(cli, sweep, moe_model(tmp_path), "--dp", "2", "--ep")
    p = doc["predicted"]
    assert (doc["dp"], doc["ep"]) == (2, True)
    # DP2 x TP1 x EP2, batch 1 a DP rank, vLLM V1 (patterns/moe.py): every step, the DP
    # all-reduce [4, 2] int32 (10), then per layer the dispatch all-gathers (nccl-tests size =
    # the gathered output) of hidden [8 -> 16, 64] bf16 = 2048 B: 5 + 20.48 = 25.48, top-k
    # weights and ids [16, 2] 4 B = 128 B: 5 + 1.28 = 6.28 each, and the combine
    # reduce-scatter of [16, 64] bf16 = 2048 B: 7 + 20.48 = 27.48.
    # Prefill: 10 + 2 x (25.48 + 2 x 6.28 + 27.48) = 10 + 2 x 65.52 = 141.04.
    assert p["prefill_us"] == pytest.approx(141.04)
    # Decode step (1 token a rank, 2 gathered): hidden [2, 64] bf16 = 256 B: 7.56; weights
    # and ids 16 B: 5.16 each; combine 256 B: 9.56: 10 + 2 x 27.44 = 64.88.
    assert p["decode_step_us"] == pytest.approx(64.88)
    assert p["e2e_us"] == pytest.approx(141.04 + 2 * 64.88)  # 270.8
    assert p["allgather_us"] == pytest.approx(2 * 38.04 + 2 * 2 * 17.88)  # 147.6
    assert p["reducescatter_us"] == pytest.approx(2 * 27.48 + 2 * 2 * 9.56)  # 93.2
    assert any("coordinate_batch_across_dp" in n and "gloo" in n for n in doc["notes"])


def test_alltoall_from_the_sweep_or_an_allgather_stand_in(cli, tmp_path):
    model = moe_model(tmp_path)
    sweep = fake_sweep(tmp_path / "a2a", {"allreduce": (10.0, 0.0), "alltoall": (8.0, 0.02)})
    p = _predict(cli, sweep, model, "--dp", "2", "--ep", "--a2a", "alltoall")["predicted"]
    # --a2a alltoall: per layer a dispatch and a combine all-to-all over the EP group of
    # [16, 64] bf16 = 2048 B in the prefill: 8 + 40.96 = 48.96; prefill 10 + 4 x 48.96 =
    # 205.84. Decode: [2, 64] = 256 B: 8 + 5.12 = 13.12; 10 + 4 x 13.12 = 62.48.
    assert p["prefill_us"] == pytest.approx(205.84)
    assert p["decode_step_us"] == pytest.approx(62.48)
    # No alltoall in the sweep: the all-gather of the same size stands in, and a note says
    # so: 2048 B: 5 + 20.48 = 25.48, prefill 10 + 4 x 25.48 = 111.92.
    other = fake_sweep(tmp_path / "ag", {"allreduce": (10.0, 0.0), "allgather": (5.0, 0.01)})
    doc = _predict(cli, other, model, "--dp", "2", "--ep", "--a2a", "alltoall")
    assert doc["predicted"]["prefill_us"] == pytest.approx(111.92)
    assert any("the sweep has no alltoall" in n for n in doc["notes"])


def test_an_ep_group_across_two_nodes_uses_the_inter_fits(cli, tmp_path):
    model = moe_model(tmp_path)
    intra = fake_sweep(tmp_path / "intra", FLAT)
    inter = fake_sweep(tmp_path / "inter", {k: (10 * a, b) for k, (a, b) in FLAT.items()})
    args = ("--dp", "2", "--tp", "2", "--ep", "--sweep-inter", str(inter),
            "--ranks-per-node")
    # One node of 4: the 910 a step of test_plan_lists_dp_ep_layouts_beside_tp_pp.
    doc = _predict(cli, intra, model, *args, "4")
    assert doc["predicted"]["decode_step_us"] == pytest.approx(910)
    assert doc["levels_used"] == ["intra"]
    # Two nodes of 2: rank = dp_rank x 2 + tp_rank, so each TP group {0, 1}, {2, 3} is one
    # node's (intra) while the DP groups {0, 2}, {1, 3} and the EP group {0, 1, 2, 3} span
    # both (inter, alpha x 10): DP all-reduce 100; TP all-reduces 3 x 10 = 30; EP
    # all-gathers 6 x 900 = 5400 and reduce-scatters 2 x 1200 = 2400; TP all-gathers
    # 3 x 30 = 90: 8020 a step, 3 steps (prefill and 2 decode) = 24060.
    doc = _predict(cli, intra, model, *args, "2")
    assert doc["predicted"]["decode_step_us"] == pytest.approx(8020)
    assert doc["predicted"]["e2e_us"] == pytest.approx(24060)
    assert doc["levels_used"] == ["inter", "intra"]


def test_uneven_dp_ranks_join_at_dispatch_and_the_slowest_counts(cli, tmp_path):
    sweep = fake_sweep(tmp_path / "sweep", {"allreduce": (1.0, 0.01),
                                            "allgather": (10.0, 0.001),
                                            "reducescatter": (20.0, 0.0)})
    doc = _predict(cli, sweep, moe_model(tmp_path), "--dp", "2", "--tp", "2", "--ep",
                   "--dp-batches", "1,3", "--eager", "--decode", "1")
    # Eager (no padding), DP rank 0 has 8 prompt tokens and DP rank 1 24: the prefill only.
    # Fits: allreduce 1 + 0.01 x B over 2; all-gather 10 + 0.001 x B over 2 (TP), over the
    # EP group of 4 scaled: alpha 30, beta x (3/4)/(1/2) = 0.0015; reduce-scatter 20 x 3 = 60.
    # Both: DP all-reduce of 32 B: 1.32. TP all-reduces (embed, o_proj) of [T, 64] bf16:
    # rank 0 1024 B 11.24 x 2 -> 23.80; rank 1 3072 B 31.72 x 2 -> 64.76.
    # The uneven dispatch joins them at 64.76 and is priced by its total (counts 256, 256,
    # 768, 768 of [32, 64] bf16 = 4096 B: 30 + 6.144 = 36.144; top-k [32, 2] x 4 B = 256 B:
    # 30.384 each), then the combine 60: 64.76 + 96.912 + 60 = 221.672.
    # TP all-gather (sequence parallel): rank 0 [8, 64] 1024 B 11.024 -> 232.696; rank 1
    # [24, 64] 3072 B 13.072 -> 234.744. o_proj: 243.936 and 266.464. Layer 1's dispatch
    # and combine from 266.464: 423.376. Then TP all-gather and logits: rank 0 11.024 +
    # [1, 1024] 2048 B 12.048 -> 446.448; rank 1 13.072 + [3, 1024] 6144 B 16.144 ->
    # 452.592: the slowest DP rank's.
    assert doc["predicted"]["prefill_us"] == pytest.approx(452.592)
    assert doc["predicted"]["e2e_us"] == pytest.approx(452.592)
