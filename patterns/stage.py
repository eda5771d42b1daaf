"""What every profile's steps are built from: one pipeline stage and the ops its ranks issue."""

from collections.abc import Callable
from dataclasses import dataclass

from patterns.layout import Layout, Workload
from patterns.models import ModelConfig, mlp_module
from patterns.ops import Op, OpKind, Phase, Step, Transport
from patterns.pattern import EngineOptions, Run


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: its layers and the model, layout, workload and options."""

    model: ModelConfig
    layout: Layout
    workload: Workload
    options: EngineOptions
    index: int
    first_layer: int
    num_layers: int
    # With data parallelism (patterns/dp_steps.py): this rank's DP rank and every DP rank's
    # tokens in the current step, which MoE layers exchange.
    dp_rank: int = 0
    dp_tokens: tuple[int, ...] = ()

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def pp(self) -> int:
        return self.layout.pp

    @property
    def h(self) -> int:
        return self.model.hidden_size

    @property
    def dtype(self) -> str:
        assert self.workload.dtype is not None  # generate() fills it in
        return self.workload.dtype

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.pp - 1

    @property
    def layers(self) -> range:
        return range(self.first_layer, self.first_layer + self.num_layers)

    def tp_op(self, kind: OpKind, shape: tuple[int, ...], out_shape: tuple[int, ...], tag: str,
              transport: Transport = Transport.NCCL, dtype: str | None = None,
              root: int | None = None) -> Op:
        return Op(kind=kind, group="tp", group_size=self.tp, shape=shape, out_shape=out_shape,
                  dtype=dtype or self.dtype, tag=tag, root=root, transport=transport)

    def p2p(self, kind: OpKind, shape: tuple[int, ...], tag: str, peer: int,
            dtype: str | None = None) -> Op:
        return Op(kind=kind, group="pp", group_size=self.pp, shape=shape, out_shape=shape,
                  dtype=dtype or self.dtype, tag=tag, peer=peer)


def stages(model: ModelConfig, layout: Layout, workload: Workload, options: EngineOptions,
           layer_counts: list[int]) -> list[Stage]:
    result, first = [], 0
    for index, count in enumerate(layer_counts):
        result.append(Stage(model, layout, workload, options, index, first, count))
        first += count
    return result


def merge(runs: list[Run]) -> list[Run]:
    """Fold consecutive runs of equal steps into one."""
    merged: list[Run] = []
    for run in runs:
        if merged and merged[-1].phase == run.phase and merged[-1].step == run.step:
            merged[-1] = Run(run.phase, run.step, merged[-1].repeat + run.repeat)
        else:
            merged.append(run)
    return merged


def run(phase: Phase, ops: list[Op], tokens: int, rows: int, repeat: int = 1) -> Run:
    return Run(phase, Step(tuple(ops), tokens, rows), repeat)


def pad_to(sizes: list[int], tokens: int) -> int:
    """The smallest capture size >= tokens, or tokens itself above the largest."""
    return next((size for size in sizes if size >= tokens), tokens)


def tp_model_calls(st: Stage, tokens: int, allreduce: Callable[[Stage, int, str], Op],
                   moe_layer: Callable[[Stage, int, int], list[Op]]) -> list[Op]:
    """The TP all-reduces of one forward pass, where every engine issues them: the
    vocab-parallel embedding on the first stage, then per layer o_proj and the MLP's
    down_proj, or the engine's MoE layer (`moe_layer`). None at tp 1."""
    if st.tp == 1:
        return []
    ops = [allreduce(st, tokens, "embed_tokens")] if st.is_first else []
    for layer in st.layers:
        ops.append(allreduce(st, tokens, f"layers.{layer}.self_attn.o_proj"))
        ops += (moe_layer(st, layer, tokens) if st.model.is_moe_layer(layer) else
                [allreduce(st, tokens, f"layers.{layer}.{mlp_module(st.model, layer)}")])
    return ops
