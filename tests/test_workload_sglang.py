"""SGLang's schedule of a workload by hand: prefill batches first, decodes wait unless
--enable-mixed-chunk (sgl-project/sglang @ 8905cbd4, managers/scheduler.py:2687-2822
get_next_batch_to_run "Run prefill first if possible", _get_new_batch_prefill_raw with
PrefillAdder's budget chunked_prefill_size - (running_bs if is_mixed_chunk else 0)), under
the overlap scheduler (SGLang's default, event_loop_overlap 1554-1626: batch n + 1 is
launched before the result of batch n is read, so a request that finished in batch n rides
batch n + 1) and under --disable-overlap-schedule (event_loop_normal 1520-1551). Either way
a finished request leaves running_batch only at filter_batch, after the prefill was tried.

Llama-3.1-8B at TP2 under SGLang: 65 all-reduces of [T, 4096] (custom all-reduce: Llama is
not in the FlashInfer fusion list) and the logits all-gather; extend steps padded to the
prefill ladder (4..32 step 4, 48..64 step 16 below a 64-token chunk), decode steps to the
decode graph sizes (1, 2, 4, 8, ...), whose logits cover every padded row.
"""

import pytest

from patterns import EngineOptions, Layout, OpKind, resolve_model
from patterns.engines.workloads import workload_pattern
from patterns.workload.metrics import request_figures
from patterns.workload.requests import Request

REQS = [Request(0, 10, 4), Request(0.01, 150, 2)]  # as tests/test_workload_steps.py
OPTS = EngineOptions(max_batched_tokens=64)


def steps_of(p) -> list[tuple[str, int, int]]:
    """(phase, padded T, logits rows) of every issued step."""
    out = []
    for seg, step in zip(p.schedule.segments, p.segment_steps, strict=True):
        gather = step.ops[-1]
        assert gather.kind == OpKind.ALLGATHER and gather.tag == "logits"
        assert len(step.ops) == 66 and step.ops[0].shape == (step.tokens, 4096)
        out += [(seg.shape.phase.value, step.tokens, gather.shape[0])] * seg.repeat
    return out


SYNC = EngineOptions(max_batched_tokens=64, disable_overlap_schedule=True)


def test_prefill_first_decodes_wait_synchronous():
    # --disable-overlap-schedule.
    # step 0: A's 10 prompt tokens -> extend padded to 12, 1 row.
    # steps 1-3: B arrives at clock 1; prefill batches run first: 64, 64, 22 (-> 24) of its
    #   150 tokens; A, running, waits (no mixed chunk).
    # step 4: decode A and B: T 2 (graph 2); B's only decode.
    # step 5: B's result was read after step 4: filtered; A alone, T 1.
    # step 6: A's last decode; then an empty schedule filters A: the end.
    p = workload_pattern("sglang", resolve_model("llama-3.1-8b"), Layout(tp=2), REQS, None,
                         SYNC, 0.010)
    assert steps_of(p) == [("prefill", 12, 1), ("prefill", 64, 1), ("prefill", 64, 1),
                           ("prefill", 24, 1), ("decode", 2, 2), ("decode", 1, 1),
                           ("decode", 1, 1)]
    a, b = request_figures(p.schedule, lambda i: 1.0)  # count steps
    # A's decodes run in steps 4, 5, 6 (3 = output 4 - 1); B's prefill spans steps 1-3.
    assert (a.decode_steps, a.tpot, b.ttft_steps, b.decode_steps) == (3, 1.0, 3, 1)
    assert [tuple(s.decode) for s in p.schedule.spans] == [(4, 7), (4, 5)]


def test_prefill_first_decodes_wait_overlap():
    # SGLang's default. Steps 0-4 as above; B's last token comes in step 4.
    # step 5: built before step 4's result is read: B rides (tokens thrown away): T 2, R 2.
    # step 6: B filtered (step 4 read); A's last decode, T 1.
    # step 7: A rides once more, T 1; then an empty schedule reads step 7: the end.
    p = workload_pattern("sglang", resolve_model("llama-3.1-8b"), Layout(tp=2), REQS, None,
                         OPTS, 0.010)
    assert steps_of(p) == [("prefill", 12, 1), ("prefill", 64, 1), ("prefill", 64, 1),
                           ("prefill", 24, 1), ("decode", 2, 2), ("decode", 2, 2),
                           ("decode", 1, 1), ("decode", 1, 1)]
    # Each request's own decode steps are the ones that yield its tokens.
    assert [tuple(s.decode) for s in p.schedule.spans] == [(4, 7), (4, 5)]


@pytest.mark.parametrize("opts, want", [
    # --enable-mixed-chunk: the prefill budget is 64 - 1 running decode = 63, and A's
    # decode rides along: T 1+63 = 64, 64, 24+1 = 25 (-> 28 on the ladder; A's last
    # token), then B's decode (A's result read: filtered on the mixed batch's merge).
    (SYNC, [("prefill", 12, 1), ("prefill", 64, 2), ("prefill", 64, 2), ("prefill", 28, 2),
            ("decode", 1, 1)]),
    # Overlap: A, done in step 3, is not yet known finished when step 4 is built: it rides
    # with B's decode (T 2); B, done in step 4, rides step 5 alone (T 1).
    (OPTS, [("prefill", 12, 1), ("prefill", 64, 2), ("prefill", 64, 2), ("prefill", 28, 2),
            ("decode", 2, 2), ("decode", 1, 1)]),
])
def test_mixed_chunk(opts, want):
    p = workload_pattern("sglang", resolve_model("llama-3.1-8b"), Layout(tp=2), REQS, None,
                         opts, 0.010, mixed_chunk=True)
    assert steps_of(p) == want


# --max-running-requests 2 (--max-num-seqs here), all at 0: A (prompt 4, output 2),
# C (prompt 4, output 4), B (prompt 4, output 1). Step 0: A 4 + C 4 = extend 8, R 2; B
# waits: running_bs + 2 = cap.
CAPPED = [Request(0, 4, 2), Request(0, 4, 4), Request(0, 4, 1)]


@pytest.mark.parametrize("overlap, want, b_waited", [
    # --disable-overlap-schedule:
    # step 1: decode A, C (T 2); A's last token.
    # step 2: A finished but still in running_batch when the prefill is tried:
    #   running_bs 2 = cap, no prefill; update_running_batch filters A: decode C, T 1.
    # step 3: running_bs 1: B's extend 4 (its only token).
    # step 4: C's last decode, T 1. (Filtering A before the prefill, B would join at 2.)
    (False, [("prefill", 8, 2), ("decode", 2, 2), ("decode", 1, 1), ("prefill", 4, 1),
             ("decode", 1, 1)], 3),
    # overlap:
    # step 1: decode A, C (T 2); A's last token.
    # step 2: step 1 not read yet: A rides with C, T 2; running_bs 2, no prefill.
    # step 3: A finished (step 1 read) but filtered only on the decode path: running_bs 2,
    #   no prefill; decode C's last, T 1.
    # step 4: running_bs 1: B's extend 4.
    # step 5: B, not yet known finished, merged and rides a decode batch, T 1 (C, done in
    #   step 3 and read, is filtered).
    (True, [("prefill", 8, 2), ("decode", 2, 2), ("decode", 2, 2), ("decode", 1, 1),
            ("prefill", 4, 1), ("decode", 1, 1)], 4),
])
def test_max_running_requests_admission(overlap, want, b_waited):
    opts = EngineOptions(max_batched_tokens=64, max_num_seqs=2,
                         disable_overlap_schedule=not overlap)
    p = workload_pattern("sglang", resolve_model("llama-3.1-8b"), Layout(tp=2), CAPPED, None,
                         opts, None)
    assert steps_of(p) == want
    assert p.schedule.spans[2].waited_steps == b_waited


def test_decode_graphs_capped_by_max_running_requests():
    # get_batch_sizes_to_capture (runner/base_cuda_graph_runner.py:58-101 @ 8905cbd4) keeps
    # the sizes up to the request pool, max_running_requests, and adds it: at 20 the plain
    # list [1, 2, 4, 8, 12, 16, 24, ...] becomes [1, 2, 4, 8, 12, 16, 20]. 18 requests of
    # 4 prompt tokens, output 2: one extend of 72 tokens (bucket 80), then one decode of 18
    # padded to 20 (24 without the cap), then (overlap) their ride of 18 more.
    from patterns.engines.sglang.profile import decode_graph_sizes
    assert decode_graph_sizes(2, "h100", max_running=20) == [1, 2, 4, 8, 12, 16, 20]
    reqs = [Request(0, 4, 2)] * 18
    for cap, padded in ((20, 20), (None, 24)):
        opts = EngineOptions(max_batched_tokens=64 * 4, max_num_seqs=cap)
        p = workload_pattern("sglang", resolve_model("llama-3.1-8b"), Layout(tp=2), reqs,
                             None, opts, None)
        assert [(g.tokens, g.graph) for g in p.step_graphs][:2] == [(80, "piecewise"),
                                                                    (padded, "full")]


@pytest.mark.parametrize("prompt, graph", [
    # prefill_cuda_graph_runner.py:118, 700-707 @ 8905cbd4: the bucket may be at most twice
    # the tokens. 1 token -> bucket 4 > 2: eager; 2 -> 4: graph; 3 -> 4: graph; 33 -> 48 <= 66.
    (1, (1, "eager")), (2, (4, "piecewise")), (3, (4, "piecewise")), (33, (48, "piecewise")),
])
def test_prefill_bucket_over_twice_the_tokens_runs_eager(prompt, graph):
    p = workload_pattern("sglang", resolve_model("llama-3.1-8b"), Layout(tp=2),
                         [Request(0, prompt, 1)], None, OPTS, None)
    first = p.step_graphs[0]
    assert (first.tokens, first.graph) == graph
