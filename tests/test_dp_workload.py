"""Request workloads at --dp > 1 (patterns/workload/dp_*.py, patterns/engines/*/dp_workload.py):
routing as each engine's front end does it, each rank's own schedule, the ranks' lockstep
(vLLM dummy forwards and waves, SGLang idle batches), the pattern's table and JSON, predict
and plan. Counts by hand; engine lines cited in the modules' docstrings (vLLM @ c8109375:
v1/engine/core_client.py:1468-1519, v1/engine/core.py:2102-2188; SGLang @ 8905cbd4:
managers/data_parallel_controller.py:749-768).

qwen3-30b-a3b at tp 1, dp 2, --ep: a step is the [4, 2] int32 DP coordination all-reduce and
48 MoE layers x (3 dispatch all-gathers + 1 combine) = 193 calls (tests/test_dp_wave.py).
"""

import json
from pathlib import Path

import pytest

from patterns import EngineOptions, Layout, Workload, generate, resolve_model
from patterns.engines.workloads import workload_pattern
from patterns.workload.requests import Request
from tests.conftest import last_json
from tests.test_predict import fake_sweep

QWEN = resolve_model("qwen3-30b-a3b")
STEP = 1 + 48 * 4
# Two requests at 0: prompts of 100 tokens, outputs of 3 and of 8 tokens (the issue's W).
W = [Request(0.0, 100, 3), Request(0.0, 100, 8)]


def _write(folder: Path, requests) -> str:
    path = folder / "w.jsonl"
    path.write_text("".join(json.dumps({"arrival_s": r.arrival_s, "prompt": r.prompt,
                                        "output": r.output}) + "\n" for r in requests))
    return str(path)


def _dp(requests, engine="vllm", step_time_s=None, **options):
    return workload_pattern(engine, QWEN, Layout(dp=2, ep=True), requests, None,
                            EngineOptions(**options), step_time_s)


def _runs(p, d):
    return [(run.phase.value, run.repeat, len(run.step.ops), run.step.rows)
            for run in p.dp_stages[d][0]]


def test_the_rank_that_finishes_first_runs_dummy_forwards(cli, tmp_path):
    p = _dp(W)
    # least-loaded at 0: both engines 0 in flight, the scan starting at engine 0 -> request
    # 0 to DP rank 0, then from engine 1 -> request 1 to DP rank 1.
    assert p.rank_of == (0, 1) and p.routing == "least-loaded"
    # Rank 0: its prefill and 2 decodes (3 tokens), then dummy forwards (no row sampled)
    # while rank 1 decodes to its 8th token (steps 3-7); rank 1: prefill and 7 decodes.
    # Async scheduling sees rank 1's request done one step after its last (step 7), at 8:
    # the wave runs to its sync at step 32 (steps 8-31, 24 dummy forwards on both).
    assert _runs(p, 0) == [("prefill", 1, STEP, 1), ("decode", 2, STEP, 1),
                           ("decode", 5, STEP, 0), ("wave_tail", 23, STEP, 0),
                           ("wave_tail", 1, STEP + 1, 0)]
    assert _runs(p, 1) == [("prefill", 1, STEP, 1), ("decode", 7, STEP, 1),
                           ("wave_tail", 23, STEP, 0), ("wave_tail", 1, STEP + 1, 0)]
    assert (p.timeline.steps, p.timeline.tail_steps, p.timeline.waves) == (32, 24, 1)
    status, out, err = cli("pattern", "--model", "qwen3-30b-a3b", "--dp", "2", "--ep",
                           "--requests", _write(tmp_path, W))
    assert status == 0, err
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()
            if line.strip() and line.split()[0] in ("0", "1-2", "3-7", "8-30", "31")}
    assert rows["3-7"] == ["dummy", "1", "decode", "1->1"]  # named as such
    assert rows["8-30"] == ["tail", "dummy", "1", "dummy", "1"]
    assert rows["31"] == ["tail+sync", "dummy", "1", "dummy", "1"]
    assert "wave tail: 24 dummy forwards, 4,633 calls a rank" in out  # 24 x 193 + 1
    last = last_json(out)
    assert (last["steps"], last["wave_tail_steps"], last["dp_routing"]) == (32, 24,
                                                                            "least-loaded")
    status, out, _ = cli("pattern", "--model", "qwen3-30b-a3b", "--dp", "2", "--ep",
                         "--requests", _write(tmp_path, W), "--format", "json")
    doc = json.loads(out)
    kinds = [[r["kind"] for r in row["ranks"]] for row in doc["step_rows"]]
    assert kinds == [["prefill", "prefill"], ["decode", "decode"], ["dummy", "decode"],
                     ["tail", "tail"], ["tail", "tail"]]
    assert [(r["dp_rank"], r["own_steps"], r["dummy_steps"], r["wave_tail_steps"], r["calls"])
            for r in doc["dp_ranks"]] == [(0, 3, 5, 24, 32 * STEP + 1),
                                          (1, 8, 0, 24, 32 * STEP + 1)]
    assert [q["dp_rank"] for q in doc["per_request"]] == [0, 1]


def test_a_dp_step_issues_the_calls_of_the_batch_pattern():
    # The workload's steps are the batch rules' calls, tags and all (patterns/tiled.py):
    # both ranks prefill 100 tokens (padded to 104), as a batch of prompt 100 at dp 2.
    p = _dp(W)
    batch = generate("vllm", QWEN, Layout(dp=2, ep=True), Workload(100, 3))
    for d in (0, 1):
        assert list(p.dp_stages[d][0][0].step.ops) == list(batch.dp_stages[d][0][0].step.ops)
        # a dummy forward of the wave's tail, and the step that also syncs
        assert list(p.dp_stages[d][0][-2].step.ops) == list(batch.stages[0][-2].step.ops)
        assert list(p.dp_stages[d][0][-1].step.ops) == list(batch.stages[0][-1].step.ops)
    tags = [op.tag for op in p.dp_stages[0][0][0].step.ops]
    assert tags[1] == "layers.0.mlp.experts.dispatch.hidden_states"
    assert tags[-1] == "layers.47.mlp.experts.combine"


def test_least_loaded_routes_by_requests_in_flight_with_a_rotating_scan():
    # dp 2, step time 10 ms: requests 0 (50 tokens out) and 1 (2 out) at 0 go to ranks 0
    # and 1; request 1 ends at step 1 (prefill at 0, its one decode at 1) and is seen done
    # at 1 + 1 + 1 (async) = 3. Requests 2 and 3 arrive at 0.1 s, step 10: rank 0 has 1 in
    # flight, rank 1 none -> request 2 to rank 1; then 1 and 1, the scan starting at rank 1
    # (it moves on by one a request) -> request 3 to rank 1. Round-robin: 0, 1, 0, 1.
    requests = [Request(0.0, 4, 50), Request(0.0, 4, 2), Request(0.1, 4, 2),
                Request(0.1, 4, 2)]
    p = _dp(requests, step_time_s=0.01)
    assert p.rank_of == (0, 1, 1, 1)
    rr = workload_pattern("vllm", QWEN, Layout(dp=2, ep=True), requests, None, EngineOptions(),
                          0.01, dp_routing="round-robin")
    assert rr.rank_of == (0, 1, 0, 1)


@pytest.mark.parametrize("async_on, rank", [(False, 1), (True, 0)])
def test_a_finish_is_seen_a_step_later_under_async_scheduling(async_on, rank):
    # Request 1 (2 tokens out) on rank 1 ends at step 1: seen at step 2 by the synchronous
    # scheduler, at 3 under async. Request 2 arrives at step 2: rank 1 is then empty (sync:
    # to rank 1) or still holds it (async: 1 and 1, the scan from rank 0 -> rank 0).
    requests = [Request(0.0, 4, 50), Request(0.0, 4, 2), Request(0.02, 4, 2)]
    p = _dp(requests, step_time_s=0.01, async_scheduling=async_on)
    assert p.rank_of == (0, 1, rank)


def test_a_wave_ends_and_a_later_request_starts_another():
    # 0: one request (3 tokens out) on rank 0: steps 0-2 and dummies to the sync at step 31;
    # the engines then idle until 0.4 s (step 40, 10 ms steps): a second wave, steps 40-71.
    # Global steps: 32 + 32; each wave's tail 29 dummy forwards (its 3 real steps, 1 of lag).
    p = _dp([Request(0.0, 100, 3), Request(0.4, 100, 3)], step_time_s=0.01)
    assert p.rank_of == (0, 1)  # at step 40 both empty, the scan from rank 1
    t = p.timeline
    assert (t.steps, t.waves, t.tail_steps) == (64, 2, 58)
    # (global step, clock step, steps, each rank's own segment or -1, tail, sync)
    assert [(g.start, g.clock, g.repeat, g.items, g.tail, g.sync) for g in t.segments] == [
        (0, 0, 1, (0, -1), False, False), (1, 1, 2, (1, -1), False, False),
        (3, 3, 28, (-1, -1), True, False), (31, 31, 1, (-1, -1), True, True),
        (32, 40, 1, (-1, 0), False, False), (33, 41, 2, (-1, 1), False, False),
        (35, 43, 28, (-1, -1), True, False), (63, 71, 1, (-1, -1), True, True)]
    # request 1's prefill is global step 32 (clock step 40), on rank 1's view
    assert p.schedule.spans[1].prefill == [32, 33]


def test_sglang_dp_attention_idle_batches_and_no_wave():
    # SGLang round-robin: request 0 to rank 0, 1 to rank 1. Its overlap scheduler runs a
    # finished request one more decode batch: rank 0 steps 0-3 (prefill, 3 decodes), rank 1
    # 0-8; rank 0 runs idle batches at steps 4-8, padded like the others' decode graphs.
    # No wave: the ranks step only while one has work (9 steps).
    p = _dp(W, engine="sglang")
    assert p.rank_of == (0, 1) and p.filler == "idle" and not p.wave
    assert p.timeline.steps == 9
    phases = [(r.phase.value, r.repeat, r.step.rows) for r in p.dp_stages[0][0]]
    assert phases == [("prefill", 1, 1), ("decode", 3, 1), ("decode", 5, 0)]
    # under the decode graph an idle rank runs the same calls as a decoding one: the MLP
    # sync, 48 x (gather, scatter), the logits' row gather and vocab all-gather: 99
    idle, decode = p.dp_stages[0][0][2].step, p.dp_stages[0][0][1].step
    assert list(idle.ops) == list(decode.ops) and len(idle.ops) == 1 + 48 * 2 + 2


def test_dense_vllm_ranks_are_independent_replicas():
    # core.py:1307-1318: each a DP-size-1 engine; no DP call; a rank with nothing of its
    # own issues nothing; its own steps are the single engine's for its requests.
    llama = resolve_model("llama-3.1-8b")
    p = workload_pattern("vllm", llama, Layout(dp=2, tp=2), W, None, EngineOptions(), None)
    assert p.filler == "none" and p.timeline.steps == 8
    groups = {op.group for d in (0, 1) for run in p.dp_stages[d][0] for op in run.step.ops}
    assert groups == {"tp"}
    one = workload_pattern("vllm", llama, Layout(tp=2), W[:1], None, EngineOptions(), None)
    own = [list(run.step.ops) for run in p.dp_stages[0][0][:2]]
    assert own == [list(run.step.ops) for run in one.stages[0]]
    assert p.dp_stages[0][0][2].step.ops == () and p.dp_stages[0][0][2].repeat == 5


MOE_CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 1000,
              "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 256,
              "torch_dtype": "bfloat16", "_name_or_path": "tinymoe", "model_type": "mixtral",
              "num_local_experts": 4, "num_experts_per_tok": 2}


def _tiny(folder: Path) -> str:
    path = folder / "moe.json"
    path.write_text(json.dumps(MOE_CONFIG))
    return str(path)


def test_predict_prices_each_step_by_its_slowest_rank(cli, tmp_path):
    sweep = fake_sweep(tmp_path / "sweep", {"allreduce": (10.0, 0.0),
                                            "allgather": (5.0, 0.01),
                                            "reducescatter": (7.0, 0.01)})
    status, out, err = cli("predict", "--sweep", str(sweep), "--engine", "vllm", "--model",
                           _tiny(tmp_path), "--dp", "2", "--ep", "--requests",
                           _write(tmp_path, W))
    assert status == 0, err
    doc = last_json(out)
    w = doc["workload"]
    # Prefill (both ranks 100 tokens, padded to 104): the [4, 2] all-reduce 10, then 2
    # layers x (hidden [104 -> 208, 64] bf16 = 26,624 B: 5 + 266.24; top-k weights and ids
    # [208, 2] x 4 B = 1,664 B: 5 + 16.64 each; combine 26,624 B: 7 + 266.24): 10 + 2 x
    # 587.76 = 1185.52. Decode and dummy forwards alike (1 token a rank): 64.88
    # (tests/test_plan_ep.py).
    assert w["ttft_comm_us"]["p50"] == pytest.approx(1185.52)
    assert w["tpot_comm_us"]["p99"] == pytest.approx(64.88)
    # 32 steps: 1185.52 + 31 x 64.88 + the sync 10 = 3206.8; the tail 24 x 64.88 + 10.
    assert w["all_steps_us"] == pytest.approx(1185.52 + 31 * 64.88 + 10)
    assert (w["wave_tail_steps"], w["wave_tail_us"]) == (24, pytest.approx(24 * 64.88 + 10))
    assert doc["predicted"]["e2e_us"] == pytest.approx(1185.52 + 7 * 64.88)


def test_plan_prices_moe_dp_layouts_as_one_dp_workload(cli, tmp_path):
    flat = {"allreduce": (10.0, 0.0), "allgather": (30.0, 0.0), "reducescatter": (40.0, 0.0),
            "gather": (20.0, 0.0), "broadcast": (6.0, 0.0), "sendrecv": (4.0, 0.0),
            "stream": (1.0, 0.0)}
    sweep = fake_sweep(tmp_path / "sweep", flat)
    status, out, err = cli("plan", "--model", _tiny(tmp_path), "--sweep", str(sweep), "--gpus",
                           "4", "--gpus-per-node", "4", "--engine", "vllm", "--requests",
                           _write(tmp_path, W), "--format", "json")
    assert status == 0, err
    rows = {(r["dp"], r["tp"], r["ep"]): r for r in json.loads(out)["layouts"]}
    # DP4 x EP4: every step (a real one, or a dummy forward on the 2 ranks without a
    # request) 810 us (tests/test_plan_ep.py: 30 + 2 x (3 x 90 + 120)); TTFT p90 one step,
    # TPOT p90 one step, end to end the 8 steps before the wave's tail: 6480.
    dp4 = rows[(4, 1, True)]
    assert (dp4["prefill_us"], dp4["decode_step_us"], dp4["e2e_us"]) == (810, 810, 6480)
    dp2 = rows[(2, 2, True)]  # 910 a step (tests/test_plan_ep.py), 8 steps
    assert (dp2["decode_step_us"], dp2["e2e_us"]) == (910, 7280)


@pytest.mark.parametrize("extra, words", [
    (["--dp-batches", "1,2"], "--dp-batches gives each DP rank one batch"),
    (["--engine", "sglang", "--dp-routing", "least-loaded"],
     "dp-routing least-loaded is vLLM's front end"),
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 1}',
      "--acceptance-length", "1.5"], "modelled at dp 1"),
    (["--pp", "2"], "use --pp 1"),
    (["--engine", "sglang", "--no-wave-tail"], "--no-wave-tail does not apply to engine sglang"),
])
def test_what_a_dp_workload_refuses(cli, tmp_path, extra, words):
    status, out, err = cli("pattern", "--model", "qwen3-30b-a3b", "--dp", "2", "--ep",
                           "--requests", _write(tmp_path, W), *extra)
    assert status == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert out == ""


def test_dp_routing_needs_requests_and_dp(cli, tmp_path):
    status, _, err = cli("pattern", "--model", "qwen3-30b-a3b", "--prompt", "8", "--decode",
                         "2", "--dp", "2", "--ep", "--dp-routing", "round-robin")
    assert status == 2 and "--dp-routing acts only with --requests" in err
    status, _, err = cli("pattern", "--model", "qwen3-30b-a3b", "--requests",
                         _write(tmp_path, W), "--dp-routing", "round-robin")
    assert status == 2 and "give --dp N" in err
