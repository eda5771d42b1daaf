"""How a real job numbered its ranks, when it is not how infercomm's layout numbers them.

infercomm (and vLLM, SGLang) place ranks tp fastest, then pp, then dp: rank = (dp_rank * pp +
stage) * tp + tp_rank ("tp-pp-dp"; patterns/layout.py). Megatron-Core's default order is
"tp-cp-ep-dp-pp" (`initialize_model_parallel(order=...)`, `core/parallel_state.py` 617 of
megatron-core 0.19.2): PP outermost, rank = (stage * dp + dp_rank) * tp + tp_rank
("tp-dp-pp"); Megatron-LM's `--use-tp-pp-dp-mapping` switches it to "tp-cp-ep-pp-dp",
infercomm's (`megatron/training/initialize.py` 388 of the same wheel). The two agree wherever
dp or pp is 1. A trace names its ranks the job's way; validate maps each to the layout's rank
it plays.
"""

from patterns.layout import Layout

LAYOUT_ORDER = "tp-pp-dp"
MEGATRON_DEFAULT_ORDER = "tp-dp-pp"
RANK_ORDERS = (LAYOUT_ORDER, MEGATRON_DEFAULT_ORDER)


def layout_rank(layout: Layout, job_rank: int, order: str) -> int:
    """The layout's rank that the job's rank `job_rank` (numbered in `order`) plays."""
    if order == LAYOUT_ORDER:
        return job_rank
    tp_rank = job_rank % layout.tp
    dp_rank = job_rank // layout.tp % layout.dp
    stage = job_rank // (layout.tp * layout.dp)
    return layout.rank_of(stage, tp_rank, dp_rank)


def job_rank(layout: Layout, rank: int, order: str) -> int:
    """The job's number (in `order`) of the layout's rank `rank`: layout_rank's inverse."""
    if order == LAYOUT_ORDER:
        return rank
    return ((layout.stage_of(rank) * layout.dp + layout.dp_rank_of(rank)) * layout.tp
            + layout.tp_rank_of(rank))
