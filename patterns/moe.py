"""Mixture-of-experts under data-parallel attention and expert parallelism: the calls of one
MoE layer, and the per-step coordination of the DP ranks, as vLLM V1 and SGLang issue them.

Engine spec sections 10.3, 10.4 and 6. The engine code wins; the files read:

vLLM (vllm-project/vllm):
- `distributed/device_communicators/all2all.py` @ 00143004 (`AgRsAll2AllManager`, the
  default `allgather_reducescatter` backend): dispatch = ONE `all_gatherv` of
  [hidden_states [T_r,h], topk_weights [T_r,k], topk_ids [T_r,k]] over the DP group, or over
  the EP group when `is_sequence_parallel`; combine = `reduce_scatterv` [sum T, h] ->
  [T_r, h]. Sizes are the DP ranks' token counts (`dp_metadata.get_chunk_sizes_across_dp_rank`).
- `distributed/device_communicators/pynccl.py`: `all_gatherv` / `reduce_scatterv` are
  ncclAllGather / ncclReduceScatter when every size is equal, else one ncclBroadcast /
  ncclReduce per rank inside one NCCL group. The replay backends issue the uneven form the
  same way (`Op.counts`).
- `v1/worker/dp_utils.py` @ 00746147 (`_run_ar`, `_synchronize_dp_ranks`): each step, an
  all-reduce of a [4, dp] int32 tensor over the DP group, on its gloo CPU group when
  `disable_nccl_for_dp_synchronization` (the default with async scheduling); Model Runner V2
  sends [3, dp] (spec 10.3). The ranks then pad to the largest token count when the synced
  CUDA-graph mode is not NONE (the minimum over ranks: a single eager rank makes every rank
  eager, unpadded): `dp_padded_tokens` below.
- `model_executor/models/deepseek_v2.py`, `qwen3_moe.py`: sequence-parallel MoE when tp > 1
  and dp > 1 (`sequence_parallel_chunk` pads T to a multiple of tp and keeps this TP rank's
  chunk; after the experts, `tensor_model_parallel_all_gather` [T/tp, h] -> [T, h]).
  Without DP, experts (partitioned with --ep, sharded without) leave one TP all-reduce per
  MoE layer (`moe_runner._maybe_reduce_final_output`), as a dense MLP's down_proj.
- `model_executor/layers/fused_moe/config.py` (`FusedMoEParallelConfig`:
  `use_all2all_kernels = dp_size > 1 and use_ep`; without --ep `flatten_tp_across_dp`
  shards every expert over dp x tp ranks): with dp > 1 and no --ep the tokens are gathered
  over DP all the same (the naive dispatch), with no sequence parallelism, and each TP rank's
  partial sum is then all-reduced over TP. The DeepEP-style kernels need --ep.
- `model_executor/layers/fused_moe/prepare_finalize/naive_dp_ep.py` @ 003d383e: the modular
  kernels dispatch the top-k weights and ids (the monolithic ones the router logits [T, E]
  instead, not modelled), quantised hidden states with their scales for quantised models.
- DeepEP / FlashInfer / mori / NIXL EP backends (`--a2a alltoall` here) are NVSHMEM or IPC
  all-to-all kernels, not NCCL: modelled as an all-to-all over the EP group of each rank's
  T_r*k token rows (dispatch) and the reverse (combine). DeepEP's low-latency buffers are
  sized for the largest rank, so every rank sends ceil(max_r T_r * k / n) rows to each of
  the n ranks; topk ids and weights travel inside DeepEP's own buffers and are not counted.

SGLang (modal-projects/sglang), DP attention (`--enable-dp-attention`, attention TP of
tp/dp ranks; SGLang's TP group holds the same ranks as the `ep` group here):
- `layers/dp_attention.py` @ 14573efd: `DpPaddingMode`: SUM_LEN for an extend batch with
  dp > 1; under CUDA graphs MAX_LEN; else MAX_LEN when sum*2 >= max*dp. MAX_LEN gather
  (`_dp_gather_via_all_gather`): an attention-TP reduce-scatter of the partial attention
  output [max, h] -> [max/tp, h] when tp > 1, then an `all_gather_into_tensor` over the TP
  (here: ep) group -> [dp*max, h]. SUM_LEN gather (`_dp_gather_via_all_reduce`): an
  all-reduce of a zero-filled [sum T, h] buffer over the TP group. Combine:
  `dp_reduce_scatter_tensor` under MAX_LEN (a reduce-scatter [dp*max, h] -> [max/tp, h]
  over the TP group, then an attention-TP all-gather when tp > 1); under SUM_LEN the experts
  all-reduce [sum T, h] and `dp_scatter` is a local copy.
- `managers/scheduler_dp_attn_mixin.py`: `MLPSyncBatchInfo.all_gather` each scheduler step:
  7 int64 per rank over the TP CPU (gloo) group (spec 10.4).
- Dense layers of a MoE model run their MLP in SGLang's FULL mode by default
  (`moe_dense_tp_size` unset): the same gather and scatter as a MoE layer.

fp8 dispatch: vLLM quantises the dispatched hidden states of block-fp8 checkpoints and
gathers their scales (`naive_dp_ep.py`) unless the experts' kernel quantises them itself
(FlashInfer CUTLASS, vLLM's choice on SM90 with EP: `patterns/engines/vllm/fp8_moe.py`,
then bf16 without scales); DeepEP's own messages: `patterns/deepep.py`
(`--a2a deepep_ll` / `deepep_ht`). Every other call (all-reduces, combine, PP, logits)
carries bf16 activations whatever the weights. Not modelled: the engine core's gloo
all-reduce of the unfinished state every 32 steps, micro-batching (DBO), SGLang's
`SGLANG_DP_USE_GATHERV` path and two-batch overlap.
"""

from collections.abc import Callable, Sequence

from patterns.deepep import DEEPEP_MODES, deepep_ops, fp8_dispatch
from patterns.dp_steps import RankStep
from patterns.layout import Layout
from patterns.models import ModelConfig
from patterns.ops import Op, OpKind, Phase, Transport

A2A_MODES = ("allgather_reducescatter", "alltoall", *DEEPEP_MODES)

# Rows of the per-step DP coordination tensor (v1/worker/dp_utils.py `_run_ar`: orig tokens,
# padded tokens, should_ubatch, cudagraph mode; Model Runner V2: 3 rows, spec 10.3).
DP_SYNC_ROWS = {"v1": 4, "v2": 3}
# int64 values each rank contributes to SGLang's MLPSyncBatchInfo all-gather (spec 10.4).
MLP_SYNC_FIELDS = 7


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def check_a2a(a2a: str) -> None:
    from patterns.errors import ConfigError
    if a2a not in A2A_MODES:
        raise ConfigError(f"a2a {a2a!r} is not a mode; use one of {', '.join(A2A_MODES)}")


def exchanges_tokens(layout: Layout) -> bool:
    """Whether MoE layers exchange tokens between DP ranks: whenever dp > 1. With --ep the
    experts are split over the EP group (`use_all2all_kernels`: dp > 1 and use_ep); without
    it vLLM shards every expert over the dp x tp ranks (`flatten_tp_across_dp`) and gathers
    the tokens the same way (the naive dispatch of `get_ep_group().dispatch`). With dp == 1
    tokens are already replicated over TP: no dispatch, one TP all-reduce."""
    return layout.dp > 1


def sequence_parallel_moe(layout: Layout) -> bool:
    """`use_sequence_parallel_moe`: --ep with tp > 1 and dp > 1 (config/parallel.py)."""
    return layout.ep and layout.tp > 1 and layout.dp > 1


def notes(model: ModelConfig, layout: Layout, engine: str = "vllm") -> list[str]:
    """What a reader of a pattern must know about its DP and EP (pattern headers): never a
    silent TP-only answer to an expert-parallel question."""
    out = []
    if layout.dp > 1 and model.is_moe and not layout.ep and engine == "sglang":
        out.append(f"dp({layout.dp}) without --ep: SGLang's DP router, {layout.dp} "
                   "independent replicas with experts over TP; DP attention needs --ep")
    elif layout.dp > 1 and not model.is_moe:
        out.append(f"dp({layout.dp}) with a dense model: {layout.dp} independent replicas, "
                   "no call between them; every replica issues the calls below")
    elif model.is_moe and layout.dp == 1:
        what = (f"{model.name} is a MoE model ({model.num_local_experts} experts, "
                f"{len(model.moe_layers or ())} MoE layers): ")
        if layout.ep:
            out.append(what + f"--ep at dp 1 makes the EP group the TP group of {layout.tp}; "
                       "tokens are replicated there, so one all-reduce per MoE layer and no "
                       "dispatch (expert parallelism with token exchange needs --dp N)")
        else:
            # vLLM's FusedMoE shards every expert over TP (intermediate_size_per_partition =
            # intermediate_size // tp_size, model_executor/layers/fused_moe/layer.py, c8109375):
            # each rank holds a 1/tp slice of each expert, not a full copy.
            out.append(what + "modelled without expert parallelism, every expert sharded over "
                       "TP (one all-reduce per MoE layer); for expert parallelism give "
                       "--dp N --ep")
    elif model.is_moe and not layout.ep:
        out.append(f"MoE with dp({layout.dp}) without --ep: every expert sharded over the "
                   f"{layout.dp * layout.tp} ranks; tokens still gathered over DP per MoE "
                   "layer")
    return out


def _parts(rows: Sequence[int], width: int) -> tuple[int, ...] | None:
    """`Op.counts` for parts of `rows` rows of `width` elements: None when equal."""
    return None if len(set(rows)) == 1 else tuple(r * width for r in rows)


def _allgather(group: str, rows: Sequence[int], index: int, width: int, dtype: str,
               tag: str) -> Op:
    return Op(kind=OpKind.ALLGATHER, group=group, group_size=len(rows),
              shape=(rows[index], width), out_shape=(sum(rows), width), dtype=dtype, tag=tag,
              counts=_parts(rows, width))


def _reducescatter(group: str, rows: Sequence[int], index: int, width: int, dtype: str,
                   tag: str) -> Op:
    return Op(kind=OpKind.REDUCESCATTER, group=group, group_size=len(rows),
              shape=(sum(rows), width), out_shape=(rows[index], width), dtype=dtype, tag=tag,
              counts=_parts(rows, width))


def _tp_op(kind: OpKind, tp: int, shape: tuple[int, ...], out_shape: tuple[int, ...],
           dtype: str, tag: str) -> Op:
    return Op(kind=kind, group="tp", group_size=tp, shape=shape, out_shape=out_shape,
              dtype=dtype, tag=tag)


def vllm_dp_coordination(layout: Layout, runner: str = "v2") -> list[Op]:
    """The per-step all-reduce of `coordinate_batch_across_dp` (none at dp 1)."""
    if layout.dp == 1:
        return []
    shape = (DP_SYNC_ROWS[runner], layout.dp)
    return [Op(kind=OpKind.ALLREDUCE, group="dp", group_size=layout.dp, shape=shape,
               out_shape=shape, dtype="int32", tag="dp_utils.coordinate_batch_across_dp",
               transport=Transport.GLOO)]


def vllm_moe_layer(prefix: str, layout: Layout, tokens: Sequence[int], dp_rank: int,
                   hidden: int, top_k: int, dtype: str,
                   a2a: str = "allgather_reducescatter", weight_format: str = "",
                   widths: tuple[int, int] | None = None,
                   defer_quant: bool = False) -> list[Op]:
    """The calls of one MoE layer on a rank of DP rank `dp_rank` (vLLM V1).

    `tokens[d]` is T_d, the tokens DP rank d runs this step (after `dp_padded_tokens`);
    `prefix` names the layer's module (e.g. "layers.3.mlp.experts"); `widths`: the hidden
    width the experts take and return when an mxfp4 backend pads it (`patterns.mxfp4.
    moe_widths`): the dispatch carries the first, the combine and TP all-reduce the second.
    `defer_quant`: the experts' kernel quantises a block-fp8 checkpoint's inputs itself, so
    the dispatch carries them in `dtype`, without scales (`patterns/engines/vllm/fp8_moe.py`).
    """
    tp, dp, t_me = layout.tp, layout.dp, tokens[dp_rank]
    w_in, w_out = widths or (hidden, hidden)
    reduce_tp = [_tp_op(OpKind.ALLREDUCE, tp, (t_me, w_out), (t_me, w_out), dtype, prefix)]
    if not exchanges_tokens(layout):
        return reduce_tp if tp > 1 else []
    if a2a != "allgather_reducescatter" and not layout.ep:
        from patterns.errors import ConfigError
        raise ConfigError(f"a2a {a2a} needs --ep: vLLM runs its all-to-all kernels only "
                          "with expert parallelism (use_all2all_kernels)")
    sequence_parallel = sequence_parallel_moe(layout)
    if sequence_parallel:  # sequence_parallel_chunk: T padded to a multiple of tp, split
        chunks = [_ceil_div(t, tp) for t in tokens]
        rows = [chunks[d] for d in range(dp) for _ in range(tp)]  # EP group: DP x TP
        group = "ep"
    else:
        chunks = list(tokens)
        rows = chunks
        group = "dp"
    n = len(rows)
    ops: list[Op] = []
    if a2a in DEEPEP_MODES:  # DeepEP's messages, fp8 for block-fp8 checkpoints
        ops += deepep_ops(prefix, dp * tp, max(chunks), top_k, w_in, dtype, a2a,
                          weight_format)
    elif a2a == "alltoall":  # --ep here (checked above): EP group of dp x tp
        per_peer = _ceil_div(max(chunks) * top_k, dp * tp)
        shape = ((dp * tp) * per_peer, hidden)
        for phase in ("dispatch", "combine"):
            ops.append(Op(kind=OpKind.ALLTOALL, group="ep", group_size=dp * tp, shape=shape,
                          out_shape=shape, dtype=dtype, tag=f"{prefix}.{phase}",
                          transport=Transport.NVSHMEM))
    else:
        index = dp_rank * tp if sequence_parallel else dp_rank  # any TP rank: equal rows
        # Block-fp8 checkpoints quantise before the gather (naive_dp_ep.py:16-52, 132-164
        # @ c8109375): fp8 hidden states (1 B each, as uint8) and their fp32 scales, one per
        # 128 channels, gathered as an extra tensor after the top-k ids.
        fp8 = fp8_dispatch(weight_format) and not defer_quant
        ops.append(_allgather(group, rows, index, w_in, "uint8" if fp8 else dtype,
                              f"{prefix}.dispatch.hidden_states"))
        ops.append(_allgather(group, rows, index, top_k, "fp32",
                              f"{prefix}.dispatch.topk_weights"))
        ops.append(_allgather(group, rows, index, top_k, "int32",
                              f"{prefix}.dispatch.topk_ids"))
        if fp8:
            ops.append(_allgather(group, rows, index, -(-w_in // 128), "fp32",
                                  f"{prefix}.dispatch.hidden_states_scales"))
        ops.append(_reducescatter(group, rows, index, w_out, dtype, f"{prefix}.combine"))
    assert n == (dp * tp if sequence_parallel else dp)
    if sequence_parallel:
        chunk = chunks[dp_rank]
        ops.append(_tp_op(OpKind.ALLGATHER, tp, (chunk, hidden), (chunk * tp, hidden), dtype,
                          f"{prefix}.sequence_parallel.allgather"))
    elif tp > 1:  # no EP: each TP rank summed its slice of every expert over DP only
        ops += reduce_tp
    return ops


def sglang_padding_mode(tokens: Sequence[int], extend: bool, graphed: bool) -> str:
    """`DpPaddingMode.get_dp_padding_mode` (and MAX_LEN under CUDA graphs)."""
    if graphed:
        return "max_len"
    if extend and len(tokens) > 1:
        return "sum_len"
    return "max_len" if sum(tokens) * 2 >= max(tokens) * len(tokens) else "sum_len"


def sglang_step_tokens(steps: Sequence[RankStep], graph_size: Callable[[int], int | None]
                       ) -> tuple[tuple[int, ...], str]:
    """Every DP rank's tokens in one SGLang step under DP attention, and the padding mode.

    A decode step runs a CUDA graph when every rank can (`can_cuda_graph` gathered by
    MLPSyncBatchInfo): all ranks pad to the graph size of the largest batch, MAX_LEN. An
    extend anywhere (or an eager step) keeps each rank's own count; the mode follows
    `DpPaddingMode.get_dp_padding_mode`.
    """
    tokens = [s.tokens for s in steps]
    extend = any(s.phase == Phase.PREFILL for s in steps)
    size = None if extend else graph_size(max(tokens))
    if size is not None:
        return (size,) * len(tokens), "max_len"
    return tuple(tokens), sglang_padding_mode(tokens, extend, graphed=False)


def sglang_mlp_sync(layout: Layout) -> list[Op]:
    """The per-step `MLPSyncBatchInfo` all-gather over the TP CPU group (none at dp 1)."""
    if layout.dp == 1:
        return []
    n = layout.dp * layout.tp
    return [Op(kind=OpKind.ALLGATHER, group="ep", group_size=n, shape=(MLP_SYNC_FIELDS,),
               out_shape=(n * MLP_SYNC_FIELDS,), dtype="int64",
               tag="scheduler.MLPSyncBatchInfo.all_gather", transport=Transport.GLOO)]


def sglang_dp_layer(prefix: str, layout: Layout, tokens: Sequence[int], dp_rank: int,
                    hidden: int, dtype: str, mode: str, top_k: int | None = None,
                    a2a: str = "allgather_reducescatter") -> list[Op]:
    """The calls between a layer's attention output and its MLP output under SGLang's DP
    attention (dp > 1): the gather of every DP rank's tokens and the scatter back. The
    attention all-reduce is part of the MAX_LEN reduce-scatter / SUM_LEN all-reduce here.

    `mode` is "max_len" or "sum_len" (`sglang_padding_mode`); `top_k` is None for a dense
    layer. With `a2a == "alltoall"` (`--moe-a2a-backend deepep`) a MoE layer keeps its
    tokens (attention-TP all-reduce when tp > 1) and its experts exchange them by all-to-all
    over the EP group, as `vllm_moe_layer` models DeepEP.
    """
    tp, dp = layout.tp, layout.dp
    n = dp * tp
    if a2a == "alltoall" and top_k is not None:
        t_me = tokens[dp_rank]
        ops = ([_tp_op(OpKind.ALLREDUCE, tp, (t_me, hidden), (t_me, hidden), dtype,
                       f"{prefix}.self_attn.o_proj")] if tp > 1 else [])
        per_peer = _ceil_div(max(tokens) * top_k, n)
        shape = (n * per_peer, hidden)
        for phase in ("dispatch", "combine"):
            ops.append(Op(kind=OpKind.ALLTOALL, group="ep", group_size=n, shape=shape,
                          out_shape=shape, dtype=dtype, tag=f"{prefix}.experts.{phase}",
                          transport=Transport.NVSHMEM))
        return ops
    if mode == "sum_len":
        total = sum(tokens)
        return [Op(kind=OpKind.ALLREDUCE, group="ep", group_size=n, shape=(total, hidden),
                   out_shape=(total, hidden), dtype=dtype, tag=f"{prefix}.dispatch.dp_gather"),
                Op(kind=OpKind.ALLREDUCE, group="ep", group_size=n, shape=(total, hidden),
                   out_shape=(total, hidden), dtype=dtype,
                   tag=f"{prefix}.combine.mlp_all_reduce")]
    longest = max(tokens)
    piece = _ceil_div(longest, tp)
    ops = []
    if tp > 1:
        ops.append(_tp_op(OpKind.REDUCESCATTER, tp, (piece * tp, hidden), (piece, hidden),
                          dtype, f"{prefix}.dispatch.dp_gather.attn_tp_reduce_scatter"))
    ops.append(Op(kind=OpKind.ALLGATHER, group="ep", group_size=n, shape=(piece, hidden),
                  out_shape=(piece * n, hidden), dtype=dtype,
                  tag=f"{prefix}.dispatch.dp_gather"))
    ops.append(Op(kind=OpKind.REDUCESCATTER, group="ep", group_size=n,
                  shape=(piece * n, hidden), out_shape=(piece, hidden), dtype=dtype,
                  tag=f"{prefix}.combine.dp_reduce_scatter_tensor"))
    if tp > 1:
        ops.append(_tp_op(OpKind.ALLGATHER, tp, (piece, hidden), (piece * tp, hidden), dtype,
                          f"{prefix}.combine.attn_tp_all_gather"))
    return ops


def sglang_dp_logits(layout: Layout, rows: Sequence[int], dp_rank: int, hidden: int,
                     vocab_padded: int, dtype: str, mode: str) -> list[Op]:
    """The logits of a DP-attention step with SGLang's default vocab-parallel LM head over
    the whole TP (here: ep) group (`enable_dp_lm_head` off, `layers/logits_processor.py`):
    `dp_gather_replicate` of every rank's sampled rows, the LM head on its vocabulary
    shard, an all-gather of the shards over the group, then `dp_scatter` (a local copy).
    `rows[d]` is DP rank d's sampled rows."""
    n = layout.dp * layout.tp
    shard = vocab_padded // n
    if mode == "sum_len":
        total = sum(rows)
        gather = [Op(kind=OpKind.ALLREDUCE, group="ep", group_size=n, shape=(total, hidden),
                     out_shape=(total, hidden), dtype=dtype, tag="logits.dp_gather")]
    else:
        piece = _ceil_div(max(rows), layout.tp)
        total = piece * n
        gather = ([_tp_op(OpKind.REDUCESCATTER, layout.tp, (piece * layout.tp, hidden),
                          (piece, hidden), dtype, "logits.dp_gather.attn_tp_reduce_scatter")]
                  if layout.tp > 1 else [])
        gather.append(Op(kind=OpKind.ALLGATHER, group="ep", group_size=n,
                         shape=(piece, hidden), out_shape=(total, hidden), dtype=dtype,
                         tag="logits.dp_gather"))
    if total == 0:
        return []
    return [*gather, Op(kind=OpKind.ALLGATHER, group="ep", group_size=n, shape=(total, shard),
                        out_shape=(total, shard * n), dtype=dtype, tag="logits")]
