"""The embedding all-reduce labelled as vLLM @ c8109375 runs it (patterns/families.py,
patterns/engines/vllm/hybrid.py embed_ops). vLLM's fusion pass takes an all-reduce whose
output goes straight into an RMSNorm in the compiled graph (`compilation/passes/fusion/
allreduce_rms_fusion.py:368-626`). A multimodal model embeds outside the graph, on the
scheduled tokens before padding (`v1/worker/gpu_model_runner.py:3569-3616`,
`v1/worker/gpu/model_states/default.py:89-95`); Gemma multiplies the embedding by sqrt(h)
before the first norm (`gemma3.py:332-341`). The pattern labelled both fused, on the padded
batch. On an H100 at tp 2 a bf16 all-reduce under 8 MiB (a multiple of 16 bytes) that is not
fused goes through vLLM's custom all-reduce (patterns/engines/vllm/transports.py)."""

import json
from pathlib import Path

from patterns import EngineOptions, Layout, Workload, from_hf_config, generate
from patterns.engines.workloads import workload_pattern
from patterns.workload.requests import Request

CONFIGS = Path(__file__).parent / "data" / "configs"
FUSED, CUSTOM = "fused-allreduce-rmsnorm", "custom-allreduce"


def decode_step(m, batch=3, tp=2):
    # batch 3 pads to the capture size 4 ([1, 2, 4, 8, ...]: rules.v1_capture_sizes)
    pattern = generate("vllm", m, Layout(tp=tp), Workload(8, 2, batch=batch),
                       EngineOptions(gpu="h100"))
    return next(run.step for run in pattern.stages[0] if run.phase.value == "decode")


def first_two(step):
    return [(op.tag, op.shape, op.transport.value) for op in step.ops[:2]]


def test_gemma3_multimodal_embeds_the_scheduled_tokens_outside_the_graph():
    # Gemma3ForConditionalGeneration, h 2560: the embedding [3, 2560] (3 scheduled tokens,
    # not the padded 4), unfused; the first o_proj [4, 2560] still fused
    step = decode_step(from_hf_config(CONFIGS / "gemma-3-4b" / "config.json"))
    assert step.tokens == 4
    assert first_two(step) == [("embed_tokens", (3, 2560), CUSTOM),
                               ("layers.0.self_attn.o_proj", (4, 2560), FUSED)]


def test_gemma3_text_model_scales_its_embedding_inside_the_graph(tmp_path):
    # the same language model served as Gemma3ForCausalLM: embedded in the graph, padded
    # to 4, but multiplied by the normalizer before input_layernorm: not fused
    raw = json.loads((CONFIGS / "gemma-3-4b" / "config.json").read_text())
    text = {**raw["text_config"], "architectures": ["Gemma3ForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(text))
    step = decode_step(from_hf_config(tmp_path / "config.json"))
    assert first_two(step) == [("embed_tokens", (4, 2560), CUSTOM),
                               ("layers.0.self_attn.o_proj", (4, 2560), FUSED)]


def test_llama4_multimodal_moe_embeds_outside_the_graph_too():
    # Llama4ForConditionalGeneration (a MoE: Model Runner V1, gpu_model_runner.py:3606-3610)
    step = decode_step(from_hf_config(CONFIGS / "llama-4-maverick-2layer" / "config.json"))
    assert first_two(step)[0] == ("embed_tokens", (3, 5120), CUSTOM)


def test_a_plain_llama_embedding_is_still_fused(tmp_path):
    # no scaling, text only: the embedding all-reduce goes into layer 0's input_layernorm
    step = decode_step(from_hf_config(CONFIGS / "qwen3-8b" / "config.json"))
    assert first_two(step)[0] == ("embed_tokens", (4, 4096), FUSED)


def test_granite_and_phi_fuse_nothing(tmp_path):
    # granite.py:240-245 multiplies each output by residual_multiplier before the add and
    # norm; phi.py:181 normalises with LayerNorm, which the pass does not match
    base = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 1000,
            "num_attention_heads": 4, "intermediate_size": 128, "torch_dtype": "bfloat16"}
    for family in ("granite", "phi"):
        (tmp_path / "config.json").write_text(json.dumps({**base, "model_type": family}))
        step = decode_step(from_hf_config(tmp_path / "config.json"))
        assert {op.transport.value for op in step.ops if op.kind == "allreduce"} == {CUSTOM}


def test_a_request_workload_embeds_each_steps_scheduled_tokens():
    # 3 requests of 6, 4 and 5 prompt tokens: one prefill step of 15 (padded to 16), then
    # decodes of 3 (padded 4), 2 and 1 as the outputs 3, 2 and 4 end
    m = from_hf_config(CONFIGS / "gemma-3-4b" / "config.json")
    requests = [Request(0.0, 6, 3), Request(0.0, 4, 2), Request(0.0, 5, 4)]
    pattern = workload_pattern("vllm", m, Layout(tp=2), requests, None,
                               EngineOptions(gpu="h100"), None)
    embeds = [(step.ops[0].shape[0], step.ops[1].shape[0]) for step in pattern.segment_steps]
    assert embeds == [(15, 16), (3, 4), (2, 2), (1, 1)]  # (embedding, first o_proj)
