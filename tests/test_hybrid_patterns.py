"""Mamba hybrids (patterns/hybrid.py, patterns/engines/vllm/hybrid.py) as vLLM @ c8109375
runs them: every number below is counted by hand from the config and vLLM's model files
(`model_executor/models/nemotron_h.py`, `granitemoehybrid.py`, `falcon_h1.py`, `jamba.py`;
`layers/mamba/mamba_mixer2.py`, `mamba_mixer.py`). Before these families were read, every
one of them was refused ("no attention + MLP layers") or, for falcon_h1, given Llama's calls."""

import json
from collections import Counter
from pathlib import Path

import pytest

from microbench.cli import main
from patterns import ConfigError, EngineOptions, Layout, Workload, from_hf_config, generate

NEMOTRON_56B = Path(__file__).parent / "data" / "configs" / "nemotron-h-56b" / "config.json"
BASE = {"hidden_size": 64, "vocab_size": 1000, "num_attention_heads": 4,
        "num_key_value_heads": 4, "intermediate_size": 128, "torch_dtype": "bfloat16"}


def model(tmp_path, **fields):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE, **fields}))
    return from_hf_config(path)


def steps(m, tp=2, prompt=8, decode=2, batch=1, **options):
    pattern = generate("vllm", m, Layout(tp=tp), Workload(prompt, decode, batch=batch),
                       EngineOptions(gpu="h100", **options))
    return {run.phase.value: run.step for run in pattern.stages[0]}


def calls(step):
    return [(op.kind.value, op.shape, op.dtype, op.tag) for op in step.ops]


def test_nemotron_h_56b_at_tp2_issues_119_allreduces_a_decode_step():
    m = from_hf_config(NEMOTRON_56B)
    # hybrid_override_pattern: 118 characters = num_hidden_layers, 54 M + 10 * + 54 -
    kinds = Counter(blocks[0][0] for blocks in m.hybrid.layers)
    assert (m.num_hidden_layers, kinds) == (118, {"mamba": 54, "attention": 10, "mlp": 54})
    decode = steps(m, prompt=128, decode=4)["decode"]
    ops = Counter(op.kind.value for op in decode.ops)
    # one all-reduce a layer (Mamba out_proj, attention o_proj, MLP down_proj: each a
    # RowParallelLinear) + the embedding's = 118 + 1 = 119; then the logits all-gather.
    # n_groups 8 is split by tp 2, so the gated norm sends nothing (mamba_mixer2.py:132)
    assert ops == {"allreduce": 119, "allgather": 1}
    assert {op.shape for op in decode.ops if op.kind == "allreduce"} == {(1, 8192)}
    tags = [op.tag for op in decode.ops]
    # layer 0 is M, layer 1 -, layer 4 * (the pattern starts "M-M-M-M*-")
    assert tags[:6] == ["embed_tokens", "layers.0.mixer.out_proj", "layers.1.mixer.down_proj",
                        "layers.2.mixer.out_proj", "layers.3.mixer.down_proj",
                        "layers.4.mixer.out_proj"]
    assert tags[8] == "layers.7.mixer.o_proj"  # "M-M-M-M*": the 8th character is *


def test_the_cli_prints_119_a_decode_step_for_the_56b(capsys):
    assert main(["pattern", "--model", str(NEMOTRON_56B), "--tp", "2", "--prompt", "128",
                 "--decode", "4"]) == 0
    out = capsys.readouterr().out
    # 3 decode steps x 119 all-reduces of [1, 8192]
    assert "decode       0  allreduce  tp/2   [1,8192]    [1,8192]    bf16" in out
    assert "    357   16.00 KiB" in out


@pytest.mark.parametrize(("tp", "words"), [
    (16, "tp(16) does not split the Mamba-2 mixer"),  # n_groups 8: 8 % 16 != 0
    (3, "tp(3) does not divide num_attention_heads(64)"),
])
def test_tp_the_mixer_refuses(tp, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        steps(from_hf_config(NEMOTRON_56B), tp=tp)


def test_one_group_all_reduces_the_gated_norm_in_fp32(tmp_path):
    # n_groups 1 at tp 2: Mixer2RMSNormGated sums x^2 over each rank's half and all-reduces
    # the [T, 1] sums (mamba_mixer2.py:119-126); x * silu(gate.float()) is fp32 (:115)
    m = model(tmp_path, model_type="nemotron_h", hybrid_override_pattern="M*",
              mamba_num_heads=8, mamba_head_dim=16, n_groups=1)
    assert calls(steps(m, prompt=5, decode=2)["prefill"]) == [
        # prompt 5 pads to the capture size 8 ([1, 2, 4, 8, ...])
        ("allreduce", (8, 64), "bf16", "embed_tokens"),
        ("allreduce", (8, 1), "fp32", "layers.0.mixer.norm"),
        ("allreduce", (8, 64), "bf16", "layers.0.mixer.out_proj"),
        ("allreduce", (8, 64), "bf16", "layers.1.mixer.o_proj"),
        ("allgather", (1, 512), "bf16", "logits"),  # vocab 1000 pads to 1024, / 2
    ]


def test_transformers_5_layers_block_type_and_no_layer_count(tmp_path):
    # transformers 5 writes nemotron_h's layers as names and no num_hidden_layers (the tiny
    # model scripts/vllm_cpu_cases.py writes is such a file)
    m = model(tmp_path, model_type="nemotron_h", mamba_num_heads=8, n_groups=2,
              layers_block_type=["linear_attention", "full_attention", "mlp"])
    assert m.num_hidden_layers == 3
    assert [b[0][0] for b in m.hybrid.layers] == ["mamba", "attention", "mlp"]


def test_latent_experts_reduce_in_the_latent_width_then_the_shared_ones(tmp_path):
    # moe_runner.py:441-460: the routed output [T, 32] before fc2_latent_proj; :417-439 the
    # shared experts' [T, 64] on its own; nothing after
    m = model(tmp_path, model_type="nemotron_h", hybrid_override_pattern="E",
              mamba_num_heads=8, n_groups=8, n_routed_experts=8, num_experts_per_tok=2,
              n_shared_experts=1, moe_latent_size=32)
    assert calls(steps(m, prompt=4)["prefill"])[1:3] == [
        ("allreduce", (4, 32), "bf16", "layers.0.mixer.experts"),
        ("allreduce", (4, 64), "bf16", "layers.0.mixer.shared_experts")]


def test_granite_hybrid_reduces_mixer_experts_and_shared_mlp_unfused(tmp_path):
    m = model(tmp_path, model_type="granitemoehybrid", num_hidden_layers=2,
              layer_types=["mamba", "attention"], num_local_experts=4, num_experts_per_tok=2,
              shared_intermediate_size=128, mamba_n_heads=8, mamba_n_groups=2)
    decode = steps(m)["decode"]
    assert [op.tag for op in decode.ops] == [
        "embed_tokens", "layers.0.mamba.out_proj", "layers.0.block_sparse_moe",
        "layers.0.shared_mlp.output_linear", "layers.1.self_attn.o_proj",
        "layers.1.block_sparse_moe", "layers.1.shared_mlp.output_linear", "logits"]
    # every output is multiplied by residual_multiplier, and the embedding by
    # embedding_multiplier, before any norm: no all-reduce meets an RMSNorm straight, so
    # none is fused; [1, 64] bf16 = 128 bytes, a multiple of 16 under 8 MiB: custom AR
    assert {op.transport.value for op in decode.ops[:-1]} == {"custom-allreduce"}


def test_falcon_h1_runs_attention_mamba_and_mlp_in_every_layer(tmp_path):
    m = model(tmp_path, model_type="falcon_h1", num_hidden_layers=2, mamba_n_heads=8,
              mamba_n_groups=1, mamba_rms_norm=True)
    tags = [op.tag for op in steps(m)["decode"].ops]
    # falcon_h1.py:382-409: attention, then the SSM, then the feed-forward; n_groups 1 and
    # mamba_rms_norm: the norm's sums too. 1 + 2 x 4 + logits = 10 calls
    assert tags == ["embed_tokens"] + [
        f"layers.{i}.{m}" for i in range(2) for m in (
            "self_attn.o_proj", "mamba.mamba.norm", "mamba.mamba.out_proj",
            "feed_forward.down_proj")] + ["logits"]
    # mamba_rms_norm false (FalconH1Config's default): the gated norm only gates, no call
    plain = model(tmp_path, model_type="falcon_h1", num_hidden_layers=1, mamba_n_heads=8,
                  mamba_n_groups=1)
    assert not any(op.tag.endswith(".norm") for op in steps(plain)["decode"].ops)


def test_jamba_mamba1_reduces_the_scheduled_tokens_by_phase(tmp_path):
    # attention where i % 2 == 1, experts where i % 2 == 1: layer 0 Mamba-1 + MLP,
    # layer 1 attention + MoE. x_proj width dt_rank 4 + 2 x d_state 16 = 36
    m = model(tmp_path, model_type="jamba", num_hidden_layers=2, attn_layer_period=2,
              attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
              num_experts=4, num_experts_per_tok=2, mamba_d_state=16, mamba_dt_rank=4)
    run = steps(m, prompt=4, decode=2, batch=3)
    # decode: 3 requests, padded to the capture size 4; the Mamba-1 op is eager and unpadded
    assert calls(run["decode"])[:6] == [
        ("allreduce", (4, 64), "bf16", "embed_tokens"),
        ("allreduce", (3, 36), "bf16", "layers.0.mamba.x_proj"),
        ("allreduce", (3, 64), "bf16", "layers.0.mamba.out_proj"),
        ("allreduce", (4, 64), "bf16", "layers.0.feed_forward.down_proj"),
        ("allreduce", (4, 64), "bf16", "layers.1.o_proj"),
        ("allreduce", (4, 64), "bf16", "layers.1.feed_forward.experts")]
    # prefill: 3 x 4 = 12 prompt tokens, padded to 16; x_proj over the 12 alone
    assert calls(run["prefill"])[1:3] == [
        ("allreduce", (12, 36), "bf16", "layers.0.mamba.x_proj"),
        ("allreduce", (12, 64), "bf16", "layers.0.mamba.out_proj")]
    # mamba_mixer.py runs inside the opaque vllm::mamba_mixer op: never fused
    assert run["decode"].ops[2].transport.value == "custom-allreduce"
    assert run["decode"].ops[3].transport.value == "fused-allreduce-rmsnorm"


def test_jamba_mixed_step_sends_prefill_and_decode_tokens_apart(tmp_path):
    # 2 prompts of 12, budget 16: step 1 holds 12 + 4 of the second prompt; step 2 the
    # first prompt's decode (1 token) beside the second's last 8: x_proj [8] then [1],
    # out_proj [9] (batch_steps.py: running requests first)
    m = model(tmp_path, model_type="jamba", num_hidden_layers=2, attn_layer_period=2,
              attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
              num_experts=4, num_experts_per_tok=2, mamba_d_state=16, mamba_dt_rank=4)
    pattern = generate("vllm", m, Layout(tp=2), Workload(12, 3, batch=2),
                       EngineOptions(gpu="h100", max_batched_tokens=16))
    mixed = [run.step for run in pattern.stages[0]][1]
    assert [(op.shape, op.tag) for op in mixed.ops[1:4]] == [
        ((8, 36), "layers.0.mamba.x_proj"), ((1, 36), "layers.0.mamba.x_proj"),
        ((9, 64), "layers.0.mamba.out_proj")]


def test_hybrids_are_v1_runner_models(tmp_path):
    # config/vllm.py:651-654: a hybrid not in DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES is V1's,
    # so at pp 2 the last stage broadcasts V1's sampled ids, not V2's two tensors
    m = model(tmp_path, model_type="nemotron_h", hybrid_override_pattern="M*M*",
              mamba_num_heads=8, n_groups=2)
    pattern = generate("vllm", m, Layout(pp=2), Workload(4, 2))
    assert pattern.options.model_runner == "v1"
    last = pattern.stages[1][-1].step
    assert [op.tag for op in last.ops if op.kind == "broadcast"] == ["pp.prev_sampled_token_ids"]


@pytest.mark.parametrize("argv", [
    ["pattern", "--engine", "sglang", "--prompt", "4", "--decode", "2"],
    ["pattern", "--disagg", "prefill=tp1,decode=tp2", "--prompt", "4", "--decode", "2"],
])
def test_what_is_not_modelled_for_hybrids_is_refused(capsys, argv):
    assert main([*argv, "--model", str(NEMOTRON_56B)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert "is a Mamba hybrid (nemotron_h)" in err and "--engine vllm" in err


def test_plan_memory_of_a_hybrid_is_refused():
    from patterns.weights import gpu_memory_bytes
    with pytest.raises(ConfigError, match="a rank's memory"):
        gpu_memory_bytes(from_hf_config(NEMOTRON_56B), Layout(tp=2), "bf16", 1024)
