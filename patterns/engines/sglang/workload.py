"""SGLang's calls for each scheduled step of a request workload (`patterns/engines/sglang/
profile.py`): extend and mixed steps padded to its prefill token ladder, decode steps to its
decode graph sizes; the decode graph all-gathers the logits of every padded row."""

from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

from patterns.engines.sglang import profile as sglang_profile
from patterns.engines.sglang.scheduler import schedule_sglang
from patterns.engines.sglang.speculative import decode_step_ops, extend_drafter_ops
from patterns.layout import Layout, Workload
from patterns.models import ModelConfig
from patterns.ops import Op
from patterns.pattern import EngineOptions
from patterns.speculative import SpecConfig
from patterns.stage import Stage, pad_to
from patterns.workload.requests import Request
from patterns.workload.schedule import StepShape
from patterns.workload.steps import StepGraph, WorkloadPattern, build_pattern, logit_rows

SGLANG_SPEC_MAX_RUNNING = 48


@lru_cache(maxsize=64)
def _shared_steps(st: Stage) -> dict[Any, tuple[Op, ...]]:
    """A stage's steps by (T, rows, logits rows), kept for every pattern of it (plan)."""
    return {}


def sglang_workload(model: ModelConfig, layout: Layout, requests: Sequence[Request],
                    dtype: str | None, options: EngineOptions, step_time_s: float | None,
                    spec: SpecConfig | None, source: str, mixed: bool,
                    shared: bool = False) -> WorkloadPattern:
    """`shared`: each step's calls one tuple for every pattern of its stage (plan prices
    thousands of lanes, each step once: analysis/workload_plan.py)."""
    # Speculative decoding turns mixed chunks off, with a warning, not an error
    # (arg_groups/speculative_hook.py:521-526 EAGLE family, 665 ngram @ 8905cbd4).
    mixed = mixed and spec is None
    budget = options.max_batched_tokens or sglang_profile.chunked_prefill_size(options.gpu)
    # --max-running-requests: SGLang sets 48 under speculative decoding when none is given
    # (arg_groups/speculative_hook.py:507-511 EAGLE family, 659-663 ngram @ 8905cbd4).
    max_running = options.max_num_seqs or (SGLANG_SPEC_MAX_RUNNING if spec else None)
    schedule = schedule_sglang(requests, step_time_s, budget, mixed, max_running,
                               spec.k if spec else 0, spec.acceptance_length if spec else 1.0,
                               overlap=not options.disable_overlap_schedule)
    prefill_sizes = [] if options.eager else sglang_profile.prefill_graph_sizes(
        min(budget, 2048) if model.mla else budget)
    decode_sizes = [] if options.eager else sglang_profile.decode_graph_sizes(
        layout.tp, options.gpu, spec is not None, max_running)

    def step_ops(st: Stage, shape: StepShape) -> tuple[StepGraph, Sequence[Op]]:
        rows = logit_rows(shape)
        if shape.prefill_seqs:
            bucket = sglang_profile.prefill_graph_tokens(prefill_sizes, shape.tokens)
            graph = (StepGraph(bucket, "piecewise") if bucket is not None
                     else StepGraph(shape.tokens, "eager"))
            if spec is None:
                return graph, calls(st, graph.tokens, rows, None)
            return graph, (sglang_profile._control(st)
                           + sglang_profile.forward(st, graph.tokens, rows)
                           + extend_drafter_ops(st, spec, shape, graph.tokens))
        if spec is not None:  # draft forwards, the target's verify, the draft extend
            tokens, ops = decode_step_ops(st, spec, shape, decode_sizes)
            mode = "full" if decode_sizes and shape.decode_seqs <= decode_sizes[-1] else "eager"
            return StepGraph(tokens, mode), sglang_profile._control(st) + ops
        if decode_sizes and shape.tokens <= decode_sizes[-1]:
            graph = StepGraph(pad_to(decode_sizes, shape.tokens), "full")
            # Under the graph the logits cover every padded row.
            return graph, calls(st, graph.tokens, rows, graph.tokens)
        return StepGraph(shape.tokens, "eager"), calls(st, shape.tokens, rows, None)

    keyed: dict[int, Any] = {}  # a stage, its shared steps

    def calls(st: Stage, tokens: int, rows: int, logit_rows: int | None) -> Sequence[Op]:
        """The control broadcast and the forward of one step (no speculation)."""
        if not shared:
            return sglang_profile._control(st) + sglang_profile.forward(st, tokens, rows,
                                                                        logit_rows)
        if keyed.get(id(st), (None,))[0] is not st:  # one stage a pattern: keyed once
            # forward reads the stage's workload for its dtype alone: one key for every
            # workload of this stage, as vllm/workload.py's
            key = replace(st, workload=Workload(1, 1, dtype=st.dtype))
            keyed[id(st)] = (st, key, _shared_steps(key))
        _, key, steps = keyed[id(st)]
        at = (tokens, rows, logit_rows)
        ops = steps.get(at)
        if ops is None:
            ops = steps[at] = tuple(sglang_profile._control(key)
                                    + sglang_profile.forward(key, tokens, rows, logit_rows))
        return ops

    # max_num_seqs is SGLang's --max-running-requests here (the scheduler reads it).
    return build_pattern("sglang", model, layout, requests, dtype,
                         replace(options, max_num_seqs=None), schedule, step_ops, source,
                         spec.method if spec else "")
