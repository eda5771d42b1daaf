"""`--engine megatron` on MoE models: Megatron-Core 0.19.2's static engine and its default
all-gather token dispatcher (patterns/engines/megatron/moe.py cites the engine's lines), call
by call against numbers worked out by hand; the bool routing map replayed on every backend.
The engine itself judges these calls in tests/test_real_engine_megatron.py.

Per MoE layer and forward of T = s x b tokens, over the dispatcher's group of n ranks (TP, or
with --ep the stage's dp x tp ranks): the attention's all-reduce (at TP), the shared expert's
all-reduce (at TP, where the model has one), then all-gathers of the routing map (bool
[T, E]), the probabilities ([T, E]) and the tokens ([T, h]), each to n x T rows, then the
reduce-scatter of [n x T, h] to [T, h].
"""

import json
from pathlib import Path

import numpy as np
import pytest

from microbench.replay import check
from patterns import ConfigError, Layout, Workload, from_hf_config, generate, resolve_model
from patterns.traces.calls import Call
from patterns.traces.to_pattern import _op
from tests.replay_helpers import infercomm, last_json, needs_mpi

MIXTRAL = resolve_model("mixtral-8x7b")  # h 4096, 32 MoE layers, 8 experts, V 32000, bf16

# The oracle's tiny MoE (scripts/megatron_cpu_oracle.py): h 128, 4 layers of which 1-3 are MoE
# (mlp_only_layers [0]), 4 experts, a shared expert, V 256, fp32.
TINY_MOE = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
            "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 4, "intermediate_size": 256, "vocab_size": 256,
            "torch_dtype": "float32", "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128,
            "decoder_sparse_step": 1, "mlp_only_layers": [0]}


FP32 = Workload(8, 4, batch=2, dtype="fp32")  # prompt 8, 1 prefill + 3 decode steps, b 2


@pytest.fixture
def tiny(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_MOE))
    return str(path)


def shapes(ops) -> list[tuple]:
    return [(op.kind.value, op.group, op.group_size, op.shape, op.out_shape, op.dtype)
            for op in ops]


def moe_layer(t: int, n: int, group: str, h: int, experts: int, dtype: str) -> list[tuple]:
    return [("allgather", group, n, (t, experts), (n * t, experts), "bool"),
            ("allgather", group, n, (t, experts), (n * t, experts), dtype),
            ("allgather", group, n, (t, h), (n * t, h), dtype),
            ("reducescatter", group, n, (n * t, h), (t, h), dtype)]


def test_mixtral_tp2_every_moe_layer_gathers_and_reduce_scatters_over_tp():
    pat = generate("megatron", MIXTRAL, Layout(tp=2), Workload(128, 4))
    (prefill, decode) = pat.stages[0]
    assert (prefill.repeat, decode.repeat) == (1, 3)
    for run, s in ((prefill, 128), (decode, 1)):
        ops = run.step.ops
        # the embedding, 32 layers of (linear_proj's all-reduce + 4 dispatcher calls), the
        # last position's logits: 1 + 32 * 5 + 1 = 162
        assert len(ops) == 162
        ar = ("allreduce", "tp", 2, (s, 1, 4096), (s, 1, 4096), "bf16")
        assert shapes(ops[:6]) == [ar, ar, *moe_layer(s, 2, "tp", 4096, 8, "bf16")]
        assert [op.tag for op in ops[2:6]] == [
            f"layers.0.mlp.token_dispatcher.{what}" for what in
            ("dispatch.routing_map", "dispatch.probs", "dispatch.hidden_states", "combine")]
        # 32000 = 128 * 2 * 125: no padding; [1, 1, 16000] -> [1, 1, 32000]
        assert shapes(ops[-1:]) == [("allgather", "tp", 2, (1, 1, 16000), (1, 1, 32000),
                                     "bf16")]
    # bytes of one prefill MoE layer's dispatch on a rank: 128 * 8 bool + 128 * 8 bf16 +
    # 128 * 4096 bf16 = 1,024 + 2,048 + 1,048,576; the combine's input 256 * 4096 * 2
    assert sum(op.bytes for op in prefill.step.ops[2:5]) == 1_051_648
    assert prefill.step.ops[5].bytes == 2_097_152


def test_mixtral_ep_over_every_rank_of_the_stage():
    # --tp 2 --dp 4 --ep: Megatron's expert_tp x ep = dp x tp = 8 ranks (8 experts, 1 each at
    # expert TP 1, or ep 4 at Megatron's default expert TP 2: the same calls); decode T = 1
    pat = generate("megatron", MIXTRAL, Layout(tp=2, dp=4, ep=True), Workload(16, 2))
    decode = pat.stages[0][1].step.ops
    assert len(decode) == 162
    assert shapes(decode[1:6]) == [("allreduce", "tp", 2, (1, 1, 4096), (1, 1, 4096), "bf16"),
                                   *moe_layer(1, 8, "ep", 4096, 8, "bf16")]


def test_tiny_moe_shared_expert_and_dense_layer_tp2(tiny):
    pat = generate("megatron", from_hf_config(tiny), Layout(tp=2), FP32)
    ops = pat.stages[0][0].step.ops
    ar = ("allreduce", "tp", 2, (8, 2, 128), (8, 2, 128), "fp32")
    # embedding; layer 0 dense (linear_proj, linear_fc2); layers 1-3: linear_proj, the shared
    # expert's linear_fc2, the dispatcher's 4; the logits: 1 + 2 + 3 * 6 + 1 = 22 (the
    # engine's trace of this model at TP2: 22 calls a prefill, tests/test_real_engine_megatron)
    assert len(ops) == 22
    assert shapes(ops[:9]) == [ar, ar, ar, ar, ar, *moe_layer(16, 2, "tp", 128, 4, "fp32")]
    assert [op.tag for op in ops[3:5]] == ["layers.1.self_attention.linear_proj",
                                           "layers.1.mlp.shared_experts.linear_fc2"]


def test_tiny_moe_pipeline_without_tp(tiny):
    model = from_hf_config(tiny)
    # PP2, no TP, no EP: no dispatcher call (tp_ep of 1); the send and the logits broadcast
    pat = generate("megatron", model, Layout(pp=2), FP32)
    assert [op.kind.value for op in pat.stages[0][0].step.ops] == ["send", "broadcast"]
    # PP2 x DP2 with --ep: each stage's 2 DP ranks; stage 0 = layers 0 (dense) and 1 (MoE):
    # 4 dispatcher calls of T = 16, the send, the broadcast
    pat = generate("megatron", model, Layout(pp=2, dp=2, ep=True), FP32)
    ops = pat.stages[0][0].step.ops
    assert shapes(ops[:4]) == moe_layer(16, 2, "ep", 128, 4, "fp32")
    assert [op.kind.value for op in ops[4:]] == ["send", "broadcast"]
    # stage 1: the receive, layers 2 and 3 (4 calls each), the broadcast: 10
    assert len(pat.stages[1][0].step.ops) == 10


@pytest.mark.parametrize("args, words", [
    (["--model", "mixtral-8x7b", "--tp", "2", "--dp", "2", "--ep", "--sp"],
     "--sp: Megatron's static engine runs sequence parallelism for the MoE model mixtral-8x7b "
     "only with TP and expert parallelism"),
    (["--model", "deepseek-v3", "--tp", "8"],
     "deepseek-v3 uses multi-latent attention, whose calls the megatron profile does not model"),
    (["--model", "mixtral-8x7b", "--tp", "2", "--dp", "2", "--dp-batches", "4,8"],
     "engine megatron does not model --dp-batches; use --engine sglang or vllm"),
])
def test_refusals_in_one_line(cli, args, words):
    status, out, err = cli("pattern", "--engine", "megatron", "--prompt", "16", "--decode", "2",
                           *args)
    assert status == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines


def test_pattern_note_names_the_dispatcher_group(cli):
    status, out, _ = cli("pattern", "--engine", "megatron", "--model", "mixtral-8x7b", "--tp",
                         "2", "--dp", "4", "--ep", "--prompt", "16", "--decode", "2")
    assert status == 0
    assert ("note: mixtral-8x7b is a MoE model (8 experts, 32 MoE layers): Megatron's "
            "all-gather dispatcher gathers each MoE layer's routing map, probabilities and "
            "tokens over the EP group of dp(4) x tp(2) = 8 ranks and reduce-scatters the "
            "experts' output") in out


# --- bool, one byte an element, on every backend ---------------------------------------

def _replay(tiny: str, out: Path, *extra: str, env: dict | None = None):
    proc, _ = infercomm("replay", "--engine", "megatron", "--model", tiny, "--prompt", "8",
                        "--decode", "4", "--batch", "2", "--iters", "1", "--warmup", "0",
                        "--check", "--out", str(out), *extra, env=env, timeout=240)
    return proc


def test_replay_gloo_ep_group_delivers_every_routing_map(tiny, tmp_path):
    # 4 gloo ranks, TP2 x DP2 with --ep: 22 calls a prefill as at TP2 (the gathers over 4)
    proc = _replay(tiny, tmp_path, "--tp", "2", "--dp", "2", "--ep", "--backend", "torch")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = last_json(proc.stdout)
    assert (doc["wrong"], doc["calls_per_inference"], doc["world_size"]) == (0, 4 * 22, 4)


@needs_mpi
def test_replay_mpi_check_sees_a_wrong_routing_map(tiny, tmp_path):
    # rank 1 flips the first element of every routing map it sends (INFERCOMM_FAULT): each of
    # the 2 ranks receives it in each of the 3 MoE layers' gathers of 4 steps: 2 * 3 * 4 = 24
    # wrong elements, and none elsewhere
    proc = _replay(tiny, tmp_path, "--tp", "2", "--backend", "mpi",
                   env={"INFERCOMM_FAULT": "corrupt:1:routing_map"})
    assert proc.returncode != 0
    assert last_json(proc.stdout)["wrong"] == 24
    assert "--check found wrong data (rank 0: 12, rank 1: 12 wrong elements)" in proc.stderr


@pytest.fixture
def fake_nccl(monkeypatch):
    """The nccl backend over the CPU stand-in of CuPy (tests/fake_cupy.py), world size 1."""
    import sys

    from microbench.backends import open_backend
    from microbench.ranks.dist import DistEnv
    from microbench.ranks.launch import free_port
    from tests import fake_cupy
    for name, module in fake_cupy.make_modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    backend = open_backend("nccl", env=DistEnv("torchrun", 0, 1, 0, "127.0.0.1", free_port()),
                           device="cuda", timeout=20)
    yield backend
    backend.close()


def test_nccl_backend_moves_bool_as_uint8(fake_nccl):
    from tests.backend_helpers import bound_op
    world = fake_nccl.new_group("tp", [0])
    assert fake_nccl._types["bool"] == fake_nccl._types["uint8"]  # torch's ncclDataType map
    for kind in ("allgather", "broadcast", "gather", "alltoall"):
        op = bound_op(fake_nccl, world, kind, 12, "bool")
        assert op.send.array.dtype == np.bool_ and op.send.nbytes == 12
        assert check.verify(op, fake_nccl.write, fake_nccl.read, corrupt=False) == 0, kind
        assert check.verify(op, fake_nccl.write, fake_nccl.read, corrupt=True) == 1, kind


def test_bool_is_never_reduced():
    with pytest.raises(ConfigError, match="the trace holds allreduce calls of bool, which "
                                          "replay does not issue"):
        _op(Call("allreduce", 64, "bool", 2), Layout(tp=2))
    assert _op(Call("allgather", 64, "bool", 2), Layout(tp=2)).out_shape == (128,)


def test_bool_is_one_byte():
    op = generate("megatron", MIXTRAL, Layout(tp=2), Workload(16, 2)).stages[0][0].step.ops[2]
    assert (op.dtype, op.numel, op.bytes) == ("bool", 16 * 8, 128)
