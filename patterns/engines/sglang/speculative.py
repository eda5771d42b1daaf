"""Speculative decoding in SGLang (EAGLE / EAGLE3 / NEXTN-MTP worker), chain drafts.

`--speculative-config` keeps vLLM's spelling; for SGLang k = num_speculative_tokens is
`--speculative-num-steps k --speculative-eagle-topk 1 --speculative-num-draft-tokens k+1`
(a chain of k drafts, the common low-latency setting). The worker that runs is the V2 one:
at modal-projects/sglang @ 8905cbd4 `python/sglang/srt/speculative/` holds
`eagle_worker_v2.py` and no `eagle_worker.py`. `forward_batch_generation`
(`eagle_worker_v2.py:1122-1215`):
- an extend (prefill) batch: the target's extend (full hidden states kept), then
  `_draft_extend_for_prefill` (742-855): the draft model over the same tokens, its logits
  for the last token of each request (num_tokens_per_req 1, CaptureHiddenMode.LAST);
- a decode batch: `draft()` (500-560) -> `draft_forward` (563-660), k - 1 draft forwards of
  B x topk tokens ("We don't need to run the last forward. we get 1 token from draft
  prefill and (#spec steps - 1) tokens here"), each with its logits; `verify()`: the target
  over k + 1 tokens a request (TARGET_VERIFY), logits for each; then
  `_draft_extend_for_decode` (869-960): the draft model over num_draft_tokens = k + 1 tokens
  a request, its logits for every one of them (num_tokens_for_logprob_per_req = k + 1; the
  last accepted is picked after), B x (k + 1) rows.
Under the decode CUDA graphs the batch is padded to SGLang's speculative decode graph list
(`patterns.engines.sglang.profile.decode_graph_sizes(speculative=True)`, capped by
max_running_requests, 48 by default with speculation) and every padded row's logits are
gathered, as without speculation. Mixed chunks are off with speculation (SGLang refuses
them together).
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
        ops += _pass(st, spec, verify, verify, "draft_extend_after_decode")
    return verify, ops
