"""`plan`'s memory held against public deployments (issue 40's must-show): quantized
checkpoints as vLLM loads them, the cards as their drivers report them, vLLM's own overhead,
the KV cache a deployment gets at max_model_len, and layouts vLLM would not load. Each figure
is cited (the vLLM log it was held against) or computed by hand.

The configs (tests/data/configs/README.md): Meta's Llama-3.1-405B-Instruct-FP8 (fbgemm_fp8),
Qwen/Qwen3-235B-A22B-FP8 (block fp8), openai/gpt-oss-120b (mxfp4), DeepSeek-R1 = V3 (block
fp8)."""

import json
from pathlib import Path

import pytest

from tests.conftest import last_json

CONFIGS = Path(__file__).parent / "data" / "configs"
SWEEP = next((Path(__file__).parent.parent / "results" / "examples" / "plan-sweeps")
             .glob("*-intra-shm"))
GIB = 1 << 30
RUN = ("--prompt", "1024", "--decode", "256", "--sweep", str(SWEEP), "--sweep-inter",
       str(SWEEP), "--format", "json")


def meta_405b_fp8(folder: Path) -> str:
    """Meta's config as Meta's quantizer leaves the checkpoint. The stored copy (OME's test
    fixture) lists modules_to_not_convert abridged: layers 0 and 125's MLP and layer 0's
    attention. Meta's converter (meta-llama/llama-models, quantization/loader.py:
    `if block.layer_id == 0 or block.layer_id == (model.n_layers - 1): continue`, then
    feed_forward w1/w3/w2 only) converts the MLP of layers 1-124 alone, so every layer's
    attention is bf16 in the checkpoint, and the config lists it: the remaining layers'
    q/k/v/o are added here, as the list goes on (layer 0's k, o, q, v order)."""
    raw = json.loads((CONFIGS / "llama-3.1-405b-instruct-fp8" / "config.json").read_text())
    listed = raw["quantization_config"]["modules_to_not_convert"]
    listed += [f"model.layers.{i}.self_attn.{p}" for i in range(1, 126)
               for p in ("k_proj", "o_proj", "q_proj", "v_proj")]
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    return str(folder)


def _rows(out: str) -> dict:
    doc = last_json(out)
    return doc, {(r["tp"], r["pp"], r["dp"], r["ep"]): r for r in doc["layouts"]}


@pytest.mark.parametrize("gpu", ["h100", "a100"])
def test_meta_405b_fp8_fits_8_gpus_at_tp8(cli, tmp_path, gpu):
    # vLLM logs "Loading model weights took 57.7520 GB" (GiB) on each of 8 H100s at TP8
    # (vllm-project/vllm#6746), and serves it "with default vLLM args" (vllm#6689, the
    # maintainers' FAQ): max_model_len 131,072. Hand: a rank of TP8 holds the MLP of 124
    # layers in fp8, 3 x 16384 x 53248 / 8 = 327,155,712 B each plus its per-row fp32
    # scales; layers 0 and 125's MLP and every layer's attention (q, o 16384^2 / 8, k, v
    # one KV head 16384 x 128) in bf16; embedding and LM head 128256 x 16384 / 8 each, bf16.
    status, out, err = cli("plan", "--model", meta_405b_fp8(tmp_path), "--gpus", "8",
                           "--gpus-per-node", "8", "--gpu", gpu, *RUN)
    assert status == 0, err
    doc, rows = _rows(out)
    tp8 = rows[(8, 1, 1, False)]
    assert tp8["fits_memory"], tp8["memory"]["reason"]
    assert tp8["weight_bytes_per_gpu"] / GIB == pytest.approx(57.752, rel=0.10)
    # every weight as stored: 124 x (327,155,712 + a 4 B scale an output row: gate and up
    # 2 x 53,248 / 8 rows, down_proj its 16,384 rows of 6,656 inputs) + 2 x 654,311,424
    # + 126 x 2 x (2 x 16384^2 / 8 + 2 x 16384 x 128) + 2 x 2 x 128256 x 16384 / 8
    # + 126 x 2 x 2 x 16384 (norms) + 2 x 16384 (final norm) B.
    mlp = 124 * (327_155_712 + 4 * (2 * 53248 // 8 + 16384)) + 2 * 654_311_424
    attention = 126 * 2 * (2 * 16384 ** 2 // 8 + 2 * 16384 * 128)
    rest = 2 * 2 * 128256 * 16384 // 8 + 126 * 2 * 2 * 16384 + 2 * 16384
    assert tp8["weight_bytes_per_gpu"] == mlp + attention + rest
    assert doc["checkpoint"] == "fbgemm_fp8 (fp8 per-row)"
    if gpu == "a100":  # no fp8 units: loaded weight-only, said so
        assert any("a100 has no fp8 units" in n for n in doc["notes"])


def test_qwen3_235b_fp8_kv_capacity_on_4_h100(cli):
    # vLLM logs "Available KV cache memory: 8.11 GiB" and "GPU KV cache size: 178,880
    # tokens" for Qwen3-235B-A22B-FP8 at TP4 on 4 H100 at the default 0.9
    # (vllm-project/vllm#21348); within 15%.
    status, out, err = cli("plan", "--model", str(CONFIGS / "qwen3-235b-a22b-fp8"), "--gpus",
                           "4", "--gpus-per-node", "4", *RUN)
    assert status == 0, err
    doc, rows = _rows(out)
    tp4 = rows[(4, 1, 1, False)]
    assert tp4["kv_capacity_tokens"] == pytest.approx(178_880, rel=0.15)
    # One token's cache on a rank: 94 layers x K and V of one KV head (4 over TP4) x 128
    # x 2 B = 48,128 B; max_model_len 40,960 (the config's max_position_embeddings):
    # one request 1,971,322,880 B; max concurrency = tokens / 40,960.
    assert tp4["max_model_len_kv_bytes_per_gpu"] == 94 * 512 * 40_960 == 1_971_322_880
    assert doc["max_model_len"] == 40_960
    assert tp4["max_concurrency"] == pytest.approx(tp4["kv_capacity_tokens"] / 40_960,
                                                   abs=0.01)
    terms = tp4["memory"]["overhead"]
    assert set(terms) == {"profile_activation_bytes", "sampler_bytes", "profile_peak_bytes",
                          "moe_workspace_bytes", "cuda_graph_bytes", "communication_bytes",
                          "non_torch_reserve_bytes", "total_bytes"}
    # the sampler's logits over max_num_seqs 1024 x vocab 151,936 x (2 B bf16 + 3 x 4 B fp32)
    assert terms["sampler_bytes"] == 1024 * 151_936 * 14
    # the MoE workspace: 8192 tokens x top-8 x (max(384, 4096) + max(768, 4096)) x 2 B
    assert terms["moe_workspace_bytes"] == 8192 * 8 * (4096 + 4096) * 2


def test_gpt_oss_120b_does_not_fit_one_h100(cli):
    # vLLM logs "Available KV cache memory: -2.14 GiB" for gpt-oss-120b on one H100 at its
    # defaults (vllm-project/vllm#23278): it does not start. One request of 131,072 tokens
    # needs 18 full-attention layers x 131,072 + 18 sliding layers x 128 (the window)
    # tokens x 8 KV heads x 64 x 2 (K, V) x 2 B = 4,836,032,512 B.
    status, out, err = cli("plan", "--model", str(CONFIGS / "gpt-oss-120b"), "--gpus", "1",
                           "--gpus-per-node", "1", *RUN[:-2])
    assert status == 0, err
    assert "no layout fits" in out
    assert "cannot hold one request of max_model_len 131,072 (4.50 GiB)" in out
    status, out, err = cli("plan", "--model", str(CONFIGS / "gpt-oss-120b"), "--gpus", "1",
                           "--gpus-per-node", "1", *RUN)
    [row] = last_json(out)["layouts"]
    assert not row["fits_memory"] and not row["best"]
    assert row["max_model_len_kv_bytes_per_gpu"] == (18 * 131_072 + 18 * 128) * 2048


def test_layouts_vllm_does_not_load_are_listed_apart(cli):
    # DeepSeek-V3's dense MLP at TP32: 18,432 / 32 = 576 inputs of down_proj, not a whole
    # number of 128-wide blocks (vLLM fp8_utils.py validate_fp8_block_shape).
    status, out, err = cli("plan", "--model", "deepseek-v3", "--gpus", "32",
                           "--gpus-per-node", "8", *RUN)
    assert status == 0, err
    doc, rows = _rows(out)
    assert not any(tp == 32 for tp, _, _, _ in rows)
    assert ("tp=32 pp=1 dp=1: vLLM does not load it: layer 0 mlp.down_proj: Weight "
            "input_size_per_partition = 576 is not divisible by weight quantization "
            "block_k = 128.") in doc["not_loadable"]
    # Qwen3-235B-FP8 at TP8 without EP: each expert's 1,536 / 8 = 192 rows (Fp8MoEMethod);
    # with EP the experts stay whole, and it loads.
    status, out, err = cli("plan", "--model", str(CONFIGS / "qwen3-235b-a22b-fp8"), "--gpus",
                           "8", "--gpus-per-node", "8", *RUN)
    doc, rows = _rows(out)
    assert (8, 1, 1, False) not in rows and (8, 1, 1, True) in rows
    assert ("tp=8 pp=1 dp=1: vLLM does not load it: layer 0 mlp.experts: The output_size "
            "of gate's and up's weight = 192 is not divisible by weight quantization "
            "block_n = 128.") in doc["not_loadable"]


def test_an_unknown_quant_method_is_refused_in_one_line(cli, tmp_path):
    raw = json.loads((CONFIGS / "qwen3-8b" / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    status, out, err = cli("plan", "--model", str(tmp_path), "--gpus", "8",
                           "--gpus-per-node", "8", *RUN)
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "quant_method 'bitsandbytes' is not modelled" in err


def test_the_cards_as_their_drivers_report_them(cli):
    status, out, err = cli("plan", "--list-gpus")
    assert status == 0, err
    table = out.splitlines()
    assert [line.split()[0] for line in table[2:-1]] == [
        "h100", "h200", "b200", "gb200", "a100", "a100-40gb", "h20", "h800", "mi300x",
        "mi325x", "mi355x"]
    gpus = {g["gpu"]: g for g in last_json(out)["gpus"]}
    # nvidia-smi's totals quoted in analysis/hardware.py: B200 183,359 MiB (179.06 GiB),
    # H100 81,559; rocm-smi's MI300X 205,822,885,888 B = 196,288 MiB.
    assert (gpus["b200"]["memory_mib"], gpus["h100"]["memory_mib"],
            gpus["mi300x"]["memory_mib"]) == (183359, 81559, 196288)
    assert gpus["a100"]["fp8_tflops"] is None
    assert "179.06" in next(line for line in table if line.startswith("b200"))


def test_kv_cache_fp8_halves_the_cache(cli):
    figures = {}
    for kv in ("auto", "fp8"):
        status, out, err = cli("plan", "--model", str(CONFIGS / "qwen3-235b-a22b-fp8"),
                               "--gpus", "4", "--gpus-per-node", "4", "--kv-cache-dtype", kv,
                               *RUN)
        assert status == 0, err
        figures[kv] = _rows(out)[1][(4, 1, 1, False)]
    auto, fp8 = figures["auto"], figures["fp8"]
    assert fp8["kv_cache_bytes_per_gpu"] * 2 == auto["kv_cache_bytes_per_gpu"]
    assert fp8["max_model_len_kv_bytes_per_gpu"] * 2 == auto["max_model_len_kv_bytes_per_gpu"]
    # the same bytes left for the cache hold twice the tokens (each count rounded down)
    assert fp8["kv_capacity_tokens"] in (2 * auto["kv_capacity_tokens"],
                                         2 * auto["kv_capacity_tokens"] + 1)
    assert fp8["compute_decode_step_us"] < auto["compute_decode_step_us"]


def test_max_model_len_beyond_the_context_is_refused(cli):
    status, out, err = cli("plan", "--model", str(CONFIGS / "qwen3-235b-a22b-fp8"), "--gpus",
                           "4", "--gpus-per-node", "4", "--max-model-len", "50000", *RUN)
    assert status == 2 and out == ""
    assert "--max-model-len 50,000 is beyond" in err and "give at most 40,960" in err


def test_a_card_runs_the_engine_rules_of_its_architecture(cli):
    # The 40 GB A100 takes vLLM's A100 defaults, max_num_seqs 256 and max_num_batched_tokens
    # 2048 (patterns/engines/vllm/rules.py, engine/arg_utils.py:2529-2551 @ c8109375), and
    # its own memory: 40,960 MiB x 0.9.
    status, out, err = cli("plan", "--model", "llama-3.1-8b", "--gpus", "8", "--gpus-per-node",
                           "8", "--gpu", "a100-40gb", *RUN)
    assert status == 0, err
    doc = last_json(out)
    assert (doc["max_num_seqs"], doc["max_batched_tokens"]) == (256, 2048)
    assert doc["memory_limit_bytes"] == int(40960 / 1024 * 0.9 * GIB)
    assert any(n.startswith("--gpu a100-40gb: memory") for n in doc["notes"])
