"""vLLM V1 over a request workload at --dp > 1: the front end routes each request to a DP
engine (`patterns/workload/dp_routing.py`, least-loaded by default), each engine's own
scheduler runs its share (`scheduler.VllmScheduler`: budget, seats, chunking, async
scheduling, prefix caching, each engine with its own cache), and

- a MoE model's engines step together (`DPEngineCoreProc`, `dp_wave.py`): at every clock
  step of a wave each runs its own step or, with nothing scheduled, a one-token dummy
  forward; every step all-reduces the DP coordination tensor and pads to the ranks' common
  CUDA-graph size (`patterns/dp_steps.py`), every MoE layer exchanges the ranks' tokens
  (`moe.vllm_moe_layer`), the wave syncs every 32 steps and ends at the first sync with no
  unfinished request (`patterns/workload/dp_timeline.py`);
- a dense model's engines are independent replicas (`core.py:1307-1318`: DP size 1 each):
  each runs its own steps with its own calls, none between them.

A step's calls are those of `profile.forward` (the same rules as a batch), kept as one
layer's calls and their layers (`patterns.tiled.TiledOps`): tens of thousands of distinct
steps (eager prefills of uneven ranks) cost their few distinct calls, not a few hundred each.
Not modelled at dp > 1: speculative decoding, pp > 1 (refused).
"""

from collections.abc import Sequence
from dataclasses import replace
from functools import cache

from patterns.dp_steps import dp_padded
from patterns.engines.vllm import profile as vllm_profile
from patterns.engines.vllm.dp_wave import WAVE_SYNC_STEPS, wave_lag, wave_sync
from patterns.engines.vllm.moe import vllm_dp_coordination
from patterns.engines.vllm.rules import v1_capture_sizes, v1_defaults
from patterns.engines.vllm.scheduler import VllmScheduler
from patterns.engines.vllm.workload import padded, prefix_cache
from patterns.errors import ConfigError
from patterns.layout import Layout, Workload
from patterns.models import ModelConfig
from patterns.ops import Op, Step
from patterns.pattern import EngineOptions
from patterns.stage import Stage, pad_to
from patterns.tiled import TiledOps, from_runs
from patterns.workload.dp_pattern import DUMMY, NONE, DPWorkloadPattern, build_dp_pattern
from patterns.workload.dp_routing import least_loaded, round_robin, routing_for
from patterns.workload.dp_timeline import GlobalSegment, lockstep
from patterns.workload.requests import Request
from patterns.workload.schedule import arrival_steps
from patterns.workload.steps import StepGraph, logit_rows, shell_pattern


def vllm_dp_workload(model: ModelConfig, layout: Layout, requests: Sequence[Request],
                     dtype: str | None, options: EngineOptions, step_time_s: float | None,
                     source: str, routing: str | None) -> DPWorkloadPattern:
    if layout.pp > 1:
        raise ConfigError(f"--requests at dp({layout.dp}) is modelled at pp 1; use --pp 1")
    default_seqs, default_budget = v1_defaults(options.gpu)
    max_seqs = options.max_num_seqs or default_seqs
    budget = options.max_batched_tokens or default_budget
    sizes = [] if options.eager else v1_capture_sizes(max_seqs, budget)
    runner = options.model_runner or vllm_profile.default_model_runner(model)
    async_on = vllm_profile.async_scheduling(options)
    options = replace(options, model_runner=runner, async_scheduling=async_on)
    vllm_profile._check_kv_heads(model, layout.tp)
    chosen = routing_for("vllm", routing)
    arrivals = arrival_steps(requests, step_time_s)
    schedulers = [VllmScheduler(requests, arrivals, max_seqs, budget, 0, 1.0, async_on,
                                prefix_cache(model, requests, options, None, 1))
                  for _ in range(layout.dp)]
    if chosen == "least-loaded":
        rank_of = least_loaded(arrivals, schedulers, wave_lag(async_on))
    else:
        rank_of = round_robin(len(requests), layout.dp)
        for r, d in enumerate(rank_of):
            schedulers[d].add(r)
    for s in schedulers:
        s.advance(None)
    schedules = [s.schedule(step_time_s) for s in schedulers]
    coupled = model.is_moe  # DPEngineCoreProc: MoE only (dp_wave.py)
    timeline = lockstep(schedules, WAVE_SYNC_STEPS if coupled else None,
                        wave_lag(async_on))
    base = shell_pattern("vllm", model, layout, requests, dtype, options, source)
    # a dense model's engines are each a DP-size-1 engine: the calls of dp 1
    st0 = _stage(model, layout if coupled else replace(layout, dp=1), base.workload, options)

    def graph_size(tokens: int) -> int | None:
        return pad_to(sizes, tokens) if sizes and tokens <= sizes[-1] else None

    @cache
    def coupled_step(tokens: tuple[int, ...], d: int, rows: int, sync: bool) -> Step:
        st = replace(st0, dp_rank=d, dp_tokens=tokens)
        return Step(_tiled(st, tokens[d], rows, runner, async_on, True, sync), tokens[d],
                    rows)

    @cache
    def own_step(tokens: int, rows: int) -> Step:
        return Step(_tiled(st0, tokens, rows, runner, async_on, False, False), tokens, rows)

    empty = Step((), 0, 0)

    def steps_of(g: GlobalSegment) -> list[tuple[StepGraph, Step]]:
        shapes = [schedules[d].segments[i].shape if i >= 0 else None
                  for d, i in enumerate(g.items)]
        if not coupled:
            out = []
            for shape in shapes:
                if shape is None:
                    out.append((StepGraph(0, "eager"), empty))
                    continue
                graph = padded(sizes, shape.tokens, shape.prefill_seqs == shape.padded_prompts)
                out.append((graph, own_step(graph.tokens, logit_rows(shape))))
            return out
        own = [1 if s is None else s.tokens for s in shapes]  # a dummy forward: 1 token
        graphs = [graph_size(t) for t in own]
        tokens, eager = dp_padded(own, graphs), None in graphs
        out = []
        for d, shape in enumerate(shapes):
            uniform = shape is None or shape.prefill_seqs == shape.padded_prompts
            mode = "eager" if eager else ("full" if uniform else "piecewise")
            rows = 0 if shape is None else logit_rows(shape)
            # ranks of equal T issue equal calls: one step for them (the first one's index)
            step = coupled_step(tokens, tokens.index(tokens[d]), rows, g.sync)
            out.append((StepGraph(tokens[d], mode), step))
        return out

    return build_dp_pattern(base, rank_of, chosen, schedules, timeline,
                            DUMMY if coupled else NONE, steps_of)


def _stage(model: ModelConfig, layout: Layout, workload: Workload,
           options: EngineOptions) -> Stage:
    from patterns.stage import stages
    # forward reads the stage's workload for its dtype alone (vllm/workload.py)
    return stages(model, layout, Workload(1, 1, dtype=workload.dtype), options,
                  [model.num_hidden_layers])[0]


def _tiled(st: Stage, tokens: int, rows: int, runner: str, async_on: bool, coupled: bool,
           sync: bool) -> TiledOps:
    """One rank's calls in a step: the DP coordination (coupled ranks), the forward of T
    tokens sampling `rows` (none for a dummy: no logits call), the wave's sync."""
    at: list[tuple[int, int, int, int]] = []
    flat = vllm_profile.forward(st, tokens, max(rows, 1), untagged=True, layers_at=at)
    if rows == 0 and flat and flat[-1].tag == "logits":
        flat = flat[:-1]
    tiled = from_runs(flat, at)
    head: tuple[Op, ...] = (tuple(vllm_dp_coordination(st.layout, runner, async_on))
                            if coupled else ())
    tail: tuple[Op, ...] = (wave_sync(st.layout),) if sync else ()
    return TiledOps(((head, 0, 0), *tiled.parts, (tail, 0, 0)))
