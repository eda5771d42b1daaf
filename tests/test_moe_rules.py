"""MoE rules under DP attention and expert parallelism (patterns/moe.py), hand-computed.

Model numbers are the real config.json values:
- DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json, engine spec section 8): hidden_size 7168,
  num_hidden_layers 61, first_k_dense_replace 3, moe_layer_freq 1 -> layers 3..60 MoE
  (vLLM models/deepseek_v2.py DeepseekV2DecoderLayer), n_routed_experts 256,
  num_experts_per_tok 8, num_attention_heads 128.
- Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B config.json): hidden_size 2048, 48 layers,
  decoder_sparse_step 1, mlp_only_layers [] -> every layer MoE (models/qwen3_moe.py),
  num_experts 128, num_experts_per_tok 8, num_attention_heads 32.
- gpt-oss-120b (openai/gpt-oss-120b config.json): hidden_size 2880, 36 layers, every one MoE,
  num_local_experts 128, experts_per_token 4, num_attention_heads 64.
- Llama 4 Scout (meta-llama/Llama-4-Scout-17B-16E text_config): hidden_size 5120, 48 layers,
  interleave_moe_layer_step 1 -> every layer MoE (models/llama4.py), num_local_experts 16,
  num_experts_per_tok 1, num_attention_heads 40.
- Mixtral-8x7B: the `mixtral-8x7b` preset (32 layers, h 4096, 8 experts, top-2).
The step builder is the test stand-in (tests/moe_standin.py); the rules are patterns/moe.py.
"""

from collections import Counter
from fractions import Fraction

import pytest

from patterns import ConfigError, Layout, ModelConfig, OpKind, Workload, resolve_model
from patterns.dp_steps import dp_padded_tokens
from patterns.engines.sglang.dp import sglang_dp_layer, sglang_mlp_sync, sglang_padding_mode
from patterns.engines.vllm.moe import vllm_moe_layer
from patterns.groups import group_of, groups
from patterns.moe import notes
from patterns.volume import volume_by_group, volume_bytes
from tests.moe_standin import MoeDims, graph_size, pattern, step_ops

DEEPSEEK_V3 = MoeDims(hidden=7168, layers=61, moe_layers=tuple(range(3, 61)), experts=256,
                      top_k=8)
QWEN3_30B = MoeDims(hidden=2048, layers=48, moe_layers=tuple(range(48)), experts=128, top_k=8)
GPT_OSS_120B = MoeDims(hidden=2880, layers=36, moe_layers=tuple(range(36)), experts=128,
                       top_k=4)
LLAMA4_SCOUT = MoeDims(hidden=5120, layers=48, moe_layers=tuple(range(48)), experts=16,
                       top_k=1)
MIXTRAL = MoeDims(hidden=4096, layers=32, moe_layers=tuple(range(32)), experts=8, top_k=2)


def model_of(dims: MoeDims, heads: int, name: str) -> ModelConfig:
    return ModelConfig(name=name, hidden_size=dims.hidden, num_hidden_layers=dims.layers,
                       vocab_size=1000, num_attention_heads=heads, num_key_value_heads=heads,
                       intermediate_size=1, torch_dtype="bf16", num_local_experts=dims.experts,
                       num_experts_per_tok=dims.top_k)


def by_kind(ops) -> Counter:
    return Counter((op.kind.value, op.group) for op in ops)


# --- groups and layout ---

def test_groups_follow_vllm_rank_order():
    # rank = (dp_rank * pp + pp_rank) * tp + tp_rank (parallel_state.py
    # initialize_model_parallel, ranks as [ExternalDP, DP, PP, TP]); the EP group is
    # all_ranks.transpose(DP, PP).reshape(-1, dp * tp).
    layout = Layout(tp=2, pp=2, dp=2, ep=True)
    assert groups(layout, "tp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert groups(layout, "pp") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert groups(layout, "dp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert groups(layout, "ep") == [(0, 1, 4, 5), (2, 3, 6, 7)]
    assert group_of(layout, "ep", 6) == (2, 3, 6, 7)
    # rank 6 = (1 * 2 + 1) * 2 + 0: DP rank 1, stage 1, TP rank 0.
    assert (layout.dp_rank_of(6), layout.stage_of(6), layout.tp_rank_of(6)) == (1, 1, 0)
    assert layout.world_size == 8 and layout.rank_of(1, 0, 1) == 6


def test_layout_validation_names_every_factor():
    deepseek = model_of(DEEPSEEK_V3, 128, "deepseek-v3")
    with pytest.raises(ConfigError, match=r"dp\(3\) x tp\(1\) = 3 ranks does not divide the "
                                          r"256 experts of deepseek-v3"):
        Layout(dp=3, ep=True).check_model(deepseek)
    Layout(dp=32, ep=True).check_model(deepseek)  # 256 % 32 == 0
    # Llama 4 Scout: 16 experts, so DP4 x TP2 = 8 fits and DP3 does not.
    scout = model_of(LLAMA4_SCOUT, 40, "llama-4-scout")
    Layout(dp=4, tp=2, ep=True).check_model(scout)
    with pytest.raises(ConfigError, match="16 experts"):
        Layout(dp=3, ep=True).check_model(scout)
    with pytest.raises(ConfigError, match="ep needs a mixture-of-experts model"):
        Layout(dp=2, ep=True).check_model(resolve_model("llama-3.1-8b"))
    with pytest.raises(ConfigError, match=r"dp-batches gives 3 batches for dp\(4\)"):
        Layout(dp=4, ep=True).check_workload(Workload(8, 8, dp_batches=(3, 5, 2)))
    with pytest.raises(ConfigError, match=r"dp\(0\)"):
        Layout(dp=0)
    with pytest.raises(ConfigError, match=r"world size 4 .* dp\(2\) x tp\(4\) x pp\(1\) = 8"):
        Layout(dp=2, tp=4).check_world_size(4)


def test_dense_model_with_dp_is_independent_replicas():
    dense = resolve_model("llama-3.1-8b")
    said = notes(dense, Layout(dp=4, tp=2))
    assert said and "4 independent replicas, no call between them" in said[0]
    # vllm-v0 generates per-replica TP calls only: no dp or ep group in any op.
    from patterns import generate
    pat = generate("vllm-v0", dense, Layout(dp=2, tp=2), Workload(4, 2))
    assert {op.group for run in pat.stages[0] for op in run.step.ops} == {"tp"}


# --- vLLM allgather_reducescatter (device_communicators/all2all.py AgRsAll2AllManager) ---

def test_deepseek_v3_dp8_ep8_tp1_decode_step():
    layout = Layout(dp=8, ep=True)
    tokens = dp_padded_tokens([128] * 8, graph_size)  # decode, batch 128: graph size 128
    assert tokens == (128,) * 8
    ops = step_ops(DEEPSEEK_V3, layout, tokens, dp_rank=0)
    # 1 DP coordination all-reduce [3, 8] int32 (Model Runner V2, v1/worker/dp_utils.py),
    # then 58 MoE layers x (3 all-gathers of the dispatch + 1 reduce-scatter); the 3 dense
    # layers issue nothing at tp 1: 1 + 58 * 4 = 233 calls.
    assert len(ops) == 233
    assert by_kind(ops) == {("allreduce", "dp"): 1, ("allgather", "dp"): 174,
                            ("reducescatter", "dp"): 58}
    assert ops[0].shape == (3, 8) and ops[0].dtype == "int32"
    assert ops[1].tag == "layers.3.mlp.experts.dispatch.hidden_states"  # first MoE layer
    hidden, weights, ids, combine = ops[1:5]
    assert (hidden.shape, hidden.out_shape, hidden.dtype) == ((128, 7168), (1024, 7168), "bf16")
    assert hidden.bytes == 128 * 7168 * 2 == 1_835_008
    assert (weights.shape, weights.dtype, weights.bytes) == ((128, 8), "fp32", 128 * 8 * 4)
    assert (ids.shape, ids.dtype, ids.bytes) == ((128, 8), "int32", 4096)
    assert (combine.kind, combine.shape, combine.out_shape) == (
        OpKind.REDUCESCATTER, (1024, 7168), (128, 7168))
    assert combine.bytes == 1024 * 7168 * 2 == 14_680_064
    assert all(op.counts is None for op in ops)  # equal sizes: ncclAllGather/ReduceScatter


def test_deepseek_v3_dp2_tp4_ep_sequence_parallel_moe():
    # tp > 1 and dp > 1: use_sequence_parallel_moe; the EP group is DP x TP = 8 ranks.
    layout = Layout(dp=2, tp=4, ep=True)
    ops = step_ops(DEEPSEEK_V3, layout, (128, 128), dp_rank=1)
    # 1 coordination; 3 dense layers x (o_proj + down_proj all-reduces); 58 MoE layers x
    # (o_proj all-reduce + 3 dispatch all-gathers + combine + TP all-gather):
    # 1 + 3 * 2 + 58 * 6 = 355.
    assert len(ops) == 355
    assert by_kind(ops) == {("allreduce", "dp"): 1, ("allreduce", "tp"): 3 * 2 + 58,
                            ("allgather", "ep"): 3 * 58, ("reducescatter", "ep"): 58,
                            ("allgather", "tp"): 58}
    moe = [op for op in ops if op.tag.startswith("layers.3.mlp.experts")]
    # sequence_parallel_chunk: 128 / 4 = 32 rows per TP rank; 8 EP ranks gather 256.
    assert [(op.kind.value, op.group, op.shape, op.out_shape) for op in moe] == [
        ("allgather", "ep", (32, 7168), (256, 7168)),
        ("allgather", "ep", (32, 8), (256, 8)),
        ("allgather", "ep", (32, 8), (256, 8)),
        ("reducescatter", "ep", (256, 7168), (32, 7168)),
        ("allgather", "tp", (32, 7168), (128, 7168)),
    ]
    # T not divisible by tp: padded to a multiple first (10 -> 12, 3 rows each).
    odd = vllm_moe_layer("m", layout, (10, 10), 0, 7168, 8, "bf16")
    assert odd[0].shape == (3, 7168) and odd[-1].out_shape == (12, 7168)


def test_qwen3_30b_a3b_ep4():
    # DP4 with --ep: an EP group of 4 holding 128 / 4 = 32 experts each. Qwen3MoeForCausalLM
    # runs Model Runner V1 (spec 10.1): the coordination tensor is [4, dp] int32.
    layout = Layout(dp=4, ep=True)
    ops = step_ops(QWEN3_30B, layout, (64,) * 4, 0, runner="v1")
    assert len(ops) == 1 + 48 * 4 == 193
    assert ops[0].shape == (4, 4)
    assert ops[1].out_shape == (256, 2048) and ops[1].bytes == 64 * 2048 * 2
    # TP4 with --ep at dp 1: the EP group is the TP group, tokens are replicated there, so a
    # MoE layer is one TP all-reduce as without --ep (moe_runner._maybe_reduce_final_output).
    tp_only = vllm_moe_layer("m", Layout(tp=4, ep=True), (64,), 0, 2048, 8, "bf16")
    assert [(op.kind.value, op.group, op.shape) for op in tp_only] == [
        ("allreduce", "tp", (64, 2048))]


def test_gpt_oss_120b_ep8():
    layout = Layout(dp=8, ep=True)
    ops = step_ops(GPT_OSS_120B, layout, (128,) * 8, 3)
    # every one of the 36 layers is MoE: 1 + 36 * 4 = 145; top-4 routing.
    assert len(ops) == 145
    hidden, weights = ops[1], ops[2]
    assert hidden.shape == (128, 2880) and hidden.bytes == 128 * 2880 * 2 == 737_280
    assert weights.shape == (128, 4) and weights.bytes == 128 * 4 * 4 == 2048


def test_mixtral_tp2_without_ep_is_unchanged():
    # No EP, no DP: one TP all-reduce per MoE layer, no coordination, no dispatch.
    layout = Layout(tp=2)
    ops = step_ops(MIXTRAL, layout, (7,), 0)
    assert len(ops) == 2 * 32 and by_kind(ops) == {("allreduce", "tp"): 64}
    assert {op.shape for op in ops} == {(7, 4096)}
    said = notes(resolve_model("mixtral-8x7b"), layout)
    assert "every expert sharded over TP (one all-reduce per MoE layer)" in said[0]


def test_llama4_scout_moe_every_layer():
    layout = Layout(dp=4, tp=2, ep=True)
    ops = step_ops(LLAMA4_SCOUT, layout, (16,) * 4, 2)
    # 48 layers, all MoE with SP (tp 2, dp 4): per layer o_proj all-reduce + 3 EP all-gathers
    # + reduce-scatter + TP all-gather; 1 + 48 * 6 = 289. Top-1: topk tensors [8, 1].
    assert len(ops) == 289
    assert [op.shape for op in ops[2:5]] == [(8, 5120), (8, 1), (8, 1)]
    assert ops[2].out_shape == (64, 5120)  # 8 rows x 8 EP ranks


def test_uneven_dp_batches():
    # --dp-batches 3,5,2,8 at prompt 16: the eager prefill runs 48, 80, 32, 128 tokens.
    layout = Layout(dp=4, ep=True)
    model = model_of(DEEPSEEK_V3, 128, "deepseek-v3")
    pat = pattern(model, DEEPSEEK_V3, layout, Workload(16, 3, dp_batches=(3, 5, 2, 8)))
    prefill = [replica[0][0].step for replica in pat.replicas()]
    assert [s.tokens for s in prefill] == [48, 80, 32, 128]
    hidden = prefill[1].ops[1]
    assert hidden.shape == (80, 7168) and hidden.out_shape == (288, 7168)  # 48+80+32+128
    assert hidden.counts == (48 * 7168, 80 * 7168, 32 * 7168, 128 * 7168)
    combine = prefill[3].ops[4]
    assert combine.shape == (288, 7168) and combine.out_shape == (128, 7168)
    assert combine.counts == hidden.counts
    # Decode under CUDA graphs: 3, 5, 2, 8 pad to graph sizes 4, 8, 2, 8, then every DP
    # rank to the largest (v1/worker/dp_utils.py _post_process_dp_padding): 8, equal.
    decode = [replica[0][1].step for replica in pat.replicas()]
    assert {s.tokens for s in decode} == {8} and decode[0].ops[1].counts is None
    # One eager rank (T > 512, no graph) makes every rank keep its own padded count: 3 -> 4
    # (row 1 of the coordination tensor is each rank's own padded count).
    assert dp_padded_tokens([3, 600], graph_size) == (4, 600)


def test_volume_by_group_counts_each_ep_call_once():
    layout = Layout(dp=4, ep=True)
    model = model_of(DEEPSEEK_V3, 128, "deepseek-v3")
    pat = pattern(model, DEEPSEEK_V3, layout, Workload(16, 2, dp_batches=(3, 5, 2, 8)))
    # Prefill: gathered rows 288; per MoE layer the hidden all-gatherv moves
    # 288*7168*2 * 3/4, the two [288, 8] 4-byte tensors 288*8*4 * 3/4 each, the combine
    # 288*7168*2 * 3/4. Decode (1 step): 4 ranks x 8 rows = 32 rows, the same factors.
    # Coordination: [3, 4] int32 = 48 bytes, all-reduce 48 * 2 * 3/4 = 72, per step.
    def per_layer(rows: int) -> Fraction:
        return Fraction(3, 4) * (rows * 7168 * 2 * 2 + rows * 8 * 4 * 2)
    expected_dp = 58 * (per_layer(288) + per_layer(32)) + 2 * 72
    assert volume_by_group(pat) == {"dp": expected_dp}
    assert volume_bytes(pat)["total"] == expected_dp


def test_alltoall_dispatch_and_combine():
    # --a2a alltoall (DeepEP): T_r * k token rows over the EP group, spread evenly:
    # 128 * 8 / 8 = 128 rows to each of 8 ranks, [1024, 7168] each way.
    layout = Layout(dp=8, ep=True)
    ops = step_ops(DEEPSEEK_V3, layout, (128,) * 8, 0, a2a="alltoall")
    assert len(ops) == 1 + 58 * 2
    dispatch, combine = ops[1], ops[2]
    assert (dispatch.kind, dispatch.group, dispatch.shape) == (OpKind.ALLTOALL, "ep",
                                                               (1024, 7168))
    assert combine.tag.endswith("combine") and combine.shape == (1024, 7168)


# --- SGLang DP attention (layers/dp_attention.py) ---

def test_sglang_padding_modes():
    assert sglang_padding_mode((128,) * 8, extend=False, graphed=True) == "max_len"
    assert sglang_padding_mode((48, 80), extend=True, graphed=False) == "sum_len"
    # eager decode: sum*2 >= max*dp -> MAX_LEN: (3+5+2+8)*2 = 36 >= 8*4 = 32
    assert sglang_padding_mode((3, 5, 2, 8), extend=False, graphed=False) == "max_len"
    # (1+1+1+16)*2 = 38 < 16*4 = 64 -> SUM_LEN
    assert sglang_padding_mode((1, 1, 1, 16), extend=False, graphed=False) == "sum_len"


def test_sglang_deepseek_dp8_decode_and_extend():
    layout = Layout(dp=8, ep=True)
    sync = sglang_mlp_sync(layout)
    assert [(op.kind.value, op.group, op.shape, op.out_shape, op.dtype) for op in sync] == [
        ("allgather", "ep", (7,), (56,), "int64")]
    # MAX_LEN (decode under graphs), attention TP 1: all_gather_into_tensor [128, h] ->
    # [1024, h] over the TP (= ep) group, then dp_reduce_scatter_tensor back.
    layer = sglang_dp_layer("layers.0", layout, (128,) * 8, 0, 7168, "bf16", "max_len")
    assert [(op.kind.value, op.group, op.shape, op.out_shape) for op in layer] == [
        ("allgather", "ep", (128, 7168), (1024, 7168)),
        ("reducescatter", "ep", (1024, 7168), (128, 7168))]
    # SUM_LEN (extend): all-reduce of the zero-filled [sum T, h] buffer, and the experts'
    # all-reduce of [sum T, h] before dp_scatter's local copy.
    extend = sglang_dp_layer("layers.0", layout, (48, 80, 32, 128, 1, 1, 1, 1), 0, 7168,
                             "bf16", "sum_len")
    assert [(op.kind.value, op.shape) for op in extend] == [("allreduce", (292, 7168))] * 2
    # Attention TP 2 (tp 16, dp 8 in SGLang's terms): the partial attention output is
    # reduce-scattered inside the attention TP group first, [128, h] -> [64, h].
    wide = sglang_dp_layer("l", Layout(dp=8, tp=2, ep=True), (128,) * 8, 0, 7168, "bf16",
                           "max_len")
    assert [(op.kind.value, op.group, op.shape, op.out_shape) for op in wide] == [
        ("reducescatter", "tp", (128, 7168), (64, 7168)),
        ("allgather", "ep", (64, 7168), (1024, 7168)),
        ("reducescatter", "ep", (1024, 7168), (64, 7168)),
        ("allgather", "tp", (64, 7168), (128, 7168))]
    deepep = sglang_dp_layer("l", layout, (128,) * 8, 0, 7168, "bf16", "max_len", top_k=8,
                             a2a="alltoall")
    assert [(op.kind.value, op.shape) for op in deepep] == [("alltoall", (1024, 7168))] * 2


def test_dp_ranks_with_different_prefill_chunks_line_up_with_dummy_steps():
    from patterns import Phase
    from patterns.dp_steps import DUMMY_STEP, RankStep, align_dp_runs
    # DP rank 0: one 6144-token prefill chunk, then 3 decode steps of 3 requests; DP rank 1:
    # two chunks (8192 + 8192), then 3 decode steps of 8. Global steps: 1 + 3 = 4 on rank 0
    # and 2 + 3 = 5 on rank 1, so rank 0 runs one dummy step at the end.
    p0, d0 = RankStep(Phase.PREFILL, 6144, 3), RankStep(Phase.DECODE, 3, 3)
    p1, d1 = RankStep(Phase.PREFILL, 8192, 8), RankStep(Phase.DECODE, 8, 8)
    runs = align_dp_runs([[(p0, 1), (d0, 3)], [(p1, 2), (d1, 3)]])
    assert runs == [((p0, p1), 1), ((d0, p1), 1), ((d0, d1), 2), ((DUMMY_STEP, d1), 1)]
    assert sum(repeat for _, repeat in runs) == 5


def test_moe_with_dp_but_no_ep_gathers_over_dp_and_reduces_over_tp():
    # fused_moe/config.py: without --ep, flatten_tp_across_dp shards every expert over the
    # dp x tp ranks; tokens are still gathered over DP (naive dispatch), no SP-MoE, and the
    # TP ranks' partial sums are all-reduced after the combine.
    layout = Layout(dp=2, tp=2)
    ops = vllm_moe_layer("m", layout, (16, 16), 0, 4096, 2, "bf16")
    assert [(op.kind.value, op.group, op.shape, op.out_shape) for op in ops] == [
        ("allgather", "dp", (16, 4096), (32, 4096)),
        ("allgather", "dp", (16, 2), (32, 2)),
        ("allgather", "dp", (16, 2), (32, 2)),
        ("reducescatter", "dp", (32, 4096), (16, 4096)),
        ("allreduce", "tp", (16, 4096), (16, 4096))]
    with pytest.raises(ConfigError, match="a2a alltoall needs --ep"):
        vllm_moe_layer("m", layout, (16, 16), 0, 4096, 2, "bf16", a2a="alltoall")


def test_sglang_step_tokens():
    from patterns import Phase
    from patterns.dp_steps import SGLANG_IDLE_STEP, RankStep
    from patterns.engines.sglang.dp import sglang_step_tokens
    decode = [RankStep(Phase.DECODE, b, b) for b in (3, 5, 2, 10)]
    # Graphed decode: every rank runs the graph of the largest batch, 10 -> 12 in SGLang's
    # sizes [1, 2, 4, 8, 12, 16, ...] (server_args.py); MAX_LEN.
    sizes = [1, 2, 4, 8, 12, 16]
    graph = lambda t: next((s for s in sizes if s >= t), None)  # noqa: E731
    assert sglang_step_tokens(decode, graph) == ((12,) * 4, "max_len")
    # An extend on one rank (others idle: 0 tokens): own counts, SUM_LEN.
    steps = [RankStep(Phase.PREFILL, 48, 3), SGLANG_IDLE_STEP]
    assert sglang_step_tokens(steps, graph) == ((48, 0), "sum_len")
