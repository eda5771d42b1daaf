"""`plan --requests` over DP replicas and pipeline stages (analysis/workload_plan.py), by
hand on flat fits and the tiny model (tests/replay_helpers.py)."""

import json

from microbench.analysis.workload_plan import route
from patterns.workload.requests import Request
from tests.replay_helpers import tiny_model
from tests.test_plan import FLAT
from tests.test_predict import fake_sweep


def test_routing_round_robin_and_least_loaded():
    # Outputs 100, 1, 1, 1 arriving 0.1 s apart, 10 ms a step: a request is taken to finish
    # its output steps after it arrives (0 -> 1.0 s, 0.1 -> 0.11, 0.2 -> 0.21, 0.3 -> 0.31).
    requests = [Request(0.0, 8, 100), Request(0.1, 8, 1), Request(0.2, 8, 1),
                Request(0.3, 8, 1)]
    assert route(requests, 2, "round-robin", 0.01) == [[0, 2], [1, 3]]
    # least-loaded: 0 -> replica 0; 1 -> replica 1 (0 has one unfinished); 2 at 0.2: 1's
    # request ended at 0.11, so replica 1 (none) before 0 (one); 3 likewise.
    assert route(requests, 2, "least-loaded", 0.01) == [[0], [1, 2, 3]]


def test_requests_over_replicas_and_stages(cli, tmp_path):
    trace = tmp_path / "requests.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": 0.0, "prompt": 8, "output": 2}) + "\n"
                             for _ in range(4)))
    status, out, err = cli("plan", "--model", tiny_model(tmp_path), "--gpus", "4",
                           "--gpus-per-node", "4", "--engine", "vllm", "--requests",
                           str(trace), "--sweep", str(fake_sweep(tmp_path / "sweep", FLAT)),
                           "--format", "json")
    assert status == 0, err
    doc = json.loads(out)
    rows = {(r["tp"], r["pp"], r["dp"]): r for r in doc["layouts"]}
    # Every layout of 4 GPUs is priced, PP and DP ones included.
    assert set(rows) == {(1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1)}
    assert not doc["refused"]
    # TP1 x PP2 x DP2: round-robin gives each replica 2 requests, dealt to its 2 batches in
    # flight: 4 lanes of one request, a prefill step (8 tokens) and a decode step (1). A
    # step at tp 1 has no TP call; the stages add a hop of [T, 64] bf16 twice (a stream gap
    # of 1 us and half a sendrecv, 2 us: 3) and the sampled tokens' two broadcasts over the
    # 2 stages (no broadcast in FLAT: the all-reduce's 10 us each): 23 us a step, as the
    # PP2 batch of tests/test_plan_floors.py. TTFT 23, TPOT 23, a lane's 2 steps 46.
    pp2 = rows[(1, 2, 2)]
    assert (pp2["prefill_us"], pp2["decode_step_us"], pp2["e2e_us"]) == (23, 23, 46)
    # Volume: 4 lanes x 2 steps; each hop 2 x T x 64 x 2 B (T 8, then 1) and 2 broadcasts
    # of 8 B: 4 x (2048 + 16 + 256 + 16) = 9344 B.
    assert pp2["volume_bytes"] == 9344
    # DP4 of one GPU: no call at all.
    assert (rows[(1, 1, 4)]["prefill_us"], rows[(1, 1, 4)]["e2e_us"]) == (0, 0)


def test_a_stage_hop_is_priced_as_predict_prices_it(cli, tmp_path):
    trace = tmp_path / "requests.jsonl"
    trace.write_text(json.dumps({"arrival_s": 0.0, "prompt": 8, "output": 2}) + "\n")
    lines = {**FLAT, "sendrecv": (2.0, 0.01), "stream": (3.0, 0.0)}
    status, out, err = cli("plan", "--model", tiny_model(tmp_path), "--gpus", "2",
                           "--gpus-per-node", "2", "--engine", "vllm", "--requests",
                           str(trace), "--sweep", str(fake_sweep(tmp_path / "sweep", lines)),
                           "--format", "json")
    assert status == 0, err
    rows = {(r["tp"], r["pp"], r["dp"]): r for r in json.loads(out)["layouts"]}
    # TP1 x PP2, one request: a prefill step of 8 tokens, then a decode step of 1. A hop of
    # [8, 64] bf16 = 1024 B: the stream's gap, 3 us, then its data 3 us later (the
    # stream, no sooner than half the smallest ping-pong, (2 + 0.01 x 8) / 2 = 1.04:
    # analysis/costs.latency_us), 6 us; half the ping-pong at 1024 B, (2 + 10.24) / 2 =
    # 6.12, is not the latency. [1, 64] bf16 = 128 B: 3 + 3 = 6. The sampled tokens' two
    # broadcasts, priced as the all-reduce (10 us each): 20. A step 26, the request's two
    # 52.
    pp2 = rows[(1, 2, 1)]
    assert (pp2["prefill_us"], pp2["decode_step_us"], pp2["e2e_us"]) == (26, 26, 52)
