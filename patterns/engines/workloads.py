"""Each engine's calls for one scheduled step of a workload, and the pattern of a workload.

vLLM V1 (`patterns/engines/vllm/profile.py`, its sources there): a step of T tokens over R
scheduled requests issues `forward(T_pad, rows)` with T_pad the capture size T pads to
(`vllm_rules.v1_capture_sizes`, `config/vllm.py: _set_cudagraph_sizes`); the logits are
all-gathered for every scheduled request, partial prefills included, and for 1 + k
positions of each request under speculative decoding (the verify rows).
SGLang (`patterns/engines/sglang/profile.py`): extend and mixed steps padded to its prefill token
ladder, decode steps to its decode graph sizes; the decode graph all-gathers the logits of
every padded row.
"""

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cache

from patterns.engines.sglang import profile as sglang_profile
from patterns.engines.sglang.scheduler import schedule_sglang
from patterns.engines.sglang.speculative import decode_step_ops, extend_drafter_ops
from patterns.engines.vllm import profile as vllm_profile
from patterns.engines.vllm.scheduler import schedule_vllm
from patterns.errors import ConfigError
from patterns.layout import Layout
from patterns.models import ModelConfig
from patterns.ops import Op
from patterns.pattern import EngineOptions
from patterns.speculative import SpecConfig, check_spec_model, drafter_ops, spec_capture_sizes
from patterns.stage import Stage, pad_to
from patterns.vllm_rules import v1_capture_sizes, v1_defaults
from patterns.workload.requests import Request
from patterns.workload.schedule import StepShape
from patterns.workload.steps import (
    StepGraph,
    WorkloadPattern,
    build_pattern,
    check_workload_layout,
    padded,
)


def logit_rows(shape: StepShape) -> int:
    """Rows the step computes logits for: one per prefill request, 1 + k per decode."""
    return shape.prefill_seqs + shape.decode_seqs * shape.decode_tokens


def vllm_workload(model: ModelConfig, layout: Layout, requests: Sequence[Request],
                  dtype: str | None, options: EngineOptions, step_time_s: float | None,
                  spec: SpecConfig | None, source: str) -> WorkloadPattern:
    default_seqs, default_budget = v1_defaults(options.gpu)
    max_seqs = options.max_num_seqs or default_seqs
    budget = options.max_batched_tokens or default_budget
    k = spec.k if spec else 0
    sizes = [] if options.eager else (spec_capture_sizes(max_seqs, budget, k) if spec
                                      else v1_capture_sizes(max_seqs, budget))
    runner = options.model_runner or vllm_profile.default_model_runner(model)
    options = replace(options, model_runner=runner)
    vllm_profile._check_kv_heads(model, layout.tp)
    schedule = schedule_vllm(requests, step_time_s, max_seqs, budget, k,
                             spec.acceptance_length if spec else 1.0,
                             vllm_profile.async_scheduling(options,
                                                           spec.method if spec else ""))

    @cache
    def model_ops(st: Stage, tokens: int) -> tuple[Op, ...]:
        """The calls a step of T tokens makes, its logits one row (set per step below):
        built once per T, since every other call follows T alone."""
        return tuple(vllm_profile.forward(st, tokens, 1))

    def step_ops(st: Stage, shape: StepShape) -> tuple[StepGraph, list[Op]]:
        graph = padded(sizes, shape.tokens, uniform_decode=shape.prefill_seqs == 0)
        ops = list(model_ops(st, graph.tokens))
        if ops and ops[-1].tag == "logits":  # R rows: every scheduled request's (verify) rows
            rows, shard = logit_rows(shape), ops[-1].shape[1]
            ops[-1] = replace(ops[-1], shape=(rows, shard), out_shape=(rows, shard * st.tp))
        if spec is not None:
            ops += drafter_ops(st, spec, shape, graph.tokens, sizes)
        return graph, ops

    return build_pattern("vllm", model, layout, requests, dtype, options, schedule, step_ops,
                         source, spec.method if spec else "")


SGLANG_SPEC_MAX_RUNNING = 48


def sglang_workload(model: ModelConfig, layout: Layout, requests: Sequence[Request],
                    dtype: str | None, options: EngineOptions, step_time_s: float | None,
                    spec: SpecConfig | None, source: str, mixed: bool) -> WorkloadPattern:
    if spec is not None and mixed:
        raise ConfigError("--mixed-chunk with --speculative-config: SGLang runs them apart "
                          "(speculative decoding turns mixed chunks off); drop --mixed-chunk")
    budget = options.max_batched_tokens or sglang_profile.chunked_prefill_size(options.gpu)
    # --max-running-requests: SGLang sets 48 under speculative decoding when none is given
    # (arg_groups/speculative_hook.py:254-258 @ 8905cbd4).
    max_running = options.max_num_seqs or (SGLANG_SPEC_MAX_RUNNING if spec else None)
    schedule = schedule_sglang(requests, step_time_s, budget, mixed, max_running,
                               spec.k if spec else 0, spec.acceptance_length if spec else 1.0,
                               overlap=not options.disable_overlap_schedule)
    prefill_sizes = [] if options.eager else sglang_profile.prefill_graph_sizes(
        min(budget, 2048) if model.mla else budget)
    decode_sizes = [] if options.eager else sglang_profile.decode_graph_sizes(layout.tp,
                                                                              options.gpu)

    def step_ops(st: Stage, shape: StepShape) -> tuple[StepGraph, list[Op]]:
        rows = logit_rows(shape)
        ctrl = sglang_profile._control(st)
        if shape.prefill_seqs:
            graph = (StepGraph(pad_to(prefill_sizes, shape.tokens), "piecewise")
                     if prefill_sizes and shape.tokens <= prefill_sizes[-1]
                     else StepGraph(shape.tokens, "eager"))
            drafts = (extend_drafter_ops(st, spec, shape, graph.tokens) if spec is not None
                      else [])
            return graph, ctrl + sglang_profile.forward(st, graph.tokens, rows) + drafts
        if spec is not None:  # draft forwards, the target's verify, the draft extend
            tokens, ops = decode_step_ops(st, spec, shape, decode_sizes)
            mode = "full" if decode_sizes and shape.decode_seqs <= decode_sizes[-1] else "eager"
            return StepGraph(tokens, mode), ctrl + ops
        if decode_sizes and shape.tokens <= decode_sizes[-1]:
            graph = StepGraph(pad_to(decode_sizes, shape.tokens), "full")
            # Under the graph the logits cover every padded row.
            return graph, ctrl + sglang_profile.forward(st, graph.tokens, rows, graph.tokens)
        return StepGraph(shape.tokens, "eager"), ctrl + sglang_profile.forward(
            st, shape.tokens, rows)

    # max_num_seqs is SGLang's --max-running-requests here (the scheduler reads it).
    return build_pattern("sglang", model, layout, requests, dtype,
                         replace(options, max_num_seqs=None), schedule, step_ops, source,
                         spec.method if spec else "")


def check_positions(model: ModelConfig, requests: Sequence[Request]) -> None:
    """Every request within the model's positions, checked before any scheduling (a
    schedule of 10^6 requests takes tens of seconds): the first that is not is named."""
    limit = model.max_position_embeddings
    if not limit:
        return
    for i, r in enumerate(requests, start=1):
        if r.prompt + r.output > limit:
            raise ConfigError(f"request {i:,} in arrival order (at {r.arrival_s:g} s): "
                              f"prompt({r.prompt}) + output({r.output}) = "
                              f"{r.prompt + r.output} tokens exceed max_position_embeddings"
                              f"({limit}) of {model.name}; every request needs prompt + "
                              f"output <= {limit}")


def workload_pattern(engine: str, model: ModelConfig, layout: Layout,
                     requests: Sequence[Request], dtype: str | None, options: EngineOptions,
                     step_time_s: float | None, spec: SpecConfig | None = None,
                     source: str = "", mixed_chunk: bool = False, flag: str = "--requests",
                     progress: Callable[[str], None] | None = None) -> WorkloadPattern:
    """The pattern of a request workload under `engine`'s scheduler. `flag` names the option
    that asked for it in refusals (--requests, or --speculative-config for one batch);
    `progress`, when given, is told each phase of a large workload."""
    if spec is not None:
        check_spec_model(spec, model, engine)
    check_workload_layout(engine, layout, flag)
    layout.check_model(model)
    check_positions(model, requests)
    if progress is not None:
        progress(f"{len(requests):,} requests read and checked; scheduling them under "
                 f"{engine}")
    if mixed_chunk and engine != "sglang":
        raise ConfigError("--mixed-chunk is SGLang's --enable-mixed-chunk; vLLM always mixes "
                          "prefill chunks and decodes; use it with --engine sglang")
    if engine == "vllm":
        pattern = vllm_workload(model, layout, requests, dtype, options, step_time_s, spec,
                                source)
    else:
        pattern = sglang_workload(model, layout, requests, dtype, options, step_time_s, spec,
                                  source, mixed_chunk)
    if progress is not None:
        assert pattern.schedule is not None
        progress(f"scheduled: {pattern.schedule.steps:,} steps; each request's figures next")
    return pattern
