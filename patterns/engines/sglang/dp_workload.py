"""SGLang over a request workload at --dp > 1: its DataParallelController routes each
request to a DP rank (round-robin by default: `patterns/workload/dp_routing.py`), each
rank's scheduler runs its share (`scheduler.schedule_sglang`: chunking, mixed chunks, the
overlap scheduler), and

- a MoE model with --ep runs DP attention (`profile._dp_attention`): the ranks step
  together, a rank with nothing to run running an IDLE batch (`get_idle_batch`,
  `managers/scheduler_dp_attn_mixin.py` @ 8905cbd4) in every step in which another runs
  one, with the MLPSyncBatchInfo all-gather, the embedding's attention-TP all-reduce and
  every layer's DP gather and scatter; decode steps pad every rank to the CUDA-graph size
  of the largest batch, extends run eager with each rank's own tokens
  (`dp.sglang_step_tokens`); chunked prefill at chunked_prefill_size / dp
  (`profile.dp_attention_budget`); there is no wave: steps run only while a rank has work;
- otherwise (--dp without --ep, dense or MoE) the ranks are independent replicas, each its
  own engine's steps and calls (`sglang/workload.py`).

Not modelled at dp > 1: speculative decoding, pp > 1 (refused).
"""

from collections.abc import Sequence
from dataclasses import replace
from functools import cache

from patterns.dp_steps import SGLANG_IDLE_STEP, RankStep
from patterns.engines.sglang import profile as sglang_profile
from patterns.engines.sglang.dp import sglang_dp_layers, sglang_mlp_sync
from patterns.engines.sglang.embedding import check_dp_attention_embedding, embedding_ops
from patterns.engines.sglang.scheduler import schedule_sglang
from patterns.engines.sglang.workload import sglang_workload
from patterns.errors import ConfigError
from patterns.layout import Layout
from patterns.models import ModelConfig
from patterns.ops import Op, Step
from patterns.pattern import EngineOptions
from patterns.stage import pad_to
from patterns.tiled import Part, TiledOps
from patterns.workload.dp_pattern import IDLE, NONE, DPWorkloadPattern, build_dp_pattern
from patterns.workload.dp_routing import round_robin, routing_for
from patterns.workload.dp_timeline import GlobalSegment, lockstep
from patterns.workload.requests import Request
from patterns.workload.steps import StepGraph, logit_rows, shell_pattern


def sglang_dp_workload(model: ModelConfig, layout: Layout, requests: Sequence[Request],
                       dtype: str | None, options: EngineOptions, step_time_s: float | None,
                       source: str, mixed: bool, routing: str | None) -> DPWorkloadPattern:
    if layout.pp > 1:
        raise ConfigError(f"--requests at dp({layout.dp}) is modelled at pp 1; use --pp 1")
    chosen = routing_for("sglang", routing)
    rank_of = round_robin(len(requests), layout.dp)
    own = [[r for r, d in enumerate(rank_of) if d == k] for k in range(layout.dp)]
    base = shell_pattern("sglang", model, layout, requests, dtype,
                         replace(options, max_num_seqs=None), source)
    dtype = base.workload.dtype or model.default_dtype
    coupled = layout.ep and model.is_moe  # DP attention
    if not coupled:  # replicas: each its own engine's workload pattern
        replicas = [sglang_workload(model, replace(layout, dp=1, ep=False),
                                    [requests[r] for r in mine], dtype, options, step_time_s,
                                    None, source, mixed) for mine in own]
        schedules = [p.schedule for p in replicas]
        timeline = lockstep(schedules)
        empty = (StepGraph(0, "eager"), Step((), 0, 0))

        def own_steps(g: GlobalSegment) -> list[tuple[StepGraph, Step]]:
            return [(p.step_graphs[i], p.segment_steps[i]) if i >= 0 else empty
                    for p, i in zip(replicas, g.items, strict=True)]

        return build_dp_pattern(base, rank_of, chosen, schedules, timeline, NONE, own_steps)
    check_dp_attention_embedding(model)
    budget = sglang_profile.dp_attention_budget(options, layout)
    schedules = [schedule_sglang([requests[r] for r in mine], step_time_s, budget, mixed,
                                 options.max_num_seqs,
                                 overlap=not options.disable_overlap_schedule) for mine in own]
    timeline = lockstep(schedules)
    sizes = [] if options.eager else sglang_profile.decode_graph_sizes(layout.dp * layout.tp,
                                                                       options.gpu)

    def graph(tokens: int) -> int | None:
        return pad_to(sizes, tokens) if sizes and tokens <= sizes[-1] else None

    @cache
    def head(own: int) -> tuple[Op, ...]:  # the MLP sync and the embedding of own tokens
        return (*sglang_mlp_sync(layout), *embedding_ops(model, layout, own, dtype))

    @cache
    def layers(tokens: tuple[int, ...], d: int, mode: str) -> tuple[Part, ...]:
        return sglang_dp_layers(model, layout, tokens, d, dtype, mode, options.a2a).parts

    @cache
    def logits(gathered: int, mode: str, n: int) -> tuple[Op, ...]:
        # the logits gather follows the largest rows (MAX_LEN) or their sum (SUM_LEN)
        rows = (gathered,) + (0,) * (n - 1) if mode == "sum_len" else (gathered,) * n
        return sglang_profile.dp_attention_logits(model, layout, rows, 0, dtype, mode,
                                                  options)

    @cache
    def step(tokens: tuple[int, ...], d: int, mode: str, gathered: int, own_rows: int) -> Step:
        ops = TiledOps(((head(tokens[d]), 0, 0), *layers(tokens, d, mode),
                        (logits(gathered, mode, len(tokens)), 0, 0)))
        return Step(ops, tokens[d], own_rows)

    def coupled_steps(g: GlobalSegment) -> list[tuple[StepGraph, Step]]:
        steps = []
        for d, i in enumerate(g.items):
            shape = schedules[d].segments[i].shape if i >= 0 else None
            steps.append(SGLANG_IDLE_STEP if shape is None else
                         RankStep(shape.phase, shape.tokens, logit_rows(shape)))
        tokens, mode = sglang_profile.sglang_step_tokens(steps, graph)
        rows = tuple(s.rows for s in steps)
        gathered = sum(rows) if mode == "sum_len" else max(rows)
        eager = any(s.phase.value == "prefill" for s in steps) or graph(max(tokens)) is None
        return [(StepGraph(tokens[d], "eager" if eager else "full"),
                 step(tokens, tokens.index(tokens[d]), mode, gathered, rows[d]))
                for d in range(len(steps))]

    return build_dp_pattern(base, rank_of, chosen, schedules, timeline, IDLE, coupled_steps)
