"""Megatron-Core's static inference engine (`StaticInferenceEngine(..., legacy=True)`, its
legacy static-batch loop), as megatron-core 0.19.2 issues its calls. Paths below are under
`megatron/core/` of the megatron-core 0.19.2 wheel (NVIDIA/Megatron-LM's release of that
name); the calls were held against the engine itself serving tiny GPTs on gloo at TP2, PP2
and TP2 x PP2, and a tiny MoE GPT at TP2, TP2 x EP2, TP2 x PP2 and PP2 x EP2
(scripts/megatron_cpu_oracle.py, tests/test_real_engine_megatron.py).

One static batch of b prompts of s tokens, generating Sd tokens: a prefill forward over
[s, b], then Sd - 1 decode forwards of [1, b]
(`inference/text_generation_controllers/text_generation_controller.py`,
`generate_all_output_tokens_static_batch`, lines 3502-3517 and 3689-3691). Shapes are
Megatron's [s, b, h]. Per forward:
- TP: the VocabParallelEmbedding all-reduce on the first stage, then per layer
  RowParallelLinear's all-reduce after linear_proj and after linear_fc2
  (`tensor_parallel/layers.py`), [s, b, h]; a MoE layer's MLP issues its shared expert's
  all-reduce and its token dispatcher's gathers and reduce-scatter instead
  (patterns/engines/megatron/moe.py), over TP or, with --ep, the stage's dp x tp ranks;
- PP: one tensor a boundary, [s, b, h] in `pipeline_dtype` (the model's dtype here), sent with
  `torch.distributed.P2POp(isend, tensor, next_rank)` on the world group
  (`inference/communication_utils.py`, `send_to_next_pipeline_rank`; the receive likewise):
  a trace names the peer as a world rank;
- the logits: the output layer (`gather_output`) all-gathers over TP only the last position,
  [1, b, V_pad/tp] -> [1, b, V_pad]: GPTModel cuts the hidden states to `[-1:]` before the
  output layer while the context's `materialize_only_last_token_logits` holds
  (`models/gpt/gpt_model.py` 739-745), and the controller sets it for every step but a prefill
  whose request asks for log-probs (`return_log_probs` or `top_n_logprobs`,
  text_generation_controller.py 3546-3553): then all s positions, [s, b, V_pad/tp];
- with PP, each step after the forward broadcasts the logits [b, 1, V_pad] (all s positions
  with log-probs: [b, s, V_pad]) from the last stage over the PP group, in the model's dtype
  (text_generation_controller.py 3569-3582, `broadcast_from_last_pipeline_stage` in
  communication_utils.py): every stage samples from them.
V_pad is the model's vocabulary as Megatron's training pads it, to a multiple of
make_vocab_size_divisible_by (128) * tp (`megatron/training/tokenizer/tokenizer.py:
_vocab_size_with_padding`). Static batching captures no CUDA graphs (not by default).

Sequence parallelism: the static loop refuses it unless the model is MoE with TP and EP > 1
(text_generation_controller.py 3469-3486, "Sequence parallellism is only supported for static
batching with MoE models"), and then turns it off for every module outside the MoE layers
(`set_model_to_sequence_parallel(..., exclude_modules=[BaseMoELayer])`); that mixed setting
is not modelled, so `--sp` is refused for every model.

Multi-latent attention (DeepSeek) is refused: its down-projections gather over TP or not
depending on the layer spec (`transformer/multi_latent_attention.py` 515-610, 652, 739), which
no engine run here has shown.

Not modelled: the dynamic engine (`inference/engines/dynamic_engine.py`, what
`StaticInferenceEngine` builds unless `legacy=True`, falling back to the legacy loop where it
cannot, as on a CPU: `pin_memory` needs CUDA). Its steps feed every active request's tokens
as one packed sequence [1, T] (`_dynamic_step_forward_logits`, text_generation_controller.py
810-856, which at PP also broadcasts the logits [1, R, V] from the last stage), with
CUDA-graph batch padding and chunked prefill in `inference/contexts/dynamic_context.py`.
"""

from patterns.engine_base import EngineInfo, register
from patterns.engines.megatron.moe import moe_layer
from patterns.errors import ConfigError
from patterns.layout import Layout, Workload
from patterns.models import ModelConfig
from patterns.ops import Op, OpKind, Phase
from patterns.pattern import EngineOptions, Pattern, Run
from patterns.stage import Stage, merge, run, stages

INFO = EngineInfo(
    name="megatron",
    engine="Megatron-Core static inference engine (StaticInferenceEngine, legacy=True)",
    version="megatron-core 0.19.2",
    source="megatron-core 0.19.2 (NVIDIA/Megatron-LM): core/inference/text_generation_"
           "controllers/text_generation_controller.py, core/inference/communication_utils.py, "
           "core/models/gpt/gpt_model.py, core/tensor_parallel/layers.py, core/transformer/"
           "moe/moe_layer.py, core/transformer/moe/token_dispatcher.py, core/transformer/"
           "moe/shared_experts.py",
    options=("sp", "return_log_probs"),
    not_modelled=(
        "the dynamic inference engine (DynamicInferenceEngine: the default of recent "
        "releases, and what StaticInferenceEngine runs without legacy=True): its steps pack "
        "every request's tokens [T, 1, h] with CUDA-graph padding and chunked prefill",
        "MoE token dispatchers other than the default all-gather one (alltoall, flex / DeepEP, "
        "the inference-optimized NCCL and NVLS ones of transformer_impl="
        "'inference_optimized'), shared-expert overlap, and moe_router_dtype='fp32' (the "
        "probabilities and the experts' reduce-scatter then fp32, not the model's dtype)",
        "expert data parallelism within a stage (expert_model_parallel_size x "
        "expert_tensor_parallel_size below dp x tp): --ep spans every dp x tp rank",
        "multi-latent attention (DeepSeek; refused)",
        "sequence parallelism (the static engine runs it only for MoE models with TP and EP, "
        "switched off outside the MoE layers; refused)",
        "fp32_residual_connection (PP tensors in fp32)",
    ),
)

MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128


def padded_vocab(vocab: int, tp: int) -> int:
    multiple = MAKE_VOCAB_SIZE_DIVISIBLE_BY * tp
    return -(-vocab // multiple) * multiple


def forward(st: Stage, s: int, b: int, logit_rows: int) -> list[Op]:
    """One forward pass over [s, b] tokens and its logits' broadcast; `logit_rows` positions
    per sequence get logits (1, or s for a prefill with log-probs)."""
    h, tp = st.h, st.tp
    shape = (s, b, h)
    ops: list[Op] = []
    if not st.is_first:
        ops.append(st.p2p(OpKind.RECV, shape, "pp.hidden_states", peer=st.index - 1))
    if tp > 1 and st.is_first:
        ops.append(st.tp_op(OpKind.ALLREDUCE, shape, shape, "embedding"))
    for layer in st.layers:
        if tp > 1:
            ops.append(st.tp_op(OpKind.ALLREDUCE, shape, shape,
                                f"layers.{layer}.self_attention.linear_proj"))
        if st.model.is_moe_layer(layer):
            ops += moe_layer(st, layer, s * b, shape)
        elif tp > 1:
            ops.append(st.tp_op(OpKind.ALLREDUCE, shape, shape, f"layers.{layer}.mlp.linear_fc2"))
    vocab = padded_vocab(st.model.vocab_size, tp)
    if not st.is_last:
        ops.append(st.p2p(OpKind.SEND, shape, "pp.hidden_states", peer=st.index + 1))
    elif tp > 1:
        ops.append(st.tp_op(OpKind.ALLGATHER, (logit_rows, b, vocab // tp),
                            (logit_rows, b, vocab), "output_layer"))
    if st.pp > 1:
        logits = (b, logit_rows, vocab)
        ops.append(Op(OpKind.BROADCAST, "pp", st.pp, logits, logits, st.dtype,
                      "pp.logits", root=st.pp - 1))
    return ops


def _stage_runs(st: Stage) -> list[Run]:
    w = st.workload
    prefill_rows = w.prompt if st.options.return_log_probs else 1
    runs = [run(Phase.PREFILL, forward(st, w.prompt, w.batch, prefill_rows),
                w.prompt * w.batch, w.batch)]
    if w.decode_steps:
        runs.append(run(Phase.DECODE, forward(st, 1, w.batch, 1), w.batch, w.batch,
                        w.decode_steps))
    return merge(runs)


def _check(model: ModelConfig, layout: Layout, sp: bool) -> None:
    if sp and not model.is_moe:
        raise ConfigError(f"--sp: Megatron's static engine refuses sequence parallelism for "
                          f"the dense model {model.name} (\"only supported for static batching "
                          "with MoE models\"); drop --sp")
    if sp:
        raise ConfigError(f"--sp: Megatron's static engine runs sequence parallelism for the "
                          f"MoE model {model.name} only with TP and expert parallelism, and "
                          "then turns it off outside the MoE layers; that is not modelled: "
                          "drop --sp")
    if model.mla:
        raise ConfigError(f"{model.name} uses multi-latent attention, whose calls the megatron "
                          "profile does not model (its down-projections gather over TP or not "
                          "by layer spec); use --engine vllm or sglang")
    if model.num_hidden_layers % layout.pp:
        raise ConfigError(f"pp({layout.pp}) does not divide num_hidden_layers"
                          f"({model.num_hidden_layers}) of {model.name}; Megatron splits "
                          "layers evenly")


@register(INFO)
def megatron(model: ModelConfig, layout: Layout, workload: Workload,
             options: EngineOptions) -> Pattern:
    _check(model, layout, options.sp)
    counts = [model.num_hidden_layers // layout.pp] * layout.pp
    runs = [tuple(_stage_runs(st)) for st in stages(model, layout, workload, options, counts)]
    return Pattern(engine=INFO.name, model=model, layout=layout, workload=workload,
                   options=options, stages=tuple(runs))
