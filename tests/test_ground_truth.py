"""The published vLLM 0.8.5 profile (DESIGN.md, "Ground truth for vllm-v0"), cell for cell.

Llama-3.1-8B, bf16, Sp = Sd = 128, batch 1: prefill T = 128 tokens, 127 decode steps of T = 1.
The P2P tensors are flat TP slices of T*h/tp elements (engine spec 2.1, op 6); the paper
writes them as 2-D views, so those cells are compared by element count.
"""

from math import prod

import pytest

from patterns import Layout, Workload, generate, pattern_rows, resolve_model

MODEL = resolve_model("llama-3.1-8b")


def rows(tp: int, pp: int) -> list:
    return pattern_rows(generate("vllm-v0", MODEL, Layout(tp=tp, pp=pp), Workload(128, 128)))


def find(table, phase, stage, op):
    hits = [r for r in table if r.phase == phase and r.stage == stage and r.op == op]
    assert len(hits) == 1, hits
    return hits[0]


@pytest.mark.parametrize("tp, vocab_shard", [(2, 64128), (4, 32064)])
def test_pure_tp(tp, vocab_shard):
    table = rows(tp, 1)
    assert {r.op for r in table} == {"allreduce", "gather"}
    prefill_ar = find(table, "prefill", 0, "allreduce")
    assert (prefill_ar.count, prefill_ar.shape) == (65, (128, 4096))
    decode_ar = find(table, "decode", 0, "allreduce")
    assert (decode_ar.count, decode_ar.shape) == (8255, (1, 4096))
    assert (find(table, "prefill", 0, "gather").count,
            find(table, "prefill", 0, "gather").shape) == (1, (1, vocab_shard))
    assert (find(table, "decode", 0, "gather").count,
            find(table, "decode", 0, "gather").shape) == (127, (1, vocab_shard))
    assert all(r.dtype == "bf16" for r in table)


def test_pp2_send_recv():
    table = rows(1, 2)
    assert {(r.stage, r.op) for r in table} == {(0, "send"), (1, "recv")}
    for stage, op in ((0, "send"), (1, "recv")):
        pre, dec = find(table, "prefill", stage, op), find(table, "decode", stage, op)
        assert (pre.count, prod(pre.shape)) == (2, 128 * 4096)
        assert (dec.count, prod(dec.shape)) == (254, 1 * 4096)


def test_pp4_sends_all_stages():
    table = rows(1, 4)
    sends = [r for r in table if r.op == "send"]
    assert sum(r.count for r in sends if r.phase == "prefill") == 6
    assert sum(r.count for r in sends if r.phase == "decode") == 762
    assert {prod(r.shape) for r in sends if r.phase == "prefill"} == {128 * 4096}
    assert {prod(r.shape) for r in sends if r.phase == "decode"} == {4096}
    assert not any(r.op == "send" and r.stage == 3 for r in table)


def test_tp2_pp2():
    table = rows(2, 2)
    ar0 = find(table, "prefill", 0, "allreduce"), find(table, "decode", 0, "allreduce")
    assert [(r.count, r.shape) for r in ar0] == [(33, (128, 4096)), (4191, (1, 4096))]
    # The last stage skips the embedding: 32 per step (DESIGN.md's note under the table).
    ar1 = find(table, "prefill", 1, "allreduce"), find(table, "decode", 1, "allreduce")
    assert [r.count for r in ar1] == [32, 32 * 127]
    ag = find(table, "prefill", 1, "allgather"), find(table, "decode", 1, "allgather")
    assert [(r.count, r.out_shape) for r in ag] == [(2, (128, 4096)), (254, (1, 4096))]
    for stage, op in ((0, "send"), (1, "recv")):
        pre, dec = find(table, "prefill", stage, op), find(table, "decode", stage, op)
        assert (pre.count, prod(pre.shape)) == (2, 128 * 2048)
        assert (dec.count, prod(dec.shape)) == (254, 1 * 2048)
    gathers = find(table, "prefill", 1, "gather"), find(table, "decode", 1, "gather")
    assert [(r.count, r.shape) for r in gathers] == [(1, (1, 64128)), (127, (1, 64128))]
    assert not any(r.op == "gather" and r.stage == 0 for r in table)
