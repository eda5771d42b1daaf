"""vLLM's DP wave: a MoE model's DP ranks step together until the wave's sync every 32 steps
finds none busy (patterns/engines/vllm/dp_wave.py; vLLM @ c8109375 `v1/engine/core.py:
2102-2188` run_busy_loop / _has_global_unfinished_reqs, `config/parallel.py:738-762`
sync_dp_state). Counts by hand; the pattern, predict and replay as a user runs them.

qwen3-30b-a3b (preset): 48 MoE layers, top-8, h 2048, Model Runner V1 (not among
config/vllm.py's V2 MoE architectures): a step at tp 1, dp 2, --ep is the [4, 2] int32
coordination all-reduce + 48 x (3 dispatch all-gathers + 1 combine reduce-scatter) = 193
calls; logits issue nothing at tp 1.
"""

import csv
import json
from pathlib import Path

import pytest

from patterns import EngineOptions, Layout, Workload, generate, resolve_model
from patterns.dp_steps import wave_tail
from patterns.ops import OpKind, Phase, Transport
from tests.conftest import last_json
from tests.replay_helpers import infercomm
from tests.test_predict import fake_sweep

QWEN = resolve_model("qwen3-30b-a3b")
STEP = 1 + 48 * 4  # 193 calls a step


def _runs(decode: int, **options):
    pat = generate("vllm", QWEN, Layout(dp=2, ep=True), Workload(100, decode),
                   EngineOptions(**options))
    return pat, [(run.phase.value, run.repeat, len(run.step.ops)) for run in pat.stages[0]]


def test_one_batch_then_dummy_forwards_to_the_sync_at_step_32():
    pat, runs = _runs(3)
    # 1 prefill + 2 decode steps; async scheduling (vLLM's default) knows the requests are
    # done after step 3 + 1, so the wave runs to its sync at step 32: steps 4-31 dummy
    # forwards, step 32 a dummy forward and the sync all-reduce (193 + 1 calls).
    assert runs == [("prefill", 1, STEP), ("decode", 2, STEP), ("wave_tail", 28, STEP),
                    ("wave_tail", 1, STEP + 1)]
    sync = pat.stages[0][-1].step.ops[-1]
    assert (sync.kind, sync.group, sync.group_size, sync.shape, sync.dtype, sync.transport,
            sync.tag) == (OpKind.ALLREDUCE, "dp", 2, (2,), "int32", Transport.GLOO,
                          "engine_core.sync_dp_state")
    dummy = pat.stages[0][2].step
    # execute_dummy_batch: _dummy_run(1): one token on each rank, its coordination and
    # every MoE layer's dispatch [1, 2048] -> [2, 2048] and combine; no sampled row.
    assert (dummy.tokens, dummy.rows) == (1, 0)
    assert dummy.ops[1].shape == (1, 2048) and dummy.ops[1].out_shape == (2, 2048)
    # 29 dummy forwards, 29 x 193 + 1 = 5598 calls; 3 x 193 + 5598 = 6177 in all.
    assert wave_tail(pat.stages[0]) == (29, 5598)
    assert pat.calls_per_inference(0) == 6177
    assert pat.dp_stages[1] == pat.dp_stages[0]  # both DP ranks alike


@pytest.mark.parametrize("decode, async_on, expected", [
    # 32 real steps (1 prefill + 31 decode), the synchronous scheduler: the sync at step 32
    # is in the last decode step and finds both ranks done: no tail.
    (32, False, [("prefill", 1, STEP), ("decode", 30, STEP), ("decode", 1, STEP + 1)]),
    # async: the ranks learn it one step later, at step 33: the wave runs to step 64.
    (32, True, [("prefill", 1, STEP), ("decode", 30, STEP), ("decode", 1, STEP + 1),
                ("wave_tail", 31, STEP), ("wave_tail", 1, STEP + 1)]),
    # 40 real steps: a sync inside the decodes at step 32, then steps 41-64 the tail.
    (40, True, [("prefill", 1, STEP), ("decode", 30, STEP), ("decode", 1, STEP + 1),
                ("decode", 8, STEP), ("wave_tail", 23, STEP), ("wave_tail", 1, STEP + 1)]),
])
def test_the_wave_ends_at_the_first_sync_that_finds_no_rank_busy(decode, async_on, expected):
    _, runs = _runs(decode, async_scheduling=async_on)
    assert runs == expected


def test_no_wave_tail_keeps_the_inference_and_its_syncs():
    _, runs = _runs(40, wave_tail=False)
    assert runs == [("prefill", 1, STEP), ("decode", 30, STEP), ("decode", 1, STEP + 1),
                    ("decode", 8, STEP)]


def test_dense_dp_and_sglang_have_no_wave():
    # core.py:1307-1318: a dense model's DP ranks run EngineCoreProc, each at DP size 1.
    dense = generate("vllm", resolve_model("llama-3.1-8b"), Layout(dp=2), Workload(100, 3))
    assert wave_tail(dense.stages[0]) == (0, 0)
    sglang = generate("sglang", QWEN, Layout(dp=2, ep=True), Workload(100, 3))
    assert not any(run.phase == Phase.WAVE_TAIL for run in sglang.stages[0])


def test_pattern_table_and_json_show_the_tail(cli):
    args = ("pattern", "--model", "qwen3-30b-a3b", "--dp", "2", "--ep", "--prompt", "100",
            "--decode", "3")
    status, out, err = cli(*args)
    assert status == 0, err
    assert "steps per inference: 1 prefill + 2 decode + 29 wave tail" in out
    assert "wave tail: 29 dummy forwards, 5,598 calls" in out
    # the sync's row: one [2] int32 all-reduce on the DP gloo group in the tail
    assert any(line.split()[:9] == ["wave_tail", "0", "allreduce", "dp/2", "[2]", "[2]",
                                    "int32", "gloo", "1"] for line in out.splitlines())
    assert last_json(out)["wave_tail_steps"] == 29
    status, out, err = cli(*args, "--format", "json")
    doc = json.loads(out)
    assert (doc["wave_tail_steps"], doc["wave_tail_calls"], doc["calls_per_inference"]) == (
        29, 5598, 6177)
    tail_rows = [r for r in doc["rows"] if r["phase"] == "wave_tail"]
    # 29 coordination all-reduces, 29 x 48 x 3 all-gathers, 29 x 48 combines, 1 sync
    assert sorted((r["op"], r["shape"] == [2], r["count"]) for r in tail_rows) == [
        ("allgather", False, 1392), ("allgather", False, 1392), ("allgather", False, 1392),
        ("allreduce", False, 29), ("allreduce", True, 1), ("reducescatter", False, 1392)]


MOE_CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 1000,
              "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 256,
              "torch_dtype": "bfloat16", "_name_or_path": "tinymoe", "model_type": "mixtral",
              "num_local_experts": 4, "num_experts_per_tok": 2}


def test_predict_prices_the_tail_apart(cli, tmp_path):
    model = tmp_path / "moe.json"
    model.write_text(json.dumps(MOE_CONFIG))
    sweep = fake_sweep(tmp_path / "sweep", {"allreduce": (10.0, 0.0),
                                            "allgather": (5.0, 0.01),
                                            "reducescatter": (7.0, 0.01)})
    status, out, err = cli("predict", "--sweep", str(sweep), "--engine", "vllm", "--model",
                           str(model), "--prompt", "8", "--decode", "3", "--dp", "2", "--ep")
    assert status == 0, err
    p = last_json(out)["predicted"]
    # The prefill and decode steps as tests/test_plan_ep.py prices them: 141.04 and 64.88
    # (a decode step: the [4, 2] all-reduce 10, 2 layers x (hidden [1 -> 2, 64] bf16 256 B
    # 7.56, top-k weights and ids 16 B 5.16 each, combine 256 B 9.56)).
    assert p["prefill_us"] == pytest.approx(141.04)
    assert p["decode_step_us"] == pytest.approx(64.88)
    assert p["e2e_us"] == pytest.approx(141.04 + 2 * 64.88)  # the inference, as before
    # The tail: 29 dummy forwards of one token a rank, a decode step's calls each, and
    # the sync's [2] int32 all-reduce (8 B: 10): 29 x 64.88 + 10 = 1891.52.
    assert p["wave_tail_us"] == pytest.approx(29 * 64.88 + 10)


def test_replay_times_the_tail_as_its_own_phase(tmp_path):
    """A workload of two requests at 0 over the tiny MoE at DP2 (prompts of 100 tokens,
    outputs of 3 and of 8: tests/test_dp_workload.py): 8 real steps, then the wave's tail
    of 24 dummy forwards to the sync at step 32, replayed on 2 gloo ranks, each issuing its
    own steps (rank 0 its dummy forwards at steps 3-7) and checked."""
    model = tmp_path / "moe.json"
    model.write_text(json.dumps(MOE_CONFIG))
    requests = tmp_path / "w.jsonl"
    requests.write_text('{"arrival_s": 0, "prompt": 100, "output": 3}\n'
                        '{"arrival_s": 0, "prompt": 100, "output": 8}\n')
    proc, _ = infercomm("replay", "--model", str(model), "--requests", str(requests),
                        "--dp", "2", "--ep", "--nproc", "2", "-n", "1", "-w", "0",
                        "--check", "--out", str(tmp_path / "out"), timeout=180)
    assert proc.returncode == 0, proc.stderr
    last = last_json(proc.stdout)
    # a step: 1 + 2 x 4 = 9 calls; 32 steps and the sync: 32 x 9 + 1
    assert (last["calls_per_inference"], last["wave_tail_steps"], last["wrong"]) == (
        32 * 9 + 1, 24, 0)
    assert last["wave_tail_us"] > 0 and "wave tail (DP lockstep)" in proc.stdout
    w = last["workload"]
    assert (w["dp"], w["steps"], w["wave_tail_steps"], w["dp_routing"]) == (
        2, 32, 24, "least-loaded")
    folder = Path(last["results_dir"])
    with open(folder / "iterations.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and float(rows[0]["wave_tail_us"]) > 0
    with open(folder / "workload_requests.csv") as f:
        requests_rows = list(csv.DictReader(f))
    # each request on its own rank: 1 step of prefill, 2 and 7 decode steps
    assert [(r["dp_rank"], r["ttft_steps"]) for r in requests_rows] == [("0", "1"), ("1", "1")]
