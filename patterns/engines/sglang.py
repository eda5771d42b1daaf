"""SGLang 0.5 (main of 2026-07-20): engine spec sections 4 and 10.4.

Code followed (modal-projects/sglang @ 8905cbd4, about 0.5.15, as the spec reads it):
`models/llama.py` (VocabParallelEmbedding all-reduce on the first PP stage, RowParallelLinear
o_proj / down_proj), `layers/logits_processor.py` (all-gather on every TP rank of
[S, V_pad/tp], `DEFAULT_VOCAB_PADDING_SIZE = 64`; S = the last token of each extend sequence,
or B in decode), `server_args.py` (CUDA-graph decode batch sizes: [1, 2, 4, 8, 12] +
range(16, 257, 8) + range(272, 512, 16) + range(512, max + 1, 32), max 256 at TP < 4 and
512 at TP >= 4 on H100; breakable prefill graphs round extend tokens up to 4..32 step 4,
48..256 step 16), `managers/scheduler_pp_mixin.py` (PP: `send_tensor_dict(all_gather_group=
attn_tp_group)`, the vLLM slice + all-gather; the sampled ids sent back from the last stage
to the first), `managers/scheduler.py: recv_requests` (`broadcast_pyobj` over the TP gloo
group every loop: the size tensor). Transports: `patterns/transports.py`.
"""

from patterns.dtypes import dtype_bytes
from patterns.engines import EngineInfo, register
from patterns.engines.stage import Stage, merge, pad_to, run, stages
from patterns.engines.vllm import pp_slice
from patterns.layout import Layout, Workload
from patterns.models import ModelConfig, mlp_module
from patterns.ops import Op, OpKind, Phase, Transport
from patterns.pattern import EngineOptions, Pattern, Run
from patterns.transports import sglang_allreduce, sglang_logits_allgather
from patterns.vllm_rules import padded_vocab, prefill_chunks, stage_layer_counts

INFO = EngineInfo(
    name="sglang",
    engine="SGLang",
    version="0.5.x (main of 2026-07-20, about 0.5.15)",
    source="sgl-project/sglang main 2026-07-20 = modal-projects/sglang @ 8905cbd4",
    options=("eager", "max_batched_tokens", "control_plane", "gpu", "nccl_only"),
    not_modelled=(
        "DP attention and expert parallelism (its own issue); MoE experts replicated over TP",
        "prefill graph buckets above 256 tokens (such steps are left unpadded)",
        "the pickled request payload of broadcast_pyobj and PP's point_to_point_pyobj",
        "sampling all-reduce (SYNC_TOKEN_IDS_ACROSS_TP or grammars)",
        "decode sizes on GPUs other than H100 (taken as H100's)",
    ),
)

# SGLang's default chunked_prefill_size is set by GPU memory; 8192 is taken for all GPUs.
CHUNKED_PREFILL_SIZE = 8192


def decode_graph_sizes(tp: int) -> list[int]:
    """`server_args.py`: the default CUDA-graph batch sizes (max 256 at TP < 4, else 512)."""
    top = 256 if tp < 4 else 512
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, top + 1, 32)]
    sizes = [s for s in sizes if s <= top]
    return sizes if sizes[-1] == top else [*sizes, top]


PREFILL_GRAPH_SIZES = [*range(4, 33, 4), *range(48, 257, 16)]


def _allreduce(st: Stage, tokens: int, tag: str) -> Op:
    transport = sglang_allreduce(tokens * st.h * dtype_bytes(st.dtype), tokens, st.tp,
                                 st.options.gpu, st.model.model_type, st.options.nccl_only)
    return st.tp_op(OpKind.ALLREDUCE, (tokens, st.h), (tokens, st.h), tag, transport)


def moe_layer_ops(st: Stage, layer: int, tokens: int) -> list[Op]:
    """One MoE layer without DP attention / EP: experts replicated over TP, output reduced
    once. Expert parallelism hooks in here."""
    return [_allreduce(st, tokens, f"layers.{layer}.{mlp_module(st.model, layer)}")]


def forward(st: Stage, tokens: int, rows: int) -> list[Op]:
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
            ops.append(_allreduce(st, tokens, f"layers.{layer}.self_attn.o_proj"))
            ops += (moe_layer_ops(st, layer, tokens) if st.model.is_moe_layer(layer) else
                    [_allreduce(st, tokens, f"layers.{layer}.{mlp_module(st.model, layer)}")])
    if not st.is_last:
        ops += [st.p2p(OpKind.SEND, shape, f"pp.{key}", peer=st.index + 1) for key in keys]
    elif st.tp > 1:
        shard = padded_vocab(st.model.vocab_size) // st.tp
        transport = sglang_logits_allgather(rows, st.dtype, st.options.gpu,
                                            st.options.nccl_only)
        ops.append(st.tp_op(OpKind.ALLGATHER, (rows, shard), (rows, shard * st.tp), "logits",
                            transport))
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
    budget = options.max_batched_tokens or CHUNKED_PREFILL_SIZE
    prefill_sizes = [] if options.eager else PREFILL_GRAPH_SIZES
    runs = []
    for chunk in prefill_chunks(w.batch, w.prompt, budget):
        tokens = pad_to(prefill_sizes, chunk.tokens)
        runs.append(run(Phase.PREFILL, _control(st) + forward(st, tokens, chunk.seqs), tokens,
                        chunk.seqs))
    if w.decode_steps:
        tokens = w.batch if options.eager else pad_to(decode_graph_sizes(st.tp), w.batch)
        runs.append(run(Phase.DECODE, _control(st) + forward(st, tokens, w.batch), tokens,
                        w.batch, w.decode_steps))
    return merge(runs)


@register(INFO)
def sglang(model: ModelConfig, layout: Layout, workload: Workload,
           options: EngineOptions) -> Pattern:
    counts = stage_layer_counts(model.num_hidden_layers, layout.pp)
    runs = [tuple(_stage_runs(st, options))
            for st in stages(model, layout, workload, options, counts)]
    return Pattern(engine=INFO.name, model=model, layout=layout, workload=workload,
                   options=options, stages=tuple(runs))
