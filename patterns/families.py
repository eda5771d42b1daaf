"""What a model family does around its all-reduces that decides whether vLLM's all-reduce +
RMSNorm fusion can take them: a multimodal architecture embeds outside the compiled graph, some
families scale the embedding, some scale every layer's output or norm with LayerNorm.

vLLM's fusion pass (`compilation/passes/fusion/allreduce_rms_fusion.py:368-626` @ c8109375,
modal-projects/vllm) matches an all-reduce whose output goes *straight* into an RMSNorm
(`rms_norm` or `fused_add_rms_norm`, Gemma's included); a multiply in between, a LayerNorm, or
an all-reduce outside the graph leaves it a plain all-reduce.
"""

# Multimodal models (vLLM's `_MULTIMODAL_MODELS`, `model_executor/models/registry.py:345-605`):
# every `*ForConditionalGeneration` but the text models of `_TEXT_GENERATION_MODELS`
# (registry.py:84, 167), and these, named otherwise.
_TEXT_ONLY_CONDITIONAL = frozenset({"ChatGLMForConditionalGeneration",
                                    "InklingForConditionalGeneration"})
_MULTIMODAL_OTHER = frozenset({
    "DeepseekVLV2ForCausalLM", "DeepseekOCRForCausalLM", "DeepseekOCR2ForCausalLM",
    "UnlimitedOCRForCausalLM", "DotsOCRForCausalLM", "GLM4VForCausalLM", "H2OVLChatModel",
    "InternVLChatModel", "MoonshotKimiaForCausalLM", "Llama_Nemotron_Nano_VL",
    "MiDashengLMModel", "MiMoV2OmniForCausalLM", "MiniCPMO", "MiniCPMV", "MolmoForCausalLM",
    "Moondream3ForCausalLM", "MossAudioModel", "HfMoondream", "NemotronH_Nano_VL_V2",
    "NemotronH_Nano_Omni_Reasoning_V3", "NemotronH_Super_Omni_Reasoning_V3", "NVLM_D",
    "Ovis", "Ovis2_5", "Ovis2_6ForCausalLM", "Ovis2_6_MoeForCausalLM", "Phi3VForCausalLM",
    "Phi4ForCausalLMV", "Phi4MMForCausalLM", "Qwen2_5OmniModel", "SkyworkR1VChatModel",
    "UltravoxModel",
})

# Families whose embedding is multiplied before the first norm (model_executor/models/ @
# c8109375): Gemma's normalizer sqrt(h) (gemma.py:288-295, gemma2.py:276-283,
# gemma3.py:332-341; gemma3n.py:600 embed_scale), Granite's embedding_multiplier
# (granite.py:313, granitemoe.py:327, granitemoeshared.py:195, granitemoehybrid.py:385),
# Falcon-H1's (falcon_h1.py:472-475), MiniCPM's scale_emb (minicpm.py:443).
SCALED_EMBEDDING = frozenset({
    "gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma3n_text", "granite",
    "granitemoe", "granitemoeshared", "granitemoehybrid", "falcon_h1", "minicpm",
})

# Families none of whose all-reduces go straight into an RMSNorm: LayerNorm models (phi.py:181,
# commandr.py:76-83, 253), and those that multiply each layer's output before its residual add
# and norm (granite.py:240-245, granitemoe.py:276-280, granitemoeshared.py:133-144,
# granitemoehybrid.py:121-138, falcon_h1.py:400-409 and its MLP's down_multiplier :96,
# minicpm.py:385-393 scale_depth).
NO_NORM_FUSION = frozenset({
    "phi", "cohere", "cohere2", "granite", "granitemoe", "granitemoeshared",
    "granitemoehybrid", "falcon_h1", "minicpm",
})


def is_multimodal(raw: dict[str, object]) -> bool:
    """Whether vLLM serves the config's architecture as a multimodal model: its first
    `architectures` entry (the one vLLM resolves first)."""
    archs = raw.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        return False
    arch = archs[0]
    return arch in _MULTIMODAL_OTHER or (arch.endswith("ForConditionalGeneration")
                                         and arch not in _TEXT_ONLY_CONDITIONAL)


def embedding_traits(raw: dict[str, object], model_type: str) -> dict[str, bool]:
    """The ModelConfig fields of the family: `multimodal`, `embedding_scaled`, `norm_fusion`."""
    family = model_type.lower()
    return {"multimodal": is_multimodal(raw), "embedding_scaled": family in SCALED_EMBEDDING,
            "norm_fusion": family not in NO_NORM_FUSION}
