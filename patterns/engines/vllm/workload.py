"""vLLM V1's calls for each scheduled step of a request workload (`profile.py` here,
its sources there): a step of T tokens over R scheduled requests issues `forward(T_pad, rows)`
with T_pad the capture size T pads to (`rules.v1_capture_sizes`, `config/vllm.py:
_set_cudagraph_sizes`); the logits are all-gathered for every scheduled request, partial
prefills included, and for 1 + k positions of each request under speculative decoding (the
verify rows)."""

from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

from patterns.engines.vllm import profile as vllm_profile
from patterns.engines.vllm.hybrid import StepMix, needs_mix
from patterns.engines.vllm.nixl_connector import dense_block_size, mla_block_size
from patterns.engines.vllm.pp_scheduler import schedule_vllm_pp
from patterns.engines.vllm.rules import v1_capture_sizes, v1_defaults
from patterns.engines.vllm.scheduler import schedule_vllm
from patterns.engines.vllm.speculative import drafter_ops, spec_capture_sizes
from patterns.engines.vllm.speculative_v2 import drafter_ops_v2, v2_graphs
from patterns.errors import ConfigError
from patterns.layout import Layout, Workload
from patterns.models import ModelConfig
from patterns.ops import Op
from patterns.pattern import EngineOptions
from patterns.speculative import SpecConfig
from patterns.stage import Stage, pad_to
from patterns.workload.prefix import PrefixCache, shares_prefixes
from patterns.workload.requests import Request
from patterns.workload.schedule import StepShape
from patterns.workload.steps import StepGraph, WorkloadPattern, build_pattern, logit_rows


@lru_cache(maxsize=4096)
def _forward_ops(st: Stage, tokens: int, mix: StepMix | None = None) -> tuple[Op, ...]:
    return tuple(vllm_profile.forward(st, tokens, 1, mix=mix))


@lru_cache(maxsize=64)
def _untagged_steps(st: Stage) -> tuple[dict[Any, tuple[Op, ...]], dict[int, tuple[Op, ...]],
                                        dict[Any, Op]]:
    """A stage's `_untagged_step`s by (T, logits rows), and what they are made of: its
    untagged forwards by T and its logits calls by rows, kept for every pattern of it (a
    stage hashed once a pattern, not once a step)."""
    return {}, {}, {}


def _untagged_step(st: Stage, tokens: int, rows: int,
                   made: tuple[dict[Any, Any], dict[int, Any], dict[Any, Op]]) -> tuple[Op, ...]:
    """One step's calls for pricing (`forward`'s `untagged`), its logits `rows` rows: one
    tuple for every lane and layout of this stage, so plan prices it once."""
    _, forwards, logits = made
    ops = forwards.get(tokens)
    if ops is None:
        ops = forwards[tokens] = tuple(vllm_profile.forward(st, tokens, 1, untagged=True))
    if ops and ops[-1].tag == "logits":
        key = (rows, ops[-1])  # by the call's value: a forward's logits call is alike at any T
        last = logits.get(key)
        if last is None:
            shard = ops[-1].shape[1]
            last = logits[key] = replace(ops[-1], shape=(rows, shard),
                                         out_shape=(rows, shard * st.tp))
        return (*ops[:-1], last)
    return ops


def vllm_workload(model: ModelConfig, layout: Layout, requests: Sequence[Request],
                  dtype: str | None, options: EngineOptions, step_time_s: float | None,
                  spec: SpecConfig | None, source: str,
                  untagged: bool = False) -> WorkloadPattern:
    """`untagged`: calls for pricing alone (plan): the layers' calls carry the tags of the
    first layer of their kind (profile.forward), each step's tuple shared between patterns."""
    default_seqs, default_budget = v1_defaults(options.gpu)
    max_seqs = options.max_num_seqs or default_seqs
    budget = options.max_batched_tokens or default_budget
    k = spec.k if spec else 0
    sizes = [] if options.eager else (spec_capture_sizes(max_seqs, budget, k) if spec
                                      else v1_capture_sizes(max_seqs, budget))
    runner = options.model_runner or vllm_profile.default_model_runner(model)
    async_on = vllm_profile.async_scheduling(options, spec.method if spec else "")
    # The pattern records the modes it was built in, not None for "the engine's default".
    options = replace(options, model_runner=runner, async_scheduling=async_on)
    # Model Runner V2 under speculation picks its own graphs (speculative_v2.py).
    v2 = (v2_graphs(max_seqs, budget, k) if spec is not None and runner == "v2"
          and not options.eager else None)
    vllm_profile._check_kv_heads(model, layout.tp)
    prefix = prefix_cache(model, requests, options, spec, layout.pp)
    if layout.pp > 1:
        check_pipeline(requests, spec, async_on, runner)
        schedule = schedule_vllm_pp(requests, max_seqs, budget, layout.pp)
    else:
        schedule = schedule_vllm(requests, step_time_s, max_seqs, budget, k,
                                 spec.acceptance_length if spec else 1.0, async_on, prefix)

    def model_ops(st: Stage, tokens: int, shape: StepShape) -> tuple[Op, ...]:
        """The calls a step of T tokens makes, its logits one row (set per step below):
        built once per T, since every other call follows T alone (and the unpadded tokens
        where the model's calls read them: hybrid.needs_mix)."""
        mix = (StepMix(shape.tokens, shape.decode_seqs * shape.decode_tokens)
               if needs_mix(st.model) else None)
        # forward reads the stage's workload for its dtype alone: one key for every
        # workload of this stage (plan prices thousands of them, analysis/workload_plan.py)
        return _forward_ops(replace(st, workload=Workload(1, 1, dtype=st.dtype)), tokens, mix)

    keyed: dict[int, Any] = {}  # a stage, its key and its _untagged_steps

    def step_ops(st: Stage, shape: StepShape) -> tuple[StepGraph, Sequence[Op]]:
        # Uniform: every request 1 (+ k) tokens; a padded 1-token prompt counts as a decode.
        uniform = shape.prefill_seqs == shape.padded_prompts
        padded_reqs = None
        if v2 is not None:
            graph, padded_reqs = v2.dispatch(shape.tokens, uniform=uniform)
        else:
            graph = padded(sizes, shape.tokens, uniform_decode=uniform)
        if untagged and spec is None and not needs_mix(st.model):
            if keyed.get(id(st), (None,))[0] is not st:  # one stage a pattern: keyed once
                key = replace(st, workload=Workload(1, 1, dtype=st.dtype))
                keyed[id(st)] = (st, key, _untagged_steps(key))
            _, key, made = keyed[id(st)]
            at = (graph.tokens, logit_rows(shape))
            ops = made[0].get(at)
            if ops is None:
                ops = made[0][at] = _untagged_step(key, *at, made)
            return graph, ops
        ops = list(model_ops(st, graph.tokens, shape))
        if ops and ops[-1].tag == "logits":  # R rows: every scheduled request's (verify) rows
            rows, shard = logit_rows(shape), ops[-1].shape[1]
            ops[-1] = replace(ops[-1], shape=(rows, shard), out_shape=(rows, shard * st.tp))
        if v2 is not None and spec is not None:
            ops += drafter_ops_v2(st, spec, shape, graph, padded_reqs, v2)
        elif spec is not None:
            ops += drafter_ops(st, spec, shape, graph.tokens, sizes)
        return graph, ops

    return build_pattern("vllm", model, layout, requests, dtype, options, schedule, step_ops,
                         source, spec.method if spec else "")


def prefix_cache(model: ModelConfig, requests: Sequence[Request], options: EngineOptions,
                 spec: SpecConfig | None, pp: int) -> PrefixCache | None:
    """vLLM's prefix cache over the workload (`patterns/workload/prefix.py`), None when it
    is off (--no-prefix-caching) or no two requests share a prefix_id (nothing can hit).
    The block size is vLLM's for the model on `options.gpu` (`nixl_connector.py`: 16 for a
    dense model) unless --kv-block-size gives it."""
    # the block size is checked (a --kv-block-size no backend takes refused) even when unused
    block = (mla_block_size(options.gpu, "auto", options.kv_block_size)[0]
             if model.mla and model.kv_lora_rank else dense_block_size(options.kv_block_size))
    if options.prefix_caching is False or not shares_prefixes(requests):
        return None
    why = ("speculative decoding (EAGLE drops the last cached block)" if spec is not None
           else f"pp({pp}) > 1" if pp > 1 else None)
    if why:
        raise ConfigError(f"requests sharing a prefix_id are modelled with prefix caching at "
                          f"pp 1 without speculative decoding, not under {why}; give "
                          "--no-prefix-caching (every prompt token computed) or drop the "
                          "prefix keys")
    return PrefixCache.of(block)


def check_pipeline(requests: Sequence[Request], spec: SpecConfig | None, async_on: bool,
                   runner: str) -> None:
    """A workload at pp > 1 is modelled for vLLM's synchronous scheduler under Model Runner
    V1 (its CPU build's mode: `pp_scheduler.py`), every request arriving at the start."""
    why = ("speculative decoding" if spec is not None else
           "async scheduling (give --no-async-scheduling)" if async_on else
           "Model Runner V2's sampled-token broadcasts (give --model-runner v1)"
           if runner != "v1" else "arrivals over time" if any(r.arrival_s > 0 for r in requests)
           else None)
    if why:
        raise ConfigError(f"a request workload at pp > 1 is modelled for vLLM's synchronous "
                          f"scheduler under Model Runner V1, all requests arriving at 0; not "
                          f"{why}")


def padded(sizes: list[int], tokens: int, uniform_decode: bool) -> StepGraph:
    """vLLM V1's default cudagraph_mode FULL_AND_PIECEWISE (vllm-project/vllm
    `docs/design/cuda_graphs.md` @ 74aef306, `v1/cudagraph_dispatcher.py`): uniform decode
    batches (every request 1, or 1 + k, tokens) replay a full graph, prefill and mixed
    batches a piecewise one, both padded to the next capture size; above the largest
    capture size the step runs eager, unpadded."""
    if not sizes or tokens > sizes[-1]:
        return StepGraph(tokens, "eager")
    return StepGraph(pad_to(sizes, tokens), "full" if uniform_decode else "piecewise")
