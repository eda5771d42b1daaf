"""vllm-v0 cases beyond the published table; every expected number is worked out in comments."""

import json

import pytest

from patterns import (
    ConfigError,
    EngineOptions,
    Layout,
    OpKind,
    Phase,
    Workload,
    generate,
    pattern_rows,
    resolve_model,
)
from patterns.shapes import graph_batch_size, padded_vocab, prefill_chunks, stage_layer_counts


def gen(model: str, tp=1, pp=1, prompt=128, decode=128, batch=1, **options):
    return generate("vllm-v0", resolve_model(model), Layout(tp=tp, pp=pp),
                    Workload(prompt, decode, batch), EngineOptions(**options))


def counts(pattern, phase, stage, kind):
    found: dict[tuple[int, ...], int] = {}
    for r in pattern_rows(pattern):
        if r.phase == phase and r.stage == stage and r.op == kind:
            found[r.shape] = found.get(r.shape, 0) + r.count
    return found


# --- vLLM's shape rules -------------------------------------------------------------------

@pytest.mark.parametrize("layers, pp, expected", [
    (126, 4, [31, 32, 32, 31]),  # engine spec section 1
    (32, 2, [16, 16]),
    (33, 2, [17, 16]),  # remainder 1 goes to stage pp-2 = 0
    (80, 3, [27, 27, 26]),  # 80 = 3*26 + 2: stages 1 and 0 get one more
    (28, 8, [3, 3, 3, 4, 4, 4, 4, 3]),  # 28 = 8*3 + 4: stages 6,5,4,3 get one more
    (5, 5, [1, 1, 1, 1, 1]),
])
def test_stage_layer_counts(layers, pp, expected):
    assert stage_layer_counts(layers, pp) == expected


@pytest.mark.parametrize("vocab, padded", [(128256, 128256), (32000, 32000), (152064, 152064),
                                           (129280, 129280), (50257, 50304), (65, 128)])
def test_padded_vocab(vocab, padded):
    # 50257 = 785*64 + 17, so 786*64 = 50304 (GPT-2's well-known padded size).
    assert padded_vocab(vocab) == padded


@pytest.mark.parametrize("batch, padded", [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8),
                                           (9, 16), (17, 24), (256, 256), (511, 512),
                                           (513, 513)])
def test_graph_batch_size(batch, padded):
    assert graph_batch_size(batch) == padded


def test_prefill_chunks_split_and_sample_rows():
    # B=2, Sp=100, 64 tokens a step: [0,64) [64,128) [128,192) [192,200).
    # Prompt 0 ends at token 99 (chunk 1), prompt 1 at 199 (chunk 3).
    chunks = prefill_chunks(batch=2, prompt=100, budget=64)
    assert [(c.tokens, c.seqs, c.rows) for c in chunks] == [
        (64, 1, 0), (64, 2, 1), (64, 1, 0), (8, 1, 1)]
    assert prefill_chunks(2, 100, 200) == [(200, 2, 2)]
    assert prefill_chunks(2, 100, None) == [(200, 2, 2)]


# --- other models, batch > 1, uneven splits, hybrid layouts -------------------------------

def test_llama2_7b_tp4_batch4_fp16():
    # Prefill T = 4*100 = 400; decode T = 4 (a capture size); 9 decode steps.
    # Allreduces per step 1 + 2*32 = 65; gather rows S = B = 4 of 32000/4 = 8000 columns.
    p = gen("llama-2-7b", tp=4, prompt=100, decode=10, batch=4)
    assert p.workload.dtype == "fp16"
    assert counts(p, "prefill", 0, "allreduce") == {(400, 4096): 65}
    assert counts(p, "decode", 0, "allreduce") == {(4, 4096): 65 * 9}
    assert counts(p, "prefill", 0, "gather") == {(4, 8000): 1}
    assert counts(p, "decode", 0, "gather") == {(4, 8000): 9}


@pytest.mark.parametrize("batch, eager, tokens", [(3, False, 4), (3, True, 3), (9, False, 16),
                                                  (9, True, 9)])
def test_decode_padding_not_applied_to_logit_rows(batch, eager, tokens):
    # Llama-3.2-1B TP2: h = 2048, 16 layers -> 33 allreduces per step; vocab shard 64128.
    p = gen("llama-3.2-1b", tp=2, prompt=16, decode=3, batch=batch, eager=eager)
    assert counts(p, "decode", 0, "allreduce") == {(tokens, 2048): 33 * 2}
    assert counts(p, "decode", 0, "gather") == {(batch, 64128): 2}


def test_405b_tp8_pp4_uneven_stages():
    # 126 layers -> [31, 32, 32, 31]; embedding only on stage 0.
    # Allreduces per step: 1+62 = 63, 64, 64, 62. P2P slices T*16384/8 = T*2048.
    p = gen("llama-3.1-405b", tp=8, pp=4, prompt=64, decode=2)
    per_step = [counts(p, "prefill", s, "allreduce")[(64, 16384)] for s in range(4)]
    assert per_step == [63, 64, 64, 62]
    assert counts(p, "prefill", 0, "send") == {(64 * 2048,): 2}
    assert counts(p, "prefill", 3, "recv") == {(64 * 2048,): 2}
    assert counts(p, "prefill", 3, "allgather") == {(64 * 2048,): 2}
    assert counts(p, "prefill", 3, "gather") == {(1, 16032): 1}  # 128256 / 8
    assert counts(p, "decode", 1, "send") == {(2048,): 2}
    assert counts(p, "decode", 1, "recv") == {(2048,): 2}


def test_hybrid_tp4_pp2_batch8_70b():
    # 80 layers -> 40/40. Stage 0: 1 + 80 = 81 allreduces a step, stage 1: 80.
    # Decode T = 8; slices 8*8192/4 = 16384 elements; 3 decode steps.
    p = gen("llama-3.1-70b", tp=4, pp=2, prompt=32, decode=4, batch=8)
    assert counts(p, "prefill", 0, "allreduce") == {(256, 8192): 81}
    assert counts(p, "decode", 1, "allreduce") == {(8, 8192): 80 * 3}
    assert counts(p, "decode", 0, "send") == {(16384,): 2 * 3}
    assert counts(p, "decode", 1, "allgather") == {(16384,): 2 * 3}
    assert counts(p, "decode", 1, "gather") == {(8, 32064): 3}


def test_step_order_on_a_receiving_stage():
    # Spec 2.1: recv hs, all_gather hs, recv residual, all_gather residual, the layers'
    # all-reduces, then the logits gather on the last stage.
    p = gen("llama-3.1-8b", tp=2, pp=2, prompt=8, decode=2)
    step = p.first_step(1, Phase.DECODE)
    kinds = [op.kind for op in step.ops]
    assert kinds[:4] == [OpKind.RECV, OpKind.ALLGATHER, OpKind.RECV, OpKind.ALLGATHER]
    assert [op.tag for op in step.ops[:4]] == ["pp.hidden_states", "pp.hidden_states.allgather",
                                                "pp.residual", "pp.residual.allgather"]
    assert kinds[4:-1] == [OpKind.ALLREDUCE] * 32 and kinds[-1] == OpKind.GATHER
    assert step.ops[4].tag == "layers.16.self_attn.o_proj"  # stage 1 starts at layer 16
    assert step.ops[0].peer == 0 and step.ops[-1].root == 0
    first = p.first_step(0, Phase.DECODE)
    assert [op.tag for op in first.ops[-2:]] == ["pp.hidden_states", "pp.residual"]
    assert first.ops[0].tag == "embed_tokens" and first.ops[-1].peer == 1


def test_mixtral_tp2_moe_allreduce_replaces_down_proj():
    # Spec 6: one all-reduce per MoE layer in place of down_proj: still 1 + 2*32 = 65.
    p = gen("mixtral-8x7b", tp=2, prompt=128, decode=128)
    assert counts(p, "prefill", 0, "allreduce") == {(128, 4096): 65}
    tags = [op.tag for op in p.first_step(0, Phase.PREFILL).ops]
    assert "layers.0.block_sparse_moe" in tags and not any("down_proj" in t for t in tags)
    assert counts(p, "decode", 0, "gather") == {(1, 16000): 127}


def test_qwen_tp4_vocab_and_tp1_has_no_calls():
    p = gen("qwen2.5-7b", tp=4, prompt=10, decode=2)
    assert counts(p, "prefill", 0, "gather") == {(1, 38016): 1}  # 152064 / 4
    assert pattern_rows(gen("qwen2.5-7b", tp=1, prompt=10, decode=2)) == []


def test_decode_one_has_no_decode_steps():
    p = gen("llama-3.1-8b", tp=2, prompt=5, decode=1)
    assert {r.phase for r in pattern_rows(p)} == {"prefill"}


def test_chunked_prefill_steps():
    # B=2, Sp=100, budget 64 (see test_prefill_chunks_split_and_sample_rows): four prefill
    # steps of 64, 64, 64, 8 tokens; the gathers sample 0, 1, 0, 1 rows.
    p = gen("llama-3.2-1b", tp=2, prompt=100, decode=3, batch=2, max_batched_tokens=64)
    assert counts(p, "prefill", 0, "allreduce") == {(64, 2048): 33 * 3, (8, 2048): 33}
    assert counts(p, "prefill", 0, "gather") == {(0, 64128): 2, (1, 64128): 2}
    prefill_steps = [r for r in p.stages[0] if r.phase == Phase.PREFILL]
    assert [r.step.tokens for r in prefill_steps] == [64, 64, 64, 8]


def test_control_plane_broadcasts():
    # Prefill: 8 broadcasts (block_tables is empty and skipped). Graphed decode: 9, with the
    # block table [B_pad, 8192/16 = 512]. Eager decode: ceil((Sp+k)/16) columns at step k.
    p = gen("llama-3.1-8b", tp=2, prompt=20, decode=14, control_plane=True)
    # input_tokens, input_positions, slot_mapping [20]; seq_lens, context_lens [1];
    # query_start_loc, seq_start_loc [2]; selected_token_indices [1].
    assert counts(p, "prefill", 0, "broadcast") == {(20,): 3, (1,): 3, (2,): 2}
    decode = counts(p, "decode", 0, "broadcast")
    assert decode[(1, 512)] == 13 and sum(decode.values()) == 9 * 13
    # Eager: Sp + k for k = 1..13 is 21..33 tokens: 2 blocks for k <= 12, 3 for k = 13.
    eager = gen("llama-3.1-8b", tp=2, prompt=20, decode=14, control_plane=True, eager=True)
    decode = counts(eager, "decode", 0, "broadcast")
    assert decode[(1, 2)] == 12 and decode[(1, 3)] == 1
    ctrl = [op for op in eager.first_step(0, Phase.DECODE).ops if op.kind == OpKind.BROADCAST]
    assert [op.dtype for op in ctrl] == ["int64"] * 3 + ["int32"] * 5 + ["int64"]
    assert all(op.root == 0 for op in ctrl)
    # No TP group, no broadcasts.
    assert counts(gen("llama-3.1-8b", pp=2, control_plane=True), "prefill", 0, "broadcast") == {}


def test_pattern_size_does_not_grow_with_decode_length():
    short = gen("llama-3.1-8b", tp=2, pp=2, decode=2)
    # the longest the model takes: max_position_embeddings 131,072 - prompt 128 = 130,944
    long = gen("llama-3.1-8b", tp=2, pp=2, decode=130_944)
    assert [len(runs) for runs in short.stages] == [len(runs) for runs in long.stages]
    assert long.stages[0][-1].repeat == 130_943


def test_dtype_follows_config_unless_given(tmp_path):
    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 1000,
           "num_attention_heads": 4, "torch_dtype": "float32"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    model = resolve_model(str(path))
    # vLLM's dtype=auto serves an fp32 checkpoint in bf16 (spec section 1).
    assert model.default_dtype == "bf16" and model.num_key_value_heads == 4
    w = Workload(8, 2, dtype="float16")
    assert w.dtype == "fp16"
    p = generate("vllm-v0", model, Layout(tp=2), w)
    # vocab 1000 -> 1024 padded, 512 per rank; fp16 = 2 bytes.
    gather = next(r for r in pattern_rows(p) if r.op == "gather")
    assert (gather.shape, gather.bytes) == ((1, 512), 1024)


@pytest.mark.parametrize("make, message", [
    (lambda: gen("llama-3.1-8b", tp=3), "tp(3) does not divide num_attention_heads(32)"),
    (lambda: gen("qwen2.5-7b", tp=8), "tp in 1, 2, 4, 7, 14, 28"),
    (lambda: gen("llama-3.2-1b", pp=17), "pp(17) exceeds num_hidden_layers(16)"),
    (lambda: gen("llama-3.1-8b", prompt=0), "prompt length 0 must be a positive integer"),
    (lambda: gen("llama-3.1-8b", decode=-1), "decode length -1 must be a positive integer"),
    (lambda: gen("llama-3.1-8b", batch=0), "batch 0 must be a positive integer"),
    (lambda: Layout(tp=0), "tp(0) must be a positive integer"),
    (lambda: resolve_model("llama-9"), "unknown model 'llama-9'"),
    (lambda: generate("vllm-v9", resolve_model("llama-3.1-8b"), Layout(), Workload(1, 1)),
     "unknown engine 'vllm-v9'; use one of megatron, sglang, trtllm, vllm, vllm-v0"),
    (lambda: Workload(1, 1, dtype="int8"), "dtype 'int8' is not a model dtype"),
])
def test_invalid_configs_say_what_and_what_instead(make, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()
