"""TensorRT-LLM's PyTorch backend: engine spec section 5.

Code followed (NVIDIA/TensorRT-LLM main as the spec reads it): `_torch/models/
modeling_llama.py` (per layer 2 all-reduces of [T, h], which AllReduceFusionOp.
RESIDUAL_RMS_NORM may fuse with the residual add and RMSNorm: same count),
`_torch/modules/embedding.py` (the embedding is vocab-split, TensorParallelMode.COLUMN:
an all-reduce of [T, h]; the LM head is COLUMN with gather_output: an all-gather of
[S, ceil(V/tp)] -> [S, tp*ceil(V/tp)] on every rank), `_torch/models/modeling_utils.py`
(`pp_recv_tensors` / `pp_send_tensors` of [hidden_states, residual]: 2 whole [T, h] tensors
per boundary, no TP slicing and no all-gather after the recv).

Batching: `tensorrt_llm/llmapi/llm_args.py` (`BaseCudaGraphConfig`, NVIDIA/TensorRT-LLM @
fcd3f316): `enable_padding` defaults to False, and without padding the captured decode batch
sizes are 1..31, 32, 64, 128 (max_batch_size 128): a batch of 10 replays the graph of 10, a
batch of 260 runs eagerly, so T = B either way. Prefill runs without graphs, unchunked unless
`--max-batched-tokens` is given.

Transports: TRT-LLM's AllReduce strategy AUTO chooses between NCCL and its own one-/two-shot
IPC kernels (with the residual + RMSNorm fusion) in C++ (`cpp/tensorrt_llm/thop/
allreduceOp.cpp`), which was not read: every call is labelled `nccl`, and `infercomm engines`
says so.
"""

from patterns.engine_base import EngineInfo, register
from patterns.layout import Layout, Workload
from patterns.models import ModelConfig, mlp_module
from patterns.ops import Op, OpKind, Phase
from patterns.pattern import EngineOptions, Pattern, Run
from patterns.shapes import prefill_chunks
from patterns.stage import Stage, merge, run, stages, tp_model_calls

INFO = EngineInfo(
    name="trtllm",
    engine="TensorRT-LLM (PyTorch backend)",
    version="1.x PyTorch backend (its main branch as this profile read it)",
    source="NVIDIA/TensorRT-LLM main: _torch/models/modeling_llama.py, _torch/modules/"
           "embedding.py, _torch/models/modeling_utils.py",
    options=("max_batched_tokens",),
    not_modelled=(
        "AllReduce strategy AUTO (NCCL or one-/two-shot IPC kernels): every call is NCCL",
        "CUDA-graph padding when enable_padding is set (off by default)",
        "attention DP and expert parallelism (--dp and --ep are refused); MoE experts sharded "
        "over TP",
        "the layer split of pipeline stages is taken as vLLM's get_pp_indices",
    ),
)


def _allreduce(st: Stage, tokens: int, tag: str) -> Op:
    return st.tp_op(OpKind.ALLREDUCE, (tokens, st.h), (tokens, st.h), tag)


def moe_layer_ops(st: Stage, layer: int, tokens: int) -> list[Op]:
    """One MoE layer without attention DP: every expert sharded over TP (`tensorrt_llm/
    mapping.py` @ 05ebebb2: without moe_tp_size / moe_ep_size, moe_tp_size = tp_size and
    moe_ep_size = 1), the partial outputs reduced once. Expert parallelism hooks in here."""
    return [_allreduce(st, tokens, f"layers.{layer}.{mlp_module(st.model, layer)}")]


def vocab_shard(vocab: int, tp: int) -> int:
    """TRT-LLM splits the LM head into ceil(V/tp) rows per rank (no 64-padding)."""
    return -(-vocab // tp)


def forward(st: Stage, tokens: int, rows: int) -> list[Op]:
    keys = ("hidden_states", "residual")
    ops = [st.p2p(OpKind.RECV, (tokens, st.h), f"pp.{key}", peer=st.index - 1)
           for key in keys] if not st.is_first else []
    ops += tp_model_calls(st, tokens, _allreduce, moe_layer_ops)
    if not st.is_last:
        ops += [st.p2p(OpKind.SEND, (tokens, st.h), f"pp.{key}", peer=st.index + 1)
                for key in keys]
    elif st.tp > 1:
        shard = vocab_shard(st.model.vocab_size, st.tp)
        ops.append(st.tp_op(OpKind.ALLGATHER, (rows, shard), (rows, shard * st.tp), "lm_head"))
    return ops


def _stage_runs(st: Stage, options: EngineOptions) -> list[Run]:
    w = st.workload
    runs = [run(Phase.PREFILL, forward(st, c.tokens, c.rows), c.tokens, c.rows)
            for c in prefill_chunks(w.batch, w.prompt, options.max_batched_tokens)]
    if w.decode_steps:
        runs.append(run(Phase.DECODE, forward(st, w.batch, w.batch), w.batch, w.batch,
                        w.decode_steps))
    return merge(runs)


@register(INFO)
def trtllm(model: ModelConfig, layout: Layout, workload: Workload,
           options: EngineOptions) -> Pattern:
    from patterns.shapes import stage_layer_counts

    counts = stage_layer_counts(model.num_hidden_layers, layout.pp)
    runs = [tuple(_stage_runs(st, options))
            for st in stages(model, layout, workload, options, counts)]
    return Pattern(engine=INFO.name, model=model, layout=layout, workload=workload,
                   options=options, stages=tuple(runs))
