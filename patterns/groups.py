"""Process groups of a layout, computed in one place for the patterns and the replay.

Global ranks follow vLLM's `initialize_model_parallel` (distributed/parallel_state.py):
all ranks as an array [ExternalDP, DP, PP, TP], so rank = (dp_rank * pp + pp_rank) * tp +
tp_rank. Its groups, which every op names by kind:
  tp  the last axis: the tp ranks of one (dp, pp) position;
  pp  the pp ranks of one (dp, tp) position;
  dp  the dp ranks of one (pp, tp) position;
  ep  DP x TP of one pipeline stage, in that order: vLLM builds it as
      `all_ranks.transpose(1, 2).reshape(-1, dp * tp)` (parallel_state.py, vllm-project/vllm
      @ 00746147); SGLang's TP group under DP attention holds the same ranks.
  pp_broadcast  the ranks of `pp` again: vLLM Model Runner V2's own NCCL group for its
      per-step broadcasts (`v1/worker/gpu/pp_utils.py`), its own communicators as in the engine.
"""

from patterns.layout import Layout

GROUP_KINDS = ("tp", "pp", "dp", "ep", "pp_broadcast")


def rank_of(layout: Layout, dp_rank: int, stage: int, tp_rank: int) -> int:
    return (dp_rank * layout.pp + stage) * layout.tp + tp_rank


def group_size(layout: Layout, kind: str) -> int:
    sizes = {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.dp * layout.tp,
             "pp_broadcast": layout.pp}
    if kind not in sizes:
        raise ValueError(f"unknown group kind {kind!r}; one of {', '.join(GROUP_KINDS)}")
    return sizes[kind]


def groups(layout: Layout, kind: str) -> list[tuple[int, ...]]:
    """Every group of one kind, each as its global ranks in group order."""
    dp, pp, tp = layout.dp, layout.pp, layout.tp
    if kind == "tp":
        return [tuple(rank_of(layout, d, s, t) for t in range(tp))
                for d in range(dp) for s in range(pp)]
    if kind in ("pp", "pp_broadcast"):
        return [tuple(rank_of(layout, d, s, t) for s in range(pp))
                for d in range(dp) for t in range(tp)]
    if kind == "dp":
        return [tuple(rank_of(layout, d, s, t) for d in range(dp))
                for s in range(pp) for t in range(tp)]
    if kind == "ep":
        return [tuple(rank_of(layout, d, s, t) for d in range(dp) for t in range(tp))
                for s in range(pp)]
    raise ValueError(f"unknown group kind {kind!r}; one of {', '.join(GROUP_KINDS)}")


def group_of(layout: Layout, kind: str, rank: int) -> tuple[int, ...]:
    """The group of `kind` that holds `rank`."""
    return next(g for g in groups(layout, kind) if rank in g)
