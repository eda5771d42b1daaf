"""SGLang's DP attention: the gather and scatter of every DP rank's tokens around each
layer's MLP, the logits, and the per-step MLPSyncBatchInfo all-gather (the vocabulary both
engines share: `patterns/moe.py`).

Engine spec sections 10.4 and 6. The engine code wins; the files read:

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
"""

from collections.abc import Callable, Sequence
from functools import lru_cache

from patterns.dp_steps import RankStep
from patterns.layout import Layout
from patterns.models import ModelConfig
from patterns.moe import ceil_div, tp_op
from patterns.ops import Op, OpKind, Phase, Transport
from patterns.tiled import Part, TiledOps

# int64 values each rank contributes to SGLang's MLPSyncBatchInfo all-gather (spec 10.4).
MLP_SYNC_FIELDS = 7


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
        ops = ([tp_op(OpKind.ALLREDUCE, tp, (t_me, hidden), (t_me, hidden), dtype,
                       f"{prefix}.self_attn.o_proj")] if tp > 1 else [])
        per_peer = ceil_div(max(tokens) * top_k, n)
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
    piece = ceil_div(longest, tp)
    ops = []
    if tp > 1:
        ops.append(tp_op(OpKind.REDUCESCATTER, tp, (piece * tp, hidden), (piece, hidden),
                          dtype, f"{prefix}.dispatch.dp_gather.attn_tp_reduce_scatter"))
    ops.append(Op(kind=OpKind.ALLGATHER, group="ep", group_size=n, shape=(piece, hidden),
                  out_shape=(piece * n, hidden), dtype=dtype,
                  tag=f"{prefix}.dispatch.dp_gather"))
    ops.append(Op(kind=OpKind.REDUCESCATTER, group="ep", group_size=n,
                  shape=(piece * n, hidden), out_shape=(piece, hidden), dtype=dtype,
                  tag=f"{prefix}.combine.dp_reduce_scatter_tensor"))
    if tp > 1:
        ops.append(tp_op(OpKind.ALLGATHER, tp, (piece, hidden), (piece * tp, hidden), dtype,
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
        piece = ceil_div(max(rows), layout.tp)
        total = piece * n
        gather = ([tp_op(OpKind.REDUCESCATTER, layout.tp, (piece * layout.tp, hidden),
                          (piece, hidden), dtype, "logits.dp_gather.attn_tp_reduce_scatter")]
                  if layout.tp > 1 else [])
        gather.append(Op(kind=OpKind.ALLGATHER, group="ep", group_size=n,
                         shape=(piece, hidden), out_shape=(total, hidden), dtype=dtype,
                         tag="logits.dp_gather"))
    if total == 0:
        return []
    return [*gather, Op(kind=OpKind.ALLGATHER, group="ep", group_size=n, shape=(total, shard),
                        out_shape=(total, shard * n), dtype=dtype, tag="logits")]


def sglang_dp_layers(model: ModelConfig, layout: Layout, tokens: Sequence[int], dp_rank: int,
                     dtype: str, mode: str, a2a: str) -> TiledOps:
    """Every layer's `sglang_dp_layer` calls of one step, one layer's calls a run of layers
    of a kind (dense or MoE: their calls differ by tag alone)."""
    parts: list[Part] = []
    for first, count, moe in _kind_runs(model):
        top_k = model.num_experts_per_tok if moe else None
        ops = sglang_dp_layer(f"layers.{first}", layout, tokens, dp_rank, model.hidden_size,
                              dtype, mode, top_k, a2a)
        parts.append((tuple(ops), first, count))
    return TiledOps(parts)


@lru_cache(maxsize=64)
def _kind_runs(model: ModelConfig) -> tuple[tuple[int, int, bool], ...]:
    """(first layer, layers, MoE) of each run of dense or MoE layers."""
    runs: list[tuple[int, int, bool]] = []
    for layer in range(model.num_hidden_layers):
        moe = model.is_moe_layer(layer)
        if runs and runs[-1][2] == moe:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, moe)
        else:
            runs.append((layer, 1, moe))
    return tuple(runs)
