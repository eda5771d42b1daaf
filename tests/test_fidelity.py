"""Fidelity corrections to the engine profiles, each checked against the engine's code."""

import pytest

from patterns.dtypes import canonical_dtype
from patterns.errors import ConfigError


@pytest.mark.parametrize("name", ["fp8", "mxfp4", "FP8"])
def test_quantised_dtype_refused_with_reason(name):
    # A quantised weight format is not an activation dtype: refused, and the message says
    # the activations stay bf16 and what to give instead.
    with pytest.raises(ConfigError) as err:
        canonical_dtype(name)
    text = str(err.value)
    assert "is not a model dtype; use one of bf16, fp16, fp32" in text
    assert "activations stay bf16" in text and "not --dtype" in text


def test_unknown_dtype_has_no_quantisation_hint():
    with pytest.raises(ConfigError) as err:
        canonical_dtype("complex64")
    assert "activations stay bf16" not in str(err.value)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_moe_at_dp1_is_sharded_over_tp_not_replicated(engine):
    # vLLM fused_moe/config.py:1331-1333 @ c8109375, SGLang fused_moe_triton/layer.py:256-257
    # @ 8905cbd4, TRT-LLM mapping.py @ 05ebebb2 (moe_tp_size = tp_size): each rank holds a 1/tp
    # slice of every expert, so each MoE layer's partial outputs are all-reduced once.
    from patterns.engines import ENGINE_INFO, generate
    from patterns.layout import Layout, Workload
    from patterns.models import resolve_model
    from patterns.moe import notes
    from patterns.ops import OpKind
    from patterns.pattern import EngineOptions

    model = resolve_model("qwen3-30b-a3b")
    layout = Layout(tp=4)
    text = " ".join(notes(model, layout, engine))
    assert "every expert sharded over TP" in text and "replicated" not in text
    assert "replicated over TP" not in " ".join(ENGINE_INFO[engine].not_modelled)
    pattern = generate(engine, model, layout, Workload(prompt=16, decode=1),
                       EngineOptions(eager=True) if engine != "trtllm" else EngineOptions())
    prefill = pattern.stages[0][0].step.ops
    moe = [op for op in prefill if op.kind == OpKind.ALLREDUCE and ".mlp" in op.tag]
    # 48 MoE layers (every layer of Qwen3-30B-A3B), one all-reduce of [16, 2048] each.
    assert len(moe) == 48 and {op.shape for op in moe} == {(16, 2048)}
