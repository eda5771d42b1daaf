"""vLLM's calls of the layers `patterns/hybrid.py` reads (Mamba hybrids) and of the embedding
as each family runs it (`patterns/families.py`), at modal-projects/vllm @ c8109375.

Every RowParallelLinear of a layer reduces its output over TP (`layers/linear.py`): the
attention's o_proj, the Mamba mixer's out_proj, the MLP's down_proj (Granite's shared MLP's
output_linear), and a MoE block once (`fused_moe/runner/moe_runner.py:462-496`) - one
all-reduce of [T, h] a block, none at tp 1. Besides:
- Mamba-2 (`layers/mamba/mamba_mixer2.py`): the gated RMSNorm before out_proj
  (`Mixer2RMSNormGated.forward_native`, :100-149; forward_cuda sends it there, :161-162)
  all-reduces each token's sum of squares, [T, 1] in fp32 (x times silu(gate.float()) is
  fp32, :115, 122-123) when n_groups == 1 (:119-126); when tp divides n_groups each rank
  normalises its own groups and nothing is sent. The all-gather of :132-135 would serve
  n_groups that tp does not divide, which MambaMixer2 refuses (:292-295), so it never runs.
  The mixer runs on the padded batch (:548-587), out_proj inside the compiled graph;
- Mamba-1 (Jamba, `layers/mamba/mamba_mixer.py:239-461`) runs inside the opaque custom op
  `vllm::mamba_mixer` (a splitting op, `config/compilation.py:767-768`): eager, on the
  scheduled tokens alone, the prefill tokens and the decode tokens each through x_proj
  (a RowParallelLinear: [n, dt_rank + 2 d_state], :111-116, 210, 368, 424), then out_proj
  over both ([P + D, h], :450-461); nothing of it fuses;
- NemotronH's latent MoE (`moe_latent_size`) reduces the routed experts' output in the latent
  width before fc2_latent_proj (`moe_runner.py:441-460, 749-756`) and the shared experts'
  output on its own (:417-439, 758-760): [T, latent] then [T, h].
The embedding's all-reduce (`vocab_parallel_embedding.py`) goes into the first RMSNorm, where
the fusion pass takes it, except where the family scales it first (gemma3.py:332-341) or
the model is multimodal: both model runners embed outside the compiled graph, on the
scheduled tokens before padding (`v1/worker/gpu_model_runner.py:3569-3616`,
`v1/worker/gpu/model_states/default.py:89-95`), and not at all in a dummy step (V2
`model_runner.py:1351-1355`, V1 `gpu_model_runner.py:6069-6078`).
Not modelled: Jamba's 1-token final prompt chunk, which vLLM's Mamba-1 metadata counts as a
decode (its x_proj call then joins the decodes').
"""

from typing import NamedTuple

from patterns.dtypes import dtype_bytes
from patterns.engines.vllm.transports import vllm_allreduce
from patterns.errors import ConfigError
from patterns.hybrid import MAMBA, MOE, check_hybrid_tp
from patterns.layout import Layout
from patterns.models import ModelConfig
from patterns.moe import exchanges_tokens
from patterns.ops import Op, OpKind
from patterns.stage import Stage


class StepMix(NamedTuple):
    """A step's scheduled tokens before padding, and how many of them are decodes."""

    tokens: int
    decodes: int = 0


def needs_mix(model: ModelConfig) -> bool:
    """Whether a step's calls depend on its unpadded tokens and their split, not on its
    padded T alone."""
    return model.multimodal or bool(model.hybrid and model.hybrid.mamba.version == 1)


def check_hybrid(model: ModelConfig, layout: Layout) -> None:
    """The layouts vLLM's Mamba mixers take, and the MoE exchange left out."""
    if model.hybrid is None:
        return
    check_hybrid_tp(model.name, model.hybrid, layout.tp)
    if model.is_moe and exchanges_tokens(layout):
        raise ConfigError(f"{model.name} is a Mamba hybrid with experts: its MoE layers at "
                          f"dp({layout.dp}) with --ep are not modelled; use --dp 1")


def _allreduce(st: Stage, tokens: int, tag: str, feeds_rmsnorm: bool, width: int | None = None,
               dtype: str | None = None) -> Op:
    """As profile._allreduce, with a width and dtype of its own (the Mamba-2 norm's)."""
    width, dtype = width or st.h, dtype or st.dtype
    nbytes = tokens * width * dtype_bytes(dtype)
    transport = vllm_allreduce(nbytes, st.tp, st.options.gpu, dtype,
                               feeds_rmsnorm and not st.options.eager, st.options.nccl_only)
    return st.tp_op(OpKind.ALLREDUCE, (tokens, width), (tokens, width), tag, transport, dtype)


def embed_ops(st: Stage, tokens: int, mix: StepMix | None) -> list[Op]:
    """The first stage's embedding all-reduce (tp > 1), as the model runs it."""
    if st.model.multimodal:
        scheduled = tokens if mix is None else mix.tokens
        return [_allreduce(st, scheduled, "embed_tokens", False)] if scheduled else []
    return [_allreduce(st, tokens, "embed_tokens", st.model.embedding_fusable)]


def hybrid_layer_ops(st: Stage, layer: int, tokens: int, mix: StepMix | None) -> list[Op]:
    """One hybrid layer's all-reduces on a rank (tp > 1), its blocks in order. A block's
    last all-reduce feeds the next norm (fusable) unless it is a stage's last, handed to the
    next stage, or the family's outputs never meet an RMSNorm straight."""
    model, hybrid = st.model, st.model.hybrid
    assert hybrid is not None
    blocks = hybrid.layers[layer]
    ops: list[Op] = []
    for n, (kind, module) in enumerate(blocks):
        tag = f"layers.{layer}.{module}"
        feeds = model.norm_fusion and not (
            not st.is_last and layer == st.layers[-1] and n == len(blocks) - 1)
        if kind == MAMBA and hybrid.mamba.version == 1:
            ops += _mamba1(st, tag, mix or StepMix(tokens))
        elif kind == MAMBA:
            if hybrid.mamba.gated_norm and hybrid.mamba.groups == 1:
                ops.append(_allreduce(st, tokens, f"{tag}.norm", False, width=1, dtype="fp32"))
            ops.append(_allreduce(st, tokens, f"{tag}.out_proj", feeds))
        elif kind == MOE and hybrid.latent_moe:
            ops.append(_allreduce(st, tokens, tag, False, width=hybrid.latent_moe))
            if hybrid.shared_experts:
                ops.append(_allreduce(st, tokens, tag.replace("experts", "shared_experts"),
                                      feeds))
        else:
            ops.append(_allreduce(st, tokens, tag, feeds))
    return ops


def _mamba1(st: Stage, tag: str, mix: StepMix) -> list[Op]:
    """Jamba's Mamba-1 mixer: x_proj over the prefill tokens, then the decodes', then
    out_proj over both; eager, unpadded."""
    width = st.model.hybrid.mamba.ssm_params  # type: ignore[union-attr]
    ops = [_allreduce(st, n, f"{tag}.x_proj", False, width=width)
           for n in (mix.tokens - mix.decodes, mix.decodes) if n]
    return [*ops, _allreduce(st, mix.tokens, f"{tag}.out_proj", False)] if mix.tokens else ops
