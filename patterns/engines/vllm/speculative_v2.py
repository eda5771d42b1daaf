"""Speculative decoding under vLLM's Model Runner V2 (its default for dense models): how the
target's verify steps and the drafter's passes pick their CUDA graphs (Model Runner V1:
`speculative.py` here).

Code read: vLLM upstream main of 2026-08-03 = modal-projects/vllm @ c8109375, `vllm/`:
- capture sizes: `config/vllm.py:1826-1870` `_set_cudagraph_sizes` takes the largest as
  min(max_num_seqs x (1 + k) x 2, 512, max_num_batched_tokens) with the plain ladder
  [1, 2, 4, 8, ..., 248, 256 + 16 i] below it; `config/compilation.py:1476-1490` rounds them
  to multiples of 1 + k only `if not use_v2_model_runner` ("MRV2 handles cudagraph capture
  sizing in cudagraph_utils.py").
- `v1/worker/gpu/cudagraph_utils.py:177-290` (`_init_candidates`): for each capture size s,
  a FULL uniform-decode graph at round_up(s, 1 + k) tokens for round_up(s, 1 + k) / (1 + k)
  requests (when within max_num_seqs requests and the largest size), and a PIECEWISE graph
  at s; a batch of T tokens takes the smallest graph token count >= T, and
  `dispatch` (365-391) the first compatible graph there (`_is_compatible`, 72-89: a FULL
  decode graph only for a uniform batch of 1 + k tokens a request), else eager.
- the drafter (`v1/worker/gpu/spec_decode/autoregressive/speculator.py` @ c8109375):
  `propose` (135-281) runs the draft prefill over the target's padded tokens through a
  graph manager of the same kind (`init_cudagraph_manager`, 67-88, decode_query_len 1 + k),
  then k - 1 draft decodes of one token a request through a FULL_DECODE_ONLY manager with
  decode_query_len 1: graphs at the plain capture sizes up to max_num_seqs. A FULL graph
  records the model, compute_logits and sampling for the padded request count
  (`autoregressive/cudagraph_utils.py:40-66`: num_reqs = desc.num_reqs), so its logits
  all-gather carries the padded rows; piecewise and eager passes gather the B real rows
  (`_prefill`, 342-379: last_hidden_states[last_token_indices]).
"""

from dataclasses import dataclass

from patterns.engines.vllm import profile as vllm_profile
from patterns.engines.vllm.rules import V1_MAX_CAPTURE
from patterns.ops import Op
from patterns.speculative import SpecConfig, draft_pass
from patterns.stage import Stage, pad_to
from patterns.workload.schedule import StepShape
from patterns.workload.steps import StepGraph


@dataclass(frozen=True)
class V2Graphs:
    """Model Runner V2's graphs under speculation: the plain capture sizes, the FULL
    uniform-decode token counts, and the request bound."""

    sizes: tuple[int, ...]
    decode: frozenset[int]
    q: int  # 1 + k
    max_reqs: int

    def dispatch(self, tokens: int, uniform: bool) -> tuple[StepGraph, int | None]:
        """(the step's graph, the padded request count of a FULL graph, else None)."""
        keys = sorted(set(self.sizes) | self.decode)
        key = next((k for k in keys if k >= tokens), None)
        if key is None:
            return StepGraph(tokens, "eager"), None
        if uniform and key in self.decode:
            return StepGraph(key, "full"), key // self.q
        if key in self.sizes:
            return StepGraph(key, "piecewise"), None
        return StepGraph(tokens, "eager"), None  # only a FULL decode graph there


def v2_graphs(max_num_seqs: int, max_batched_tokens: int, k: int) -> V2Graphs:
    q = 1 + k
    cap = min(max_num_seqs * q * 2, V1_MAX_CAPTURE, max_batched_tokens)
    sizes = [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, cap + 1, 16)] if s <= cap]
    if max_batched_tokens <= cap and max_batched_tokens not in sizes:
        sizes.append(max_batched_tokens)
    limit = min(max_num_seqs * q, cap)
    decode = frozenset(r for r in (-(-s // q) * q for s in sizes) if r <= limit)
    return V2Graphs(tuple(sorted(sizes)), decode, q, max_num_seqs)


def drafter_ops_v2(st: Stage, spec: SpecConfig, shape: StepShape, graph: StepGraph,
                   padded_reqs: int | None, graphs: V2Graphs) -> list[Op]:
    """The drafter's calls after a target step that ran as `graph` (V2)."""
    if spec.method == "ngram" or st.tp == 1:
        return []
    batch = shape.prefill_seqs + shape.decode_seqs
    ops = draft_pass(st, spec, graph.tokens, padded_reqs or batch, "draft.0",
                     vllm_profile._allreduce)
    decode_sizes = [s for s in graphs.sizes if s <= graphs.max_reqs]
    later = pad_to(decode_sizes, batch) if decode_sizes and batch <= decode_sizes[-1] else batch
    for i in range(1, spec.k):
        ops += draft_pass(st, spec, later, later, f"draft.{i}", vllm_profile._allreduce)
    return ops
