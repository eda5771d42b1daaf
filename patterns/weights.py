"""Weight and KV-cache bytes one GPU holds under a layout: whether a layout can be deployed.

Counted: the embedding, each layer's attention (grouped-query, or DeepSeek's multi-head latent
attention), its dense MLP (gate, up, down) or its experts (the same three each) with shared
experts and router, its two RMSNorms, the final norm and the LM head unless tied. Not counted:
biases (Qwen2's q/k/v, gpt-oss's), Qwen3's per-head q/k norms, attention sinks, DeepSeek's
MTP layer and quantization scales.

The KV cache of a batch (`gpu_memory_bytes`): per token and layer, K and V of the rank's KV
heads (one where TP exceeds the KV heads), or MLA's cached latent (kv_lora_rank +
qk_rope_head_dim, the same on every TP rank), in the serving dtype (vLLM's
kv_cache_dtype=auto); every layer at full length (gpt-oss's sliding-window layers, which
vLLM caches to their window, are counted whole: an overestimate). Activations and CUDA
graphs are not counted.

Shards as vLLM shards them: TP splits attention heads (a KV head is replicated where there
are fewer KV heads than TP ranks, `QKVParallelLinear`), MLA's q_b/kv_b/o (its q_a and kv_a
projections are replicated, `ReplicatedLinear`), the MLP, experts without EP, and the padded
vocabulary of the embedding and LM head (`VocabParallelEmbedding`); PP splits the layers as
`get_pp_indices` does (shapes.stage_layer_counts), the embedding on the first stage, the
final norm and LM head on the last (a tied LM head is the embedding only where both sit on
one stage); with EP the experts split whole over the EP group of dp x tp ranks; DP attention
replicates everything else over the DP ranks. The figure is the heaviest rank's.

Bytes: as the checkpoint stores each weight (`quantization_config`, read by
patterns/quantization.py as vLLM loads it): each projection by its own module path, so the
modules a config keeps in the dtype (Meta's 405B-FP8: attention and the first and last
layers' MLP) stay there; scales counted (block fp8 4 B a 128 x 128 block, per-row 4 B a row,
NVFP4 an fp8 byte every 16, mxfp4 one every 32, AWQ/GPTQ an fp16 scale and a packed zero a
group); embedding, LM head, norms and router in the dtype.
"""

from dataclasses import dataclass
from functools import cache

from patterns.dtypes import DTYPE_BYTES
from patterns.errors import ConfigError
from patterns.hybrid import check_hybrid_use
from patterns.layout import Layout
from patterns.models import ModelConfig
from patterns.quantization import PRESET_SCHEMES, Format, QuantScheme
from patterns.shapes import padded_vocab, stage_layer_counts

MXFP4_BYTES = 4.25 / 8


@dataclass(frozen=True)
class LayerWeights:
    """One layer's parameters on one rank, by how they are stored."""

    linear: float  # attention and dense-MLP matrices
    experts: float  # routed and shared experts
    plain: float  # norms and router: always the dtype


def scheme_of(model: ModelConfig) -> QuantScheme | None:
    """The checkpoint's quantization (patterns/quantization.py); a preset's from its method.
    A method the tool does not model is refused here, in its one line."""
    scheme = model.quantization or PRESET_SCHEMES.get(model.weight_format)
    if scheme is not None and scheme.refusal:
        raise ConfigError(scheme.refusal)
    return scheme


def _mla(model: ModelConfig) -> bool:
    return model.mla and bool(model.kv_lora_rank)


def _head_dim(model: ModelConfig) -> int:
    return model.head_dim or model.hidden_size // model.num_attention_heads


def attention_parts(model: ModelConfig, tp: int) -> list[tuple[str, float, int]]:
    """(projection, parameters on a rank of TP `tp`, its input width) of one layer's
    attention, named as the checkpoint names them."""
    h, heads = model.hidden_size, model.num_attention_heads
    if _mla(model):
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        q = ([("q_a_proj", h * model.q_lora_rank, h),
              ("q_b_proj", model.q_lora_rank * heads * qk / tp, model.q_lora_rank)]
             if model.q_lora_rank else [("q_proj", h * heads * qk / tp, h)])
        return [*q, ("kv_a_proj_with_mqa", h * (model.kv_lora_rank + model.qk_rope_head_dim), h),
                ("kv_b_proj", model.kv_lora_rank * heads * (model.qk_nope_head_dim
                                                            + model.v_head_dim) / tp,
                 model.kv_lora_rank),
                ("o_proj", heads * model.v_head_dim * h / tp, heads * model.v_head_dim // tp)]
    d = _head_dim(model)
    kv_heads = max(model.num_key_value_heads // tp, 1)  # replicated below one head a rank
    return [("q_proj", h * heads * d / tp, h), ("k_proj", h * kv_heads * d, h),
            ("v_proj", h * kv_heads * d, h), ("o_proj", heads * d * h / tp, heads * d // tp)]


def _attention(model: ModelConfig, tp: int) -> float:
    return sum(params for _, params, _ in attention_parts(model, tp))


def _mla_norms(model: ModelConfig) -> int:
    if not _mla(model):
        return 0
    return model.kv_lora_rank + model.q_lora_rank


def _routed_per_rank(model: ModelConfig, tp: int, ep_size: int) -> float:
    """The routed experts one rank holds: with EP whole experts (the most a rank gets),
    without each expert split over TP."""
    experts = model.num_local_experts
    return -(-experts // ep_size) if ep_size > 1 else experts / tp


def layer_weights(model: ModelConfig, layer: int, tp: int, ep_size: int) -> LayerWeights:
    """Layer `layer`'s parameters on one rank of a TP group of `tp` (ep_size: the EP group,
    1 without expert parallelism)."""
    h = model.hidden_size
    plain = 2 * h + _mla_norms(model)
    if not model.is_moe_layer(layer):
        return LayerWeights(_attention(model, tp) + 3 * h * model.intermediate_size / tp, 0.0,
                            plain)
    inter = model.moe_intermediate_size or model.intermediate_size
    routed = _routed_per_rank(model, tp, ep_size) * 3 * h * inter
    shared = 3 * h * model.shared_expert_intermediate_size / tp
    return LayerWeights(_attention(model, tp), routed + shared,
                        plain + h * model.num_local_experts)


def _mlp_prefix(model: ModelConfig, layer: int) -> str:
    block = "feed_forward" if model.model_type.startswith("llama4") else "mlp"
    return f"model.layers.{layer}.{block}"


def _bpp(fmt: Format | None, row: int, dtype_bytes: float) -> float:
    return dtype_bytes if fmt is None else fmt.bytes_per_param(row)


@cache
def layer_bytes(model: ModelConfig, layer: int, tp: int, ep_size: int,
                dtype_bytes: float) -> tuple[float, float]:
    """(every weight but the routed experts, the routed experts) of layer `layer` on one
    rank, in bytes as the checkpoint stores them (patterns/quantization.py: each projection
    by its own module path, scales counted; norms and router in the dtype)."""
    scheme, h = scheme_of(model), model.hidden_size
    if scheme is None:
        w = layer_weights(model, layer, tp, ep_size)
        routed = (_routed_per_rank(model, tp, ep_size) * 3 * h * (
            model.moe_intermediate_size or model.intermediate_size)
            if model.is_moe_layer(layer) else 0.0)
        return (w.linear + w.experts - routed + w.plain) * dtype_bytes, routed * dtype_bytes
    prefix, mlp = f"model.layers.{layer}.self_attn", _mlp_prefix(model, layer)
    dense = sum(params * _bpp(scheme.format_of(f"{prefix}.{name}"), row, dtype_bytes)
                for name, params, row in attention_parts(model, tp))
    dense += (2 * h + _mla_norms(model)) * dtype_bytes
    if not model.is_moe_layer(layer):
        inter = model.intermediate_size
        dense += sum(h * inter / tp * _bpp(scheme.format_of(f"{mlp}.{name}"), row,
                                              dtype_bytes)
                     for name, row in (("gate_proj", h), ("up_proj", h),
                                       ("down_proj", inter // tp)))
        return dense, 0.0
    inter = model.moe_intermediate_size or model.intermediate_size
    shared_name = "shared_expert" if model.model_type.startswith("qwen2_moe") else "shared_experts"
    shared = model.shared_expert_intermediate_size
    dense += sum(h * shared / tp * _bpp(scheme.format_of(f"{mlp}.{shared_name}.{name}"), row,
                                         dtype_bytes)
                 for name, row in (("gate_proj", h), ("up_proj", h),
                                   ("down_proj", shared // tp or 1))) if shared else 0.0
    dense += h * model.num_local_experts * dtype_bytes  # router
    routed = (_routed_per_rank(model, tp, ep_size) * 3 * h * inter
              * _bpp(scheme.format_of(f"{mlp}.experts", experts=True), h, dtype_bytes))
    return dense, routed


def stage_bytes(model: ModelConfig, layout: Layout, dtype: str) -> list[float]:
    """Each pipeline stage's weight bytes on one of its ranks."""
    check_hybrid_use(model.name, model.hybrid, None, "a rank's memory (weights, KV cache)")
    dtype_bytes = DTYPE_BYTES[dtype]
    tp, pp = layout.tp, layout.pp
    ep_size = layout.dp * tp if layout.ep else 1
    vocab_rows = padded_vocab(model.vocab_size) * model.hidden_size / tp
    out, first = [], 0
    for stage, count in enumerate(stage_layer_counts(model.num_hidden_layers, pp)):
        total = sum(sum(layer_bytes(model, layer, tp, ep_size, dtype_bytes))
                    for layer in range(first, first + count))
        first += count
        if stage == 0:
            total += vocab_rows * dtype_bytes
        if stage == pp - 1:
            total += model.hidden_size * dtype_bytes  # final norm
            if not (model.tie_word_embeddings and pp == 1):
                total += vocab_rows * dtype_bytes
        out.append(total)
    return out


def kv_bytes_per_token_layer(model: ModelConfig, tp: int, dtype: str) -> int:
    """One token's cache in one layer on one rank of a TP group of `tp`."""
    check_hybrid_use(model.name, model.hybrid, None, "a rank's memory (weights, KV cache)")
    if _mla(model):
        return (model.kv_lora_rank + model.qk_rope_head_dim) * DTYPE_BYTES[dtype]
    kv_heads = max(model.num_key_value_heads // tp, 1)
    return 2 * kv_heads * _head_dim(model) * DTYPE_BYTES[dtype]


def gpu_memory_bytes(model: ModelConfig, layout: Layout, dtype: str,
                     tokens: int) -> tuple[int, int]:
    """(weights, KV cache) of the rank whose sum is the largest, when each DP rank caches
    `tokens` tokens (batch x (prompt + decode)); tokens 0: the heaviest rank's weights."""
    per_layer = kv_bytes_per_token_layer(model, layout.tp, dtype) * tokens
    counts = stage_layer_counts(model.num_hidden_layers, layout.pp)
    stages = [(w, count * per_layer) for w, count in zip(stage_bytes(model, layout, dtype),
                                                         counts, strict=True)]
    weights, cache = max(stages, key=sum)
    return round(weights), cache


def total_params(model: ModelConfig) -> int:
    """Every counted parameter once (one rank of TP1 PP1 holds them all; vocab unpadded)."""
    layers = sum(sum((w.linear, w.experts, w.plain))
                 for w in (layer_weights(model, i, 1, 1)
                           for i in range(model.num_hidden_layers)))
    vocab = model.vocab_size * model.hidden_size
    return round(layers + vocab * (1 if model.tie_word_embeddings else 2) + model.hidden_size)
