"""SGLang's embedding under DP attention (patterns/engines/sglang/embedding.py): vocab-sharded
over the attention-TP group and all-reduced there when attn_tp > 1 (SGLang @ 8905cbd4
`layers/vocab_parallel_embedding.py:246-252, 562-574`; `models/qwen2_moe.py:837-843`,
`deepseek_v2.py:2380-2384`), by hand. Here --tp is the attention TP (SGLang's --tp is
dp x tp), so `--dp 4 --tp 4 --ep` is 16 ranks with attention-TP groups of 4."""

import pytest

from patterns import ConfigError, EngineOptions, Layout, Workload, generate, resolve_model
from patterns.ops import OpKind, Phase, Transport

QWEN = resolve_model("qwen3-30b-a3b")  # h 2048, 48 MoE layers


def _first(pattern, phase, dp_rank=0):
    return next(run.step for run in pattern.runs(0, dp_rank) if run.phase == phase)


def test_qwen3_moe_dp4_tp4_embedding_allreduce_in_prefill_and_decode(cli):
    pat = generate("sglang", QWEN, Layout(dp=4, tp=4, ep=True), Workload(100, 3))
    prefill, decode = _first(pat, Phase.PREFILL), _first(pat, Phase.DECODE)
    for step, tokens in ((prefill, 100), (decode, 1)):
        # After the per-step MLPSyncBatchInfo all-gather (gloo), the embedding's all-reduce
        # of this rank's [T, 2048] bf16 over its attention-TP group of 4, on NCCL (the
        # attention-TP group has no custom all-reduce: parallel_state.py:2270-2283).
        embed = step.ops[1]
        assert (embed.kind, embed.group, embed.group_size, embed.shape, embed.dtype,
                embed.transport, embed.tag) == (OpKind.ALLREDUCE, "tp", 4, (tokens, 2048),
                                                "bf16", Transport.NCCL, "embed_tokens")
        assert sum(op.tag == "embed_tokens" for op in step.ops) == 1
    # The extend runs eager with T = 100 (one prompt of 100 < 8192 / 4 = 2048, one chunk);
    # the decode step of 1 request replays the graph of 1.
    assert (prefill.tokens, decode.tokens) == (100, 1)
    # The table shows both rows.
    status, out, err = cli("pattern", "--engine", "sglang", "--model", "qwen3-30b-a3b",
                           "--dp", "4", "--tp", "4", "--ep", "--prompt", "100", "--decode",
                           "3")
    assert status == 0, err
    rows = [line.split()[:8] for line in out.splitlines()]
    assert ["prefill", "0", "allreduce", "tp/4", "[100,2048]", "[100,2048]", "bf16",
            "nccl"] in rows
    assert ["decode", "0", "allreduce", "tp/4", "[1,2048]", "[1,2048]", "bf16", "nccl"] in rows


def test_deepseek_v3_and_idle_ranks():
    # DeepSeek-V3 (get_embedding_tp_kwargs: the attention-TP group), dp 2 x attention tp 2,
    # eager: DP rank 0 has 1 prompt of 16 tokens and DP rank 1 3 prompts (48 tokens); each
    # all-reduces its own [T, 7168].
    pat = generate("sglang", resolve_model("deepseek-v3"), Layout(dp=2, tp=2, ep=True),
                   Workload(16, 2, dp_batches=(1, 3)), EngineOptions(eager=True))
    shapes = [next(op.shape for op in _first(pat, Phase.PREFILL, d).ops
                   if op.tag == "embed_tokens") for d in (0, 1)]
    assert shapes == [(16, 7168), (48, 7168)]


def test_attention_tp_1_has_none_and_whole_tp_models_are_refused():
    pat = generate("sglang", QWEN, Layout(dp=4, ep=True), Workload(100, 3))
    assert not any(op.tag == "embed_tokens" for run in pat.stages[0] for op in run.step.ops)
    # Mixtral's embedding is the whole TP group's (models/mixtral.py:276-280): refused.
    with pytest.raises(ConfigError, match="builds the embedding of mixtral over the whole TP"):
        generate("sglang", resolve_model("mixtral-8x7b"), Layout(dp=2, tp=2, ep=True),
                 Workload(16, 2))


def test_dp_attention_divides_the_chunked_prefill_size_by_dp():
    # server_args.py:5572-5580: chunked_prefill_size 8192 // dp 4 = 2048 a rank; a prompt of
    # 3000 tokens takes 2 extend steps, 2048 then 952.
    pat = generate("sglang", QWEN, Layout(dp=4, ep=True), Workload(3000, 2))
    assert [(run.phase.value, run.step.tokens) for run in pat.stages[0]][:2] == [
        ("prefill", 2048), ("prefill", 952)]
    pat = generate("sglang", QWEN, Layout(dp=4, ep=True), Workload(3000, 2),
                   EngineOptions(max_batched_tokens=4096))  # given: 4096 // 4 = 1024
    assert [run.step.tokens for run in pat.stages[0] if run.phase == Phase.PREFILL] == [
        1024, 952] and pat.stages[0][0].repeat == 2
