"""vLLM V1 as users run it in late 2026 (0.25-0.27): engine spec sections 3 and 10.1-10.2.

Code read: vLLM upstream main of 2026-08-03 as modal-projects/vllm @ c8109375 (about
0.27-dev), `vllm/`:
- model all-reduces: `layers/vocab_parallel_embedding.py` (embedding, first stage only) and
  `layers/linear.py` RowParallelLinear (o_proj, down_proj): 1 + 2*L_s of [T, h] per step;
  MoE layers reduce the experts' output once (`fused_moe/runner/moe_runner.py:
  _maybe_reduce_final_output`), see `moe_layer_ops`; which layers are MoE:
  `models/deepseek_v2.py:1239-1243`, `models/llama4.py:342-345`, `models/qwen3_moe.py:387-391`
  (`patterns.models._moe_layers`); mxfp4 experts (gpt-oss) all-reduce the padded hidden
  size on some backends (`mxfp4.py` here: `oracle/mxfp4.py:637-685`, `--moe-backend`);
- refusals: heads % tp (`models/llama.py`, MLA: `models/deepseek_v2.py:478`) and the KV-head
  rule of `models/llama.py:147-152` (kv % tp when kv >= tp, else tp % kv);
- transports: `transports.py` here (`cuda_communicator.py`, `all_reduce_utils.py` @
  00d618aa, `compilation/passes/fusion/allreduce_rms_fusion.py` @ 0052812d); `--eager`
  (enforce_eager) turns torch.compile off (`config/vllm.py:1193-1199`), so nothing is fused;
- logits: `layers/logits_processor.py` all-gathers on every TP rank (`use_all_gather()` is
  True in V1), [R, V_pad/tp] -> [R, V_pad], through PyNccl since #40996 (`95ed0fea`);
  R = scheduled requests (`logits_indices = query_start_loc[1:] - 1`), partial prefills
  included;
- batching: `config/vllm.py:1782-1860` `_set_cudagraph_sizes` and `v1/cudagraph_dispatcher.py`:
  every step of T <= cap tokens, decode or mixed, is padded to the next capture size
  (`rules.v1_capture_sizes`); prefill is chunked at max_num_batched_tokens (`rules.v1_defaults`,
  `engine/arg_utils.py:2529-2551`), a batch's decodes beside later chunks (`batch_steps.py`);
- PP: `distributed/parallel_state.py: isend_tensor_dict / irecv_tensor_dict`: the metadata
  (`send_object` on gloo: an int64 and the pickled list), then hidden_states and residual
  sliced to [T*h/tp] when tp divides them, then a TP all-gather after the recv
  (`pp_transfer.py` here); layer split `distributed/utils.py: get_pp_indices`;
- per-step broadcasts of sampled tokens from the last PP stage, at the end of the step on
  every stage. Model Runner V2 (`v1/worker/gpu/pp_utils.py:35-50, 126-197`, `PPHandler`;
  `v1/worker/gpu/model_runner.py:1497-1531`): 2 broadcasts on its own NCCL group
  `pp_broadcast`, sampled tokens [R, 1] int64 and (num_sampled, num_rejected) [2, R] int32,
  skipped when no request needs its sample later: `compute_need_sampled_mask`
  (`pp_utils.py:35-49`) keeps a request when old_computed + scheduled >= prefill_len (not a
  non-final prefill chunk) and max(old_computed, prefill_len) + 1 < max_seq_len = prompt +
  max_tokens (`v1/worker/gpu/states.py:104`), old_computed the tokens before the step. A
  prompt's last chunk passes when the output is over 1 token; decode step j (old_computed
  prompt + j - 1, j <= output - 1) always passes, the last one included. V2 is the default
  for dense models and the MoE architectures of `config/vllm.py:69-79`
  (`_is_default_v2_model_runner_model`, #44443 `a2f71300`). Model Runner V1 with async
  scheduling (`v1/worker/gpu_model_runner.py:4582-4590, 4822-4837`): sampled ids [R, 1]
  int32 on the PP group, skipped when every request is a partial prefill; under
  `--no-async-scheduling` V1 broadcasts nothing (`use_async_scheduling` guards the call).
- MoE with data parallelism (`--dp N`, `--ep`): the rules and their sources are in
  `moe.py` here (all2all.py AgRsAll2AllManager, fused_moe/config.py, dp_utils.py), the DP
  ranks' steps lined up and padded in `patterns/dp_steps.py`, their dummy forwards and the
  wave's 32-step sync in `dp_wave.py`. A dense model at dp > 1 is independent replicas.
  DeepSeek-V2/V3 at tp > 1, dp > 1 with --ep run their own sequence-parallel layers
  (`patterns/engines/vllm/sp.py`).
"""

from dataclasses import replace
from functools import lru_cache

from patterns.dtypes import dtype_bytes
from patterns.engine_base import EngineInfo, register
from patterns.engines.vllm.batch_steps import scheduled_batch
from patterns.engines.vllm.dp_wave import dp_replicas
from patterns.engines.vllm.fp8_moe import defers_input_quant
from patterns.engines.vllm.hybrid import StepMix, embed_ops, hybrid_layer_ops
from patterns.engines.vllm.moe import vllm_moe_layer
from patterns.engines.vllm.moe_backend import check_moe_backend
from patterns.engines.vllm.mxfp4 import moe_allreduce_width, moe_widths
from patterns.engines.vllm.pp_transfer import pp_receive, pp_send, sends_metadata
from patterns.engines.vllm.rules import v1_capture_sizes, v1_defaults
from patterns.engines.vllm.sp import deepseek_sp, sp_final, sp_input, sp_moe_layer
from patterns.engines.vllm.transports import vllm_allreduce
from patterns.errors import ConfigError
from patterns.layout import Layout, Workload
from patterns.models import ModelConfig, mlp_module
from patterns.moe import exchanges_tokens
from patterns.ops import Op, OpKind, Phase
from patterns.pattern import EngineOptions, Pattern, Run
from patterns.shapes import padded_vocab, prefill_chunks, stage_layer_counts
from patterns.stage import Stage, merge, pad_to, run, stages

INFO = EngineInfo(
    name="vllm",
    engine="vLLM V1 (Model Runner V2 by default)",
    version="0.25-0.27 (upstream main of 2026-08-03)",
    source="vllm-project/vllm main 2026-08-03 = modal-projects/vllm @ c8109375; size tables "
           "vllm-project/vllm @ 00d618aa (all_reduce_utils.py), @ 0052812d "
           "(allreduce_rms_fusion.py)",
    options=("eager", "max_batched_tokens", "gpu", "nccl_only", "model_runner", "max_num_seqs",
             "a2a", "moe_backend", "async_scheduling", "pp_whole_tensors", "prefix_caching",
             "kv_block_size", "wave_tail", "tensor_device"),
    not_modelled=(
        "MoE at dp > 1: DBO micro-batching, EPLB, the DP pause protocol",
        "the shared-memory SchedulerOutput broadcast (the engine core to the workers)",
        "sequence parallelism / AsyncTP (off for dense models by default)",
        "speculative decoding unless --speculative-config is given",
    ),
)

# The model_type of the MoE architectures in DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES
# (config/vllm.py:69-79): DeepseekV2, Qwen2Moe, GraniteMoe; DeepseekV3 is not among them.
_V2_MOE_MODEL_TYPES = frozenset({"deepseek_v2", "qwen2_moe", "granitemoe"})


def default_model_runner(model: ModelConfig) -> str:
    if model.hybrid:  # a hybrid is V1's unless its architecture is listed (config/vllm.py:651)
        return "v1"
    return "v2" if not model.is_moe or model.model_type in _V2_MOE_MODEL_TYPES else "v1"


def async_scheduling(options: EngineOptions, spec_method: str = "") -> bool:
    """Whether vLLM schedules asynchronously (`config/vllm.py:1064-1143` @ c8109375): on
    unless turned off (`--no-async-scheduling`) or the speculative method is not one it
    supports (EAGLE-type: eagle, eagle3 and the MTP methods, `config/speculative.py:37-66`;
    ngram on the CPU is not, so it is off there, and asked for explicitly vLLM refuses it:
    "Currently, async scheduling is only supported with EAGLE/MTP/..."). vLLM's CPU build
    turns it off (`platforms/cpu.py:142-144`): its runs match `--no-async-scheduling`."""
    if spec_method == "ngram":
        if options.async_scheduling:
            raise ConfigError("--async-scheduling with ngram speculation: vLLM refuses it "
                              "(async scheduling supports EAGLE/MTP drafters); drop "
                              "--async-scheduling or use eagle, eagle3 or mtp")
        return False
    return options.async_scheduling is not False


def _allreduce(st: Stage, tokens: int, tag: str, feeds_rmsnorm: bool = True,
               width: int | None = None) -> Op:
    width = width or st.h
    nbytes = tokens * width * dtype_bytes(st.dtype)
    # enforce_eager turns torch.compile off, and with it the fusion pass; some families'
    # outputs never meet an RMSNorm straight (patterns/families.py).
    fusable = feeds_rmsnorm and not st.options.eager and st.model.norm_fusion
    transport = vllm_allreduce(nbytes, st.tp, st.options.gpu, st.dtype, fusable,
                               st.options.nccl_only)
    return st.tp_op(OpKind.ALLREDUCE, (tokens, width), (tokens, width), tag, transport)


def moe_layer_ops(st: Stage, layer: int, tokens: int, feeds_rmsnorm: bool) -> list[Op]:
    """The calls of one MoE layer's experts.

    At dp 1 every expert is sharded over TP (each rank holds a 1/tp slice of every expert:
    `fused_moe/config.py:1331-1333` intermediate_size // tp_size; with --ep whole experts of
    the TP group) and tokens, replicated over TP, are not moved: the routed and shared
    experts' summed output is all-reduced once (`moe_runner._maybe_reduce_final_output`).
    At dp > 1 the DP ranks exchange tokens: dispatch and combine, `moe.
    vllm_moe_layer` (all2all.py AgRsAll2AllManager, or `--a2a alltoall`); the TP all-reduce
    left there (no --ep, tp > 1) goes through the same transport chain as any other.
    """
    prefix = f"layers.{layer}.{mlp_module(st.model, layer)}"
    if not exchanges_tokens(st.layout):
        # mxfp4 experts may all-reduce the padded hidden size (mxfp4.py here).
        width = moe_allreduce_width(st.h, st.model.weight_format, st.options.gpu,
                                    st.options.moe_backend)
        return [_allreduce(st, tokens, prefix, feeds_rmsnorm, width)]
    widths = moe_widths(st.h, st.model.weight_format, st.options.gpu, st.options.moe_backend)
    # Block-fp8 experts under FlashInfer CUTLASS take bf16 inputs (fp8_moe.py).
    defer = defers_input_quant(st.model.weight_format, st.options.gpu, st.layout.ep,
                               st.options.moe_backend, st.options.a2a)
    ops = vllm_moe_layer(prefix, st.layout, st.dp_tokens, st.dp_rank, st.h,
                         st.model.num_experts_per_tok, st.dtype, st.options.a2a,
                         st.model.weight_format, widths, defer)
    return [_allreduce(st, tokens, op.tag, feeds_rmsnorm, widths[1])
            if op.kind == OpKind.ALLREDUCE and op.group == "tp" else op for op in ops]


def _layer_ops(st: Stage, layer: int, tokens: int, mix: StepMix | None = None) -> list[Op]:
    if st.model.hybrid:  # Mamba hybrids: hybrid.py
        return hybrid_layer_ops(st, layer, tokens, mix)
    # The last layer of a stage that hands its output to the next stage feeds no RMSNorm,
    # so the fusion pass cannot take its second all-reduce.
    feeds_rmsnorm = st.is_last or layer != st.layers[-1]
    sp = deepseek_sp(st)  # DeepSeek's own sequence-parallel MoE layers: patterns/engines/vllm/sp.py
    if sp and st.model.is_moe_layer(layer):
        return sp_moe_layer(st, layer, tokens, moe_layer_ops(st, layer, tokens, feeds_rmsnorm))
    ops = sp_input(st, layer, tokens) if sp else []
    if st.tp > 1:
        ops.append(_allreduce(st, tokens, f"layers.{layer}.self_attn.o_proj"))
    if st.model.is_moe_layer(layer):
        return ops + moe_layer_ops(st, layer, tokens, feeds_rmsnorm)
    if st.tp == 1:  # a dense layer (DeepSeek's first 3) issues nothing at tp 1
        return ops
    tag = f"layers.{layer}.{mlp_module(st.model, layer)}"
    return [*ops, _allreduce(st, tokens, tag, feeds_rmsnorm)]


def _layer_runs(st: Stage) -> list[tuple[int, tuple[object, ...], int]]:
    """Runs of layers of one class (first layer, class, layers): what `_layer_ops` reads of
    a layer but its number (one class, the same calls but for their tags). Kept by what
    they follow from (a DP rank's stage differs by its step's tokens alone)."""
    return _runs_of(st.model, st.layers, st.tp > 1)


@lru_cache(maxsize=64)
def _runs_of(model: ModelConfig, layers: range, flags: bool
             ) -> list[tuple[int, tuple[object, ...], int]]:
    moe, runs = model.is_moe_layer, []
    for layer in layers:
        # at tp 1 the last / first / after-MoE flags choose nothing (no fusion, no SP)
        kind = ((moe(layer), mlp_module(model, layer), layer == layers[-1], layer == 0,
                 layer > 0 and moe(layer - 1)) if flags else (moe(layer), mlp_module(
                     model, layer))) + (model.layer_blocks(layer),)
        first, _, count = runs.pop() if runs and runs[-1][1] == kind else (layer, kind, 0)
        runs.append((first, kind, count + 1))
    return runs


def forward(st: Stage, tokens: int, rows: int, vocab_multiple: int = 64,
            untagged: bool = False, mix: StepMix | None = None,
            layers_at: list[tuple[int, int, int, int]] | None = None) -> list[Op]:
    """Model calls of one forward pass of T = `tokens` over R = `rows` requests. `untagged`,
    for pricing alone (plan reads no tag): one layer's calls stand for every layer of its
    class (`_layer_runs`), the same objects, the first one's tags; `layers_at` is then told
    where each run of layers lies (`patterns.tiled.from_runs` makes their tags again).
    `mix`: the step's tokens before padding and its decodes, where the model's calls depend
    on them (hybrid.py)."""
    metadata = sends_metadata(st)
    ops, shape = pp_receive(st, tokens, metadata=metadata)
    if st.tp > 1 and st.is_first:
        ops += embed_ops(st, tokens, mix)
    if st.tp > 1 or exchanges_tokens(st.layout):  # MoE layers exchange tokens at dp > 1
        built: dict[tuple[object, ...], list[Op]] = {}
        for layer, kind, count in (_layer_runs(st) if untagged else ()):
            if kind not in built:
                built[kind] = _layer_ops(st, layer, tokens, mix)
            if layers_at is not None:
                layers_at.append((len(ops), layer, count, len(built[kind])))
            ops += built[kind] * count
        for layer in (() if untagged else st.layers):
            ops += _layer_ops(st, layer, tokens, mix)
        if deepseek_sp(st):
            ops += sp_final(st, tokens)
    if not st.is_last:
        ops += pp_send(st, tokens, shape, metadata)
    elif st.tp > 1:
        shard = padded_vocab(st.model.vocab_size, vocab_multiple) // st.tp
        ops.append(st.tp_op(OpKind.ALLGATHER, (rows, shard), (rows, shard * st.tp), "logits"))
    return ops


def pp_broadcasts(st: Stage, rows: int, sampled: bool, needed: bool, runner: str) -> list[Op]:
    """The per-step broadcasts of sampled tokens from the last stage (pp > 1 only).

    `sampled`: some request finishes its prompt or decodes in this step; `needed`: one of
    those has a later step (Model Runner V2 skips the broadcast otherwise).
    """
    if st.pp == 1:
        return []
    root = st.pp - 1
    if runner == "v2":
        if not (sampled and needed):
            return []
        return [Op(OpKind.BROADCAST, "pp_broadcast", st.pp, shape, shape, dtype,
                   f"pp_broadcast.{name}", root=root)
                for name, shape, dtype in (("sampled_tokens", (rows, 1), "int64"),
                                           ("num_sampled_rejected", (2, rows), "int32"))]
    if not sampled or not async_scheduling(st.options):
        return []
    return [Op(OpKind.BROADCAST, "pp", st.pp, (rows, 1), (rows, 1), "int32",
               "pp.prev_sampled_token_ids", root=root)]


def _stage_runs(st: Stage, options: EngineOptions, runner: str) -> list[Run]:
    w = st.workload
    default_seqs, default_budget = v1_defaults(options.gpu)
    max_seqs = options.max_num_seqs or default_seqs
    budget = options.max_batched_tokens or default_budget
    sizes = [] if options.eager else v1_capture_sizes(max_seqs, budget)
    runs, scheduled = [], scheduled_batch(w, budget, max_seqs, st.pp, options)
    for s in scheduled or ():  # chunked prompts: decodes ride beside later chunks
        tokens = pad_to(sizes, s.tokens)
        runs.append(run(s.phase, forward(st, tokens, s.rows, mix=StepMix(s.tokens, s.decodes))
                        + pp_broadcasts(st, s.rows, s.samples > 0, w.decode_steps > 0, runner),
                        tokens, s.rows, s.repeat))
    for chunk in () if scheduled else prefill_chunks(w.batch, w.prompt, budget):
        tokens = pad_to(sizes, chunk.tokens)
        # A prompt's first token is needed later only if it has decode steps.
        ops = forward(st, tokens, chunk.seqs, mix=StepMix(chunk.tokens)) + pp_broadcasts(
            st, chunk.seqs, chunk.rows > 0, w.decode_steps > 0, runner)
        runs.append(run(Phase.PREFILL, ops, tokens, chunk.seqs))
    if w.decode_steps and not scheduled:
        tokens = pad_to(sizes, w.batch)
        # Decode step j (1..Sd-1) is needed: V2 checks prompt + j - 1 + 1 < prompt + Sd.
        runs.append(run(Phase.DECODE, forward(st, tokens, w.batch, mix=StepMix(
            w.batch, w.batch)) + pp_broadcasts(st, w.batch, True, True, runner), tokens,
            w.batch, w.decode_steps))
    return merge([r for r in runs if r.repeat])


def _kv_splits(kv: int, tp: int) -> bool:
    """`models/llama.py:147-152`: KV heads split evenly, or each replicated evenly."""
    return kv % tp == 0 if kv >= tp else tp % kv == 0


def _check_kv_heads(model: ModelConfig, tp: int) -> None:
    kv, heads = model.num_key_value_heads, model.num_attention_heads
    if model.mla or _kv_splits(kv, tp):
        return
    allowed = [t for t in range(1, heads + 1) if heads % t == 0 and _kv_splits(kv, t)]
    raise ConfigError(f"tp({tp}) does not split num_key_value_heads({kv}) of {model.name}: "
                      "vLLM needs kv % tp == 0 when kv >= tp, else tp % kv == 0; use tp in "
                      f"{', '.join(map(str, allowed))}")


@register(INFO)
def vllm_v1(model: ModelConfig, layout: Layout, workload: Workload,
            options: EngineOptions) -> Pattern:
    max_seqs = options.max_num_seqs or v1_defaults(options.gpu)[0]
    # Without --dp-batches every DP rank has --batch: not a loop over a million replicas.
    largest = max(workload.dp_batches) if workload.dp_batches else workload.batch
    if largest > max_seqs:
        raise ConfigError(f"batch({largest}) exceeds max-num-seqs({max_seqs}): vLLM "
                          "would not run it as one batch; use batch <= max-num-seqs")
    _check_kv_heads(model, layout.tp)
    check_moe_backend(model, layout, options)
    runner = options.model_runner or default_model_runner(model)
    options = replace(options, model_runner=runner, async_scheduling=async_scheduling(options))
    counts = stage_layer_counts(model.num_hidden_layers, layout.pp)
    if layout.dp > 1 and model.is_moe:  # DP ranks in lockstep, the wave: dp_wave.py
        replicas = dp_replicas(model, layout, workload, options, runner,
                               bool(options.async_scheduling), lambda st, t, own: forward(
                                   st, t, own.rows, mix=StepMix(own.tokens, own.tokens * (
                                       own.phase == Phase.DECODE)))
                               + pp_broadcasts(st, own.rows, own.rows > 0, True, runner))
        return Pattern(engine=INFO.name, model=model, layout=layout, workload=workload,
                       options=options, stages=replicas[0], dp_stages=replicas)
    # Dense at dp > 1: independent replicas (engine spec 10.3), each with its own batch.
    batches = list(workload.dp_batches) if workload.dp_batches else [workload.batch]
    replicas = tuple(
        tuple(tuple(_stage_runs(st, options, runner)) for st in stages(
            model, layout, replace(workload, batch=b, dp_batches=None), options, counts))
        for b in (batches if workload.dp_batches else batches[:1]))
    return Pattern(engine=INFO.name, model=model, layout=layout, workload=workload,
                   options=options, stages=replicas[0],
                   dp_stages=replicas if workload.dp_batches else ())
