"""Megatron-LM static-batch inference: engine spec section 5.

Code followed (NVIDIA/Megatron-LM main as the spec reads it): `core/inference/
model_inference_wrappers/abstract_model_inference_wrapper.py` (a prefill forward over the
whole prompt [s, b], then one token per step; PP sends one tensor [s, b, h] per boundary),
`core/tensor_parallel/layers.py` (VocabParallelEmbedding all-reduce, RowParallelLinear
all-reduce after proj and FC2; with `sequence_parallel` a reduce-scatter [s, b, h] ->
[s/tp, b, h] instead, and ColumnParallelLinear all-gathers [s/tp, b, h] -> [s, b, h] before
QKV and FC1, plus one before the output layer; the output layer's `gather_output`
all-gathers the logits [s, b, V_pad/tp] -> [s, b, V_pad] over all s positions in prefill),
`megatron/training/tokenizer/tokenizer.py: _vocab_size_with_padding` (V padded to a multiple
of make_vocab_size_divisible_by (default 128) * tensor_model_parallel_size). Static batching
captures no CUDA graphs: a batch of 10 or 260 runs as 10 or 260.

Shapes are Megatron's [s, b, h]; T = s * b. Sequence parallelism scatters s, so every step's
s must be divisible by tp: decode steps (s = 1) refuse it at tp > 1.
"""

from patterns.engine_base import EngineInfo, register
from patterns.errors import ConfigError
from patterns.layout import Layout, Workload
from patterns.models import ModelConfig
from patterns.ops import Op, OpKind, Phase
from patterns.pattern import EngineOptions, Pattern, Run
from patterns.stage import Stage, merge, run, stages

INFO = EngineInfo(
    name="megatron",
    engine="Megatron-LM inference (static batching)",
    version="core 0.1x static inference (its main branch as this profile read it)",
    source="NVIDIA/Megatron-LM main: core/inference/model_inference_wrappers/"
           "abstract_model_inference_wrapper.py, core/tensor_parallel/layers.py",
    options=("sp",),
    not_modelled=(
        "MoE token dispatchers (MoE models are refused)",
        "dynamic batching / the dynamic inference engine and its CUDA graphs",
        "the broadcast of sampled tokens between pipeline stages",
        "fp32_residual_connection (PP tensors in fp32)",
    ),
)

MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128


def padded_vocab(vocab: int, tp: int) -> int:
    multiple = MAKE_VOCAB_SIZE_DIVISIBLE_BY * tp
    return -(-vocab // multiple) * multiple


def forward(st: Stage, s: int, b: int, logit_rows: int) -> list[Op]:
    """One forward pass over [s, b] tokens; `logit_rows` positions per sequence get logits."""
    h, tp, sp = st.h, st.tp, st.options.sp and st.tp > 1
    full, scattered = (s, b, h), (s // tp, b, h)
    ar = OpKind.ALLREDUCE

    def reduce(tag: str) -> Op:
        if sp:
            return st.tp_op(OpKind.REDUCESCATTER, full, scattered, tag)
        return st.tp_op(ar, full, full, tag)

    def gather(tag: str) -> Op:
        return st.tp_op(OpKind.ALLGATHER, scattered, full, tag)

    boundary = scattered if sp else full
    ops: list[Op] = []
    if not st.is_first:
        ops.append(st.p2p(OpKind.RECV, boundary, "pp.hidden_states", peer=st.index - 1))
    if tp > 1:
        if st.is_first:
            ops.append(reduce("embedding"))
        for layer in st.layers:
            if sp:
                ops.append(gather(f"layers.{layer}.self_attention.linear_qkv"))
            ops.append(reduce(f"layers.{layer}.self_attention.linear_proj"))
            if sp:
                ops.append(gather(f"layers.{layer}.mlp.linear_fc1"))
            ops.append(reduce(f"layers.{layer}.mlp.linear_fc2"))
    if not st.is_last:
        ops.append(st.p2p(OpKind.SEND, boundary, "pp.hidden_states", peer=st.index + 1))
    elif tp > 1:
        if sp:
            ops.append(gather("output_layer.input"))
        shard = padded_vocab(st.model.vocab_size, tp) // tp
        ops.append(st.tp_op(OpKind.ALLGATHER, (logit_rows, b, shard),
                            (logit_rows, b, shard * tp), "output_layer"))
    return ops


def _stage_runs(st: Stage) -> list[Run]:
    w = st.workload
    runs = [run(Phase.PREFILL, forward(st, w.prompt, w.batch, w.prompt), w.prompt * w.batch,
                w.batch)]
    if w.decode_steps:
        runs.append(run(Phase.DECODE, forward(st, 1, w.batch, 1), w.batch, w.batch,
                        w.decode_steps))
    return merge(runs)


def _check(model: ModelConfig, layout: Layout, workload: Workload, sp: bool) -> None:
    if model.is_moe:
        raise ConfigError(f"{model.name} is a MoE model; the megatron profile models dense "
                          "models only (Megatron's MoE token dispatchers are not modelled)")
    if model.num_hidden_layers % layout.pp:
        raise ConfigError(f"pp({layout.pp}) does not divide num_hidden_layers"
                          f"({model.num_hidden_layers}) of {model.name}; Megatron splits "
                          "layers evenly")
    if sp and layout.tp > 1:
        if workload.prompt % layout.tp:
            raise ConfigError(f"--sp: the prefill's T({workload.prompt}) tokens per sequence "
                              f"is not divisible by tp({layout.tp}); use a prompt length that "
                              f"is a multiple of {layout.tp}")
        if workload.decode_steps:
            raise ConfigError(f"--sp: a decode step's T(1) token per sequence is not divisible"
                              f" by tp({layout.tp}); use --decode 1 (prefill only) or drop --sp")


@register(INFO)
def megatron(model: ModelConfig, layout: Layout, workload: Workload,
             options: EngineOptions) -> Pattern:
    _check(model, layout, workload, options.sp)
    counts = [model.num_hidden_layers // layout.pp] * layout.pp
    runs = [tuple(_stage_runs(st)) for st in stages(model, layout, workload, options, counts)]
    return Pattern(engine=INFO.name, model=model, layout=layout, workload=workload,
                   options=options, stages=tuple(runs))
