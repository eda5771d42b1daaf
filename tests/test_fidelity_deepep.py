"""DeepEP dispatch and combine in vLLM (`--a2a deepep_ll` / `deepep_ht`, patterns/deepep.py):
the bytes of a message, the fp8 dispatch of block-fp8 checkpoints with its scales, and the
rows per destination, by hand. Sources: vLLM @ c8109375 `fused_moe/all2all_utils.py:205-208`,
`prepare_finalize/deepep_ll.py:64-80, 254-305`, `deepep_ht.py:35-48, 288-312`; DeepEP @
005dcc9d `csrc/kernels/internode_ll.cu` (num_bytes_per_msg)."""

import pytest

from patterns.engines import generate
from patterns.errors import ConfigError
from patterns.layout import Layout, Workload
from patterns.models import resolve_model
from patterns.ops import OpKind, Phase
from patterns.pattern import EngineOptions


def _a2a(model: str, a2a: str, layout: Layout, batch: int, **options):
    pattern = generate("vllm", resolve_model(model), layout, Workload(16, 2, batch=batch),
                       EngineOptions(a2a=a2a, **options))
    decode = [run for run in pattern.stages[0]
            if run.phase != Phase.WAVE_TAIL][-1].step  # the wave's tail: test_dp_wave.py
    ops = [op for op in decode.ops if op.kind == OpKind.ALLTOALL]
    dispatch, combine = ops[0], ops[1]
    return decode.tokens, dispatch, combine


@pytest.mark.parametrize("a2a, options, message", [
    # 16 B header + 7168 fp8 bytes + 7168 / 128 = 56 fp32 scales (224 B) = 7408 B; DeepEP
    # low latency takes batched kernels (BATCHED_DEEPGEMM), which quantise first.
    ("deepep_ll", {}, 16 + 7168 + 56 * 4),
    # fp8 data + scales, and the top-8 ids (int64) and weights (fp32): 7168 + 224 + 8 * 12,
    # with --moe-backend deep-gemm (quantised before the dispatch, deepep_ht.py:288-312).
    ("deepep_ht", {"moe_backend": "deep-gemm"}, 7168 + 56 * 4 + 8 * 12),
    # vLLM's default on an H100 with EP, FlashInfer CUTLASS, defers the quantisation
    # (fp8_moe.py): bf16 rows, 7168 x 2 = 14,336 B + 8 x 12 = 14,432 B.
    ("deepep_ht", {}, 7168 * 2 + 8 * 12),
])
def test_deepseek_v3_block_fp8_dispatch_rows(a2a, options, message):
    # dp 8 x tp 1 with --ep: no sequence parallelism; decode of 8 requests -> T = 8.
    tokens, dispatch, combine = _a2a("deepseek-v3", a2a, Layout(dp=8, ep=True), batch=8,
                                     **options)
    assert tokens == 8
    # 8 tokens x top-8 = 64 (token, expert) rows over 8 ranks: 8 per destination, 64 in all.
    assert (dispatch.shape, dispatch.dtype) == ((64, message), "uint8")
    # The combine returns bf16 rows of h: 64 x 7168 x 2 B.
    assert (combine.shape, combine.dtype) == ((64, 7168), "bf16")
    assert combine.bytes == 64 * 7168 * 2


def test_bf16_model_dispatches_bf16():
    # Qwen3-30B-A3B (bf16, h 2048, top-8), dp 4: T = 8; 8 x 8 / 4 = 16 rows per destination.
    _, ll, _ = _a2a("qwen3-30b-a3b", "deepep_ll", Layout(dp=4, ep=True), batch=8)
    assert ll.shape == (64, 16 + 2048 * 2)
    _, ht, _ = _a2a("qwen3-30b-a3b", "deepep_ht", Layout(dp=4, ep=True), batch=8)
    assert ht.shape == (64, 2048 * 2 + 8 * 12)


def test_mxfp4_gpt_oss_dispatches_bf16_of_the_padded_hidden_size():
    # gpt-oss-120b: mxfp4 experts take bf16 activations (no fp8 dispatch). h 2880 is not a
    # low-latency size: 3072 (16 + 3072 x 2 = 6160 B); high throughput rounds 5760 B up to
    # a multiple of 512: 6144 B = 3072 elements, + top-4 ids and weights (4 x 12 B).
    # dp 8: T = 8, 8 x 4 / 8 = 4 rows per destination, 32 in all.
    _, ll, ll_back = _a2a("gpt-oss-120b", "deepep_ll", Layout(dp=8, ep=True), batch=8)
    assert ll.shape == (32, 6160) and ll_back.shape == (32, 3072)
    _, ht, ht_back = _a2a("gpt-oss-120b", "deepep_ht", Layout(dp=8, ep=True), batch=8)
    assert ht.shape == (32, 6144 + 4 * 12) and ht_back.shape == (32, 3072)


def test_deepep_needs_ep_and_the_vllm_profile():
    with pytest.raises(ConfigError, match="a2a deepep_ll"):
        generate("vllm", resolve_model("qwen3-30b-a3b"), Layout(dp=2), Workload(16, 2),
                 EngineOptions(a2a="deepep_ll"))
    with pytest.raises(ConfigError, match="modelled for the vllm profile"):
        generate("sglang", resolve_model("qwen3-30b-a3b"), Layout(dp=2, ep=True),
                 Workload(16, 2), EngineOptions(a2a="deepep_ht"))
