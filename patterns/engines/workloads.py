"""The pattern of a request workload: each engine's scheduler and step calls
(`patterns/engines/vllm/workload.py`, `patterns/engines/sglang/workload.py`), picked by engine."""

from collections.abc import Callable, Sequence

from patterns.engines.sglang.profile import chunked_prefill_size
from patterns.engines.sglang.workload import sglang_workload
from patterns.engines.vllm.rules import v1_defaults
from patterns.engines.vllm.workload import vllm_workload
from patterns.errors import ConfigError
from patterns.hybrid import check_hybrid_use
from patterns.layout import Layout
from patterns.models import ModelConfig
from patterns.pattern import EngineOptions
from patterns.speculative import SpecConfig, check_spec_model
from patterns.workload.prefix import shares_prefixes
from patterns.workload.requests import Request
from patterns.workload.steps import WorkloadPattern, check_workload_layout


def check_positions(model: ModelConfig, requests: Sequence[Request]) -> None:
    """Every request within the model's positions, checked before any scheduling (a
    schedule of 10^6 requests takes tens of seconds): the first that is not is named."""
    limit = model.max_position_embeddings
    if not limit:
        return
    for i, r in enumerate(requests, start=1):
        if r.prompt + r.output > limit:
            # a file's request by its line (the order of arrival is not the file's)
            which = (f"the request on line {r.line:,} of the --requests file" if r.line
                     else f"request {i:,} in arrival order")
            raise ConfigError(f"{which} (at {r.arrival_s:g} s): "
                              f"prompt({r.prompt}) + output({r.output}) = "
                              f"{r.prompt + r.output} tokens exceed max_position_embeddings"
                              f"({limit}) of {model.name}; every request needs prompt + "
                              f"output <= {limit}")


MAX_STEPS = 10 ** 8  # about 5 minutes of scheduling at 3 us a step; more is refused


def check_step_count(engine: str, requests: Sequence[Request], options: EngineOptions) -> None:
    """Refuse, before scheduling, a workload whose prompts alone need more than MAX_STEPS
    steps at the step's token budget (every step computes at most that many prompt tokens):
    with --max-batched-tokens 1 a workload of long prompts never finished."""
    budget = options.max_batched_tokens or (
        v1_defaults(options.gpu)[1] if engine == "vllm" else chunked_prefill_size(options.gpu))
    prompt_tokens = sum(r.prompt for r in requests)
    least = -(-prompt_tokens // budget)
    if least > MAX_STEPS:
        raise ConfigError(f"{prompt_tokens:,} prompt tokens at {budget:,} a step "
                          f"(--max-batched-tokens) need at least {least:,} steps, more than "
                          f"{MAX_STEPS:,}; raise --max-batched-tokens or give fewer requests")


def workload_pattern(engine: str, model: ModelConfig, layout: Layout,
                     requests: Sequence[Request], dtype: str | None, options: EngineOptions,
                     step_time_s: float | None, spec: SpecConfig | None = None,
                     source: str = "", mixed_chunk: bool = False, flag: str = "--requests",
                     progress: Callable[[str], None] | None = None,
                     untagged: bool = False, dp_routing: str | None = None
                     ) -> WorkloadPattern:
    """The pattern of a request workload under `engine`'s scheduler. `flag` names the option
    that asked for it in refusals (--requests, or --speculative-config for one batch);
    `progress`, when given, is told each phase of a large workload; `untagged`, calls for
    pricing alone (plan): under vLLM their tags not each layer's (vllm/workload.py), under
    SGLang each step's calls one tuple for every pattern of its stage (sglang/workload.py).
    At dp > 1 the requests go to the DP ranks by `dp_routing` (None: the engine's front
    end's own: patterns/workload/dp_routing.py) and each rank schedules its share
    (vllm/dp_workload.py, sglang/dp_workload.py)."""
    if spec is not None:
        check_spec_model(spec, model, engine)
    check_workload_layout(engine, layout, flag)
    layout.check_model(model)
    check_hybrid_use(model.name, model.hybrid, engine)
    check_positions(model, requests)
    check_step_count(engine, requests, options)
    if progress is not None:
        progress(f"{len(requests):,} requests read and checked; scheduling them under "
                 f"{engine}")
    if mixed_chunk and engine != "sglang":
        raise ConfigError("--mixed-chunk is SGLang's --enable-mixed-chunk; vLLM always mixes "
                          "prefill chunks and decodes; use it with --engine sglang")
    if engine != "vllm" and (shares_prefixes(requests) or options.prefix_caching is not None
                             or options.kv_block_size is not None):
        raise ConfigError(f"shared prefixes (prefix_id), --prefix-caching and --kv-block-size "
                          f"are modelled for vLLM's prefix cache; {engine}'s own is not "
                          "modelled: use --engine vllm, or drop them")
    if dp_routing is not None and layout.dp == 1:
        raise ConfigError("dp-routing routes requests between DP ranks; give --dp N (N > 1) "
                          "or drop it")
    if layout.dp > 1:
        pattern = _dp_workload(engine, model, layout, requests, dtype, options, step_time_s,
                               spec, source, mixed_chunk, dp_routing)
    elif engine == "vllm":
        pattern = vllm_workload(model, layout, requests, dtype, options, step_time_s, spec,
                                source, untagged)
    else:
        pattern = sglang_workload(model, layout, requests, dtype, options, step_time_s, spec,
                                  source, mixed_chunk, untagged)
    if progress is not None:
        assert pattern.schedule is not None
        progress(f"scheduled: {pattern.schedule.steps:,} steps; each request's figures next")
    return pattern


def _dp_workload(engine: str, model: ModelConfig, layout: Layout, requests: Sequence[Request],
                 dtype: str | None, options: EngineOptions, step_time_s: float | None,
                 spec: SpecConfig | None, source: str, mixed_chunk: bool,
                 routing: str | None) -> WorkloadPattern:
    if spec is not None:
        raise ConfigError(f"speculative decoding over a request workload is modelled at dp 1, "
                          f"not dp({layout.dp}); drop --speculative-config or use --dp 1")
    if engine == "vllm":
        from patterns.engines.vllm.dp_workload import vllm_dp_workload
        return vllm_dp_workload(model, layout, requests, dtype, options, step_time_s, source,
                                routing)
    from patterns.engines.sglang.dp_workload import sglang_dp_workload
    return sglang_dp_workload(model, layout, requests, dtype, options, step_time_s, source,
                              mixed_chunk, routing)
