"""Speculative decoding in vLLM V1 under Model Runner V1: the target's verify steps and the
drafter's passes (the --speculative-config and a drafter's pass: `patterns/speculative.py`;
Model Runner V2, the default for dense models: `speculative_v2.py`).

`--speculative-config '{"method": "mtp"|"eagle"|"eagle3"|"ngram", "num_speculative_tokens": k}'`
(vLLM's own flag and keys) and the mean tokens a verify step yields (`--acceptance-length`,
vLLM's "mean acceptance length", 1 + accepted drafts / drafts) or the per-position
acceptance rates vLLM logs (`--acceptance-rate r1,r2,...`, r_i the share of steps whose
draft i was accepted, so the length is 1 + sum r_i).

What vLLM does (vllm-project/vllm; `config/speculative.py: use_eagle()` is True for eagle,
eagle3 and mtp, so one `EagleProposer` drafts for all three):
- the scheduler gives each decoding request 1 + k tokens a step (num_tokens_with_spec,
  `v1/core/sched/scheduler.py` @ 00024d31), and the target computes logits for each of them
  (the verify rows), so its logits all-gather is [P + D(1 + k), V/tp];
- `v1/spec_decode/eagle.py` @ 008603a3, `EagleProposer.propose()`: after every target step
  the drafter runs once over the step's tokens (num_tokens, padded by `pad_for_cudagraph`
  when at most max_cudagraph_capture_size), then `compute_logits` of the last token of each
  of the B scheduled requests ("sample_hidden_states = last_hidden_states[
  last_token_indices]"): a TP all-gather [B, V/tp]; with k = 1 it returns there ("Early
  exit if there is only one draft token"); else k - 1 more passes of B tokens (padded the
  same way) each with its own logits all-gather [B, V/tp];
- each drafter pass is a small model on the target's TP group: the vocab-parallel
  embedding's all-reduce, then per draft layer the attention o_proj all-reduce and the MLP's
  (DeepSeek-V3's MTP block is one MoE decoder layer, `models/deepseek_mtp.py`: embed_tokens,
  eh_proj (replicated), mtp_block, shared_head; EAGLE heads one Llama layer,
  `models/llama_eagle.py`, `llama_eagle3.py`), and its lm_head's all-gather; eagle3 heads
  may carry their own vocabulary (`draft_vocab_size`, give it in the JSON);
- ngram proposes on the CPU: no drafter collectives;
- CUDA graphs (`config/vllm.py: _set_cudagraph_sizes`, decode_query_len = 1 +
  num_speculative_tokens): the largest capture size is min(max_num_seqs x (1 + k) x 2, 512,
  max_num_batched_tokens), and `config/compilation.py:
  adjust_cudagraph_sizes_for_spec_decode` @ 002284db rounds every size up to a multiple of
  1 + k, dropping those above the largest ([1 + k] when none is left);
  `v1/cudagraph_dispatcher.py` then runs a uniform decode batch (every request 1 + k tokens)
  in a full graph.
Each all-reduce takes the target's transport rule (`transports.vllm_allreduce`).
SGLang's EAGLE worker: `patterns/engines/sglang/speculative.py`.
"""

from patterns.engines.vllm import profile as vllm_profile
from patterns.engines.vllm.rules import V1_MAX_CAPTURE
from patterns.ops import Op
from patterns.speculative import SpecConfig, draft_pass
from patterns.stage import Stage, pad_to
from patterns.workload.schedule import StepShape


def spec_capture_sizes(max_num_seqs: int, max_batched_tokens: int, k: int) -> list[int]:
    q = 1 + k
    cap = min(max_num_seqs * q * 2, V1_MAX_CAPTURE, max_batched_tokens)
    sizes = [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, cap + 1, 16)] if s <= cap]
    if max_batched_tokens <= cap:
        sizes.append(max_batched_tokens)
    rounded = sorted({r for r in (-(-s // q) * q for s in sizes) if r <= cap})
    return rounded or ([q] if q <= cap else [])


def drafter_ops(st: Stage, spec: SpecConfig, shape: StepShape, step_tokens: int,
                sizes: list[int]) -> list[Op]:
    """The drafter's calls after a target step of `step_tokens` (padded) tokens."""
    if spec.method == "ngram" or st.tp == 1:
        return []
    rows = shape.prefill_seqs + shape.decode_seqs  # B: every scheduled request
    ops = draft_pass(st, spec, step_tokens, rows, "draft.0", vllm_profile._allreduce)
    later = pad_to(sizes, rows) if sizes and rows <= sizes[-1] else rows
    for i in range(1, spec.k):
        ops += draft_pass(st, spec, later, rows, f"draft.{i}", vllm_profile._allreduce)
    return ops
