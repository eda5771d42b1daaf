"""patterns/quantization.py: each quantization_config read as vLLM loads it (the bytes a
weight takes, scales included, and the modules kept in the dtype), checked by hand; real
configs where the search tools found them (tests/data/configs/README.md), else blocks in the
form vLLM's readers take (modal-projects/vllm @ c8109375, model_executor/layers/
quantization/: compressed_tensors, modelopt.py, awq.py, gptq.py)."""

from dataclasses import replace
from pathlib import Path

import pytest

from patterns import ConfigError, Layout, from_hf_config
from patterns.quantization import quantization_scheme
from patterns.weights import gpu_memory_bytes, scheme_of

CONFIGS = Path(__file__).parent / "data" / "configs"
ATTN, MLP = "model.layers.3.self_attn.q_proj", "model.layers.3.mlp.down_proj"


def scheme(block: dict):
    return quantization_scheme({"quantization_config": block, "torch_dtype": "bfloat16"}, "t")


def bpp(s, path: str, experts: bool = False, row: int = 4096) -> float | None:
    fmt = s.format_of(path, experts)
    return None if fmt is None else fmt.bytes_per_param(row)


def test_fp8_block_and_per_tensor():
    block = scheme({"quant_method": "fp8", "weight_block_size": [128, 128]})
    # 1 B a weight and a 4 B fp32 scale a 128 x 128 block: 1 + 4 / 16384
    assert bpp(block, MLP) == 1 + 4 / 16384 and block.fp8_compute
    tensor = scheme({"quant_method": "fp8", "activation_scheme": "static",
                     "ignored_layers": ["lm_head", "model.layers.3.self_attn.q_proj"]})
    assert bpp(tensor, MLP) == 1.0 and bpp(tensor, ATTN) is None
    with pytest.raises(ConfigError, match="weight_block_size is"):
        scheme({"quant_method": "fp8", "weight_block_size": [128]})


def test_fbgemm_keeps_the_modules_meta_lists():
    # Meta's 405B-FP8 config (the copy's abridged list): layer 0 and 125's MLP, layer 0's
    # attention stay bf16; a per-row fp32 scale: 1 + 4 / row
    s = from_hf_config(CONFIGS / "llama-3.1-405b-instruct-fp8").quantization
    assert bpp(s, "model.layers.0.mlp.down_proj") is None
    assert bpp(s, "model.layers.125.mlp.gate_proj") is None
    assert bpp(s, "model.layers.0.self_attn.v_proj") is None
    assert bpp(s, "model.layers.1.mlp.down_proj", row=6656) == 1 + 4 / 6656
    assert bpp(s, "model.layers.10.mlp.up_proj") == 1 + 4 / 4096  # not model.layers.1...


# compressed-tensors groups as llm-compressor writes them (llama4's W8A8-FP8 copy: OME's
# pkg/hfutil/modelconfig/testdata/llama4.json, group_0 weights float 8-bit per channel,
# activations float 8-bit per token, targets Linear)
W8A8_FP8 = {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                  "dynamic": True}, "targets": ["Linear"]}
W8A16 = {"weights": {"num_bits": 8, "type": "int", "strategy": "channel"},
         "input_activations": None, "targets": ["Linear"]}
W4A16 = {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
                     "symmetric": True}, "input_activations": None, "targets": ["Linear"]}
NVFP4 = {"weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                     "group_size": 16}, "targets": ["Linear"]}


@pytest.mark.parametrize("group, expected, fp8", [
    (W8A8_FP8, 1 + 4 / 4096, True),  # an fp32 scale a 4,096-wide row
    (W8A16, 1 + 4 / 4096, False),  # int8 weights, bf16 arithmetic
    (W4A16, 0.5 + 2 / 128, False),  # 4 bits and a bf16 scale every 128
    (NVFP4, 0.5 + 1 / 16, False),  # 4-bit floats and an fp8 scale every 16
])
def test_compressed_tensors_schemes(group, expected, fp8):
    s = scheme({"quant_method": "compressed-tensors", "config_groups": {"group_0": group},
                "ignore": ["lm_head", "re:.*self_attn.*"]})
    assert bpp(s, MLP) == pytest.approx(expected) and s.fp8_compute is fp8
    assert bpp(s, ATTN) is None  # the ignore's regular expression
    assert bpp(s, "model.layers.3.mlp.experts", experts=True) == pytest.approx(expected)


def test_modelopt_fp8_and_nvfp4():
    fp8 = scheme({"quant_method": "modelopt", "quant_algo": "FP8"})
    assert bpp(fp8, ATTN) == 1.0
    nvfp4 = scheme({"quant_method": "modelopt",
                    "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                     "exclude_modules": ["lm_head", "*self_attn*"]}})
    assert bpp(nvfp4, MLP) == 0.5 + 1 / 16 and bpp(nvfp4, ATTN) is None
    with pytest.raises(ConfigError, match="modelopt quant_algo 'W4A8_AWQ' is not modelled"):
        scheme({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"})


def test_mxfp4_quantizes_the_experts_alone():
    s = from_hf_config(CONFIGS / "gpt-oss-120b").quantization
    # 4-bit values and an 8-bit scale every 32: 4.25 bits
    assert bpp(s, "model.layers.0.mlp.experts", experts=True) == 4.25 / 8
    assert bpp(s, "model.layers.0.self_attn.q_proj") is None


def test_awq_and_gptq():
    awq = scheme({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
                  "modules_to_not_convert": ["visual"]})
    # 4 bits, and every 128 inputs an fp16 scale and a packed 4-bit zero: 0.5 + 2.5 / 128
    assert bpp(awq, MLP) == 0.5 + 2.5 / 128
    assert bpp(awq, "model.visual.blocks.0.attn.qkv") is None  # a substring, as AWQ matches
    gptq = scheme({"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": False})
    assert bpp(gptq, MLP, row=4096) == 1 + 3 / 4096  # one scale and zero an output row


def test_w4a16_llama_8b_by_hand():
    # Llama-3.1-8B, W4A16 group 128, lm_head kept: a layer's linear weights 4096 x (4096 x 2
    # + 1024 x 2) + 3 x 4096 x 14336 = 218,103,808 at 0.515625 B = 112,459,776 B, x 32 =
    # 3,598,712,832; norms 32 x 2 x 4096 x 2 B = 524,288; embedding and LM head 2 x 128256 x
    # 4096 x 2 B = 2,101,346,304; final norm 8,192 B: 5,700,591,616 B on one GPU.
    block = {"quant_method": "compressed-tensors", "config_groups": {"group_0": W4A16},
             "ignore": ["lm_head"]}
    model = replace(from_hf_config(CONFIGS / "qwen3-8b"), hidden_size=4096,
                    num_hidden_layers=32, vocab_size=128256, intermediate_size=14336,
                    num_key_value_heads=8, head_dim=128, quantization=scheme(block))
    assert gpu_memory_bytes(model, Layout(tp=1), "bf16", 0)[0] == 5_700_591_616


def test_a_method_the_tool_does_not_model_is_refused_where_its_weights_are_sized():
    model = from_hf_config(CONFIGS / "qwen3-8b")
    odd = replace(model, quantization=scheme({"quant_method": "bitsandbytes"}))
    with pytest.raises(ConfigError, match="quant_method 'bitsandbytes' is not modelled"):
        scheme_of(odd)
    with pytest.raises(ConfigError, match="quant_method 'bitsandbytes' is not modelled"):
        gpu_memory_bytes(odd, Layout(tp=1), "bf16", 0)
