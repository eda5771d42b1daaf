"""vLLM V0 (0.8.5, VLLM_USE_V1=0) on GPUs: engine spec section 2.

Code followed (vLLM 0.8.5): `worker/worker_base.py` (`_get_driver_input_and_broadcast`:
C1 broadcasts), `distributed/parallel_state.py` (`recv_tensor_dict` / `send_tensor_dict` with
`all_gather_group=get_tp_group()`: flat TP slices, then an all-gather), `layers/
vocab_parallel_embedding.py` (embedding all-reduce), `layers/linear.py` (RowParallelLinear
all-reduce of o_proj and down_proj), `layers/logits_processor.py` (`_gather_logits`: gather to
TP rank 0, since `use_all_gather()` is False for V0 on GPUs), `distributed/utils.py`
(`get_pp_indices`).
"""

from patterns.engine_base import EngineInfo, register
from patterns.layout import Layout, Workload
from patterns.models import ModelConfig, mlp_module
from patterns.ops import Op, OpKind, Phase, Step
from patterns.pattern import EngineOptions, Pattern, Run
from patterns.shapes import (
    MAX_GRAPH_BATCH,
    graph_batch_size,
    padded_vocab,
    prefill_chunks,
    stage_layer_counts,
)
from patterns.stage import merge

# vLLM V0 defaults: KV-cache block size and max_seq_len_to_capture, which set the width of
# the padded block table a graphed decode step broadcasts.
BLOCK_SIZE = 16
MAX_SEQ_LEN_TO_CAPTURE = 8192


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _StageBuilder:
    """Builds the steps of one pipeline stage."""

    def __init__(self, model: ModelConfig, layout: Layout, workload: Workload, stage: int,
                 first_layer: int, num_layers: int) -> None:
        self.model = model
        self.layout = layout
        self.dtype = workload.dtype
        self.stage = stage
        self.first_layer = first_layer
        self.num_layers = num_layers
        self.tp = layout.tp

    def _tp_op(self, kind: OpKind, shape: tuple[int, ...], out_shape: tuple[int, ...],
               tag: str, dtype: str | None = None, root: int | None = None) -> Op:
        return Op(kind=kind, group="tp", group_size=self.tp, shape=shape, out_shape=out_shape,
                  dtype=dtype or self.dtype, tag=tag, root=root)

    def _p2p(self, kind: OpKind, tokens: int, key: str, peer: int) -> Op:
        flat = (tokens * self.model.hidden_size // self.tp,)
        return Op(kind=kind, group="pp", group_size=self.layout.pp, shape=flat, out_shape=flat,
                  dtype=self.dtype, tag=f"pp.{key}", peer=peer)

    def control_plane(self, tokens: int, seqs: int, rows: int, block_cols: int,
                      context_rows: int) -> list[Op]:
        """C1: `broadcast_tensor_dict` from TP rank 0, one call per non-empty tensor.

        `seqs` is the (maybe graph-padded) number of sequences, `context_rows` the unpadded
        one (context_lens is built before padding).
        """
        tensors = [
            ("input_tokens", (tokens,), "int64"),
            ("input_positions", (tokens,), "int64"),
            ("slot_mapping", (tokens,), "int64"),
            ("seq_lens_tensor", (seqs,), "int32"),
            ("context_lens_tensor", (context_rows,), "int32"),
            ("block_tables", (seqs, block_cols), "int32"),
            ("query_start_loc", (seqs + 1,), "int32"),
            ("seq_start_loc", (seqs + 1,), "int32"),
            ("selected_token_indices", (rows,), "int64"),
        ]
        return [self._tp_op(OpKind.BROADCAST, shape, shape, f"ctrl.{name}", dtype, root=0)
                for name, shape, dtype in tensors if 0 not in shape]

    def forward(self, tokens: int, rows: int) -> list[Op]:
        """Model calls of one forward pass over `tokens` tokens, sampling `rows` rows."""
        h, tp, pp, stage = self.model.hidden_size, self.tp, self.layout.pp, self.stage
        ops: list[Op] = []
        if stage > 0:
            for key in ("hidden_states", "residual"):
                ops.append(self._p2p(OpKind.RECV, tokens, key, peer=stage - 1))
                if tp > 1:
                    ops.append(self._tp_op(OpKind.ALLGATHER, (tokens * h // tp,), (tokens, h),
                                           f"pp.{key}.allgather"))
        if tp > 1:
            if stage == 0:
                ops.append(self._tp_op(OpKind.ALLREDUCE, (tokens, h), (tokens, h),
                                       "embed_tokens"))
            # MoE layers all-reduce the experts' summed output where a dense MLP reduces
            # down_proj (moe_runner._maybe_reduce_final_output): same count, same shape.
            for layer in range(self.first_layer, self.first_layer + self.num_layers):
                for module in ("self_attn.o_proj", mlp_module(self.model, layer)):
                    ops.append(self._tp_op(OpKind.ALLREDUCE, (tokens, h), (tokens, h),
                                           f"layers.{layer}.{module}"))
        if stage < pp - 1:
            ops.extend(self._p2p(OpKind.SEND, tokens, key, peer=stage + 1)
                       for key in ("hidden_states", "residual"))
        elif tp > 1:
            vocab_shard = padded_vocab(self.model.vocab_size) // tp
            ops.append(self._tp_op(OpKind.GATHER, (rows, vocab_shard), (rows, vocab_shard * tp),
                                   "logits", root=0))
        return ops


def _decode_block_cols(prompt: int, steps: int) -> list[tuple[int, int]]:
    """(block-table width, steps) for eager decode steps 1..steps, one entry per width.

    At decode step k each sequence holds Sp + k tokens, so ceil((Sp + k) / 16) blocks: the
    width changes once every 16 steps, which keeps the run list short.
    """
    segments = []
    first = _ceil_div(prompt + 1, BLOCK_SIZE)
    last = _ceil_div(prompt + steps, BLOCK_SIZE)
    for cols in range(first, last + 1):
        lo = max(1, (cols - 1) * BLOCK_SIZE + 1 - prompt)
        hi = min(steps, cols * BLOCK_SIZE - prompt)
        segments.append((cols, hi - lo + 1))
    return segments


def _stage_runs(builder: _StageBuilder, workload: Workload, options: EngineOptions) -> list[Run]:
    batch, prompt = workload.batch, workload.prompt
    control = options.control_plane and builder.tp > 1
    chunked = options.max_batched_tokens is not None
    runs: list[Run] = []

    for chunk in prefill_chunks(batch, prompt, options.max_batched_tokens):
        ops = []
        if control:
            # A plain prefill's block table is empty and skipped; with chunked prefill each
            # prompt's blocks were all allocated when it was first scheduled.
            block_cols = _ceil_div(prompt, BLOCK_SIZE) if chunked else 0
            ops += builder.control_plane(chunk.tokens, chunk.seqs, chunk.rows, block_cols,
                                         chunk.seqs)
        ops += builder.forward(chunk.tokens, chunk.rows)
        runs.append(Run(Phase.PREFILL, Step(tuple(ops), chunk.tokens, chunk.rows), 1))

    steps = workload.decode_steps
    if steps == 0:
        return merge(runs)
    graphed = not options.eager and batch <= MAX_GRAPH_BATCH
    tokens = graph_batch_size(batch) if graphed else batch
    model_ops = tuple(builder.forward(tokens, batch))
    if not control:
        segments = [((), steps)]
    elif graphed:
        # A graphed step broadcasts the whole padded block table of the capture batch.
        cols = _ceil_div(MAX_SEQ_LEN_TO_CAPTURE, BLOCK_SIZE)
        segments = [(tuple(builder.control_plane(tokens, tokens, batch, cols, batch)), steps)]
    else:
        segments = [(tuple(builder.control_plane(tokens, batch, batch, cols, batch)), repeat)
                     for cols, repeat in _decode_block_cols(prompt, steps)]
    for ctrl, repeat in segments:
        runs.append(Run(Phase.DECODE, Step(ctrl + model_ops, tokens, batch), repeat))
    return merge(runs)


INFO = EngineInfo(
    name="vllm-v0",
    engine="vLLM V0 (VLLM_USE_V1=0)",
    version="0.8.5 (V0 engine, removed in v0.11.0)",
    source="vllm-project/vllm main 2025-05-07 @ 98c89e16f (fork tensorflowt/vllm-0.8.5)",
    options=("eager", "max_batched_tokens", "control_plane"),
    not_modelled=(
        "custom all-reduce: every call is NCCL, as in the published profile (custom AR off)",
        "the shared-memory MessageQueue metadata broadcast (C0) and gloo send_object of PP",
        "MoE expert parallelism",
    ),
)


@register(INFO)
def vllm_v0(model: ModelConfig, layout: Layout, workload: Workload,
            options: EngineOptions) -> Pattern:
    # dp > 1 with a dense model: independent replicas, each issuing the stages below
    # (`generate` refuses EP and DP MoE for this profile).
    stages = []
    first_layer = 0
    for stage, num_layers in enumerate(stage_layer_counts(model.num_hidden_layers, layout.pp)):
        builder = _StageBuilder(model, layout, workload, stage, first_layer, num_layers)
        stages.append(tuple(_stage_runs(builder, workload, options)))
        first_layer += num_layers
    return Pattern(engine="vllm-v0", model=model, layout=layout, workload=workload,
                   options=options, stages=tuple(stages))
