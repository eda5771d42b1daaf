"""Compute floors: the least time a layout's GPUs need for a step's arithmetic and memory
traffic (a roofline from --gpu's peak dense FLOP/s and HBM bandwidth, analysis/hardware.py),
shown beside the communication floor that `plan` predicts from the sweeps.

A floor, not a prediction of the engine: each stage of a step takes
max(FLOPs / peak, bytes / bandwidth) on one of its ranks (TP ranks work in parallel, each on
its shard), and one batch walks the stages one after the other, so a step's floor is the sum
over stages (a pipeline's per-token cost). Kernels reach a fraction of either peak, so the
engine is slower than this; what the floor shows is what no kernel can go below.

- Prefill of B prompts of Sp tokens: 2 x (the rank's active parameters) x B x Sp FLOPs, plus
  causal attention, 4 FLOPs per (query, key) pair, head and head_dim (QK^T and PV, 2 each)
  over the Sp^2 / 2 pairs the causal mask keeps, per layer; the rank's weights read once.
  Chunked prefill (the engine's token budget a step) sums its chunks' floors: the weights
  read once a chunk, the FLOPs those of one pass split among them.
- A decode step of B sequences at the mean context L = Sp + Sd / 2 (the average over the
  decode, so that Sd - 1 steps at it make the decode's floor): 2 x active parameters x B
  plus 4 x B x L x heads x head_dim per layer; it reads the rank's weights and the KV cache
  of B x L tokens (patterns/weights.py's per-token bytes). A MoE rank reads the share of its
  routed experts the step's tokens can reach, min(1, tokens x top-k / experts), where tokens
  is the rank's routing group's: B, or dp x B under EP.
- Active parameters: every dense one on the rank, and of the routed experts top-k experts'
  worth per token split over TP (under EP, dp x tp ranks share dp x B tokens: the same
  B x top-k / tp per rank on average). The input embedding is a lookup: neither FLOPs nor
  a full read. An fp8 checkpoint runs at the fp8 peak, any other at bf16's.
"""

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from typing import Any

from microbench.analysis.hardware import GPU_SPECS
from patterns.dtypes import DTYPE_BYTES
from patterns.layout import Layout
from patterns.models import ModelConfig
from patterns.shapes import padded_vocab, stage_layer_counts
from patterns.weights import (
    _head_dim,
    kv_bytes_per_token_layer,
    layer_bytes,
    layer_weights,
    scheme_of,
)

# The KV cache's element for the floors' cache reads: None the serving dtype's, "uint8" for
# --kv-cache-dtype fp8 (one byte). plan sets it while it prices (layouts.plan), so every floor
# of a plan reads the cache as the engine stores it without each caller passing it on.
KV_CACHE_DTYPE: ContextVar[str | None] = ContextVar("kv_cache_dtype", default=None)


@dataclass(frozen=True)
class StageWork:
    """One rank of one stage: what a token costs it."""

    layers: int
    dense_params: float  # every non-routed parameter used per token (LM head included)
    routed_active: float  # routed expert parameters one token uses on this rank
    dense_bytes: float  # bytes of the weights every step reads
    routed_bytes: float  # bytes of the rank's routed experts
    routed_experts: int  # experts whose share the rank holds (the fraction read is of these)
    heads: int  # attention heads on the rank


@dataclass(frozen=True)
class ComputeFloor:
    prefill_us: float
    decode_step_us: float


def stage_work(model: ModelConfig, layout: Layout, dtype: str) -> list[StageWork]:
    tp, b = layout.tp, DTYPE_BYTES[dtype]
    ep_size = layout.dp * tp if layout.ep else 1
    vocab_rank = padded_vocab(model.vocab_size) * model.hidden_size / tp
    out, first = [], 0
    for stage, count in enumerate(stage_layer_counts(model.num_hidden_layers, layout.pp)):
        dense = routed = dense_bytes = routed_bytes = 0.0
        for layer in range(first, first + count):
            w = layer_weights(model, layer, tp, ep_size)
            routed_rank = 0.0
            if model.is_moe_layer(layer):
                inter = model.moe_intermediate_size or model.intermediate_size
                experts = model.num_local_experts
                held = -(-experts // ep_size) if ep_size > 1 else experts / tp
                routed_rank = held * 3 * model.hidden_size * inter
                routed += model.num_experts_per_tok * 3 * model.hidden_size * inter / tp
            dense += w.linear + w.experts - routed_rank + w.plain
            kept, routed_stored = layer_bytes(model, layer, tp, ep_size, b)
            dense_bytes += kept
            routed_bytes += routed_stored
        first += count
        if stage == layout.pp - 1:  # the LM head: used and read every step
            dense += vocab_rank
            dense_bytes += vocab_rank * b
        experts = model.num_local_experts if model.is_moe else 0
        out.append(StageWork(count, dense, routed, dense_bytes, routed_bytes,
                             experts, max(model.num_attention_heads // tp, 1)))
    return out


def _peak(model: ModelConfig, gpu: str) -> float:
    """An fp8 checkpoint whose activations are fp8 too (W8A8) runs at the fp8 rate where the
    GPU has one (an A100 runs it weight-only, at bf16's); any other at bf16's."""
    spec, scheme = GPU_SPECS[gpu], scheme_of(model)
    return spec.fp8_flops if scheme is not None and scheme.fp8_compute else spec.bf16_flops


def step_floor_us(model: ModelConfig, layout: Layout, dtype: str, gpu: str,
                  prefill_tokens: int, prefill_pairs: float, decode_seqs: int,
                  context: float) -> float:
    """One step's floor through every stage (module doc): `prefill_tokens` prompt tokens
    whose causal attention covers `prefill_pairs` (query, key) pairs, and `decode_seqs`
    sequences decoding one token each at a mean context of `context` tokens."""
    return step_floor(model, layout, dtype, gpu)(prefill_tokens, prefill_pairs, decode_seqs,
                                                 context)


@cache
def _floor_terms(model: ModelConfig, layout: Layout, dtype: str, gpu: str,
                 kv_dtype: str | None = None) -> tuple[Any, ...]:
    """What `step_floor_us` reads of a layout, looked up once: (peak, bandwidth, head_dim,
    KV bytes a token and layer, EP spread, top-k, per run of alike stages its terms)."""
    work: list[tuple[Any, ...]] = []  # stages alike in a row: one term added `count` times
    for s in _work(model, layout, dtype):
        term = (2 * (s.dense_params + s.routed_active), s.heads, s.layers, s.dense_bytes,
                s.routed_bytes, s.routed_experts)
        if work and work[-1][:-1] == term:
            work[-1] = (*term, work[-1][-1] + 1)
        else:
            work.append((*term, 1))
    return (_peak(model, gpu), GPU_SPECS[gpu].hbm_bytes_per_s, _head_dim(model),
            kv_bytes_per_token_layer(model, layout.tp, kv_dtype or dtype),
            layout.dp if layout.ep else 1, model.num_experts_per_tok, tuple(work))


def step_floor(model: ModelConfig, layout: Layout, dtype: str,
               gpu: str) -> Callable[[int, float, int, float], float]:
    """`step_floor_us` of one layout, what does not vary step to step looked up once (plan
    prices thousands of steps a layout under --requests); the KV cache's element as
    KV_CACHE_DTYPE says."""
    return _step_floor(model, layout, dtype, gpu, KV_CACHE_DTYPE.get())


@cache
def _step_floor(model: ModelConfig, layout: Layout, dtype: str, gpu: str,
                kv_dtype: str | None) -> Callable[[int, float, int, float], float]:
    peak, bandwidth, d, kv_token, spread, top_k, work = _floor_terms(model, layout, dtype, gpu,
                                                                     kv_dtype)

    def floor(prefill_tokens: int, prefill_pairs: float, decode_seqs: int,
              context: float) -> float:
        tokens = prefill_tokens + decode_seqs
        routing = tokens * spread
        total = 0.0
        for params2, heads, layers, dense_bytes, routed_bytes, experts, count in work:
            reached = min(1.0, routing * top_k / experts) if experts else 0.0
            flops = (params2 * tokens
                     + (4 * prefill_pairs + 4 * decode_seqs * context) * heads * d * layers)
            read = (dense_bytes + reached * routed_bytes
                    + decode_seqs * context * kv_token * layers)
            stage = max(flops / peak, read / bandwidth)
            for _ in range(count):
                total += stage
        return total * 1e6
    return floor


def step_floors(model: ModelConfig, layout: Layout, dtype: str, gpu: str,
                prefill_tokens: Any, prefill_pairs: Any, decode_seqs: Any,
                context: Any) -> Any:
    """`step_floor`'s floor of many steps at once (numpy arrays of int tokens and sequences,
    float pairs and contexts: plan's --requests prices thousands a layout): the same
    operations in the same order on each element, so the same floats."""
    import numpy as np
    peak, bandwidth, d, kv_token, spread, top_k, work = _floor_terms(model, layout, dtype, gpu,
                                                                     KV_CACHE_DTYPE.get())
    tokens = prefill_tokens + decode_seqs
    routing = tokens * spread
    total = np.zeros(len(tokens))
    for params2, heads, layers, dense_bytes, routed_bytes, experts, count in work:
        reached = np.minimum(1.0, routing * top_k / experts) if experts else 0.0
        flops = (params2 * tokens
                 + (4 * prefill_pairs + 4 * decode_seqs * context) * heads * d * layers)
        read = (dense_bytes + reached * routed_bytes
                + decode_seqs * context * kv_token * layers)
        stage = np.maximum(flops / peak, read / bandwidth)
        for _ in range(count):
            total += stage
    return total * 1e6


def compute_floor(model: ModelConfig, layout: Layout, dtype: str, gpu: str, batch: int,
                  prompt: int, decode: int, budget: int | None = None) -> ComputeFloor:
    """The prefill's and the mean decode step's floor (module doc), in microseconds, for a
    DP replica of `batch` requests: the prefill's causal attention covers Sp^2 / 2 pairs a
    prompt; a decode step's context is Sp + Sd / 2. Under chunked prefill (`budget` tokens a
    step, the B x Sp prompt tokens taken in order) the prefill is the sum of its chunks'
    floors: every chunk reads the weights again, while the FLOPs add up to one pass's (a
    chunk's queries at positions a..b of their prompt cover (b^2 - a^2) / 2 pairs)."""
    floor = step_floor(model, layout, dtype, gpu)
    prefill = sum(floor(tokens, pairs, 0, 0.0)
                  for tokens, pairs in prefill_chunk_work(batch, prompt, budget))
    step = floor(0, 0.0, batch, prompt + decode / 2)
    return ComputeFloor(prefill, step)


def prefill_chunk_work(batch: int, prompt: int,
                       budget: int | None) -> list[tuple[int, float]]:
    """(tokens, causal pairs) of each prefill step when B x Sp tokens go `budget` a step."""
    total = batch * prompt
    step = total if budget is None else min(budget, total)
    out = []
    for start in range(0, total, step):
        end = min(start + step, total)
        pairs = 0.0
        for i in range(start // prompt, (end - 1) // prompt + 1):
            a, b = max(start - i * prompt, 0), min(end - i * prompt, prompt)
            pairs += (b * b - a * a) / 2
        out.append((end - start, pairs))
    return out


@cache
def _work(model: ModelConfig, layout: Layout, dtype: str) -> tuple[StageWork, ...]:
    return tuple(stage_work(model, layout, dtype))
