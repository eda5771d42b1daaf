"""A MoE layer of Megatron-Core's static inference engine, as megatron-core 0.19.2 issues its
calls (paths under `megatron/core/` of the 0.19.2 wheel); held against the engine serving a
tiny MoE GPT on gloo at TP2, TP2 x EP2, TP2 x PP2 and PP2 x EP2
(scripts/megatron_cpu_oracle.py, tests/test_real_engine_megatron.py).

The token dispatcher is the default one, `moe_token_dispatcher_type="allgather"`
(`transformer/transformer_config.py` 862; `MoEAllGatherTokenDispatcher`, built in
`transformer/moe/moe_layer.py` 299); the inference-optimized dispatchers
(`token_dispatcher_inference.py`) run only with `transformer_impl="inference_optimized"`, and
the static loop changes none of it. Its group is `tp_ep`: the expert tensor-parallel ranks
(`expert_tensor_parallel_size`, which defaults to the TP size: `model_parallel_config.py`
506-507) times the expert-parallel ones (`expert_model_parallel_size`). Megatron builds
expert_tp x ep x expert_dp = tp x dp, so:
- without --ep (expert_model_parallel_size 1): the group is the TP group;
- with --ep: expert_tp x ep = dp x tp (ep = dp at Megatron's default expert TP, or ep = dp x tp
  with expert_tensor_parallel_size 1: the same calls), every rank of the stage: the group
  infercomm names "ep". A layout with expert data parallelism left over (ep x expert_tp below
  dp x tp) is not expressible with --ep.
At tp_ep 1 (TP1 without --ep) the dispatcher issues nothing.

A MoE layer's forward (`MoELayer.forward`'s `custom_forward`, moe_layer.py 651-692), after
the attention's linear_proj all-reduce, over the T = s x b tokens of the step:
1. the shared expert, when the model has one (`moe_shared_expert_intermediate_size`): a
   SharedExpertMLP on the attention TP group (`shared_experts.py` 129), computed first (654,
   unless `moe_shared_expert_overlap`): its linear_fc2 all-reduces [s, b, h] over TP;
2. the router (`router.py` TopKRouter): no call at inference (its aux losses run only in
   training, 799);
3. `token_dispatch` (token_dispatcher.py 278-300): all-gathers over tp_ep the routing map,
   bool [T, E], then the probabilities [T, E], then the tokens [T, h], each to
   [tp_ep x T, ...];
4. the local experts: no call (their linears are `is_expert`, so `explicit_expert_comm`:
   `tensor_parallel/layers.py` 960, 1326);
5. `token_combine` (352-365): reduce-scatters the experts' output [tp_ep x T, h] to [T, h]
   over tp_ep, in the probabilities' dtype (`hidden_states.to(self.local_probs.dtype)`, 363).
The probabilities (and so the reduce-scatter) are in the router's dtype: the model's unless
`moe_router_dtype` is set (router.py 103-107; moe_utils.py 875 casts them to the logits'
dtype); with `moe_router_dtype="fp32"`, which many MoE recipes set, both are fp32 (not
modelled: the model's dtype here).
"""

from patterns.ops import Op, OpKind
from patterns.stage import Stage


def dispatch_group(st: Stage) -> tuple[str, int]:
    """The dispatcher's tp_ep group: infercomm's group kind and its size."""
    layout = st.layout
    return ("ep", layout.ep_size) if layout.ep else ("tp", layout.tp)


def moe_layer(st: Stage, layer: int, tokens: int, hidden: tuple[int, ...]) -> list[Op]:
    """The calls of MoE layer `layer` after its attention: `tokens` = T, `hidden` the layer's
    [s, b, h] (what the shared expert all-reduces)."""
    ops: list[Op] = []
    prefix = f"layers.{layer}.mlp"
    if st.model.shared_expert_intermediate_size and st.tp > 1:
        ops.append(st.tp_op(OpKind.ALLREDUCE, hidden, hidden,
                            f"{prefix}.shared_experts.linear_fc2"))
    group, size = dispatch_group(st)
    if size == 1:
        return ops
    experts, h = st.model.num_local_experts, st.h

    def gather(width: int, dtype: str, what: str) -> Op:
        return Op(OpKind.ALLGATHER, group, size, (tokens, width), (size * tokens, width),
                  dtype, f"{prefix}.token_dispatcher.dispatch.{what}")

    ops += [gather(experts, "bool", "routing_map"), gather(experts, st.dtype, "probs"),
            gather(h, st.dtype, "hidden_states"),
            Op(OpKind.REDUCESCATTER, group, size, (size * tokens, h), (tokens, h), st.dtype,
               f"{prefix}.token_dispatcher.combine")]
    return ops
