"""A minimal stand-in for the vLLM V1 profile's forward pass, for the MoE rules' tests only
(the real profile is `patterns/engines/vllm.py`): per step the DP coordination all-reduce,
then per layer the attention output all-reduce (tp > 1) and either the dense MLP's
all-reduce (tp > 1) or the MoE layer's calls from `patterns.moe`; logits all-gather at tp > 1.
"""

from dataclasses import dataclass

from patterns import Layout, ModelConfig, Op, OpKind, Pattern, Phase, Workload
from patterns.dp_steps import RankStep, align_dp_runs, build_replicas, dp_padded_tokens
from patterns.engines.vllm.moe import vllm_dp_coordination, vllm_moe_layer
from patterns.pattern import EngineOptions
from patterns.shapes import graph_batch_size


@dataclass(frozen=True)
class MoeDims:
    """The config.json numbers the MoE rules read."""

    hidden: int
    layers: int
    moe_layers: tuple[int, ...]
    experts: int
    top_k: int
    vocab_shard_rows: int = 0  # 0: no logits call in the stand-in


def step_ops(dims: MoeDims, layout: Layout, tokens: tuple[int, ...], dp_rank: int,
             a2a: str = "allgather_reducescatter", runner: str = "v2",
             dtype: str = "bf16") -> list[Op]:
    tp, t_me, h = layout.tp, tokens[dp_rank], dims.hidden
    ops = vllm_dp_coordination(layout, runner)

    def tp_allreduce(tag: str) -> Op:
        return Op(kind=OpKind.ALLREDUCE, group="tp", group_size=tp, shape=(t_me, h),
                  out_shape=(t_me, h), dtype=dtype, tag=tag)

    for layer in range(dims.layers):
        if tp > 1:
            ops.append(tp_allreduce(f"layers.{layer}.self_attn.o_proj"))
        if layer in dims.moe_layers:
            ops += vllm_moe_layer(f"layers.{layer}.mlp.experts", layout, tokens, dp_rank, h,
                                  dims.top_k, dtype, a2a)
        elif tp > 1:
            ops.append(tp_allreduce(f"layers.{layer}.mlp.down_proj"))
    return ops


def graph_size(t: int) -> int | None:
    return graph_batch_size(t) if t <= 512 else None


def pattern(model: ModelConfig, dims: MoeDims, layout: Layout, workload: Workload,
            a2a: str = "allgather_reducescatter") -> Pattern:
    """Per DP rank one prefill step (eager: its own B_r*Sp tokens) and Sd-1 decode steps
    (graphed: every rank padded to the largest graph size), lined up and built by
    patterns.dp_steps; pp = 1."""
    per_rank = []
    for d in range(layout.dp):
        b = workload.batch_of(d)
        own = [(RankStep(Phase.PREFILL, b * workload.prompt, b), 1)]
        if workload.decode_steps:
            own.append((RankStep(Phase.DECODE, b, b), workload.decode_steps))
        per_rank.append(own)

    def tokens_of(steps: tuple[RankStep, ...]) -> tuple[int, ...]:
        eager = any(s.phase == Phase.PREFILL for s in steps)
        return dp_padded_tokens([s.tokens for s in steps], (lambda t: None) if eager
                                else graph_size)

    replicas = build_replicas(
        align_dp_runs(per_rank), 1, tokens_of,
        lambda d, stage, steps, tokens: step_ops(dims, layout, tokens, d, a2a))
    return Pattern(engine="standin", model=model, layout=layout, workload=workload,
                   options=EngineOptions(), stages=replicas[0], dp_stages=replicas)
