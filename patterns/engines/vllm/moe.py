"""vLLM V1's MoE layer under data-parallel attention and expert parallelism, and the
per-step coordination of its DP ranks (the vocabulary both engines share: `patterns/moe.py`).

Engine spec sections 10.3 and 6. The engine code wins; the files read:

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
  `disable_nccl_for_dp_synchronization` (the default with async scheduling; NCCL under
  `--no-async-scheduling`); Model Runner V2 sends [3, dp] (spec 10.3), always on gloo. The
  ranks then pad to the largest token count when the synced
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

fp8 dispatch: vLLM quantises the dispatched hidden states of block-fp8 checkpoints and
gathers their scales (`naive_dp_ep.py`) unless the experts' kernel quantises them itself
(FlashInfer CUTLASS, vLLM's choice on SM90 with EP: `patterns/engines/vllm/fp8_moe.py`,
then bf16 without scales); DeepEP's own messages: `patterns/deepep.py`
(`--a2a deepep_ll` / `deepep_ht`). Every other call (all-reduces, combine, PP, logits)
carries bf16 activations whatever the weights. Not modelled: the engine core's gloo
all-reduce of the unfinished state every 32 steps, micro-batching (DBO), SGLang's
`SGLANG_DP_USE_GATHERV` path and two-batch overlap.
"""

from collections.abc import Sequence

from patterns.deepep import DEEPEP_MODES, deepep_ops, fp8_dispatch
from patterns.layout import Layout
from patterns.moe import (
    allgather,
    ceil_div,
    exchanges_tokens,
    reducescatter,
    sequence_parallel_moe,
    tp_op,
)
from patterns.ops import Op, OpKind, Transport

# Rows of the per-step DP coordination tensor (v1/worker/dp_utils.py `_run_ar`: orig tokens,
# padded tokens, should_ubatch, cudagraph mode; Model Runner V2: 3 rows, spec 10.3).
DP_SYNC_ROWS = {"v1": 4, "v2": 3}


def vllm_dp_coordination(layout: Layout, runner: str = "v2",
                         async_scheduling: bool = True) -> list[Op]:
    """The per-step all-reduce of `coordinate_batch_across_dp` (none at dp 1).

    Model Runner V2 reduces on the DP group's CPU (gloo) group always
    (`v1/worker/gpu/dp_utils.py:32-37` @ c8109375). V1 does so only when
    `disable_nccl_for_dp_synchronization`, which vLLM sets from async scheduling
    (`config/vllm.py:1145-1156`); under `--no-async-scheduling` V1 copies the tensor to
    the GPU and reduces it on the NCCL device group (`v1/worker/dp_utils.py:18-33, 53`)."""
    if layout.dp == 1:
        return []
    shape = (DP_SYNC_ROWS[runner], layout.dp)
    on_cpu = runner == "v2" or async_scheduling
    return [Op(kind=OpKind.ALLREDUCE, group="dp", group_size=layout.dp, shape=shape,
               out_shape=shape, dtype="int32", tag="dp_utils.coordinate_batch_across_dp",
               transport=Transport.GLOO if on_cpu else Transport.NCCL)]


def vllm_moe_layer(prefix: str, layout: Layout, tokens: Sequence[int], dp_rank: int,
                   hidden: int, top_k: int, dtype: str,
                   a2a: str = "allgather_reducescatter", weight_format: str = "",
                   widths: tuple[int, int] | None = None,
                   defer_quant: bool = False) -> list[Op]:
    """The calls of one MoE layer on a rank of DP rank `dp_rank` (vLLM V1).

    `tokens[d]` is T_d, the tokens DP rank d runs this step (after `dp_padded_tokens`);
    `prefix` names the layer's module (e.g. "layers.3.mlp.experts"); `widths`: the hidden
    width the experts take and return when an mxfp4 backend pads it (`mxfp4.
    moe_widths`): the dispatch carries the first, the combine and TP all-reduce the second.
    `defer_quant`: the experts' kernel quantises a block-fp8 checkpoint's inputs itself, so
    the dispatch carries them in `dtype`, without scales (`patterns/engines/vllm/fp8_moe.py`).
    """
    tp, dp, t_me = layout.tp, layout.dp, tokens[dp_rank]
    w_in, w_out = widths or (hidden, hidden)
    reduce_tp = [tp_op(OpKind.ALLREDUCE, tp, (t_me, w_out), (t_me, w_out), dtype, prefix)]
    if not exchanges_tokens(layout):
        return reduce_tp if tp > 1 else []
    if a2a != "allgather_reducescatter" and not layout.ep:
        from patterns.errors import ConfigError
        raise ConfigError(f"a2a {a2a} needs --ep: vLLM runs its all-to-all kernels only "
                          "with expert parallelism (use_all2all_kernels)")
    sequence_parallel = sequence_parallel_moe(layout)
    if sequence_parallel:  # sequence_parallel_chunk: T padded to a multiple of tp, split
        chunks = [ceil_div(t, tp) for t in tokens]
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
                          "" if defer_quant else weight_format)  # deferred: bf16 rows
    elif a2a == "alltoall":  # --ep here (checked above): EP group of dp x tp
        per_peer = ceil_div(max(chunks) * top_k, dp * tp)
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
        ops.append(allgather(group, rows, index, w_in, "uint8" if fp8 else dtype,
                              f"{prefix}.dispatch.hidden_states"))
        ops.append(allgather(group, rows, index, top_k, "fp32",
                              f"{prefix}.dispatch.topk_weights"))
        ops.append(allgather(group, rows, index, top_k, "int32",
                              f"{prefix}.dispatch.topk_ids"))
        if fp8:
            ops.append(allgather(group, rows, index, -(-w_in // 128), "fp32",
                                  f"{prefix}.dispatch.hidden_states_scales"))
        ops.append(reducescatter(group, rows, index, w_out, dtype, f"{prefix}.combine"))
    assert n == (dp * tp if sequence_parallel else dp)
    if sequence_parallel:
        chunk = chunks[dp_rank]
        ops.append(tp_op(OpKind.ALLGATHER, tp, (chunk, hidden), (chunk * tp, hidden), dtype,
                          f"{prefix}.sequence_parallel.allgather"))
    elif tp > 1:  # no EP: each TP rank summed its slice of every expert over DP only
        ops += reduce_tp
    return ops
