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

Bytes: the serving dtype's, except where the checkpoint is quantized
(config.json `quantization_config.quant_method`): fp8 (DeepSeek-V3) stores every linear
layer of the decoder in 1 byte (embedding, LM head, norms and router stay in the dtype);
mxfp4 (gpt-oss) stores the experts in 4.25 bits (4-bit values and one 8-bit scale per 32).
"""

from dataclasses import dataclass

from patterns.dtypes import DTYPE_BYTES
from patterns.hybrid import check_hybrid_use
from patterns.layout import Layout
from patterns.models import ModelConfig
from patterns.shapes import padded_vocab, stage_layer_counts

MXFP4_BYTES = 4.25 / 8


@dataclass(frozen=True)
class LayerWeights:
    """One layer's parameters on one rank, by how they are stored."""

    linear: float  # attention and dense-MLP matrices (fp8 in an fp8 checkpoint)
    experts: float  # routed and shared experts (mxfp4 in an mxfp4 checkpoint; fp8 in fp8)
    plain: float  # norms and router: always the dtype


def _mla(model: ModelConfig) -> bool:
    return model.mla and bool(model.kv_lora_rank)


def _head_dim(model: ModelConfig) -> int:
    return model.head_dim or model.hidden_size // model.num_attention_heads


def _attention(model: ModelConfig, tp: int) -> float:
    h, heads = model.hidden_size, model.num_attention_heads
    if _mla(model):
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        if model.q_lora_rank:
            q = h * model.q_lora_rank + model.q_lora_rank * heads * qk / tp
        else:
            q = h * heads * qk / tp
        kv_a = h * (model.kv_lora_rank + model.qk_rope_head_dim)
        kv_b = model.kv_lora_rank * heads * (model.qk_nope_head_dim + model.v_head_dim) / tp
        o = heads * model.v_head_dim * h / tp
        return q + kv_a + kv_b + o
    d = _head_dim(model)
    kv_heads = max(model.num_key_value_heads // tp, 1)  # replicated below one head a rank
    return 2 * h * heads * d / tp + 2 * h * kv_heads * d


def _mla_norms(model: ModelConfig) -> int:
    if not _mla(model):
        return 0
    return model.kv_lora_rank + model.q_lora_rank


def layer_weights(model: ModelConfig, layer: int, tp: int, ep_size: int) -> LayerWeights:
    """Layer `layer`'s parameters on one rank of a TP group of `tp` (ep_size: the EP group,
    1 without expert parallelism)."""
    h = model.hidden_size
    plain = 2 * h + _mla_norms(model)
    if not model.is_moe_layer(layer):
        return LayerWeights(_attention(model, tp) + 3 * h * model.intermediate_size / tp, 0.0,
                            plain)
    inter = model.moe_intermediate_size or model.intermediate_size
    experts = model.num_local_experts
    # With EP whole experts, the most one rank holds; without, each expert split over TP.
    per_rank = -(-experts // ep_size) if ep_size > 1 else experts / tp
    routed = per_rank * 3 * h * inter
    shared = 3 * h * model.shared_expert_intermediate_size / tp
    return LayerWeights(_attention(model, tp), routed + shared, plain + h * experts)


def _bytes(model: ModelConfig, weights: LayerWeights, dtype_bytes: float) -> float:
    linear = 1.0 if model.weight_format == "fp8" else dtype_bytes
    expert = {"fp8": 1.0, "mxfp4": MXFP4_BYTES}.get(model.weight_format, dtype_bytes)
    return weights.linear * linear + weights.experts * expert + weights.plain * dtype_bytes


def stage_bytes(model: ModelConfig, layout: Layout, dtype: str) -> list[float]:
    """Each pipeline stage's weight bytes on one of its ranks."""
    check_hybrid_use(model.name, model.hybrid, None, "a rank's memory (weights, KV cache)")
    dtype_bytes = DTYPE_BYTES[dtype]
    tp, pp = layout.tp, layout.pp
    ep_size = layout.dp * tp if layout.ep else 1
    vocab_rows = padded_vocab(model.vocab_size) * model.hidden_size / tp
    out, first = [], 0
    for stage, count in enumerate(stage_layer_counts(model.num_hidden_layers, pp)):
        total = sum(_bytes(model, layer_weights(model, layer, tp, ep_size), dtype_bytes)
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
