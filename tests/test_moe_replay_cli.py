"""`infercomm replay --dp N --ep` as a user runs it: the vllm and sglang profiles of a tiny
DeepSeek-V3-shaped MoE model (3 layers, the first dense: first_k_dense_replace 1; 8 experts,
top-2) on 4 and 8 local ranks, over MPI and gloo, with --check."""

import json

import pytest

from tests.replay_helpers import infercomm, last_json, needs_mpi

TINY_MOE = {"hidden_size": 64, "num_hidden_layers": 3, "vocab_size": 1000,
            "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128,
            "torch_dtype": "bfloat16", "model_type": "deepseek_v3", "n_routed_experts": 8,
            "num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
            "_name_or_path": "tiny-moe"}
BACKENDS = [pytest.param("mpi", marks=needs_mpi), "torch"]


def tiny_moe(tmp_path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_MOE))
    return str(path)


def replay(tmp_path, backend: str, nproc: int, *extra: str, env: dict | None = None):
    return infercomm("replay", "--model", tiny_moe(tmp_path), "--prompt", "4", "--decode", "3",
                     "--backend", backend, "--nproc", str(nproc), "--check", "-n", "1",
                     "-w", "0", "--timeout", "60", "--out", str(tmp_path / "out"), *extra,
                     env=env, timeout=180)[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_vllm_dp4_ep_uneven_batches_replay_checks(tmp_path, backend):
    # --no-wave-tail: the inference's own steps (the wave's tail: tests/test_dp_wave.py)
    proc = replay(tmp_path, backend, 4, "--dp", "4", "--ep", "--dp-batches", "3,5,2,8",
                  "--eager", "--no-wave-tail")
    assert proc.returncode == 0, proc.stderr
    last = last_json(proc.stdout)
    # Eager: per step 1 coordination all-reduce + 2 MoE layers x (3 dispatch all-gathers
    # + 1 combine reduce-scatter), the dense layer and the logits silent at tp 1: 9 calls;
    # 1 prefill + 2 decode steps = 27. Prefill T = 12, 20, 8, 32: all-gatherv.
    assert (last["calls_per_inference"], last["wrong"], last["dp"], last["ep"]) == (
        27, 0, 4, True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sglang_dp2_tp2_replay_checks(tmp_path, backend):
    proc = replay(tmp_path, backend, 4, "--engine", "sglang", "--dp", "2", "--tp", "2", "--ep",
                  "--dp-batches", "3,5")
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["wrong"] == 0


@needs_mpi
def test_vllm_dp4_tp2_ep_on_8_ranks_and_a_corrupted_dispatch(tmp_path):
    proc = replay(tmp_path, "mpi", 8, "--dp", "4", "--tp", "2", "--ep", "--dp-batches",
                  "3,5,2,8", "--no-wave-tail")  # the inference alone: test_dp_wave.py
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["wrong"] == 0
    # Rank 5 corrupts the first element of its hidden-state dispatch inputs only: every
    # rank of its EP group of 8 receives the bad element, so --check finds it and the run
    # exits with status 1.
    proc = replay(tmp_path, "mpi", 8, "--dp", "4", "--tp", "2", "--ep", "--dp-batches",
                  "3,5,2,8", "--no-wave-tail",
                  env={"INFERCOMM_FAULT": "corrupt:5:dispatch.hidden_states"})
    assert proc.returncode == 1 and last_json(proc.stdout)["wrong"] > 0
