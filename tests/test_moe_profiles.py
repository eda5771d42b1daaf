"""The `vllm` and `sglang` profiles with --dp N --ep: counts and shapes of whole steps,
hand-computed. Rules: patterns/moe.py (vLLM all2all.py @ 00143004, dp_utils.py @ 00746147,
fused_moe/config.py, prepare_finalize/naive_dp_ep.py @ 003d383e; SGLang
layers/dp_attention.py @ 14573efd); the DP step alignment: patterns/dp_steps.py.

Models: the presets deepseek-v3 (61 layers, first_k_dense_replace 3 -> 58 MoE layers, 256
experts, top-8, h 7168), qwen3-30b-a3b (48 MoE layers, 128 experts, top-8, h 2048),
gpt-oss-120b (36 MoE layers, 128 experts, top-4, h 2880), mixtral-8x7b; Llama 4 Scout from
its config.json text_config (values below). vLLM V1's capture sizes: [1, 2, 4] +
range(8, 256, 8) + range(256, 513, 16) (cap 512: max_num_seqs 1024, 8192 batched tokens).
DeepseekV3, Qwen3Moe, GptOss and Mixtral run Model Runner V1 by default (config/vllm.py
DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES lists DeepseekV2, Qwen2Moe, GraniteMoe only), so the
coordination tensor is [4, dp] int32 on the DP gloo group.
"""

import json
from collections import Counter

import pytest

from patterns import ConfigError, EngineOptions, Layout, Workload, generate, resolve_model
from patterns.models import from_hf_config
from patterns.ops import Phase, Transport
from patterns.volume import volume_by_group

DEEPSEEK = resolve_model("deepseek-v3")


def kinds(step) -> Counter:
    return Counter((op.kind.value, op.group) for op in step.ops)


def steps_of(pattern, dp_rank=0, stage=0):
    """The inference's own runs: vLLM's wave tail after them (dummy forwards to the DP
    wave's 32-step sync) is tested in tests/test_dp_wave.py."""
    return [(run.phase, run.step, run.repeat) for run in pattern.runs(stage, dp_rank)
            if run.phase != Phase.WAVE_TAIL]


def steps_of_runs(pattern, dp_rank):
    return [run for run in pattern.runs(0, dp_rank) if run.phase != Phase.WAVE_TAIL]


@pytest.mark.parametrize("backend", ["deep-gemm", "triton"])
def test_deepseek_v3_dp8_ep8_tp1_fp8_dispatch(backend):
    # --moe-backend deep-gemm / triton: the kernels take fp8 inputs, so the naive dispatch
    # quantises first (naive_dp_ep.py:16-52 @ c8109375).
    pat = generate("vllm", DEEPSEEK, Layout(dp=8, ep=True), Workload(16, 3, batch=128),
                   EngineOptions(moe_backend=backend))
    (p_phase, prefill, p_rep), (d_phase, decode, d_rep) = steps_of(pat)
    assert (p_phase, p_rep, d_phase, d_rep) == (Phase.PREFILL, 1, Phase.DECODE, 2)
    # Prefill: 128 x 16 = 2048 tokens per rank, above the 512 cap: eager, unpadded.
    # Decode: 128 requests, a capture size: T = 128 on every rank.
    assert (prefill.tokens, decode.tokens) == (2048, 128)
    for step in (prefill, decode):
        # 1 coordination all-reduce; 58 MoE layers x (4 dispatch all-gathers: fp8 hidden
        # states, top-k weights and ids, fp8 scales (block-fp8 checkpoint, naive_dp_ep.py @
        # c8109375) + 1 combine reduce-scatter) over the DP group; the 3 dense layers and the
        # logits issue nothing at tp 1: 1 + 58 * 5 = 291.
        assert len(step.ops) == 291
        assert kinds(step) == {("allreduce", "dp"): 1, ("allgather", "dp"): 232,
                               ("reducescatter", "dp"): 58}
    coord = decode.ops[0]
    assert (coord.shape, coord.dtype, coord.transport) == ((4, 8), "int32", Transport.GLOO)
    hidden, weights, ids, scales, combine = decode.ops[1:6]
    assert hidden.tag == "layers.3.mlp.experts.dispatch.hidden_states"
    # fp8 (1 byte) hidden states; 7168 / 128 = 56 fp32 scales a token.
    assert (hidden.shape, hidden.out_shape, hidden.dtype) == ((128, 7168), (1024, 7168),
                                                              "uint8")
    assert (scales.shape, scales.out_shape, scales.dtype) == ((128, 56), (1024, 56), "fp32")
    assert (weights.shape, weights.dtype, ids.dtype) == ((128, 8), "fp32", "int32")
    assert combine.dtype == "bf16"  # the experts' output stays bf16
    assert (combine.shape, combine.out_shape) == ((1024, 7168), (128, 7168))
    assert {op.transport for op in decode.ops[1:]} == {Transport.NCCL}  # PyNccl all_gatherv
    # Calls per inference on a rank: 3 steps x 291, then the wave's tail: async scheduling
    # (vLLM's default) learns the requests are done one step after the last, step 4, so the
    # wave runs to its sync at step 32: 29 dummy forwards of 291 calls (T = 1 on every
    # rank) and the sync's all-reduce (dp_wave.py): 873 + 29 * 291 + 1 = 9313.
    assert pat.calls_per_inference(0) == 873 + 29 * 291 + 1 == 9313


@pytest.mark.parametrize("options", [{}, {"moe_backend": "flashinfer-cutlass"},
                                     {"gpu": "h200"}])
def test_deepseek_v3_dp8_ep8_tp1_flashinfer_cutlass_bf16_dispatch(options):
    # vLLM's default on SM90 for block-fp8 with EP (oracle/fp8.py:113-122 @ c8109375: "prefer
    # ... FI CUTLASS for EP"): FlashInferExperts.expects_unquantized_inputs
    # (flashinfer_cutlass_moe.py:127-128), so the dispatch defers quantisation: bf16 hidden
    # states, fp32 top-k weights, int32 top-k ids, no scales; then the bf16 reduce-scatter.
    # 1 + 58 x (3 + 1) = 233 calls a step.
    pat = generate("vllm", DEEPSEEK, Layout(dp=8, ep=True), Workload(16, 3, batch=128),
                   EngineOptions(**options))
    decode = steps_of(pat)[-1][1]
    assert len(decode.ops) == 233
    assert kinds(decode) == {("allreduce", "dp"): 1, ("allgather", "dp"): 174,
                             ("reducescatter", "dp"): 58}
    layer3 = [(op.kind.value, op.tag.rsplit(".", 1)[-1], op.shape, op.out_shape, op.dtype)
              for op in decode.ops if op.tag.startswith("layers.3.")]
    # T = 128 a rank, 8 ranks: [128, 7168] -> [1024, 7168] bf16 (2 B: 1,835,008 B sent).
    assert layer3 == [
        ("allgather", "hidden_states", (128, 7168), (1024, 7168), "bf16"),
        ("allgather", "topk_weights", (128, 8), (1024, 8), "fp32"),
        ("allgather", "topk_ids", (128, 8), (1024, 8), "int32"),
        ("reducescatter", "combine", (1024, 7168), (128, 7168), "bf16")]
    assert decode.ops[1].bytes == 128 * 7168 * 2


@pytest.mark.parametrize("gpu, a2a, backend, words", [
    ("b200", "allgather_reducescatter", "flashinfer-cutlass", "SM90 only"),
    ("h100", "allgather_reducescatter", "marlin", "does not run block-fp8 experts"),
    ("h100", "deepep_ll", "flashinfer-cutlass", "not DeepEP low latency's batched one"),
])
def test_fp8_moe_backend_refusals(gpu, a2a, backend, words):
    with pytest.raises(ConfigError, match=words):
        generate("vllm", DEEPSEEK, Layout(dp=8, ep=True), Workload(16, 3, batch=8),
                 EngineOptions(gpu=gpu, moe_backend=backend, a2a=a2a))


def test_deepseek_v3_dp2_tp4_ep_sequence_parallel():
    # --moe-backend deep-gemm: the fp8 dispatch with its scales (vLLM's default on an H100,
    # FlashInfer CUTLASS, dispatches bf16: test above).
    pat = generate("vllm", DEEPSEEK, Layout(dp=2, tp=4, ep=True), Workload(16, 2, batch=8),
                   EngineOptions(moe_backend="deep-gemm"))
    decode = steps_of(pat, dp_rank=1)[-1][1]
    assert decode.tokens == 8
    # DeepSeek's own sequence-parallel layers (patterns/vllm_sp.py, deepseek_v2.py @
    # c8109375): 1 coordination + embedding all-reduce + 3 dense layers x 2 all-reduces +
    # layer 3 (attention reduce-scatter + 4 EP all-gathers (fp8 hidden states, top-k weights
    # and ids, scales) + EP reduce-scatter) + 57 MoE layers x (input all-gather + those 6) +
    # the final [h, residual] all-gather + logits: 1 + 1 + 6 + 6 + 57 * 7 + 1 + 1 = 415.
    assert len(decode.ops) == 415
    assert kinds(decode) == {("allreduce", "dp"): 1, ("allreduce", "tp"): 1 + 6,
                             ("reducescatter", "tp"): 58,
                             ("allgather", "ep"): 232, ("reducescatter", "ep"): 58,
                             ("allgather", "tp"): 57 + 1 + 1}
    moe = [op for op in decode.ops if op.tag.startswith("layers.3.")]
    # 8 tokens / 4 TP ranks = 2 rows; the EP group of 8 gathers 16.
    assert [(op.kind.value, op.group, op.shape, op.out_shape) for op in moe] == [
        ("reducescatter", "tp", (8, 7168), (2, 7168)),
        ("allgather", "ep", (2, 7168), (16, 7168)),
        ("allgather", "ep", (2, 8), (16, 8)),
        ("allgather", "ep", (2, 8), (16, 8)),
        ("allgather", "ep", (2, 56), (16, 56)),
        ("reducescatter", "ep", (16, 7168), (2, 7168))]


def test_qwen3_30b_a3b_ep4_and_gpt_oss_120b_ep8():
    qwen = generate("vllm", resolve_model("qwen3-30b-a3b"), Layout(dp=4, ep=True),
                    Workload(8, 2, batch=64))
    decode = steps_of(qwen)[-1][1]
    # 48 MoE layers: 1 + 48 * 4 = 193; T = 64 (a capture size); EP group of 4.
    assert len(decode.ops) == 193 and decode.ops[0].shape == (4, 4)
    assert decode.ops[1].out_shape == (256, 2048)
    oss = generate("vllm", resolve_model("gpt-oss-120b"), Layout(dp=8, ep=True),
                   Workload(8, 2, batch=128))
    decode = steps_of(oss)[-1][1]
    # 36 MoE layers, top-4: 1 + 36 * 4 = 145; no torch_dtype -> bf16 hidden states.
    assert len(decode.ops) == 145
    assert [(op.shape, op.dtype) for op in decode.ops[1:3]] == [((128, 2880), "bf16"),
                                                                ((128, 4), "fp32")]


def test_mixtral_tp2_without_ep_unchanged():
    mixtral = resolve_model("mixtral-8x7b")
    plain = generate("vllm", mixtral, Layout(tp=2), Workload(16, 3))
    with_ep = generate("vllm", mixtral, Layout(tp=2, ep=True), Workload(16, 3))
    # --ep at dp 1: the EP group is the TP group, tokens replicated there: the same calls.
    assert plain.stages == with_ep.stages and not plain.dp_stages
    decode = steps_of(plain)[-1][1]
    # 1 embedding + 2 x 32 layers all-reduces + logits all-gather; no DP call.
    assert kinds(decode) == {("allreduce", "tp"): 65, ("allgather", "tp"): 1}


def test_llama4_scout_moe_every_layer(tmp_path):
    # meta-llama/Llama-4-Scout-17B-16E config.json text_config, as public copies quote it
    # (search-index file ids 52267445720, 67089035748): 48 layers, h 5120, 40 heads, 8 KV
    # heads, 16 experts, top-1, interleave_moe_layer_step 1, vocab 202048.
    config = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
              "text_config": {"model_type": "llama4_text", "num_hidden_layers": 48,
                              "hidden_size": 5120, "num_attention_heads": 40,
                              "num_key_value_heads": 8, "head_dim": 128,
                              "intermediate_size": 8192, "intermediate_size_mlp": 16384,
                              "vocab_size": 202048, "num_experts_per_tok": 1,
                              "num_local_experts": 16, "interleave_moe_layer_step": 1,
                              "torch_dtype": "bfloat16"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    scout = from_hf_config(tmp_path)
    assert scout.moe_layers == tuple(range(48))
    pat = generate("vllm", scout, Layout(dp=4, tp=2, ep=True), Workload(8, 2, batch=16))
    decode = steps_of(pat)[-1][1]
    # 1 + embed 1 + 48 x (o_proj + 3 EP gathers + reduce-scatter + TP gather) + logits 1.
    assert len(decode.ops) == 1 + 1 + 48 * 6 + 1
    gathers = [op for op in decode.ops if op.tag == "layers.0.feed_forward.experts"
               ".dispatch.topk_ids"]
    assert [(op.shape, op.out_shape) for op in gathers] == [((8, 1), (64, 1))]
    with pytest.raises(ConfigError, match="16 experts"):
        generate("vllm", scout, Layout(dp=3, ep=True), Workload(8, 2))


def test_uneven_dp_batches():
    layout = Layout(dp=4, ep=True)
    # Eager: prefill 3,5,2,8 x 16 = 48, 80, 32, 128 tokens, an all-gatherv.
    pat = generate("vllm", DEEPSEEK, layout, Workload(16, 3, dp_batches=(3, 5, 2, 8)),
                   EngineOptions(eager=True))
    prefill = steps_of(pat, dp_rank=2)[0][1]
    hidden = prefill.ops[1]
    assert hidden.shape == (32, 7168) and hidden.out_shape == (288, 7168)
    assert hidden.counts == (48 * 7168, 80 * 7168, 32 * 7168, 128 * 7168)
    # Graphed: every rank's T <= 512 runs a graph, so all pad to the largest: 128 in the
    # prefill, and decode 3,5,2,8 -> graph sizes 4,8,2,8 -> 8 (v1/worker/dp_utils.py).
    pat = generate("vllm", DEEPSEEK, layout, Workload(16, 3, dp_batches=(3, 5, 2, 8)))
    assert [[run.step.tokens for run in pat.runs(0, d) if run.phase != Phase.WAVE_TAIL]
            for d in range(4)] == [[128, 8]] * 4
    assert all(op.counts is None for op in pat.runs(0, 1)[0].step.ops)


def test_dp_ranks_with_different_prefill_chunks():
    # dp-batches 3,8 at prompt 2048: rank 0 prefills 6144 tokens in 1 chunk, rank 1 16384 in
    # 2 chunks of 8192. Global steps: (6144, 8192) eager; (decode 3 -> 4, 8192) rank 0's own
    # graph size, rank 1 eager; (3 -> 4, 8 -> 8) both graphed -> 8, 8; then rank 0 has
    # finished its 2 decode steps and runs a 1-token dummy step (graph size 1) beside rank
    # 1's last decode: max(1, 8) = 8.
    pat = generate("vllm", DEEPSEEK, Layout(dp=2, ep=True), Workload(2048, 3, dp_batches=(3, 8)))
    rank0 = [(run.phase.value, run.step.tokens, run.repeat) for run in steps_of_runs(pat, 0)]
    rank1 = [(run.phase.value, run.step.tokens, run.repeat) for run in steps_of_runs(pat, 1)]
    assert rank0 == [("prefill", 6144, 1), ("decode", 4, 1), ("decode", 8, 1), ("decode", 8, 1)]
    assert steps_of_runs(pat, 0)[-1].step.rows == 0  # the dummy step samples no row
    assert rank1 == [("prefill", 8192, 1), ("prefill", 8192, 1), ("decode", 8, 2)]
    step1 = pat.runs(0, 0)[1].step.ops[1]
    assert step1.counts == (4 * 7168, 8192 * 7168)  # uneven: an all-gatherv
    # Dummy steps sample nothing; both ranks issue 4 steps x 233 calls (1 + 58 x 4: the
    # bf16 dispatch of FlashInfer CUTLASS, vLLM's default here, has no scale tensor), then
    # the wave's tail to step 32 (4 real steps + 1 of async lag <= 32): 28 dummy steps of
    # 233 calls and the sync: 4 * 233 + 28 * 233 + 1.
    assert pat.calls_per_inference(0) == 32 * 233 + 1


def test_alltoall_and_volume_by_group():
    pat = generate("vllm", DEEPSEEK, Layout(dp=8, ep=True), Workload(16, 2, batch=128),
                   EngineOptions(a2a="alltoall"))
    decode = steps_of(pat)[-1][1]
    # DeepEP-style: 128 x 8 / 8 = 128 rows to each of 8 ranks, [1024, 7168] each way.
    assert len(decode.ops) == 1 + 58 * 2
    assert {(op.kind.value, op.group, op.shape, op.transport) for op in decode.ops[1:]} == {
        ("alltoall", "ep", (1024, 7168), Transport.NVSHMEM)}
    # Volume: 58 x 2 all-to-alls per step of rows x 7168 x 2 bytes x 7/8, rows = 8 x 2048
    # in the prefill (T 2048 x top-8 / 8 per peer) and 1024 in the decode step; the [4, 8]
    # int32 coordination is 128 bytes x 2 x 7/8 = 224 per step. The wave's tail: 2 real
    # steps + 1 of async lag -> the sync at step 32: 30 dummy steps of T = 1 (1 x 8 / 8 = 1
    # row to each peer: 8 rows each way) and the sync's [2] int32 all-reduce, 8 x 2 x 7/8 =
    # 14 bytes.
    ep = 58 * 2 * (16384 + 1024 + 30 * 8) * 7168 * 2 * 7 // 8
    assert volume_by_group(pat) == {"ep": ep, "dp": 32 * 224 + 14}
    with pytest.raises(ConfigError, match=r"needs --dp N \(N > 1\) and --ep \(here dp\(8\), ep "
                                          "False"):
        generate("vllm", DEEPSEEK, Layout(dp=8), Workload(16, 2), EngineOptions(a2a="alltoall"))


def test_dense_model_with_dp_is_replicas():
    llama = resolve_model("llama-3.1-8b")
    pat = generate("vllm", llama, Layout(dp=2, tp=2), Workload(16, 2, dp_batches=(4, 9)))
    # Each replica its own batch (decode 4 -> 4, 9 -> 16), no call outside its TP group.
    assert [pat.runs(0, d)[-1].step.tokens for d in range(2)] == [4, 16]
    assert {op.group for d in range(2) for run in pat.runs(0, d) for op in run.step.ops} == {
        "tp"}


def test_sglang_dp_attention_deepseek_dp8():
    pat = generate("sglang", DEEPSEEK, Layout(dp=8, ep=True), Workload(16, 2, batch=128))
    prefill, decode = steps_of(pat)[0][1], steps_of(pat)[-1][1]
    # Decode under graphs, MAX_LEN: MLPSyncBatchInfo all-gather (7 int64 per rank, gloo);
    # every one of the 61 layers (dense ones in FULL mode too) gathers [128, h] -> [1024, h]
    # and reduce-scatters back; logits: rows gathered, vocab shards all-gathered.
    assert len(decode.ops) == 1 + 61 * 2 + 2
    assert decode.ops[0].transport == Transport.GLOO and decode.ops[0].out_shape == (56,)
    assert [(op.kind.value, op.shape, op.out_shape) for op in decode.ops[1:3]] == [
        ("allgather", (128, 7168), (1024, 7168)), ("reducescatter", (1024, 7168), (128, 7168))]
    assert decode.ops[-1].shape == (1024, 129280 // 8)  # 129280 = 64 * 2020: no padding
    # Extend, SUM_LEN: all-reduces of the zero-filled [sum T, h] buffer, twice per layer.
    # DP attention divides chunked_prefill_size by dp (server_args.py:5572-5580 @
    # 8905cbd4): 8192 / 8 = 1024 tokens a chunk, so each rank's 128 x 16 = 2048 prompt
    # tokens take 2 extend steps of 1024: [8 x 1024, h].
    first = pat.stages[0][0]
    assert (first.phase.value, first.step.tokens, first.repeat) == ("prefill", 1024, 2)
    assert {(op.kind.value, op.shape) for op in prefill.ops[1:123]} == {
        ("allreduce", (8192, 7168))}


def test_engines_without_dp_rules_refuse_ep_and_sglang_dp_without_ep_is_replicas():
    # megatron models --ep (tests/test_megatron_moe.py)
    for engine in ("vllm-v0", "trtllm"):
        with pytest.raises(ConfigError, match=f"engine {engine} does not model --ep; use "
                                              "--engine sglang or vllm"):
            generate(engine, DEEPSEEK, Layout(dp=8, ep=True), Workload(16, 2))
    with pytest.raises(ConfigError, match="does not model dp\\(2\\) with the MoE model"):
        generate("trtllm", resolve_model("mixtral-8x7b"), Layout(dp=2, tp=2), Workload(16, 2))
    # SGLang --dp without --ep: its DP router, replicas with experts over TP (no DP call).
    pat = generate("sglang", resolve_model("mixtral-8x7b"), Layout(dp=2, tp=2),
                   Workload(16, 2))
    assert {op.group for run in pat.stages[0] for op in run.step.ops} == {"tp"}


def test_alltoall_needs_dp_and_ep():
    with pytest.raises(ConfigError, match=r"it needs --dp N \(N > 1\) and --ep \(here dp\(1\)"):
        generate("vllm", DEEPSEEK, Layout(tp=8, ep=True), Workload(16, 2),
                 EngineOptions(a2a="alltoall"))


@pytest.mark.parametrize("async_on, runner, transport", [
    # Model Runner V1 (DeepSeek-V3's default) all-reduces its [4, dp] int32 coordination
    # tensor on the DP group's gloo CPU group only when disable_nccl_for_dp_synchronization,
    # which config/vllm.py:1145-1156 @ c8109375 sets from async scheduling; without it, on
    # the NCCL device group (v1/worker/dp_utils.py:18-33, 53).
    (None, "v1", Transport.GLOO), (True, "v1", Transport.GLOO),
    (False, "v1", Transport.NCCL),
    # Model Runner V2 always uses the CPU group (v1/worker/gpu/dp_utils.py:32-37): [3, dp].
    (False, "v2", Transport.GLOO), (None, "v2", Transport.GLOO),
])
def test_dp_coordination_transport_follows_async_scheduling(async_on, runner, transport):
    pat = generate("vllm", DEEPSEEK, Layout(dp=8, ep=True), Workload(16, 3, batch=128),
                   EngineOptions(async_scheduling=async_on, model_runner=runner))
    for _phase, step, _repeat in steps_of(pat):
        coord = step.ops[0]
        assert coord.tag == "dp_utils.coordinate_batch_across_dp"
        rows = 4 if runner == "v1" else 3
        assert (coord.shape, coord.dtype, coord.transport) == ((rows, 8), "int32", transport)
