"""Hand-computed speculative-decoding cells: DeepSeek-V3 MTP k=1 and Llama-3.1-8B EAGLE k=3
at TP4 and TP8, per verify step and per output token.

Rules (vllm-project/vllm): the scheduler gives a decoding request 1 + k tokens a step
(`v1/core/sched/scheduler.py` @ 00024d31, num_tokens_with_spec) and the target computes
logits for each (the verify rows); `v1/spec_decode/eagle.py` @ 008603a3
`EagleProposer.propose()` runs the drafter once over the step's tokens, gathers the logits
of the last token of each request (`compute_logits(sample_hidden_states)`), returns there
when k == 1 ("Early exit if there is only one draft token"), else runs k - 1 more passes of
B tokens, each padded by `pad_for_cudagraph` and each with its own logits all-gather.
Capture sizes (`config/vllm.py _set_cudagraph_sizes`, `config/compilation.py
adjust_cudagraph_sizes_for_spec_decode`): cap = min(1024 x (1 + k) x 2, 512, 8192) = 512,
sizes rounded up to multiples of 1 + k: k=1 -> 2, 4, 8, ...; k=3 -> 4, 8, 16, ...
One request, prompt 16, output 9 (8 tokens after the prefill's). SGLang's cells at the end.
"""

import json
import math

import pytest

from microbench.views.workload import workload_document
from patterns import ConfigError, EngineOptions, Layout, OpKind, Transport, resolve_model
from patterns.engines.vllm.speculative import spec_capture_sizes
from patterns.engines.workloads import workload_pattern
from patterns.speculative import parse_spec
from patterns.workload.requests import Request


def verify_step(model: str, spec: str, accept: float, tp: int):
    s = parse_spec(spec, accept, None)
    p = workload_pattern("vllm", resolve_model(model), Layout(tp=tp), [Request(0, 16, 9)],
                         None, EngineOptions(), None, s)
    _prefill, decode = p.schedule.segments
    return p, decode.repeat, p.segment_steps[1], p.step_graphs[1]


def per_output_token(pattern) -> float:
    """The request's decode bytes per output token after the first, as `pattern
    --format json` reports it (per_request.decode_bytes_per_token)."""
    return workload_document(pattern)["per_request"][0]["decode_bytes_per_token"]


MTP1 = '{"method": "mtp", "num_speculative_tokens": 1}'
EAGLE3 = '{"method": "eagle", "num_speculative_tokens": 3}'


@pytest.mark.parametrize("tp, shard, step_bytes, per_token", [
    # DeepSeek-V3: h 7168, 61 layers (3 dense + 58 MoE, each one MLP all-reduce at dp 1),
    # vocab 129280 (a multiple of 64). A verify step: T = 1 + 1 = 2 (capture size 2).
    # Target: 1 embed + 61 x 2 = 123 all-reduces [2, 7168] + logits all-gather [2, V/tp].
    # MTP pass (one, k = 1): embed, o_proj, MoE experts all-reduces [2, 7168] + logits
    # all-gather [1, V/tp]. All-reduce input 2 x 7168 x 2 B = 28,672 B; 126 of them =
    # 3,612,672 B.
    # TP4: shard 129280/4 = 32320: + 2 x 32320 x 2 = 129,280 + 1 x 32320 x 2 = 64,640
    #      -> 3,806,592 B a verify step.
    # Per output token: 5 verify steps carry the 8 tokens after the first ->
    # 5 x 3,806,592 / 8 = 2,379,120 B (at the mean, 3,806,592 / 1.8 = 2,114,773.3 B).
    (4, 32320, 3_806_592, 2_379_120),
    # TP8: shard 16160: + 64,640 + 32,320 -> 3,709,632 B; 5 x 3,709,632 / 8 = 2,318,520 B.
    (8, 16160, 3_709_632, 2_318_520),
])
def test_deepseek_v3_mtp_k1(tp, shard, step_bytes, per_token):
    p, steps, step, graph = verify_step("deepseek-v3", MTP1, 1.8, tp)
    assert (graph.tokens, graph.graph) == (2, "full")
    # 8 tokens after the prefill at 1.8 a step: ceil(8 / 1.8) = ceil(4.44) = 5 verify steps.
    assert steps == 5
    ars = [o for o in step.ops if o.kind == OpKind.ALLREDUCE]
    gathers = [(o.tag, o.shape) for o in step.ops if o.kind == OpKind.ALLGATHER]
    assert len(ars) == 126 and {o.shape for o in ars} == {(2, 7168)}
    assert sum(o.tag.startswith("draft.0.") for o in ars) == 3
    assert gathers == [("logits", (2, shard)), ("draft.0.logits", (1, shard))]
    assert len(step.ops) == 128
    assert sum(o.bytes for o in step.ops) == step_bytes
    assert per_output_token(p) == per_token
    # 28,672 B is under the 2 MiB (TP4) / 512 KiB (TP8) FlashInfer fusion limit on H100.
    assert {o.transport for o in ars} == {Transport.FUSED_ALLREDUCE_RMSNORM}


@pytest.mark.parametrize("tp, shard, step_bytes, per_token", [
    # Llama-3.1-8B: h 4096, 32 layers, vocab 128256, Model Runner V1 (--model-runner v1).
    # A verify step: T = 1 + 3 = 4 (capture size 4). Target: 1 + 2 x 32 = 65 all-reduces
    # [4, 4096] + logits all-gather [4, V/tp]. EAGLE head (one Llama layer): pass 0 over the
    # step's 4 tokens; passes 1 and 2 over B = 1 token padded to the smallest capture size,
    # 4 (V1's sizes are rounded to multiples of 1 + k): each pass embed, o_proj and
    # down_proj all-reduces [4, 4096] + logits all-gather [1, V/tp].
    # All-reduces: 65 + 3 x 3 = 74 of 4 x 4096 x 2 B = 32,768 B -> 2,424,832 B.
    # TP4: shard 32064: target 4 x 32064 x 2 = 256,512; drafter 3 x 64,128 = 192,384
    #      -> 2,873,728 B a verify step.
    # Per output token: 4 verify steps for 8 tokens -> 4 x 2,873,728 / 8 = 1,436,864 B.
    (4, 32064, 2_873_728, 1_436_864),
    # TP8: shard 16032: 128,256 + 3 x 32,064 = 96,192 -> 2,649,280 B; x 4 / 8 = 1,324,640.
    (8, 16032, 2_649_280, 1_324_640),
])
def test_llama_eagle_k3_model_runner_v1(tp, shard, step_bytes, per_token):
    s = parse_spec(EAGLE3, 2.5, None)
    p = workload_pattern("vllm", resolve_model("llama-3.1-8b"), Layout(tp=tp),
                         [Request(0, 16, 9)], None, EngineOptions(model_runner="v1"), None, s)
    step, graph, steps = p.segment_steps[1], p.step_graphs[1], p.schedule.segments[1].repeat
    assert (graph.tokens, graph.graph) == (4, "full")
    assert steps == 4  # ceil(8 / 2.5) = ceil(3.2) = 4 verify steps
    ars = [o for o in step.ops if o.kind == OpKind.ALLREDUCE]
    gathers = [(o.tag, o.shape) for o in step.ops if o.kind == OpKind.ALLGATHER]
    assert len(ars) == 74 and {o.shape for o in ars} == {(4, 4096)}
    assert gathers == [("logits", (4, shard))] + [(f"draft.{i}.logits", (1, shard))
                                                  for i in range(3)]
    assert len(step.ops) == 78
    assert sum(o.bytes for o in step.ops) == step_bytes
    assert per_output_token(p) == per_token


@pytest.mark.parametrize("tp, shard, step_bytes, per_token", [
    # The same under Model Runner V2, Llama's default (speculative_v2.py @ c8109375): the
    # verify step of T = 4 replays the FULL decode graph of 4 tokens, 1 request; the draft
    # prefill takes that graph too (its logits [1, V/tp], the padded request count, 1); the
    # draft decodes (passes 1, 2) take the plain size of B = 1: [1, 4096] all-reduces.
    # All-reduces: 65 + 3 = 68 of 32,768 B + 6 of 1 x 4096 x 2 = 8,192 B -> 2,277,376 B.
    # TP4: + 256,512 + 192,384 = 2,726,272 B; 4 steps / 8 tokens -> 1,363,136 B.
    (4, 32064, 2_726_272, 1_363_136),
    # TP8: + 128,256 + 96,192 = 2,501,824 B; x 4 / 8 = 1,250,912 B.
    (8, 16032, 2_501_824, 1_250_912),
])
def test_llama_eagle_k3(tp, shard, step_bytes, per_token):
    p, steps, step, graph = verify_step("llama-3.1-8b", EAGLE3, 2.5, tp)
    assert p.options.model_runner == "v2"
    assert (graph.tokens, graph.graph) == (4, "full")
    assert steps == 4
    ars = [o.shape for o in step.ops if o.kind == OpKind.ALLREDUCE]
    assert ars == [(4, 4096)] * 68 + [(1, 4096)] * 6
    gathers = [(o.tag, o.shape) for o in step.ops if o.kind == OpKind.ALLGATHER]
    assert gathers == [("logits", (4, shard))] + [(f"draft.{i}.logits", (1, shard))
                                                  for i in range(3)]
    assert sum(o.bytes for o in step.ops) == step_bytes
    assert per_output_token(p) == per_token


@pytest.mark.parametrize("runner, k, batch, want", [
    # k = 3, 3 requests: T = 12. V1's sizes are multiples of 4 ([4, 8, 16, ...]): FULL at
    # 16; drafter pass 0 over 16 tokens with 3 logits rows, passes 1-2 over B = 3 padded
    # to 4 tokens, 3 rows (eagle.py: compute_logits of the real requests).
    ("v1", 3, 3, ((16, "full"), (16, 3), [(4, 3), (4, 3)])),
    # V2: 12 is no capture size; the next, 16 (from size 16), holds a FULL decode graph of
    # 16 / 4 = 4 requests: the draft prefill's logits carry 4 rows (padded); the draft
    # decodes take the plain size 4 >= 3: 4 tokens, 4 rows inside their FULL graphs.
    ("v2", 3, 3, ((16, "full"), (16, 4), [(4, 4), (4, 4)])),
    # k = 2, 4 requests: T = 12. V1 rounds [1, 2, 4, 8, 16, 24, ...] to multiples of 3:
    # [3, 6, 9, 18, 24, ...]: FULL at 18. V2: the decode graphs sit at 3, 6, 9, 18, 24, ...
    # and the plain ones at 1, 2, 4, 8, 16, 24, ...: the smallest >= 12 is 16, a PIECEWISE
    # graph only: the drafter's prefill gathers the 4 real rows; its one draft decode pads
    # B = 4 to the plain size 4 (V1: to the rounded size 6, with 4 real rows).
    ("v1", 2, 4, ((18, "full"), (18, 4), [(6, 4)])),
    ("v2", 2, 4, ((16, "piecewise"), (16, 4), [(4, 4)])),
])
def test_model_runner_changes_spec_graphs(runner, k, batch, want):
    s = parse_spec(f'{{"method": "eagle", "num_speculative_tokens": {k}}}', 2.0, None)
    p = workload_pattern("vllm", resolve_model("llama-3.1-8b"), Layout(tp=2),
                         [Request(0, 16, 9)] * batch, None,
                         EngineOptions(model_runner=runner), None, s)
    graph, step = p.step_graphs[1], p.segment_steps[1]
    assert p.schedule.segments[1].shape.decode_seqs == batch
    passes = []
    for i in range(k):
        tag = f"draft.{i}"
        ar = next(o for o in step.ops if o.tag == f"{tag}.embed_tokens")
        lg = next(o for o in step.ops if o.tag == f"{tag}.logits")
        passes.append((ar.shape[0], lg.shape[0]))
    assert ((graph.tokens, graph.graph), passes[0], passes[1:]) == want


def test_capture_sizes_round_up_to_multiples_of_1_plus_k():
    # max_num_seqs 4, budget 64, k 1: cap = min(4 x 2 x 2, 512, 64) = 16; base sizes
    # [1, 2, 4, 8, 16] rounded up to multiples of 2 -> [2, 4, 8, 16].
    assert spec_capture_sizes(4, 64, 1) == [2, 4, 8, 16]
    # k 2: cap = min(4 x 3 x 2, 512, 64) = 24; [1, 2, 4, 8, 16, 24] -> multiples of 3:
    # 3, 3, 6, 9, 18, 24 -> [3, 6, 9, 18, 24].
    assert spec_capture_sizes(4, 64, 2) == [3, 6, 9, 18, 24]


def test_acceptance_rates_give_the_length():
    # vLLM's per-position rates 0.8, 0.5, 0.2: mean length 1 + 0.8 + 0.5 + 0.2 = 2.5.
    assert parse_spec(EAGLE3, None, "0.8,0.5,0.2").acceptance_length == pytest.approx(2.5)


@pytest.mark.parametrize("spec, length, rate, words", [
    ('{"method": "medusa", "num_speculative_tokens": 2}', 2.0, None, "not modelled"),
    (EAGLE3, 4.5, None, "between 1 and"),
    (EAGLE3, None, None, "needs one of"),
    (EAGLE3, None, "0.5,0.8,0.1", "not increasing"),
    ("{", 2.0, None, "not JSON"),
])
def test_bad_spec_refused(spec, length, rate, words):
    with pytest.raises(ConfigError, match=words):
        parse_spec(spec, length, rate)


def test_mtp_needs_mtp_layers():
    s = parse_spec(MTP1, 1.5, None)
    with pytest.raises(ConfigError, match="MTP layers"):
        workload_pattern("vllm", resolve_model("llama-3.1-8b"), Layout(tp=2),
                         [Request(0, 8, 4)], None, EngineOptions(), None, s)


# SGLang (modal-projects/sglang @ 8905cbd4 speculative/eagle_worker_v2.py:1122-1215,
# forward_batch_generation), k = 3 as --speculative-num-steps 3 --speculative-eagle-topk 1
# --speculative-num-draft-tokens 4. A decode step of one request (graph size 1 in the
# speculative list): draft_forward runs k - 1 = 2 draft forwards of 1 token ("We don't need
# to run the last forward"), each 3 all-reduces [1, 4096] (8,192 B) + logits [1, V/tp];
# verify: the target over 1 x 4 = 4 tokens, 65 all-reduces [4, 4096] (32,768 B) + logits
# [4, V/tp]; _draft_extend_for_decode (869-960): the draft over 4 tokens, 3 all-reduces
# [4, 4096] + logits of all 4 tokens [4, V/tp] (num_tokens_for_logprob_per_req = 4).
# All-reduces: 6 x 8,192 + 68 x 32,768 = 2,277,376 B; calls 2 x 4 + 66 + 4 = 78.


@pytest.mark.parametrize("tp, shard, step_bytes", [
    # TP4: logits 2 x (1 x 32064 x 2) = 128,256 + 2 x (4 x 32064 x 2) = 513,024
    # -> 2,277,376 + 641,280 = 2,918,656 B.
    (4, 32064, 2_918_656),
    # TP8: 2 x 32,064 + 2 x 128,256 = 320,640 -> 2,598,016 B.
    (8, 16032, 2_598_016),
])
def test_sglang_llama_eagle_k3(tp, shard, step_bytes):
    s = parse_spec(EAGLE3, 2.5, None)
    p = workload_pattern("sglang", resolve_model("llama-3.1-8b"), Layout(tp=tp),
                         [Request(0, 16, 9)], None, EngineOptions(), None, s)
    decode = p.schedule.segments[1]
    step = p.segment_steps[1]
    # ceil(8 / 2.5) = 4 verify steps yield its tokens; under the overlap scheduler (SGLang's
    # default) the request, not yet known finished, rides one more decode batch: 5.
    assert decode.repeat == 5 and tuple(p.schedule.spans[0].decode) == (1, 5)
    assert [(o.tag, o.shape) for o in step.ops if o.tag.endswith("logits")] == [
        ("draft.0.logits", (1, shard)), ("draft.1.logits", (1, shard)),
        ("logits", (4, shard)), ("draft_extend_after_decode.logits", (4, shard))]
    assert len(step.ops) == 78
    assert sum(o.bytes for o in step.ops) == step_bytes
    # Llama is not in SGLang's fusion list: custom all-reduce; bf16 logits of <= 128 rows
    # on H100 go through the multimem all-gather (patterns/transports.py).
    assert {o.transport for o in step.ops if o.kind == OpKind.ALLREDUCE} == {
        Transport.CUSTOM_ALLREDUCE}
    assert {o.transport for o in step.ops if o.kind == OpKind.ALLGATHER} == {
        Transport.MULTIMEM}


def test_sglang_deepseek_v3_mtp_k1_tp4():
    # k = 1: no draft forward before the verify; verify over 2 tokens: 123 all-reduces
    # [2, 7168] + logits [2, 32320]; draft extend after decode over 2 tokens: 3 all-reduces
    # + logits of both [2, 32320]. Bytes: 126 x 28,672 + 129,280 + 129,280 = 3,871,232 B
    # (vLLM's drafter, 3,806,592 B above, gathers the last token's logits only).
    s = parse_spec(MTP1, 1.8, None)
    p = workload_pattern("sglang", resolve_model("deepseek-v3"), Layout(tp=4),
                         [Request(0, 16, 9)], None, EngineOptions(), None, s)
    step = p.segment_steps[1]
    # ceil(8 / 1.8) = 5 verify steps, + 1 ride under the overlap scheduler.
    assert p.schedule.segments[1].repeat == 6
    sync = workload_pattern("sglang", resolve_model("deepseek-v3"), Layout(tp=4),
                            [Request(0, 16, 9)], None,
                            EngineOptions(disable_overlap_schedule=True), None, s)
    assert sync.schedule.segments[1].repeat == 5 and sync.segment_steps[1] == step
    assert len(step.ops) == 128 and sum(o.bytes for o in step.ops) == 3_871_232
    assert step.ops[-1].tag == "draft_extend_after_decode.logits"


@pytest.mark.parametrize("method, accept, async_on, verifies", [
    # vLLM's async scheduling (`v1/core/sched/scheduler.py:485-502` @ c8109375): at
    # schedule(n + 1), before update_from_output(n), a request is skipped only when step n
    # reaches max_tokens even if every draft is rejected. Output 9: 8 tokens after the
    # prefill's. a = 3: ceil(8 / 3) = 3 verifies; before the last the request holds
    # 1 + 2 x 3 = 7 tokens, so the last must yield 2 > 1: verified once more (4 steps).
    ("eagle", 3.0, None, 4), ("eagle", 3.0, True, 4), ("eagle", 3.0, False, 3),
    # a = 2.5: ceil(8 / 2.5) = 4 verifies; before the last 1 + 3 x 2.5 = 8.5, the last must
    # yield 0.5 <= 1: skipped, no extra verify.
    ("eagle", 2.5, None, 4), ("eagle", 2.5, False, 4),
    # ngram: vLLM turns async scheduling off (config/vllm.py:1095-1117): 3 verifies.
    ("ngram", 3.0, None, 3), ("ngram", 3.0, False, 3),
])
def test_async_scheduling_wasted_verify(method, accept, async_on, verifies):
    s = parse_spec(f'{{"method": "{method}", "num_speculative_tokens": 3}}', accept, None)
    p = workload_pattern("vllm", resolve_model("llama-3.1-8b"), Layout(tp=4),
                         [Request(0, 16, 9)], None, EngineOptions(async_scheduling=async_on),
                         None, s)
    _prefill, decode = p.schedule.segments
    assert decode.repeat == verifies
    # The request's own decode steps (its TPOT) are the ones that yield tokens.
    assert tuple(p.schedule.spans[0].decode) == (1, 1 + math.ceil(8 / accept))


def test_async_scheduling_with_ngram_refused():
    # config/vllm.py:1064-1083 @ c8109375: async scheduling asked for with a drafter it does
    # not support is a ValueError in vLLM.
    s = parse_spec('{"method": "ngram", "num_speculative_tokens": 3}', 2.0, None)
    with pytest.raises(ConfigError, match="--async-scheduling with ngram"):
        workload_pattern("vllm", resolve_model("llama-3.1-8b"), Layout(tp=4),
                         [Request(0, 16, 9)], None, EngineOptions(async_scheduling=True),
                         None, s)


@pytest.mark.parametrize("given, first_batch", [
    # SGLang sets max_running_requests to 48 with speculative decoding when none is given
    # (arg_groups/speculative_hook.py:507-511 @ 8905cbd4): of 50 prompts of 4 tokens
    # arriving at 0, the first extend takes 48 (192 tokens, within the 8192 chunk).
    (None, 48),
    (64, 50),  # --max-running-requests 64 given: all 50 (200 tokens).
])
def test_sglang_speculation_caps_running_requests_at_48(given, first_batch):
    s = parse_spec('{"method": "eagle", "num_speculative_tokens": 1}', 1.5, None)
    p = workload_pattern("sglang", resolve_model("llama-3.1-8b"), Layout(tp=2),
                         [Request(0, 4, 3)] * 50, None, EngineOptions(max_num_seqs=given),
                         None, s)
    first = p.schedule.segments[0].shape
    assert (first.prefill_seqs, first.prefill_tokens) == (first_batch, 4 * first_batch)


@pytest.mark.parametrize("k, options", [
    # vLLM's defaults: max_num_seqs 1024 x (1 + 8) = 9216 > 8192 tokens, a legal setting
    # (vLLM does not check it); two requests decode 2 x 9 = 18 tokens a step.
    (8, {}),
    # k = 3 with a 2048-token budget: 1024 x 4 = 4096 > 2048, legal too.
    (3, {"max_batched_tokens": 2048}),
])
def test_legal_speculation_budgets_not_refused(k, options):
    s = parse_spec(f'{{"method": "eagle", "num_speculative_tokens": {k}}}', 2.0, None)
    p = workload_pattern("vllm", resolve_model("llama-3.1-8b"), Layout(tp=2),
                         [Request(0, 16, 9)] * 2, None, EngineOptions(**options), None, s)
    decode = p.schedule.segments[1].shape
    assert (decode.decode_seqs, decode.tokens) == (2, 2 * (1 + k))


def test_decodes_beyond_the_budget_refused_when_they_happen():
    # Budget 8, k = 3: three requests decoding need 3 x 4 = 12 > 8 tokens: vLLM would leave
    # one out of the step (not modelled): refused at the step it happens.
    s = parse_spec(EAGLE3, 2.0, None)
    with pytest.raises(ConfigError, match="step 1: 3 requests decode 4 tokens each"):
        workload_pattern("vllm", resolve_model("llama-3.1-8b"), Layout(tp=2),
                         [Request(0, 2, 5)] * 3, None,
                         EngineOptions(max_batched_tokens=8, max_num_seqs=4), None, s)


@pytest.mark.parametrize("batch, padded", [
    # SGLang's speculative decode graph list (server_args.py:4179-4206 @ 8905cbd4): 1-8,
    # 10-32 by 2, ...: 3 requests stay 3 (the plain list would pad to 4), 9 pad to 10 (not
    # 12). Verify tokens: 3 x 4 = 12, 10 x 4 = 40; the draft extend after it gathers the
    # logits of all of them: [12 | 40, V/tp].
    (3, 3), (9, 10),
])
def test_sglang_speculative_graph_list(batch, padded):
    s = parse_spec(EAGLE3, 2.5, None)
    p = workload_pattern("sglang", resolve_model("llama-3.1-8b"), Layout(tp=2),
                         [Request(0, 16, 9)] * batch, None, EngineOptions(), None, s)
    decode = p.schedule.segments[1]
    assert decode.shape.decode_seqs == batch
    step, graph = p.segment_steps[1], p.step_graphs[1]
    assert (graph.tokens, graph.graph) == (padded * 4, "full")
    logits = {o.tag: o.shape[0] for o in step.ops if o.tag.endswith("logits")}
    assert logits == {"draft.0.logits": padded, "draft.1.logits": padded,
                      "logits": padded * 4, "draft_extend_after_decode.logits": padded * 4}


def test_eagle3_draft_vocabulary_from_its_config_or_given(tmp_path):
    # vLLM sizes an EAGLE-3 head's lm_head by its own config's draft_vocab_size, else that
    # config's vocab_size (models/llama_eagle3.py:276-302 @ c8109375), never the target's.
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text('{"vocab_size": 128256, "draft_vocab_size": 32000}')
    from_config = parse_spec(json.dumps({"method": "eagle3", "num_speculative_tokens": 2,
                                         "model": str(head)}), 2.0, None)
    given = parse_spec('{"method": "eagle3", "num_speculative_tokens": 2, '
                       '"draft_vocab_size": 32000}', 2.0, None)
    assert from_config.draft_vocab == given.draft_vocab == 32000
    # The drafter's logits at TP2: [rows, 32000 / 2 = 16000] (a multiple of 64 already).
    p = workload_pattern("vllm", resolve_model("llama-3.1-8b"), Layout(tp=2),
                         [Request(0, 16, 4)], None, EngineOptions(), None, from_config)
    drafts = [o.shape for o in p.segment_steps[1].ops if o.tag.startswith("draft.")
              and o.tag.endswith("logits")]
    assert drafts and all(shape[1] == 16000 for shape in drafts)
    with pytest.raises(ConfigError, match="own vocabulary; give \"draft_vocab_size\""):
        parse_spec('{"method": "eagle3", "num_speculative_tokens": 2}', 2.0, None)
    with pytest.raises(ConfigError, match=r"is not a local config\.json"):
        parse_spec('{"method": "eagle3", "num_speculative_tokens": 2, '
                   '"model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}', 2.0, None)


@pytest.mark.parametrize("prompt, graph, rows", [
    # pad_spec_decode (v1/core/sched/scheduler.py:864-897 @ c8109375), EAGLE k = 3: A
    # (prompt 16, output 9) decodes from step 1; B arrives at 10 ms = clock step 1.
    # B's prompt of 1 token, admitted beside A's decode and no running prompt chunk, is
    # scheduled as 1 + 3 = 4 tokens: T = 4 + 4 = 8, a uniform decode: Model Runner V2's FULL
    # graph at 8 (2 requests); logits for 4 + 4 = 8 rows.
    (1, (8, "full"), 8),
    # A 2-token prompt is not padded: T = 4 + 2 = 6, a mixed batch: the graphs at 8 are a
    # FULL decode one (incompatible) and a PIECEWISE one: piecewise at 8; logits 4 + 1 rows.
    (2, (8, "piecewise"), 5),
])
def test_one_token_prompt_padded_to_a_verify(prompt, graph, rows):
    s = parse_spec(EAGLE3, 2.0, None)
    p = workload_pattern("vllm", resolve_model("llama-3.1-8b"), Layout(tp=2),
                         [Request(0, 16, 9), Request(0.01, prompt, 3)], None,
                         EngineOptions(), 0.01, s)
    step1 = p.step_graphs[1]
    assert (step1.tokens, step1.graph) == graph
    logits = next(o for o in p.segment_steps[1].ops if o.tag == "logits")
    assert logits.shape[0] == rows


def test_sglang_speculation_turns_mixed_chunk_off():
    # SGLang accepts --enable-mixed-chunk with speculative decoding and turns it off with a
    # warning (arg_groups/speculative_hook.py:521-526 @ 8905cbd4), so the pattern is the one
    # without it. A (prompt 4, output 9) at 0; B (prompt 4, output 9) at 15 ms, 10 ms steps:
    # B is there from step 2. Mixed chunks (no speculation) put A's decode in B's extend
    # (decode_seqs 1); under speculation B's extend runs alone (decode_seqs 0).
    reqs = [Request(0, 4, 9), Request(0.015, 4, 9)]
    s = parse_spec('{"method": "eagle", "num_speculative_tokens": 1}', 1.5, None)

    def b_extend(spec, mixed):
        p = workload_pattern("sglang", resolve_model("llama-3.1-8b"), Layout(tp=2), reqs,
                             None, EngineOptions(), 0.010, spec, mixed_chunk=mixed)
        shapes = [seg.shape for seg in p.schedule.segments]
        return p, [sh for sh in shapes if sh.prefill_seqs][1]

    _, plain_mixed = b_extend(None, True)
    assert (plain_mixed.prefill_tokens, plain_mixed.decode_seqs) == (4, 1)
    spec_mixed, b = b_extend(s, True)
    assert (b.prefill_tokens, b.decode_seqs) == (4, 0)
    spec_plain, _ = b_extend(s, False)
    assert spec_mixed.schedule == spec_plain.schedule
