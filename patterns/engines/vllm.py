"""vLLM V1 as users run it in late 2026 (0.25-0.27): engine spec sections 3 and 10.1-10.2.

Code followed: vLLM upstream main of 2026-08-03 (modal-projects/vllm @ c8109375, about
0.27-dev) and of 2026-05-19 (local-inference-lab/vllm @ 9aaf83ef50), as the spec reads them:
- model all-reduces: `layers/vocab_parallel_embedding.py` (embedding, first stage only) and
  `layers/linear.py` RowParallelLinear (o_proj, down_proj): 1 + 2*L_s of [T, h] per step;
  MoE layers reduce the experts' output once (`fused_moe/runner/moe_runner.py:
  _maybe_reduce_final_output`), see `moe_layer_ops`;
- transports: `patterns/transports.py` (`cuda_communicator.py`, `all_reduce_utils.py` @
  00d618aa, `compilation/passes/fusion/allreduce_rms_fusion.py` @ 0052812d);
- logits: `layers/logits_processor.py` all-gathers on every TP rank (`use_all_gather()` is
  True in V1), [R, V_pad/tp] -> [R, V_pad], through PyNccl since #40996 (`95ed0fea`);
  R = scheduled requests (`logits_indices = query_start_loc[1:] - 1`), partial prefills
  included;
- batching: `config/vllm.py: _set_cudagraph_sizes` and `v1/cudagraph_dispatcher.py`: every
  step of T <= cap tokens, decode or mixed, is padded to the next capture size
  (`patterns.vllm_rules.v1_capture_sizes`); prefill is always chunked at
  max_num_batched_tokens (default 8192);
- PP: `distributed/parallel_state.py: isend_tensor_dict / irecv_tensor_dict`: hidden_states
  and residual sliced to [T*h/tp] when tp divides them, then a TP all-gather after the recv;
  layer split `distributed/utils.py: get_pp_indices`;
- per-step PP broadcasts from the last stage: Model Runner V2 (`v1/worker/gpu/pp_utils.py`,
  `PPHandler`; default for dense models since #44443 `a2f71300`, and for DeepseekV2 / Qwen2Moe
  architectures, `config/vllm.py: _is_default_v2_model_runner_model`) sends 2 on its own NCCL
  group `pp_broadcast`: sampled tokens [R, 1] int64 and [2, R] int32; Model Runner V1 with
  async scheduling sends sampled ids [R, 1] int32 on the PP group
  (`v1/worker/gpu_model_runner.py: _pp_broadcast_prev_sampled_token_ids`), skipped when no
  request samples.
"""

from dataclasses import replace

from patterns.dtypes import dtype_bytes
from patterns.engines import EngineInfo, register
from patterns.engines.stage import Stage, merge, pad_to, run, stages
from patterns.errors import ConfigError
from patterns.layout import Layout, Workload
from patterns.models import ModelConfig, mlp_module
from patterns.ops import Op, OpKind, Phase
from patterns.pattern import EngineOptions, Pattern, Run
from patterns.transports import vllm_allreduce
from patterns.vllm_rules import (
    V1_MAX_BATCHED_TOKENS,
    V1_MAX_NUM_SEQS,
    padded_vocab,
    prefill_chunks,
    stage_layer_counts,
    v1_capture_sizes,
)

INFO = EngineInfo(
    name="vllm",
    engine="vLLM V1 (Model Runner V2 by default)",
    version="0.25-0.27 (upstream main of 2026-08-03)",
    source="vllm-project/vllm main 2026-08-03 = modal-projects/vllm @ c8109375; size tables "
           "vllm-project/vllm @ 00d618aa (all_reduce_utils.py), @ 0052812d "
           "(allreduce_rms_fusion.py)",
    options=("eager", "max_batched_tokens", "gpu", "nccl_only", "model_runner",
             "max_num_seqs"),
    not_modelled=(
        "expert parallelism and DP (its own issue); MoE experts are replicated over TP",
        "decodes of early-finished prompts mixed into later prefill chunks",
        "gloo send_object of PP metadata; the shared-memory SchedulerOutput broadcast",
        "sequence parallelism / AsyncTP (off for dense models by default)",
        "speculative decoding (MTP layers, larger capture sizes)",
    ),
)

# Architectures vLLM runs on Model Runner V2 by default (engine spec 10.1).
_V2_MOE_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "qwen2_moe"})


def default_model_runner(model: ModelConfig) -> str:
    return "v2" if not model.is_moe or model.model_type in _V2_MOE_MODEL_TYPES else "v1"


def _allreduce(st: Stage, tokens: int, tag: str, feeds_rmsnorm: bool = True) -> Op:
    nbytes = tokens * st.h * dtype_bytes(st.dtype)
    transport = vllm_allreduce(nbytes, st.tp, st.options.gpu, st.dtype, feeds_rmsnorm,
                               st.options.nccl_only)
    return st.tp_op(OpKind.ALLREDUCE, (tokens, st.h), (tokens, st.h), tag, transport)


def moe_layer_ops(st: Stage, layer: int, tokens: int, feeds_rmsnorm: bool) -> list[Op]:
    """The calls of one MoE layer's experts without expert parallelism.

    Experts are replicated over TP (each rank holds a 1/tp slice of every expert) and tokens
    are not moved: the routed and shared experts' summed output is all-reduced once
    (`moe_runner._maybe_reduce_final_output`). Expert parallelism (dispatch / combine)
    hooks in here.
    """
    return [_allreduce(st, tokens, f"layers.{layer}.{mlp_module(st.model, layer)}",
                       feeds_rmsnorm)]


def _layer_ops(st: Stage, layer: int, tokens: int) -> list[Op]:
    # The last layer of a stage that hands its output to the next stage feeds no RMSNorm,
    # so the fusion pass cannot take its second all-reduce.
    feeds_rmsnorm = st.is_last or layer != st.layers[-1]
    ops = [_allreduce(st, tokens, f"layers.{layer}.self_attn.o_proj")]
    if st.model.is_moe_layer(layer):
        return ops + moe_layer_ops(st, layer, tokens, feeds_rmsnorm)
    tag = f"layers.{layer}.{mlp_module(st.model, layer)}"
    return [*ops, _allreduce(st, tokens, tag, feeds_rmsnorm)]


def pp_slice(st: Stage, tokens: int) -> tuple[tuple[int, ...], bool]:
    """The shape one PP tensor travels in, and whether a TP all-gather rebuilds it."""
    flat = tokens * st.h
    if flat % st.tp == 0:
        return (flat // st.tp,), st.tp > 1
    return (tokens, st.h), False


def forward(st: Stage, tokens: int, rows: int, vocab_multiple: int = 64) -> list[Op]:
    """Model calls of one forward pass of T = `tokens` over R = `rows` requests."""
    ops: list[Op] = []
    shape, gathered = pp_slice(st, tokens)
    keys = ("hidden_states", "residual")
    if not st.is_first:
        for key in keys:
            ops.append(st.p2p(OpKind.RECV, shape, f"pp.{key}", peer=st.index - 1))
            if gathered:
                ops.append(st.tp_op(OpKind.ALLGATHER, shape, (tokens, st.h),
                                    f"pp.{key}.allgather"))
    if st.tp > 1:
        if st.is_first:
            ops.append(_allreduce(st, tokens, "embed_tokens"))
        for layer in st.layers:
            ops += _layer_ops(st, layer, tokens)
    if not st.is_last:
        ops += [st.p2p(OpKind.SEND, shape, f"pp.{key}", peer=st.index + 1) for key in keys]
    elif st.tp > 1:
        shard = padded_vocab(st.model.vocab_size, vocab_multiple) // st.tp
        ops.append(st.tp_op(OpKind.ALLGATHER, (rows, shard), (rows, shard * st.tp), "logits"))
    return ops


def pp_broadcasts(st: Stage, rows: int, sampled: bool, runner: str) -> list[Op]:
    """The per-step broadcasts of sampled tokens from the last stage (pp > 1 only)."""
    if st.pp == 1:
        return []
    root = st.pp - 1
    if runner == "v2":
        return [Op(OpKind.BROADCAST, "pp_broadcast", st.pp, shape, shape, dtype,
                   f"pp_broadcast.{name}", root=root)
                for name, shape, dtype in (("sampled_tokens", (rows, 1), "int64"),
                                           ("num_sampled", (2, rows), "int32"))]
    if not sampled:
        return []
    return [Op(OpKind.BROADCAST, "pp", st.pp, (rows, 1), (rows, 1), "int32",
               "pp.prev_sampled_token_ids", root=root)]


def _stage_runs(st: Stage, options: EngineOptions, runner: str) -> list[Run]:
    w = st.workload
    max_seqs = options.max_num_seqs or V1_MAX_NUM_SEQS
    budget = options.max_batched_tokens or V1_MAX_BATCHED_TOKENS
    sizes = [] if options.eager else v1_capture_sizes(max_seqs, budget)
    runs = []
    for chunk in prefill_chunks(w.batch, w.prompt, budget):
        tokens = pad_to(sizes, chunk.tokens)
        ops = forward(st, tokens, chunk.seqs) + pp_broadcasts(st, chunk.seqs, chunk.rows > 0,
                                                               runner)
        runs.append(run(Phase.PREFILL, ops, tokens, chunk.seqs))
    if w.decode_steps:
        tokens = pad_to(sizes, w.batch)
        ops = forward(st, tokens, w.batch) + pp_broadcasts(st, w.batch, True, runner)
        runs.append(run(Phase.DECODE, ops, tokens, w.batch, w.decode_steps))
    return merge(runs)


@register(INFO)
def vllm_v1(model: ModelConfig, layout: Layout, workload: Workload,
            options: EngineOptions) -> Pattern:
    max_seqs = options.max_num_seqs or V1_MAX_NUM_SEQS
    if workload.batch > max_seqs:
        raise ConfigError(f"batch({workload.batch}) exceeds max-num-seqs({max_seqs}): vLLM "
                          "would not run it as one batch; use batch <= max-num-seqs")
    runner = options.model_runner or default_model_runner(model)
    options = replace(options, model_runner=runner)
    counts = stage_layer_counts(model.num_hidden_layers, layout.pp)
    runs = [tuple(_stage_runs(st, options, runner))
            for st in stages(model, layout, workload, options, counts)]
    return Pattern(engine=INFO.name, model=model, layout=layout, workload=workload,
                   options=options, stages=tuple(runs))
