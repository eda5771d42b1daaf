"""DeepSeek-V2/V3's own sequence-parallel MoE path in vLLM V1 (tp > 1, dp > 1, --ep, pp 1).

Code read: modal-projects/vllm @ c8109375, `vllm/model_executor/models/deepseek_v2.py`:
- `DeepseekV2DecoderLayer.__init__` (1244-1249, 1265): `use_sequence_parallel_moe` =
  `parallel_config.use_sequence_parallel_moe` (config/parallel.py:673-687: --ep, tp > 1,
  dp > 1) and pp == 1 and a MoE layer; the attention is then built with
  `reduce_results=False`: no o_proj all-reduce.
- `DeepseekV2DecoderLayer.forward` (1298-1360): when its input arrives sequence-parallel
  (the previous layer was one too), the normed hidden states are all-gathered over TP,
  [ceil(T/tp), h] -> [tp*ceil(T/tp), h], before the attention; after the attention the
  output is padded to a multiple of tp and reduce-scattered over TP, [tp*ceil(T/tp), h] ->
  [ceil(T/tp), h] (this replaces the attention all-reduce); the residual is chunked locally;
  the MoE runs `already_sequence_parallel=True` (408-426: no chunk, no all-gather after the
  experts), so the layer ends with [ceil(T/tp), h] on each TP rank.
- `DeepseekV2Model.forward` (1474-1508): a dense layer after a sequence-parallel one, and the
  final norm after the last layer, first all-gather hidden states and residual concatenated,
  [ceil(T/tp), 2h] -> [tp*ceil(T/tp), 2h].
Other MoE models (Qwen3-MoE, ...) chunk and all-gather inside the MoE block
(`patterns.engines.vllm.moe.vllm_moe_layer`), keeping the attention all-reduce.
"""

from patterns.moe import sequence_parallel_moe
from patterns.ops import Op, OpKind
from patterns.stage import Stage

DEEPSEEK_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32"})
SP_ALLGATHER_SUFFIX = ".sequence_parallel.allgather"  # the MoE block's own (not here)


def deepseek_sp(st: Stage) -> bool:
    return (st.model.model_type in DEEPSEEK_MODEL_TYPES and sequence_parallel_moe(st.layout)
            and st.pp == 1)


def _chunk(st: Stage, tokens: int) -> int:
    return -(-tokens // st.tp)


def _combined_allgather(st: Stage, tokens: int, tag: str) -> Op:
    c = _chunk(st, tokens)
    return st.tp_op(OpKind.ALLGATHER, (c, 2 * st.h), (c * st.tp, 2 * st.h), tag)


def sp_input(st: Stage, layer: int, tokens: int) -> list[Op]:
    """What a layer does first when the previous layer left its output sequence-parallel."""
    if layer == 0 or not st.model.is_moe_layer(layer - 1):
        return []
    if not st.model.is_moe_layer(layer):
        return [_combined_allgather(st, tokens, f"layers.{layer}.input.allgather")]
    c = _chunk(st, tokens)
    return [st.tp_op(OpKind.ALLGATHER, (c, st.h), (c * st.tp, st.h),
                     f"layers.{layer}.input_layernorm.allgather")]


def sp_moe_layer(st: Stage, layer: int, tokens: int, moe_ops: list[Op]) -> list[Op]:
    """One sequence-parallel MoE layer: [input all-gather], the attention reduce-scatter in
    place of its all-reduce, the experts' dispatch and combine without the final
    all-gather."""
    c = _chunk(st, tokens)
    scatter = st.tp_op(OpKind.REDUCESCATTER, (c * st.tp, st.h), (c, st.h),
                       f"layers.{layer}.self_attn.reduce_scatter")
    return [*sp_input(st, layer, tokens), scatter,
            *[op for op in moe_ops if not op.tag.endswith(SP_ALLGATHER_SUFFIX)]]


def sp_final(st: Stage, tokens: int) -> list[Op]:
    """The all-gather before the final norm when the last layer was sequence-parallel."""
    if not st.is_last or not st.model.is_moe_layer(st.layers[-1]):
        return []
    return [_combined_allgather(st, tokens, "norm.allgather")]
