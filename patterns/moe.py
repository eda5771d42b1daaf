"""Mixture-of-experts under data-parallel attention and expert parallelism, what vLLM V1 and
SGLang share: the --a2a modes, when tokens are exchanged, the notes a pattern carries, and
the uneven gathers both engines' MoE layers are built from. Each engine's own calls:
`patterns/engines/vllm/moe.py` (vLLM's MoE layer and DP coordination) and
`patterns/engines/sglang/dp.py` (SGLang's DP attention).

Engine spec sections 10.3, 10.4 and 6; the engine files read are cited in each engine's module.

fp8 dispatch, and what is not modelled: `patterns/engines/vllm/moe.py`'s docstring.
"""

from collections.abc import Sequence
from functools import lru_cache

from patterns.deepep import DEEPEP_MODES
from patterns.layout import Layout
from patterns.models import ModelConfig
from patterns.ops import Op, OpKind

A2A_MODES = ("allgather_reducescatter", "alltoall", *DEEPEP_MODES)


def ceil_div(a: int, b: int) -> int:
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
    if engine == "megatron" and model.is_moe:
        return [_megatron_note(model, layout)]
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


def _megatron_note(model: ModelConfig, layout: Layout) -> str:
    """Megatron's all-gather token dispatcher (patterns/engines/megatron/moe.py)."""
    what = (f"{model.name} is a MoE model ({model.num_local_experts} experts, "
            f"{len(model.moe_layers or ())} MoE layers): ")
    if layout.ep:
        group = f"the EP group of dp({layout.dp}) x tp({layout.tp}) = {layout.ep_size} ranks"
    elif layout.tp > 1:
        group = f"the TP group of {layout.tp}"
    else:
        return what + ("at tp 1 without --ep every rank holds every expert: no dispatch call "
                       "(expert parallelism: --dp N --ep)")
    replicas = (f"; dp({layout.dp}) without --ep: {layout.dp} replicas, each with its own "
                "experts" if layout.dp > 1 and not layout.ep else "")
    return what + (f"Megatron's all-gather dispatcher gathers each MoE layer's routing map, "
                   f"probabilities and tokens over {group} and reduce-scatters the experts' "
                   f"output{replicas}")


def uneven_counts(rows: Sequence[int], width: int) -> tuple[int, ...] | None:
    """`Op.counts` for parts of `rows` rows of `width` elements: None when equal."""
    return _counts(tuple(rows), width)


@lru_cache(maxsize=4096)
def _counts(rows: tuple[int, ...], width: int) -> tuple[int, ...] | None:
    # a DP workload asks for the same rows' counts once a layer kind and call of each step
    return None if len(set(rows)) == 1 else tuple(r * width for r in rows)


def allgather(group: str, rows: Sequence[int], index: int, width: int, dtype: str,
               tag: str) -> Op:
    return Op(kind=OpKind.ALLGATHER, group=group, group_size=len(rows),
              shape=(rows[index], width), out_shape=(sum(rows), width), dtype=dtype, tag=tag,
              counts=uneven_counts(rows, width))


def reducescatter(group: str, rows: Sequence[int], index: int, width: int, dtype: str,
                   tag: str) -> Op:
    return Op(kind=OpKind.REDUCESCATTER, group=group, group_size=len(rows),
              shape=(sum(rows), width), out_shape=(rows[index], width), dtype=dtype, tag=tag,
              counts=uneven_counts(rows, width))


def tp_op(kind: OpKind, tp: int, shape: tuple[int, ...], out_shape: tuple[int, ...],
           dtype: str, tag: str) -> Op:
    return Op(kind=kind, group="tp", group_size=tp, shape=shape, out_shape=out_shape,
              dtype=dtype, tag=tag)
