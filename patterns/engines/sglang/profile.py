"""SGLang 0.5 (main of 2026-07-20): engine spec sections 4 and 10.4.

Code read: modal-projects/sglang @ 8905cbd4 (upstream main of 2026-07-20, about 0.5.15),
`python/sglang/srt/`:
- `models/llama.py`: VocabParallelEmbedding all-reduce on the first PP stage,
  RowParallelLinear o_proj / down_proj: 1 + 2*L_s all-reduces of [T, h];
- `layers/logits_processor.py:376`: logits all-gathered on every TP rank, [S, V_pad/tp] ->
  [S, V_pad] (`DEFAULT_VOCAB_PADDING_SIZE = 64`), through `MultimemAllGatherer` (Triton
  multimem, `triton_symm_mem_ag.py:489-510`) for bf16 2-D inputs of at most
  `recommended_max_tokens(floor=128)` rows (128 unless --max-running-requests is set), NCCL
  otherwise; S = the last token of each extend sequence, chunked ones included
  (`logits_processor.py:517-518`), or B in decode, padded like the batch: the decode graph
  computes the logits of all its rows and slices them afterwards
  (`model_executor/runner/decode_cuda_graph_runner.py:1265-1283`);
- `server_args.py:4179-4206` `_generate_decode_cuda_graph_batch_sizes`: [1, 2, 4, 8, 12] +
  range(16, 257, 8) + range(272, 512, 16) + range(512, max_bs + 1, 32), cut at max_bs and
  max_bs appended; `server_args.py:3922-3948`: max_bs 256 at TP < 4 and 512 at TP >= 4 on
  H100 / A100 / H200, 512 on B200; chunked_prefill_size 8192 (16384 on B200);
- `server_args.py:4232-4249` `_generate_prefill_cuda_graph_batch_sizes` and `:3984-4015`:
  prefill (extend) steps padded to the token ladder 4..32 step 4, 48..256 step 16, 288..512
  step 32, 576..1024 step 64, 1280..4096 step 256, 4608.. step 512, up to
  chunked_prefill_size (2048 for MLA models);
- `managers/scheduler_pp_mixin.py`: PP proxy tensors through `send_tensor_dict(
  all_gather_group=attn_tp_group)` (vLLM's slice + all-gather), and the sampled ids sent from
  the last stage back to the first;
- `managers/scheduler.py: recv_requests`: `broadcast_pyobj` over the TP gloo group each
  scheduler loop (the size tensor; `--control-plane`).
Transports: `transports.py` here (custom all-reduce V2, FlashInfer fusion).
DP attention with expert parallelism (`--dp N --ep`, a MoE model): `dp.py` here
(`layers/dp_attention.py` @ 14573efd, MLPSyncBatchInfo), hooked in `_dp_attention`; `--dp`
without `--ep` is SGLang's DP router: independent replicas.
"""

from dataclasses import replace

from patterns.deepep import DEEPEP_MODES
from patterns.dp_steps import SGLANG_IDLE_STEP, RankStep, align_dp_runs, build_replicas
from patterns.dtypes import dtype_bytes
from patterns.engine_base import EngineInfo, register
from patterns.engines.sglang.dp import (
    sglang_dp_layers,
    sglang_dp_logits,
    sglang_mlp_sync,
    sglang_step_tokens,
)
from patterns.engines.sglang.embedding import check_dp_attention_embedding, embedding_ops
from patterns.engines.sglang.transports import sglang_allreduce, sglang_logits_allgather
from patterns.engines.vllm.pp_transfer import PP_KEYS, pp_receive
from patterns.errors import ConfigError
from patterns.layout import Layout, Workload
from patterns.models import ModelConfig, mlp_module
from patterns.ops import Op, OpKind, Phase, Transport
from patterns.pattern import EngineOptions, Pattern, Run
from patterns.shapes import padded_vocab, prefill_chunks, stage_layer_counts
from patterns.stage import Stage, merge, pad_to, run, stages, tp_model_calls
from patterns.tiled import TiledOps

INFO = EngineInfo(
    name="sglang",
    engine="SGLang",
    version="0.5.x (main of 2026-07-20, about 0.5.15)",
    source="sgl-project/sglang main 2026-07-20 = modal-projects/sglang @ 8905cbd4",
    options=("eager", "max_batched_tokens", "control_plane", "gpu", "nccl_only", "a2a",
             "disable_overlap_schedule"),
    not_modelled=(
        "DP attention at pp > 1; its prefill CUDA graphs, two-batch overlap, "
        "SGLANG_DP_USE_GATHERV, enable_dp_lm_head",
        "the pickled request payload of broadcast_pyobj and PP's point_to_point_pyobj",
        "sampling all-reduce (SYNC_TOKEN_IDS_ACROSS_TP or grammars)",
        "--max-running-requests (the multimem logits all-gather is taken up to 128 rows)",
    ),
)

def chunked_prefill_size(gpu: str) -> int:
    """`server_args.py:3922-3948`: 8192 on H100 / A100 / H200, 16384 on B200."""
    return 16384 if gpu == "b200" else 8192


def decode_graph_sizes(tp: int, gpu: str, speculative: bool = False,
                       max_running: int | None = None) -> list[int]:
    """The decode CUDA-graph batch sizes (@ 8905cbd4): `server_args.py:4179-4206`
    `_generate_decode_cuda_graph_batch_sizes`, the plain list or, with speculative decoding,
    its own ("less padding for smaller batch sizes": 1-8, 10-32 by 2, 40-64 by 4, 72-256 by
    8, then by 16), up to the default max_bs of `server_args.py:3922-3948`; then
    `runner/base_cuda_graph_runner.py:58-101` `get_batch_sizes_to_capture` keeps those up to
    the request pool's size, max_running_requests, adding it when it is below the largest.
    The verify and draft graphs of the EAGLE worker take the same list
    (`speculative/eagle_worker_v2.py:374-400`)."""
    top = 512 if gpu == "b200" or tp >= 4 else 256
    if speculative:
        sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8),
                 *range(272, top + 1, 16)]
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16),
                 *range(512, top + 1, 32)]
    sizes = [s for s in sizes if s <= top]
    if sizes[-1] != top:
        sizes.append(top)
    if max_running is not None and max_running < top:
        sizes = sorted({s for s in sizes if s <= max_running} | {max_running})
    return sizes


def prefill_graph_sizes(max_tokens: int) -> list[int]:
    """`server_args.py:4232-4249`: the extend-token ladder, up to `max_tokens`."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32),
             *range(576, 1025, 64), *range(1280, 4097, 256), *range(4608, max_tokens + 1, 512)]
    return [s for s in sizes if s <= max_tokens]


def prefill_graph_tokens(sizes: list[int], tokens: int) -> int | None:
    """The token bucket an extend batch replays its prefill graph at, or None when it runs
    eager: above the largest, or when the bucket is more than twice the tokens
    (`runner/prefill_cuda_graph_runner.py:118, 700-707` @ 8905cbd4,
    _MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR = 2: a 1-token extend, bucket 4, runs eager)."""
    if not sizes or tokens > sizes[-1]:
        return None
    bucket = pad_to(sizes, tokens)
    return bucket if bucket <= 2 * tokens else None


# Fusion architectures whose decoder layers do not pass is_last_layer to LayerCommunicator
# (`models/qwen3_next.py:564, 737` @ 8905cbd4): their last MLP all-reduce is fused too.
_NO_LAST_LAYER_FLAG = frozenset({"qwen3_next"})


def fusable(model: ModelConfig, tag: str) -> bool:
    """Whether SGLang's all-reduce + RMSNorm fusion can take the all-reduce `tag`
    (@ 8905cbd4): the attention output's goes into `prepare_mlp`'s fused
    post_attention_layernorm (`layers/communicator.py:1104-1113`) in every layer; a layer's
    MLP/MoE one is deferred into the next layer's `prepare_attn` (`communicator.py:547-575`)
    only when `should_fuse_mlp_allreduce_with_next_layer` (`communicator.py:773-818`: `not
    self.is_last_layer`), so the last layer's is a plain all-reduce (`models/qwen3_moe.py:
    330-337, 826-848`); the embedding's is VocabParallelEmbedding's own, never fused."""
    if tag == "embed_tokens":
        return False
    last = model.num_hidden_layers - 1
    return (model.model_type in _NO_LAST_LAYER_FLAG
            or tag != f"layers.{last}.{mlp_module(model, last)}")


def _allreduce(st: Stage, tokens: int, tag: str) -> Op:
    transport = sglang_allreduce(tokens * st.h * dtype_bytes(st.dtype), tokens, st.tp,
                                 st.options.gpu, st.model.model_type, st.options.nccl_only,
                                 fusable(st.model, tag))
    return st.tp_op(OpKind.ALLREDUCE, (tokens, st.h), (tokens, st.h), tag, transport)


def moe_layer_ops(st: Stage, layer: int, tokens: int) -> list[Op]:
    """One MoE layer without DP attention / EP: every expert sharded over TP
    (`layers/moe/fused_moe_triton/layer.py:256-257` @ 8905cbd4: intermediate_size //
    moe_tp_size), each rank's partial output reduced once (`layer.py:1299`). Expert
    parallelism hooks in here."""
    return [_allreduce(st, tokens, f"layers.{layer}.{mlp_module(st.model, layer)}")]


def forward(st: Stage, tokens: int, rows: int, logit_rows: int | None = None) -> list[Op]:
    """One forward pass of T = `tokens`, sampling `rows` requests; the logits cover
    `logit_rows` rows (the padded batch under a decode graph, else `rows`)."""
    logit_rows = rows if logit_rows is None else logit_rows
    ops, shape = pp_receive(st, tokens, interleaved=True)
    ops += tp_model_calls(st, tokens, _allreduce, moe_layer_ops)
    if not st.is_last:
        ops += [st.p2p(OpKind.SEND, shape, f"pp.{key}", peer=st.index + 1) for key in PP_KEYS]
    elif st.tp > 1:
        shard = padded_vocab(st.model.vocab_size) // st.tp
        transport = sglang_logits_allgather(logit_rows, st.dtype, st.options.gpu,
                                            st.options.nccl_only)
        ops.append(st.tp_op(OpKind.ALLGATHER, (logit_rows, shard), (logit_rows, shard * st.tp),
                            "logits", transport))
    # The last stage hands the sampled ids back to the first (scheduler_pp_mixin).
    if st.pp > 1 and rows and st.is_last:
        ops.append(st.p2p(OpKind.SEND, (rows,), "pp.next_token_ids", peer=0, dtype="int64"))
    elif st.pp > 1 and rows and st.is_first:
        ops.append(st.p2p(OpKind.RECV, (rows,), "pp.next_token_ids", peer=st.pp - 1,
                          dtype="int64"))
    return ops


def _control(st: Stage) -> list[Op]:
    """`recv_requests`: broadcast_pyobj's size tensor from TP rank 0 over the gloo group."""
    if not (st.options.control_plane and st.tp > 1):
        return []
    return [st.tp_op(OpKind.BROADCAST, (1,), (1,), "ctrl.recv_requests.size", Transport.GLOO,
                     dtype="int64", root=0)]


def _stage_runs(st: Stage, options: EngineOptions) -> list[Run]:
    w = st.workload
    budget = options.max_batched_tokens or chunked_prefill_size(options.gpu)
    # Prefill graphs are captured up to chunked_prefill_size (2048 for MLA backends).
    prefill_sizes = [] if options.eager else prefill_graph_sizes(
        min(budget, 2048) if st.model.mla else budget)
    runs = []
    for chunk in prefill_chunks(w.batch, w.prompt, budget):
        tokens = prefill_graph_tokens(prefill_sizes, chunk.tokens) or chunk.tokens
        runs.append(run(Phase.PREFILL, _control(st) + forward(st, tokens, chunk.seqs), tokens,
                        chunk.seqs))
    if w.decode_steps:
        tokens = w.batch if options.eager else pad_to(decode_graph_sizes(st.tp, options.gpu),
                                                      w.batch)
        # Under the graph the logits (and their all-gather) cover every padded row.
        runs.append(run(Phase.DECODE, _control(st) + forward(st, tokens, w.batch, tokens),
                        tokens, w.batch, w.decode_steps))
    return merge(runs)


def _dp_attention(model: ModelConfig, layout: Layout, workload: Workload,
                  options: EngineOptions) -> tuple[tuple[tuple[Run, ...], ...], ...]:
    """A MoE model at dp > 1 runs DP attention (`--enable-dp-attention`, SGLang's --tp is
    dp x tp here): every DP rank's runs, the ranks stepping together with idle batches
    (`patterns.dp_steps`). Per step the MLPSyncBatchInfo all-gather and the embedding's
    attention-TP all-reduce (`embedding.py`); per layer (dense layers too: FULL MLP mode)
    the DP gather and scatter of `dp.sglang_dp_layer`, or DeepEP all-to-all for MoE layers
    with `--a2a alltoall`; the logits of `sglang_dp_logits`. Extend steps run eager here,
    in chunks of chunked_prefill_size / dp (`dp_attention_budget`)."""
    if layout.pp > 1:
        raise ConfigError(f"sglang with dp({layout.dp}) models DP attention at pp 1 only; "
                          "use --pp 1")
    check_dp_attention_embedding(model)
    budget = dp_attention_budget(options, layout)
    sizes = [] if options.eager else decode_graph_sizes(layout.dp * layout.tp, options.gpu)

    def graph(tokens: int) -> int | None:
        return pad_to(sizes, tokens) if sizes and tokens <= sizes[-1] else None

    per_rank = []
    for d in range(layout.dp):
        batch = workload.batch_of(d)
        own = [(RankStep(Phase.PREFILL, chunk.tokens, chunk.seqs), 1)
               for chunk in prefill_chunks(batch, workload.prompt, budget)]
        if workload.decode_steps:
            own.append((RankStep(Phase.DECODE, batch, batch), workload.decode_steps))
        per_rank.append(own)
    dtype = workload.dtype or model.default_dtype

    def ops_of(d: int, stage: int, steps: tuple[RankStep, ...],
               tokens: tuple[int, ...]) -> list[Op]:
        _, mode = sglang_step_tokens(steps, graph)
        return list(dp_attention_step(model, layout, tokens, d, mode,
                                      tuple(s.rows for s in steps), dtype, options))

    return build_replicas(align_dp_runs(per_rank, SGLANG_IDLE_STEP), 1,
                          lambda steps: sglang_step_tokens(steps, graph)[0], ops_of)


def dp_attention_step(model: ModelConfig, layout: Layout, tokens: tuple[int, ...], d: int,
                      mode: str, rows: tuple[int, ...], dtype: str,
                      options: EngineOptions) -> TiledOps:
    """DP rank d's calls in a DP-attention step of every rank's `tokens` (padded) and
    sampled `rows`: the MLPSyncBatchInfo all-gather, the embedding's attention-TP
    all-reduce (`embedding.py`), every layer's DP gather and scatter, the logits."""
    layers = sglang_dp_layers(model, layout, tokens, d, dtype, mode, options.a2a)
    return TiledOps((((*sglang_mlp_sync(layout),
                       *embedding_ops(model, layout, tokens[d], dtype)), 0, 0),
                     *layers.parts, (dp_attention_logits(model, layout, rows, d, dtype, mode,
                                                         options), 0, 0)))


def dp_attention_logits(model: ModelConfig, layout: Layout, rows: tuple[int, ...], d: int,
                        dtype: str, mode: str, options: EngineOptions) -> tuple[Op, ...]:
    return tuple(_dp_logits_transport(op, options) for op in sglang_dp_logits(
        layout, rows, d, model.hidden_size, padded_vocab(model.vocab_size), dtype, mode))


def dp_attention_budget(options: EngineOptions, layout: Layout) -> int:
    """A DP-attention rank's chunk of prefill tokens: SGLang divides chunked_prefill_size
    (given or its default) by dp_size (`server_args.py:5572-5580` @ 8905cbd4)."""
    return (options.max_batched_tokens or chunked_prefill_size(options.gpu)) // layout.dp


def _dp_logits_transport(op: Op, options: EngineOptions) -> Op:
    """Under DP attention the logits all-gather over the whole TP group is still
    `self._logits_gatherer(logits)`, the MultimemAllGatherer (`layers/logits_processor.py:
    357-361, 376-381, 706-710` @ 8905cbd4: enabled whenever enable_dp_lm_head is off), so
    it takes the same transport rule as without DP, on the gathered rows."""
    if op.tag != "logits":
        return op
    return replace(op, transport=sglang_logits_allgather(op.shape[0], op.dtype, options.gpu,
                                                         options.nccl_only))


def _check_a2a(options: EngineOptions) -> None:
    if options.a2a in DEEPEP_MODES:
        raise ConfigError(f"a2a {options.a2a} is modelled for the vllm profile (its DeepEP "
                          "prepare/finalize); for sglang use --a2a alltoall")


@register(INFO)
def sglang(model: ModelConfig, layout: Layout, workload: Workload,
           options: EngineOptions) -> Pattern:
    _check_a2a(options)
    # --dp N --ep is DP attention (--enable-dp-attention); --dp alone is SGLang's DP router:
    # independent replicas, MoE or not.
    if layout.dp > 1 and model.is_moe and layout.ep:
        replicas = _dp_attention(model, layout, workload, options)
        return Pattern(engine=INFO.name, model=model, layout=layout, workload=workload,
                       options=options, stages=replicas[0], dp_stages=replicas)
    counts = stage_layer_counts(model.num_hidden_layers, layout.pp)
    # Replicas at dp > 1 (SGLang's DP router), each with its own batch.
    batches = [workload.batch_of(d) for d in range(layout.dp)]
    replicas = tuple(
        tuple(tuple(_stage_runs(st, options)) for st in stages(
            model, layout, replace(workload, batch=b, dp_batches=None), options, counts))
        for b in (batches if workload.dp_batches else batches[:1]))
    return Pattern(engine=INFO.name, model=model, layout=layout, workload=workload,
                   options=options, stages=replicas[0],
                   dp_stages=replicas if workload.dp_batches else ())
