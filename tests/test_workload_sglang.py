"""SGLang's schedule of a workload by hand: prefill batches first, decodes wait unless
--enable-mixed-chunk (sgl-project/sglang @ d51c1c21, managers/scheduler.py
get_next_batch_to_run "Run prefill first if possible", get_new_batch_prefill with
PrefillAdder's budget chunked_prefill_size - (running_bs if is_mixed_chunk else 0)).

Llama-3.1-8B at TP2 under SGLang: 65 all-reduces of [T, 4096] (custom all-reduce: Llama is
not in the FlashInfer fusion list) and the logits all-gather; extend steps padded to the
prefill ladder (4..32 step 4, 48..64 step 16 below a 64-token chunk), decode steps to the
decode graph sizes (1, 2, 4, 8, ...), whose logits cover every padded row.
"""

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


def test_prefill_first_decodes_wait():
    # step 0: A's 10 prompt tokens -> extend padded to 12, 1 row.
    # steps 1-3: B arrives at clock 1; prefill batches run first: 64, 64, 22 (-> 24) of its
    #   150 tokens; A, running, waits (no mixed chunk).
    # step 4: decode A and B: T 2 (graph 2); B's only decode, B leaves.
    # steps 5-6: decode A alone, T 1: A's last two decode steps.
    p = workload_pattern("sglang", resolve_model("llama-3.1-8b"), Layout(tp=2), REQS, None,
                         OPTS, 0.010)
    assert steps_of(p) == [("prefill", 12, 1), ("prefill", 64, 1), ("prefill", 64, 1),
                           ("prefill", 24, 1), ("decode", 2, 2), ("decode", 1, 1),
                           ("decode", 1, 1)]
    a, b = request_figures(p.schedule, lambda i: 1.0)  # count steps
    # A's decodes run in steps 4, 5, 6 (3 = output 4 - 1); B's prefill spans steps 1-3.
    assert (a.decode_steps, a.tpot, b.ttft_steps, b.decode_steps) == (3, 1.0, 3, 1)
    assert [tuple(s.decode) for s in p.schedule.spans] == [(4, 7), (4, 5)]


def test_mixed_chunk_matches_vllm_steps():
    # --enable-mixed-chunk: the prefill budget is 64 - 1 running decode = 63, and A's
    # decode rides along: T 1+63 = 64, 64, 24+1 = 25 (-> 28 on the ladder), then B's decode.
    p = workload_pattern("sglang", resolve_model("llama-3.1-8b"), Layout(tp=2), REQS, None,
                         OPTS, 0.010, mixed_chunk=True)
    assert steps_of(p) == [("prefill", 12, 1), ("prefill", 64, 2), ("prefill", 64, 2),
                           ("prefill", 28, 2), ("decode", 1, 1)]
