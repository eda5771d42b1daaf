"""A request workload as a pattern: the scheduled steps, each with the calls its token count
gives under the engine's own rules (transports included), run-length folded.

Each distinct step shape is turned into calls once (`functools.cache` on the shape), so the
cost of a pattern is that of its distinct shapes and segments, not of its steps.
One engine replica at pp 1 here, or at pp > 1 for vLLM's synchronous scheduler, whose queue
of pp batches in flight `patterns/engines/vllm/pp_scheduler.py` simulates: each stage's
calls of an issued batch are one step of that stage's runs. At dp > 1 (pp 1) the requests
are routed to DP ranks and each runs its own: `dp_pattern.py`.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

from patterns.engine_base import ENGINE_INFO, _check_options
from patterns.errors import ConfigError
from patterns.layout import Layout, Workload
from patterns.models import ModelConfig
from patterns.ops import Op, Step
from patterns.pattern import EngineOptions, Pattern, Run
from patterns.stage import Stage, stages
from patterns.workload.requests import Request
from patterns.workload.schedule import Schedule, StepShape

WORKLOAD_ENGINES = ("vllm", "sglang")
NOT_MODELLED = {
    "vllm-v0": "vLLM V0 was removed from vLLM; use --engine vllm",
    "trtllm": "TRT-LLM's in-flight batching (its capacity and micro-batch schedulers) is not "
              "modelled; use --engine vllm or sglang",
    "megatron": "Megatron-LM's static inference batches take no request stream; use --engine "
                "vllm or sglang",
}


@dataclass(frozen=True)
class StepGraph:
    """How a step runs: its padded token count and whether under a CUDA graph."""

    tokens: int  # T the calls carry
    graph: str  # "full", "piecewise" or "eager"


@dataclass(frozen=True)
class WorkloadPattern(Pattern):
    """A pattern whose runs are a request workload's scheduled steps, in order."""

    schedule: Schedule | None = None
    requests: tuple[Request, ...] = ()
    source: str = ""  # the --requests argument
    step_graphs: tuple[StepGraph, ...] = ()  # per segment of `schedule`
    segment_steps: tuple[Step, ...] = ()  # per segment: the step its calls make (shared)
    spec: str = ""  # the speculative method, "" when none


def check_workload_layout(engine: str, layout: Layout, flag: str = "--requests") -> None:
    if engine not in WORKLOAD_ENGINES:
        raise ConfigError(f"{flag} with engine {engine}: "
                          f"{NOT_MODELLED.get(engine, 'not modelled; use vllm or sglang')}")
    if layout.pp > 1 and (engine != "vllm" or layout.dp > 1):
        raise ConfigError(f"{flag} is modelled at pp 1 (here pp({layout.pp}), dp({layout.dp}))"
                          f"{' but for vllm at dp 1' if engine == 'vllm' else ''}: engines keep "
                          "several batches in flight under PP; use --pp 1")


def shell_workload(requests: Sequence[Request], dtype: str | None) -> Workload:
    """The Workload a workload pattern carries for code that reads one: the longest prompt
    and output, one request (the steps themselves are the schedule's)."""
    return Workload(prompt=max(r.prompt for r in requests),
                    decode=max(r.output for r in requests), batch=1, dtype=dtype)


def shell_pattern(engine: str, model: ModelConfig, layout: Layout, requests: Sequence[Request],
                  dtype: str | None, options: EngineOptions, source: str) -> WorkloadPattern:
    """A workload pattern's engine, model, layout, options, requests and source, checked as
    `build_pattern` checks them, with no steps yet (a DP workload adds its own:
    patterns/workload/dp_pattern.py)."""
    longest = max(requests, key=lambda r: r.prompt + r.output)
    model.check_sequence(longest.prompt, longest.output)
    _check_options(ENGINE_INFO[engine], options)
    return WorkloadPattern(engine=engine, model=model, layout=layout,
                           workload=shell_workload(requests, dtype or model.default_dtype),
                           options=options, stages=((),), requests=tuple(requests),
                           source=source)


def build_pattern(engine: str, model: ModelConfig, layout: Layout, requests: Sequence[Request],
                  dtype: str | None, options: EngineOptions, schedule: Schedule,
                  step_ops: Callable[[Stage, StepShape], tuple[StepGraph, Sequence[Op]]],
                  source: str, spec: str = "") -> WorkloadPattern:
    """`step_ops(stage, shape)`: the engine's graph decision and calls for one step shape."""
    longest = max(requests, key=lambda r: r.prompt + r.output)
    model.check_sequence(longest.prompt, longest.output)
    workload = shell_workload(requests, dtype or model.default_dtype)
    _check_options(ENGINE_INFO[engine], options)
    from patterns.shapes import stage_layer_counts
    sts = stages(model, layout, workload, options,
                 stage_layer_counts(model.num_hidden_layers, layout.pp))

    @cache
    def of(index: int, shape: StepShape) -> tuple[StepGraph, Step]:
        graph, ops = step_ops(sts[index], shape)
        # a tuple given is kept, shared with other patterns; one Step a stage and shape
        return graph, Step(tuple(ops), graph.tokens, shape.samples)

    per_stage: list[tuple[Run, ...]] = []
    graphs: list[StepGraph] = []
    steps: list[Step] = []
    for index in range(len(sts)):  # the stages step together: one issued batch, a step each
        runs: list[Run] = []
        for seg in schedule.segments:
            graph, step = of(index, seg.shape)
            if index == 0:
                graphs.append(graph)
                steps.append(step)
            if runs and runs[-1].phase == seg.shape.phase and runs[-1].step == step:
                runs[-1] = Run(seg.shape.phase, step, runs[-1].repeat + seg.repeat)
            else:
                runs.append(Run(seg.shape.phase, step, seg.repeat))
        per_stage.append(tuple(runs))
    return WorkloadPattern(engine=engine, model=model, layout=layout, workload=workload,
                           options=options, stages=tuple(per_stage), schedule=schedule,
                           requests=tuple(requests), source=source,
                           step_graphs=tuple(graphs), segment_steps=tuple(steps), spec=spec)


def logit_rows(shape: StepShape) -> int:
    """Rows the step computes logits for: one per prefill request, 1 + k per decode (and per
    1-token prompt padded to 1 + k, which is verified as a decode)."""
    padded = shape.padded_prompts
    return shape.prefill_seqs - padded + (shape.decode_seqs + padded) * shape.decode_tokens
