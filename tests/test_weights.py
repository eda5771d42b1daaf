"""patterns/weights.py: parameter counts checked against the published totals, and the
weights one GPU holds under a layout checked by hand; `plan --gpu-memory` leaves out the
layouts that do not fit."""

from dataclasses import replace
from pathlib import Path

import pytest

from patterns import ConfigError, Layout, from_hf_config, resolve_model
from patterns.weights import gpu_memory_bytes, total_params
from tests.conftest import last_json
from tests.replay_helpers import tiny_model
from tests.test_plan import FLAT, PLAN, fake_sweep

CONFIGS = Path(__file__).parent / "data" / "configs"


def gpu_weight_bytes(model, layout, dtype):  # the heaviest rank's weights: no KV cache
    return gpu_memory_bytes(model, layout, dtype, 0)[0]


@pytest.mark.parametrize("name, params", [
    # Llama-3.1-8B, h 4096, 32 layers, vocab 128256, 8 KV heads of 128, MLP 14336, untied:
    # embedding and LM head 2 x 128256 x 4096 = 1,050,673,152; a layer q 4096^2 + k, v
    # 2 x 4096 x 1024 + o 4096^2 + MLP 3 x 4096 x 14336 + 2 norms x 4096 = 218,112,000,
    # x 32 = 6,979,584,000; final norm 4096: 8,030,261,248 (its model card: 8.03B).
    ("llama-3.1-8b", 8_030_261_248),
    # Llama-3.1-70B, h 8192, 80 layers, MLP 28672: 2 x 128256 x 8192 = 2,101,346,304; a
    # layer 2 x 8192^2 + 2 x 8192 x 1024 + 3 x 8192 x 28672 + 2 x 8192 = 855,654,400, x 80 =
    # 68,452,352,000; + 8192: 70,553,706,496 (model card: 70.6B).
    ("llama-3.1-70b", 70_553_706_496),
    # Mixtral-8x7B: 2 x 32000 x 4096 = 262,144,000; a layer's attention 41,943,040, 8
    # experts x 3 x 4096 x 14336 = 1,409,286,144, router 4096 x 8, norms 8192: 1,451,270,144,
    # x 32 = 46,440,644,608; + 4096: 46,702,792,704 (model card: 46.7B).
    ("mixtral-8x7b", 46_702_792_704),
])
def test_dense_and_mixtral_counts_by_hand(name, params):
    assert total_params(resolve_model(name)) == params


@pytest.mark.parametrize("name, published, tolerance", [
    # Model cards: DeepSeek-V3 "671B total parameters" (the 14B MTP module apart), Qwen3-
    # 30B-A3B "30.5B", gpt-oss-120b "116.8B" (biases and sinks, not counted, make the rest),
    # Llama-3.1-405B 405.85B.
    ("deepseek-v3", 671e9, 0.001), ("qwen3-30b-a3b", 30.5e9, 0.002),
    ("gpt-oss-120b", 116.8e9, 0.001), ("llama-3.1-405b", 405.85e9, 0.0005),
])
def test_moe_and_mla_counts_match_the_model_cards(name, published, tolerance):
    assert total_params(resolve_model(name)) == pytest.approx(published, rel=tolerance)


def test_tp8_of_llama_70b_by_hand():
    # A rank of TP8: per layer q and o 8192^2 / 8 each, k and v one KV head each (8 heads
    # over 8 ranks) 8192 x 128, MLP 3 x 8192 x 28672 / 8, norms 2 x 8192: 106,971,136, x 80
    # = 8,557,690,880; embedding and LM head 128256 x 8192 / 8 each = 2 x 131,334,144;
    # final norm 8192: 8,820,367,360 parameters, bf16: 17,640,734,720 bytes.
    model = resolve_model("llama-3.1-70b")
    assert gpu_weight_bytes(model, Layout(tp=8), "bf16") == 17_640_734_720


def test_expert_parallel_holds_whole_experts_and_full_attention():
    # Mixtral DP2 with EP over 2 ranks: each rank has the whole attention (41,943,040 a
    # layer), 4 whole experts (4 x 3 x 4096 x 14336 = 704,643,072), router and norms
    # (32,768 + 8192): 746,627,072 x 32 = 23,892,066,304; embedding and LM head unsplit
    # 2 x 131,072,000; final norm 4096: 24,154,214,400 parameters, 48,308,428,800 bytes.
    model = resolve_model("mixtral-8x7b")
    assert gpu_weight_bytes(model, Layout(tp=1, dp=2, ep=True), "bf16") == 48_308_428_800
    # TP2 splits the experts instead: same expert bytes, half the attention and vocab.
    assert gpu_weight_bytes(model, Layout(tp=2), "bf16") < 48_308_428_800


def test_quantized_checkpoints_from_their_config():
    deepseek = from_hf_config(f"{CONFIGS}/deepseek-r1")
    assert (deepseek.weight_format, deepseek.q_lora_rank, deepseek.kv_lora_rank,
            deepseek.moe_intermediate_size, deepseek.shared_expert_intermediate_size) == (
        "fp8", 1536, 512, 2048, 2048)
    # The fp8 checkpoint: the decoder's matrices D in 1 byte, embedding and LM head V in 2;
    # against bf16 everywhere (D + 2V) / (2D + 2V) = 0.5 + V / (2D + 2V): V / D is 0.27% on
    # a rank of TP8 (2 x 129280 x 7168 / 8 = 231.7 M of 84.5 G parameters).
    fp8 = gpu_weight_bytes(deepseek, Layout(tp=8), "bf16")
    assert 0.50 < fp8 / gpu_weight_bytes(replace(deepseek, weight_format="", quantization=None),
                                         Layout(tp=8),
                                         "bf16") < 0.51
    assert fp8 == gpu_weight_bytes(resolve_model("deepseek-v3"), Layout(tp=8), "bf16")
    # The Qwen3-30B-A3B copy is the MLX 4-bit one: a quantization_config with no
    # quant_method, which vLLM does not load: its weights are refused, not read as bf16;
    # its shapes are the preset's.
    mlx = from_hf_config(f"{CONFIGS}/qwen3-30b-a3b")
    with pytest.raises(ConfigError, match="has no quant_method"):
        gpu_weight_bytes(mlx, Layout(tp=8), "bf16")
    plain = gpu_weight_bytes(replace(mlx, quantization=None), Layout(tp=8), "bf16")
    assert plain == gpu_weight_bytes(resolve_model("qwen3-30b-a3b"), Layout(tp=8), "bf16")
    gpt = from_hf_config(f"{CONFIGS}/gpt-oss-20b")
    assert gpt.weight_format == "mxfp4" and gpt.head_dim == 64


def test_kv_cache_by_hand():
    # Llama-3.1-70B TP8: one KV head of 128 a rank, K and V in bf16: 512 B a token and
    # layer, x 80 layers x 1280 tokens = 52,428,800 B. DeepSeek-V3's MLA caches its latent
    # (512 + 64) x 2 B = 1,152 B a token and layer on every TP rank, x 61 x 1280 =
    # 89,948,160 B.
    assert gpu_memory_bytes(resolve_model("llama-3.1-70b"), Layout(tp=8), "bf16",
                            1280) == (17_640_734_720, 52_428_800)
    assert gpu_memory_bytes(resolve_model("deepseek-v3"), Layout(tp=8), "bf16",
                            1280)[1] == 89_948_160


def test_plan_leaves_out_what_does_not_fit(cli, tmp_path):
    sweep = fake_sweep(tmp_path / "sweep", FLAT)
    model = tiny_model(tmp_path)
    # The tiny model (h 64, 4 layers of 4 heads of 16, vocab 1000 padded to 1024, MLP 256,
    # untied), bf16, batch 1 of 8 + 4 tokens. One rank holding it all (dp=4 replicas):
    # weights 4 layers x (4 x 64^2 + 3 x 64 x 256 + 2 norms x 64) = 262,656, embedding and
    # LM head 2 x 1024 x 64 = 131,072, final norm 64: 393,792 parameters, 787,584 B
    # (769.12 KiB); KV 4 layers x 2 x 4 heads x 16 x 2 B x 12 tokens = 12,288 B. TP2:
    # weights 4 x (2 x 64^2 + 3 x 64 x 256 / 2 + 128) + 131,072 / 2 + 64 = 197,184
    # parameters, 394,368 B, KV half, 6,144 B. PP2's fuller stage, the last: 2 x 65,664 +
    # 65,536 + 64 = 196,928 parameters, 393,856 B, KV 2 layers, 6,144 B. A GPU allowed
    # Activations of a 16-token step (--max-batched-tokens 16): 16 x (2 x 64 + 3 x 256 / tp)
    # x 2 B = 28,672 B at TP1, 16,384 at TP2. A GPU allowed 450 KiB (460,800 B: --gpu-memory
    # x 0.9) keeps TP2 x DP2 (416,896 B, and 6,144 B more for one request of --max-model-len
    # 12) and PP2 x DP2 (428,672 + 6,144), not the replicas of one rank (828,544 + 12,288),
    # which are listed apart with their figures, never best.
    gib = 460_800 / 0.9 / 2**30
    status, out, err = cli("plan", "--model", model, "--sweep", str(sweep), *PLAN,
                           "--gpu-memory", str(gib), "--max-batched-tokens", "16",
                           "--max-model-len", "12", "--format", "json")
    assert status == 0, err
    doc = last_json(out)
    assert doc["gpu_memory_gib"] == pytest.approx(gib)
    assert doc["gpu_memory_utilization"] == 0.9
    memory = {(x["tp"], x["pp"], x["dp"]): (x["weight_bytes_per_gpu"],
                                             x["kv_cache_bytes_per_gpu"],
                                             x["activation_bytes_per_gpu"], x["fits_memory"])
              for x in doc["layouts"]}
    assert memory[(2, 1, 2)] == (394_368, 6_144, 16_384, True)
    assert memory[(1, 2, 2)] == (393_856, 6_144, 28_672, True)
    assert memory[(1, 1, 4)] == (787_584, 12_288, 28_672, False)
    assert not any(x["best"] for x in doc["layouts"] if not x["fits_memory"])
    for flag, value, message in (("--gpu-memory", "0", "--gpu-memory 0.0 must be a positive"),
                                 ("--gpu-memory-utilization", "1.5",
                                  "--gpu-memory-utilization 1.5 must be in (0, 1]")):
        status, out, err = cli("plan", "--model", model, "--sweep", str(sweep), *PLAN,
                               flag, value)
        assert status == 2 and out == "" and message in err, err
