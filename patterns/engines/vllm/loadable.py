"""Whether vLLM loads a checkpoint under a layout: the shape checks its layers make when they
create their weights, with vLLM's own message.

Read at modal-projects/vllm @ c8109375:
- KV heads (`model_executor/layers/linear.py` 1075-1080, `QKVParallelLinear`): at
  tp >= num_key_value_heads each rank holds one head, replicated tp / kv times, so tp must be
  a multiple of the KV heads; below, the KV heads must divide over tp (`divide`, whose
  assertion reads "{a} is not divisible by {b}").
- block-quantized weights (`quantization/utils/fp8_utils.py` 1192-1236,
  `validate_fp8_block_shape`): a row-parallel layer's (o_proj, down_proj) input shard must be
  a whole number of block_k columns; a column-parallel layer of one output (MLA's q_b_proj,
  kv_b_proj) a whole number of block_n rows. Merged layers (gate_up, qkv) are let through
  (`linear.py` 533-556, `_maybe_allow_fp8_block_shape_mismatch`).
- block-quantized experts (`quantization/fp8.py` 520-543, `Fp8MoEMethod.create_weights`): the
  expert's intermediate shard (moe_intermediate_size / tp without EP, whole with it) a
  multiple of block_n, and of block_k at tp > 1.
Layers are created in order, so the first failing one's message is the one vLLM prints.
"""

from functools import cache

from patterns.models import ModelConfig
from patterns.weights import scheme_of


def _kv_heads(model: ModelConfig, tp: int) -> str | None:
    kv = model.num_key_value_heads
    if model.mla and model.kv_lora_rank:
        return None
    if tp >= kv and tp % kv:
        return (f"{tp} is not divisible by {kv}: vLLM replicates num_key_value_heads({kv}) over "
                f"tp={tp} only as whole copies (linear.py QKVParallelLinear)")
    if tp < kv and kv % tp:
        return (f"{kv} is not divisible by {tp}: num_key_value_heads({kv}) must split evenly "
                f"over tp={tp} (linear.py QKVParallelLinear)")
    return None


def _row(name: str, size: int, block_k: int) -> str | None:
    if size % block_k:
        return (f"{name}: Weight input_size_per_partition = {size} is not divisible by "
                f"weight quantization block_k = {block_k}.")
    return None


def _column(name: str, size: int, block_n: int) -> str | None:
    if size % block_n:
        return (f"{name}: Weight output_partition_size = {size} is not divisible by weight "
                f"quantization block_n = {block_n}.")
    return None


def _block_checks(model: ModelConfig, tp: int, ep: bool) -> str | None:
    """The first layer vLLM would refuse to create under block quantization, or None."""
    scheme = scheme_of(model)
    if scheme is None or tp == 1:
        return None
    blocks = {fmt.block for _, fmt in scheme.rules if fmt.block}
    if not blocks:
        return None
    block_n, block_k = blocks.pop()
    heads = model.num_attention_heads // tp
    for layer in range(model.num_hidden_layers):
        checks = []
        if model.mla and model.kv_lora_rank:
            qk = model.qk_nope_head_dim + model.qk_rope_head_dim
            checks += [_column("self_attn.q_b_proj", heads * qk, block_n),
                       _column("self_attn.kv_b_proj",
                               heads * (model.qk_nope_head_dim + model.v_head_dim), block_n),
                       _row("self_attn.o_proj", heads * model.v_head_dim, block_k)]
        else:
            d = model.head_dim or model.hidden_size // model.num_attention_heads
            checks.append(_row("self_attn.o_proj", heads * d, block_k))
        if not model.is_moe_layer(layer):
            checks.append(_row("mlp.down_proj", model.intermediate_size // tp, block_k))
        else:
            if model.shared_expert_intermediate_size:
                checks.append(_row("mlp.shared_experts.down_proj",
                                   model.shared_expert_intermediate_size // tp, block_k))
            inter = model.moe_intermediate_size or model.intermediate_size
            share = inter if ep else inter // tp
            if share % block_n:
                checks.append(f"mlp.experts: The output_size of gate's and up's weight = "
                              f"{share} is not divisible by weight quantization block_n = "
                              f"{block_n}.")
            elif share % block_k:
                checks.append(f"mlp.experts: The input_size of down's weight = {share} is not "
                              f"divisible by weight quantization block_k = {block_k}.")
        failed = next((c for c in checks if c), None)
        if failed:
            return f"layer {layer} {failed}"
    return None


@cache
def load_refusal(model: ModelConfig, tp: int, ep: bool) -> str | None:
    """vLLM's reason for refusing to load the checkpoint at this TP (and EP), or None."""
    reason = _kv_heads(model, tp) or _block_checks(model, tp, ep)
    return None if reason is None else f"vLLM does not load it: {reason}"
