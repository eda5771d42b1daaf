"""Speculative decoding in SGLang (EAGLE / EAGLE3 / NEXTN-MTP worker), chain drafts.

`--speculative-config` keeps vLLM's spelling; for SGLang k = num_speculative_tokens is
`--speculative-num-steps k --speculative-eagle-topk 1 --speculative-num-draft-tokens k+1`
(a chain of k drafts, the common low-latency setting). sgl-project/sglang @ 00559eac,
`python/sglang/srt/speculative/eagle_worker.py`, `forward_batch_generation`:
- an extend (prefill) batch: the target's extend (`forward_target_extend`, full hidden
  states kept), then `forward_draft_extend`: the draft model over the same tokens, its
  logits for the last token of each request (CaptureHiddenMode.LAST);
- a decode batch: `draft()` -> `draft_forward`, k - 1 draft forwards of B x topk tokens
  ("We don't need to run the last forward. we get 1 token from draft prefill and (#spec
  steps - 1) tokens here"), each with its logits; `verify()`: the target over
  num_tokens_per_req = k + 1 tokens a request (ForwardMode.TARGET_VERIFY), logits for each;
  then `forward_draft_extend_after_decode`: the draft model over k + 1 tokens a request
  (num_tokens_per_req = speculative_num_steps + 1), logits of the last (LAST).
Under the decode CUDA graphs the batch is padded to the decode graph sizes
(`patterns.engines.sglang.decode_graph_sizes`; SGLang may lower the largest with
speculation: not modelled) and every padded row's logits are gathered, as without
speculation. Mixed chunks are off with speculation (SGLang refuses them together).
"""

from patterns.engines.sglang import profile as sglang_profile
from patterns.engines.sglang.transports import sglang_logits_allgather
from patterns.ops import Op
from patterns.speculative import SpecConfig, draft_pass
from patterns.stage import Stage, pad_to
from patterns.workload.schedule import StepShape


def _pass(st: Stage, spec: SpecConfig, tokens: int, rows: int, tag: str) -> list[Op]:
    transport = sglang_logits_allgather(rows, st.dtype, st.options.gpu, st.options.nccl_only)
    return draft_pass(st, spec, tokens, rows, tag, sglang_profile._allreduce, transport)


def extend_drafter_ops(st: Stage, spec: SpecConfig, shape: StepShape,
                       tokens: int) -> list[Op]:
    """After a prefill (extend) step of `tokens` (padded): the draft extend over them."""
    if st.tp == 1 or spec.method == "ngram":
        return []
    return _pass(st, spec, tokens, shape.prefill_seqs, "draft_extend")


def decode_step_ops(st: Stage, spec: SpecConfig, shape: StepShape,
                    graph_sizes: list[int]) -> tuple[int, list[Op]]:
    """(tokens the verify runs with, calls) of one decode step of B = shape.decode_seqs
    requests: k - 1 draft forwards, the target's verify, the draft extend after it."""
    batch = shape.decode_seqs
    graphed = bool(graph_sizes) and batch <= graph_sizes[-1]
    rows = pad_to(graph_sizes, batch) if graphed else batch
    per = 1 + spec.k
    ops: list[Op] = []
    if st.tp > 1 and spec.method != "ngram":
        for i in range(spec.k - 1):
            ops += _pass(st, spec, rows, rows, f"draft.{i}")
    verify = rows * per
    # The verify's logits: every token of every (padded) request.
    ops += sglang_profile.forward(st, verify, batch * per, verify if graphed else None)
    if st.tp > 1 and spec.method != "ngram":
        ops += _pass(st, spec, verify, rows, "draft_extend_after_decode")
    return verify, ops
