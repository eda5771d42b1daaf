"""Real config.json files of current families (tests/data/configs, README there) load through
`from_hf_config` and are modelled as vLLM builds them: MoE layers by each family's own rule,
tags that say what a layer is, dtype and heads as vLLM reads them."""

import json
from pathlib import Path

import pytest

from patterns import PRESETS, ConfigError, Layout, Workload, from_hf_config, generate
from patterns.models import mlp_module

CONFIGS = Path(__file__).parent / "data" / "configs"


def load(name):
    return from_hf_config(CONFIGS / name / "config.json")


def allreduce_tags(model, tp=2):
    step = generate("vllm", model, Layout(tp=tp), Workload(8, 2)).stages[0][0].step
    return [op.tag for op in step.ops if op.kind == "allreduce"]


def test_every_config_loads_with_its_numbers():
    got = {name: load(name) for name in ("qwen3-8b", "qwen3-30b-a3b", "deepseek-r1",
                                        "gpt-oss-20b", "gemma-3-4b", "phi-3-mini-4k",
                                        "llama-4-maverick-2layer")}
    row = {n: (m.hidden_size, m.num_hidden_layers, m.vocab_size, m.num_attention_heads,
               m.num_key_value_heads, m.num_local_experts, m.num_experts_per_tok,
               m.default_dtype) for n, m in got.items()}
    assert row == {  # each number as the file spells it
        "qwen3-8b": (4096, 36, 151936, 32, 8, 0, 0, "bf16"),  # "dtype": "float32" -> bf16
        "qwen3-30b-a3b": (2048, 48, 151936, 32, 4, 128, 8, "bf16"),
        "deepseek-r1": (7168, 61, 129280, 128, 128, 256, 8, "bf16"),
        "gpt-oss-20b": (2880, 24, 201088, 64, 8, 32, 4, "bf16"),  # no torch_dtype at all
        "gemma-3-4b": (2560, 34, 262144, 8, 4, 0, 0, "bf16"),  # from text_config
        "phi-3-mini-4k": (3072, 32, 32064, 32, 32, 0, 0, "bf16"),
        "llama-4-maverick-2layer": (5120, 2, 202048, 40, 8, 128, 1, "bf16"),  # text_config
    }
    assert got["deepseek-r1"].mla and not got["qwen3-8b"].mla


def test_presets_match_their_config_files():
    fields = ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads",
              "num_key_value_heads", "intermediate_size", "num_local_experts",
              "num_experts_per_tok", "model_type", "moe_layers", "mla")
    for preset, folder in (("qwen3-8b", "qwen3-8b"), ("qwen3-30b-a3b", "qwen3-30b-a3b"),
                           ("deepseek-v3", "deepseek-r1")):
        a, b = PRESETS[preset], load(folder)
        assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields], preset
    # gpt-oss-120b = gpt-oss-20b with 36 layers and 128 experts (README there).
    big, small = PRESETS["gpt-oss-120b"], load("gpt-oss-20b")
    assert (big.hidden_size, big.vocab_size, big.num_attention_heads) == (
        small.hidden_size, small.vocab_size, small.num_attention_heads)
    assert (big.num_hidden_layers, big.num_local_experts, big.torch_dtype) == (36, 128, "fp32")


def test_deepseek_dense_layers_then_moe():
    # first_k_dense_replace 3, moe_layer_freq 1 (vllm models/deepseek_v2.py:1239-1243):
    # layers 0-2 reduce down_proj, 3-60 the experts' sum. MTP (num_nextn_predict_layers 1)
    # adds nothing without speculative decoding: 1 + 2 * 61 = 123 all-reduces.
    model = load("deepseek-r1")
    tags = allreduce_tags(model, tp=8)
    assert len(tags) == 123
    assert [mlp_module(model, i) for i in (0, 2, 3, 60)] == [
        "mlp.down_proj", "mlp.down_proj", "mlp.experts", "mlp.experts"]
    assert "layers.2.mlp.down_proj" in tags and "layers.3.mlp.experts" in tags


def test_llama4_interleaved_moe_layers():
    # interleave_moe_layer_step 2 (vllm models/llama4.py:342-345): MoE when (i + 1) % 2 == 0,
    # so of the 2 layers, 0 is dense (feed_forward.down_proj) and 1 is MoE.
    tags = allreduce_tags(load("llama-4-maverick-2layer"), tp=8)
    assert tags == ["embed_tokens", "layers.0.self_attn.o_proj",
                    "layers.0.feed_forward.down_proj", "layers.1.self_attn.o_proj",
                    "layers.1.feed_forward.experts"]


def test_qwen3_moe_every_layer_and_mlp_only_layers(tmp_path):
    tags = allreduce_tags(load("qwen3-30b-a3b"))
    assert sum(t.endswith("mlp.experts") for t in tags) == 48
    # mlp_only_layers [0, 5] (vllm models/qwen3_moe.py:387-391): those two are dense.
    raw = json.loads((CONFIGS / "qwen3-30b-a3b" / "config.json").read_text())
    raw["mlp_only_layers"] = [0, 5]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    model = from_hf_config(tmp_path / "config.json")
    assert len(model.moe_layers) == 46
    assert [mlp_module(model, i) for i in (0, 1, 5)] == [
        "mlp.down_proj", "mlp.experts", "mlp.down_proj"]


def test_gpt_oss_every_layer_is_moe_and_runs_in_bf16():
    model = load("gpt-oss-20b")
    assert model.torch_dtype == "fp32"  # no torch_dtype: transformers' float32 default
    p = generate("vllm", model, Layout(tp=2), Workload(8, 2))
    assert p.workload.dtype == "bf16"  # vLLM's dtype=auto serves fp32 configs as bf16
    assert sum(t.endswith("mlp.experts") for t in allreduce_tags(model)) == 24


def test_gemma3_text_config_and_its_defaults(tmp_path):
    # head_dim 256 != 2560 / 8; the all-reduces are of the hidden size: [T, 2560].
    p = generate("vllm", load("gemma-3-4b"), Layout(tp=2), Workload(8, 2))
    assert p.stages[0][0].step.ops[0].shape == (8, 2560)
    # A text_config holding only what differs from Gemma3TextConfig gets its defaults
    # (transformers @ 008f5c8c configuration_gemma3.py): vocab 262208, 8 heads, 4 KV heads.
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "gemma3", "torch_dtype": "bfloat16",
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                        "model_type": "gemma3_text", "num_hidden_layers": 34,
                        "sliding_window": 1024}}))
    sparse = from_hf_config(tmp_path / "config.json")
    assert (sparse.vocab_size, sparse.num_attention_heads, sparse.num_key_value_heads,
            sparse.tie_word_embeddings) == (262208, 8, 4, True)


def test_phi3_loads_and_splits_over_tp4():
    # 32064 = 64 * 501: no padding, 8016 a rank at TP4.
    p = generate("vllm", load("phi-3-mini-4k"), Layout(tp=4), Workload(8, 2))
    assert p.stages[0][0].step.ops[-1].shape == (1, 8016)


@pytest.mark.parametrize("engine, tp, message", [
    # MLA attention splits its 128 heads over TP (vllm models/deepseek_v2.py:478); the name is
    # the config's own (model_type deepseek_v3, hidden 7168, 61 layers), not its folder's.
    ("vllm", 3, "tp(3) does not divide num_attention_heads(128) of deepseek_v3-h7168-L61 (MLA"),
    ("vllm", 256, "tp(256) does not divide num_attention_heads(128)"),
])
def test_refusals_for_mla(engine, tp, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        generate(engine, load("deepseek-r1"), Layout(tp=tp), Workload(8, 2))


def test_vllm_kv_head_rule():
    # vllm models/llama.py:147-152: kv (4) >= tp needs kv % tp == 0, kv < tp needs tp % kv:
    # Qwen2.5-7B (28 heads, 4 KV heads) refuses tp 7 under vllm; vllm-v0 keeps its behaviour.
    with pytest.raises(ConfigError, match=r"tp\(7\) does not split num_key_value_heads\(4\)"
                                          r".*use tp in 1, 2, 4, 28"):
        generate("vllm", PRESETS["qwen2.5-7b"], Layout(tp=7), Workload(8, 2))
    generate("vllm-v0", PRESETS["qwen2.5-7b"], Layout(tp=7), Workload(8, 2))
