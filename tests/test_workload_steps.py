"""Hand-computed step sequences of three small workloads under vLLM V1's scheduler, checked
call by call, and the per-request communication under TTFT and TPOT.

Rules (vllm/v1/core/sched/scheduler.py @ 00024d31, `schedule()`): RUNNING requests first, in
order, each its remaining prompt or 1 decode token cut to the token budget; then WAITING
requests in arrival order while budget is left and len(running) < max_num_seqs, each
min(prompt, budget left). A request leaves RUNNING after the step that samples its last
token. Llama-3.1-8B at TP2 (h 4096, 32 layers, vocab 128256 = V_pad): every step issues
1 embed all-reduce + 32 x (o_proj, down_proj) = 65 all-reduces of [T, 4096] bf16 and one
logits all-gather [R, 128256/2 = 64128], R = scheduled requests. CUDA-graph sizes with
max_num_seqs 4, budget 64: cap = min(2 x 4, 512, 64) = 8 -> [1, 2, 4, 8]
(config/vllm.py _set_cudagraph_sizes); a step above 8 tokens runs eager, unpadded.
"""

from patterns import EngineOptions, Layout, OpKind, Transport, resolve_model
from patterns.engines.workloads import workload_pattern
from patterns.workload.metrics import request_figures
from patterns.workload.requests import Request

LLAMA = resolve_model("llama-3.1-8b")
OPTS = EngineOptions(max_batched_tokens=64, max_num_seqs=4)


def expected_ops(tokens: int, rows: int) -> list[tuple]:
    """The calls of one step by hand: (kind, shape, tag, transport). At TP2 on H100 every
    all-reduce of at most 64 MiB that feeds an RMSNorm takes FlashInfer's fused kernel
    (allreduce_rms_fusion.py: FI_ALLREDUCE_FUSION_MAX_SIZE_MB[90][2] = 64)."""
    fused = Transport.FUSED_ALLREDUCE_RMSNORM
    ops = [(OpKind.ALLREDUCE, (tokens, 4096), "embed_tokens", fused)]
    for layer in range(32):
        ops += [(OpKind.ALLREDUCE, (tokens, 4096), f"layers.{layer}.self_attn.o_proj", fused),
                (OpKind.ALLREDUCE, (tokens, 4096), f"layers.{layer}.mlp.down_proj", fused)]
    return [*ops, (OpKind.ALLGATHER, (rows, 64128), "logits", Transport.NCCL)]


def step_bytes(tokens: int, rows: int) -> int:
    """65 all-reduces of T x 4096 x 2 B + the all-gather's R x 64128 x 2 B input."""
    return 65 * tokens * 8192 + rows * 128256


def check_steps(pattern, want: list[tuple[int, int, int, str]]) -> None:
    """want: per issued step (padded T, logits rows R, prefill requests, graph)."""
    got = []
    for seg, graph, step in zip(pattern.schedule.segments, pattern.step_graphs,
                                pattern.segment_steps, strict=True):
        calls = [(op.kind, op.shape, op.tag, op.transport) for op in step.ops]
        got += [(graph.tokens, calls, seg.shape.prefill_seqs, graph.graph)] * seg.repeat
    assert len(got) == len(want)
    for i, ((tokens, calls, prefills, graph), (t, r, p, g)) in enumerate(
            zip(got, want, strict=True)):
        assert (tokens, prefills, graph) == (t, p, g), f"step {i}"
        assert calls == expected_ops(t, r), f"step {i}"


def test_long_prompt_chunked_while_another_decodes():
    # A: arrives 0, prompt 10, output 4 (3 decode steps); B: arrives 10 ms = clock step 1,
    # prompt 150, output 2. Step time 10 ms.
    # step 0: A's 10 prompt tokens (T 10 > 8: eager), A samples its first token.
    # step 1: A decodes (1); B joins with min(150, 64-1) = 63 -> T 64, R 2.
    # step 2: A decodes (1); B 63 more (24 left) -> T 64, R 2.
    # step 3: A's last decode (1); B's last 24 -> T 25, R 2; A leaves.
    # step 4: B's one decode -> T 1, full graph of size 1, R 1.
    p = workload_pattern("vllm", LLAMA, Layout(tp=2), [Request(0, 10, 4),
                                                       Request(0.01, 150, 2)],
                         None, OPTS, 0.010)
    check_steps(p, [(10, 1, 1, "eager"), (64, 2, 1, "eager"), (64, 2, 1, "eager"),
                    (25, 2, 1, "eager"), (1, 1, 0, "full")])
    a, b = request_figures(p.schedule, lambda i: sum(o.bytes for o in p.segment_steps[i].ops))
    # A: TTFT = step 0 = 65*10*8192 + 128256 = 5,453,056 B; TPOT = steps 1-3 /3 =
    # (2*34,335,232 + 13,568,512)/3 = 27,412,992 B (34,335,232 = 65*64*8192 + 2*128256).
    assert (a.ttft, a.ttft_steps, a.tpot, a.decode_steps) == (5_453_056, 1, 27_412_992, 3)
    assert a.ttft == step_bytes(10, 1)
    # B: TTFT = steps 1-3 = 82,238,976 B; TPOT = step 4 = 65*8192 + 128256 = 660,736 B.
    assert (b.ttft, b.ttft_steps, b.tpot, b.decode_steps) == (82_238_976, 3, 660_736, 1)


def test_arrivals_mid_decode():
    # A: 0 s, prompt 4, output 5; B and C: 25 ms -> clock step ceil(2.5) = 3, prompts 6 and
    # 3, outputs 2 and 1. Step time 10 ms.
    # step 0: A's prompt, T 4 (piecewise graph of 4: a prefill is not a uniform decode).
    # steps 1-2: A decodes alone, T 1 (full graph of 1), one run of 2 until the arrival.
    # step 3: A decodes + B's 6 + C's 3 = T 10 (eager), R 3; C's only token is sampled here.
    # step 4: A's and B's last decodes, T 2 (full graph of 2), R 2.
    reqs = [Request(0, 4, 5), Request(0.025, 6, 2), Request(0.025, 3, 1)]
    p = workload_pattern("vllm", LLAMA, Layout(tp=2), reqs, None, OPTS, 0.010)
    check_steps(p, [(4, 1, 1, "piecewise"), (1, 1, 0, "full"), (1, 1, 0, "full"),
                    (10, 3, 2, "eager"), (2, 2, 0, "full")])
    assert [s.repeat for s in p.schedule.segments] == [1, 2, 1, 1]  # steps 1-2 folded
    a, b, c = request_figures(p.schedule, lambda i: len(p.segment_steps[i].ops))
    # Calls: 66 a step. A: TTFT 1 step (66), 4 decode steps (66 each). C: no decode step.
    assert (a.ttft, a.decode_steps, a.tpot) == (66, 4, 66)
    assert (b.ttft, b.decode_steps, b.tpot) == (66, 1, 66)
    assert (c.ttft, c.decode_steps, c.tpot) == (66, 0, None)


def test_max_num_seqs_reached_synchronous():
    # --no-async-scheduling (update_from_output(n) before schedule(n + 1)).
    # max_num_seqs 2, budget 64: cap = min(2*2, 512, 64) = 4 -> sizes [1, 2, 4].
    # A, B, C at 0, prompts 5, outputs 3, 2, 2.
    # step 0: A 5 + B 5 = T 10 (eager); RUNNING holds 2 = max_num_seqs, C waits.
    # step 1: A, B decode: T 2 (full graph 2); B's last token: B leaves.
    # step 2: A's last decode + C's 5 = T 6 (> 4: eager), R 2.
    # step 3: C's decode, T 1.
    opts = EngineOptions(max_batched_tokens=64, max_num_seqs=2, async_scheduling=False)
    reqs = [Request(0, 5, 3), Request(0, 5, 2), Request(0, 5, 2)]
    p = workload_pattern("vllm", LLAMA, Layout(tp=2), reqs, None, opts, None)
    check_steps(p, [(10, 2, 2, "eager"), (2, 2, 0, "full"), (6, 2, 1, "eager"),
                    (1, 1, 0, "full")])
    assert [s.waited_steps for s in p.schedule.spans] == [0, 0, 2]  # C waited steps 0, 1
    assert [tuple(s.prefill) for s in p.schedule.spans] == [(0, 1), (0, 1), (2, 3)]
    assert [tuple(s.decode) for s in p.schedule.spans] == [(1, 3), (1, 2), (3, 4)]


def test_max_num_seqs_reached_async():
    # vLLM's default, async scheduling (v1/engine/core.py:625-741 @ c8109375: schedule(n+1)
    # before update_from_output(n)); the same three requests.
    # step 0: A 5 + B 5 = T 10 (eager), C waits.
    # step 1: A, B decode (T 2); B samples its last token, but stays in RUNNING at step 2.
    # step 2: B skipped (computed 5 + 1 + 2 - 1 placeholder = 7 >= prompt 5 + max_tokens 2,
    #         scheduler.py:485-502) yet len(running) = 2 = max_num_seqs: C still waits.
    #         A's last decode alone: T 1 (full graph 1), R 1.
    # step 3: B gone; A skipped but held: running 1 < 2, C joins: T 5 (> 4: eager), R 1.
    # step 4: C's decode, T 1. One step more than synchronous: C admitted at 3, not 2.
    opts = EngineOptions(max_batched_tokens=64, max_num_seqs=2)
    reqs = [Request(0, 5, 3), Request(0, 5, 2), Request(0, 5, 2)]
    p = workload_pattern("vllm", LLAMA, Layout(tp=2), reqs, None, opts, None)
    check_steps(p, [(10, 2, 2, "eager"), (2, 2, 0, "full"), (1, 1, 0, "full"),
                    (5, 1, 1, "eager"), (1, 1, 0, "full")])
    assert [s.waited_steps for s in p.schedule.spans] == [0, 0, 3]  # C waited steps 0-2
    assert [tuple(s.prefill) for s in p.schedule.spans] == [(0, 1), (0, 1), (3, 4)]
    assert [tuple(s.decode) for s in p.schedule.spans] == [(1, 3), (1, 2), (4, 5)]


def test_async_held_slot_freed_inside_a_run_of_decodes():
    # max_num_seqs 2: A (prompt 5, output 2), B (5, 6), C (5, 2), all at 0. Sizes [1, 2, 4].
    # Async: step 0: A 5 + B 5 (T 10). step 1: A, B decode (A's last).
    # step 2: A skipped but held: B decodes alone (T 1), C waits (B + A = 2).
    # step 3: A gone: B decodes + C's 5 (T 6). step 4: B, C decode (C's last), T 2.
    # step 5: B's fifth and last decode, T 1 (C held, nobody waits).
    # Synchronous: C joins at step 2 (T 6); B, C decode at 3 (T 2); B alone at 4 and 5.
    reqs = [Request(0, 5, 2), Request(0, 5, 6), Request(0, 5, 2)]
    for async_on, want in ((True, [(10, 2, 2, "eager"), (2, 2, 0, "full"), (1, 1, 0, "full"),
                                   (6, 2, 1, "eager"), (2, 2, 0, "full"), (1, 1, 0, "full")]),
                           (False, [(10, 2, 2, "eager"), (2, 2, 0, "full"), (6, 2, 1, "eager"),
                                    (2, 2, 0, "full"), (1, 1, 0, "full"), (1, 1, 0, "full")])):
        opts = EngineOptions(max_batched_tokens=64, max_num_seqs=2, async_scheduling=async_on)
        p = workload_pattern("vllm", LLAMA, Layout(tp=2), reqs, None, opts, None)
        check_steps(p, want)


def test_async_every_slot_held_by_a_finished_request():
    # max_num_seqs 1, async: A (prompt 5, output 2), B (prompt 3, output 1), both at 0.
    # step 0: A 5 (T 5, eager: sizes [1, 2] with cap min(2, 512, 64) = 2); B waits.
    # step 1: A's only decode, T 1 (full graph 1).
    # next schedule: A skipped, B blocked (A held): nothing scheduled, no calls, no clock;
    #   its update frees A's slot.
    # step 2: B's 3 (eager), R 1; B samples its only token.
    # Synchronous: the same three steps (A leaves before step 2 is scheduled).
    reqs = [Request(0, 5, 2), Request(0, 3, 1)]
    for async_on in (True, False):
        opts = EngineOptions(max_batched_tokens=64, max_num_seqs=1, async_scheduling=async_on)
        p = workload_pattern("vllm", LLAMA, Layout(tp=2), reqs, None, opts, 0.01)
        check_steps(p, [(5, 1, 1, "eager"), (1, 1, 0, "full"), (3, 1, 1, "eager")])
        assert p.schedule.clock_steps == 3


def test_folding_keeps_steps_flat():
    # 200 identical requests at 0 with 1000-token outputs: 1 prefill step (200 x 5 = 1000
    # tokens <= 8192) then 999 decode steps of T 200 in one run: 2 segments, not 1000.
    reqs = [Request(0, 5, 1000)] * 200
    p = workload_pattern("vllm", LLAMA, Layout(tp=2), reqs, None, EngineOptions(), None)
    assert [(s.repeat, s.shape.tokens) for s in p.schedule.segments] == [(1, 1000), (999, 200)]
    assert p.calls_per_inference(0) == 1000 * 66


def test_docs_worked_example_async_moves_an_admission():
    # docs/workloads.md "Scheduling modes": examples/workloads/small.jsonl, Llama-3.1-70B TP8,
    # 30 ms steps, budget 2048, max_num_seqs 2. A (1500, 4) and B (200, 12) at 0; C (300, 6)
    # at 50 ms = clock step 2. A decodes in steps 1-3 (4 - 1 = 3).
    # Synchronous: A gone at 4, C's 300 + B's 1 = 301 in step 4; 20 steps in all.
    # Async: A held in step 4 (B alone, T 1), C in step 5; 22 steps in all.
    from pathlib import Path

    from patterns.workload.requests import read_requests
    reqs = read_requests(str(Path(__file__).parent.parent / "examples/workloads/small.jsonl"))
    model = resolve_model("llama-3.1-70b")
    for async_on, head, total in ((False, [(0, 1, 1700), (1, 3, 2), (4, 1, 301)], 20),
                                  (True, [(0, 1, 1700), (1, 3, 2), (4, 1, 1), (5, 1, 301)], 22)):
        opts = EngineOptions(max_batched_tokens=2048, max_num_seqs=2, async_scheduling=async_on)
        p = workload_pattern("vllm", model, Layout(tp=8), reqs, None, opts, 0.030)
        segs = p.schedule.segments[:len(head)]
        assert [(s.start, s.repeat, s.shape.tokens) for s in segs] == head
        assert p.schedule.steps == total
