"""patterns/disagg: one request's KV transfer between a prefill and a decode layout, bytes and
rank pairs checked by hand against the connectors' code (cited in patterns/disagg/), and the
`pattern --disagg` output and refusals."""

import pytest

from patterns import ConfigError, EngineOptions, Workload, resolve_model
from patterns.disagg import generate_disagg, parse_disagg, plan_transfer
from patterns.disagg.layouts import connector_of
from tests.conftest import last_json

LLAMA70 = resolve_model("llama-3.1-70b")
DSV3 = resolve_model("deepseek-v3")


def transfer(model, spec, engine="vllm", connector=None, prompt=1000, kv="auto"):
    return plan_transfer(model, parse_disagg(spec), connector_of(engine, connector), prompt,
                         model.default_dtype, kv)


def pairs(t):
    return [(p.prefill, p.decode, p.src_head, p.dst_head, p.heads, t.descriptor_count(p),
             t.descriptor_bytes(p)) for p in t.pairs if not p.dummy]


# Llama-3.1-70B: 80 layers, 8 KV heads of 128, bf16: K and V of one head, one token, one
# layer = 2 x 128 x 2 = 512 bytes; the whole model 80 x 8 x 512 = 327,680 bytes a token.
# vLLM blocks of 16 tokens: a prompt of 1000 fills ceil(1000/16) = 63 blocks = 1008 slots,
# and the NixlConnector reads whole blocks.

def test_llama70b_vllm_tp4_to_tp8_by_hand():
    t = transfer(LLAMA70, "prefill=tp4,decode=tp8")
    # tp ratio 8/4 = 2: decode rank d reads from prefill rank d // 2 the one KV head it holds,
    # head d % 2 of the prefill rank's two (nixl/worker.py rank_offset, utils.py:470).
    # Per pair: 80 layers x 2 regions (K, V) x 63 blocks = 10,080 descriptors of 16 tokens x
    # 1 head x 128 x 2 bytes = 4,096 bytes: 41,287,680 bytes.
    assert pairs(t) == [(d // 2, d, d % 2, 0, 1, 10_080, 4_096) for d in range(8)]
    assert [t.pair_bytes(p) for p in t.pairs] == [41_287_680] * 8
    # 8 pairs x 41,287,680 = 330,301,440 = 1008 slots x 327,680: the whole cache, once.
    assert t.total_bytes == 330_301_440 == 1008 * 327_680
    assert t.direction == "read" and t.granularity == "block"


def test_llama70b_vllm_tp8_to_tp4_by_hand():
    t = transfer(LLAMA70, "prefill=tp8,decode=tp4")
    # tp ratio -2: decode rank d reads from prefill ranks 2d and 2d + 1, each read filling
    # half of its block (its head i of two): the same 8 pairs of 10,080 x 4,096 bytes.
    assert pairs(t) == [(2 * d + i, d, 0, i, 1, 10_080, 4_096) for d in range(4)
                        for i in range(2)]
    assert t.total_bytes == 330_301_440


def test_llama70b_descriptors_by_hand():
    t = transfer(LLAMA70, "prefill=tp4,decode=tp8")
    first, second = list(t.descriptors(t.pairs[1]))[:2]  # prefill 0 -> decode 1
    # HND: a prefill block is 2 heads x 16 tokens x 256 bytes = 8,192 bytes, head 1 starts
    # 4,096 bytes in; a decode block holds one head: 4,096 bytes.
    assert first == (4_096, 0, 4_096)
    assert second == (8_192 + 4_096, 4_096, 4_096)
    assert sum(n for _, _, n in t.descriptors(t.pairs[1])) == 41_287_680


def test_llama70b_sglang_mooncake_slices_by_hand():
    t = transfer(LLAMA70, "prefill=tp4,decode=tp8", "sglang", "mooncake")
    # Pages of 1 token; tp differs, so send_kvcache_slice: per layer, K/V and token one
    # descriptor of the decode rank's 1 head x 256 bytes: 80 x 2 x 1000 = 160,000 x 256 =
    # 40,960,000 bytes a pair, 8 pairs: 327,680,000 = 1000 x 327,680 (no partial block).
    assert pairs(t) == [(d // 2, d, d % 2, 0, 1, 160_000, 256) for d in range(8)]
    assert t.total_bytes == 327_680_000 and t.direction == "write"
    same = transfer(LLAMA70, "prefill=tp8,decode=tp8", "sglang", "mooncake")
    # Equal tp: send_kvcache, one run of the request's 1000 pages a layer and K/V:
    # 160 descriptors of 1000 x 256 = 256,000 bytes.
    assert pairs(same) == [(d, d, 0, 0, 1, 160, 256_000) for d in range(8)]


# DeepSeek-V3: MLA caches kv_lora_rank 512 + qk_rope_head_dim 64 = 576 values a token and
# layer, bf16: 1,152 bytes, on every TP rank; 61 layers. vLLM blocks of 64 (FlashMLA): a
# prompt of 1000 is 16 blocks = 1024 slots.

def test_deepseek_v3_mla_vllm_by_hand():
    t = transfer(DSV3, "prefill=tp8,decode=tp16")
    # ratio 2, cache replicated: decode rank d reads the whole latent from prefill d // 2:
    # 61 layers x 1 region x 16 blocks = 976 descriptors of 64 x 1,152 = 73,728 bytes =
    # 71,958,528 bytes a pair, 16 pairs: 1,151,336,448.
    assert pairs(t) == [(d // 2, d, 0, 0, 1, 976, 73_728) for d in range(16)]
    assert t.total_bytes == 16 * 71_958_528 == 1_151_336_448
    fewer = transfer(DSV3, "prefill=tp16,decode=tp8")
    # ratio -2: only the first prefill rank of each decode rank is read (worker.py:1924);
    # the other is notified: 8 pairs with data, 8 notifications.
    assert pairs(fewer) == [(2 * d, d, 0, 0, 1, 976, 73_728) for d in range(8)]
    assert sum(p.dummy for p in fewer.pairs) == 8
    assert fewer.total_bytes == 8 * 71_958_528


def test_deepseek_v3_fp8_cache_and_sglang_pages():
    # fp8 KV cache: one byte a value, 576 a token and layer: half of bf16's.
    assert transfer(DSV3, "prefill=tp8,decode=tp8", kv="fp8").total_bytes == \
        8 * 61 * 1024 * 576
    t = transfer(DSV3, "prefill=tp8,decode=tp8", "sglang", "nixl")
    # SGLang pages of 1: one run of 1000 x 1,152 bytes a layer, 61 descriptors a pair.
    assert pairs(t) == [(d, d, 0, 0, 1, 61, 1_152_000) for d in range(8)]


@pytest.mark.parametrize("engine, connector, spec, prefill_first", [
    ("vllm", "nixl", "prefill=tp2,decode=tp4", False),
    ("vllm", "nixl", "prefill=tp4,decode=tp2", False),
    ("sglang", "mooncake", "prefill=tp2,decode=tp4", False),
    ("sglang", "mooncake", "prefill=tp4,decode=tp2", False),
])
def test_every_decode_byte_written_once(engine, connector, spec, prefill_first):
    # Over all pairs, the descriptors tile each decode rank's buffer exactly (tiny sizes).
    model = resolve_model("llama-3.1-8b")
    t = transfer(model, spec, engine, connector, prompt=20)
    for d in range(t.decode.tp):
        covered = bytearray(t.decode.rank_bytes)
        for pair in (p for p in t.pairs if p.decode == d):
            for _, dst, n in t.descriptors(pair):
                assert not any(covered[dst:dst + n])
                covered[dst:dst + n] = b"\x01" * n
        assert all(covered)


@pytest.mark.parametrize("engine, connector, spec, words", [
    # vLLM refuses a replicated prefill cache read by fewer decode ranks (worker.py:1417).
    ("vllm", "nixl", "prefill=tp16,decode=tp4", "replicated prefill cache"),
    # prefill 2 heads a rank, decode 1 (replicated): not 4 decode blocks a prefill block.
    ("vllm", "nixl", "prefill=tp4,decode=tp16", "exactly tp-ratio decode blocks"),
    ("vllm", "mooncake", "prefill=tp4,decode=tp8", "not modelled"),
    ("trtllm", "nixl", "prefill=tp4,decode=tp8", "no disaggregated-serving connector"),
    ("sglang", "lmcache", "prefill=tp4,decode=tp8", "has no lmcache connector"),
])
def test_refusals(engine, connector, spec, words):
    with pytest.raises(ConfigError, match=words):
        generate_disagg(engine, LLAMA70, parse_disagg(spec), Workload(prompt=64, decode=8),
                        EngineOptions(), connector)


def test_heads_that_cannot_map_and_decode_that_does_not_fit():
    # Llama-2-13B has 40 KV heads: tp 4 and tp 10 both split them, neither divides the other.
    with pytest.raises(ConfigError, match="neither divides"):
        generate_disagg("vllm", resolve_model("llama-2-13b"),
                        parse_disagg("prefill=tp4,decode=tp10"), Workload(prompt=64, decode=8),
                        EngineOptions())
    # Llama-3.1-8B decode tp1: 64 requests of 32,768 + 128 tokens at 131,072 bytes a token
    # (32 layers x 8 heads x 512) = 275.9 GB of KV cache, beyond 0.9 x 80 GiB.
    with pytest.raises(ConfigError, match="does not hold the batch"):
        generate_disagg("vllm", resolve_model("llama-3.1-8b"),
                        parse_disagg("prefill=tp1,decode=tp1"),
                        Workload(prompt=32_768, decode=128, batch=64), EngineOptions())


def test_pattern_json_and_bad_input_lines(cli):
    status, out, _ = cli("pattern", "--model", "llama-3.1-70b", "--disagg",
                         "prefill=tp4,decode=tp8", "--prompt", "1000", "--decode", "16",
                         "--format", "json")
    doc = last_json(out)
    assert status == 0 and doc["kv_transfer_bytes"] == 330_301_440
    assert {r["side"] for r in doc["rows"]} == {"prefill", "transfer", "decode"}
    read = [r for r in doc["rows"] if r["op"] == "kv_read"]
    assert read == [{**read[0], "count": 10_080, "bytes": 4_096, "pairs": 8}]
    assert doc["kv_transfer"]["pairs"][0]["decode_rank"] == 4  # job ranks: prefill first
    for argv, words in (
            (["--disagg", "prefill=tp4,decode=tp8", "--tp", "2"], "drop --tp"),
            (["--disagg", "prefill=tp4,decode=tp8", "--connector", "ucx"], "no ucx connector"),
            (["--disagg", "prefill=tp4,decode=tp16"], "exactly tp-ratio"),
            (["--disagg", "prefill=tp4,decode=tp1"], "does not hold the batch"),
            (["--connector", "nixl"], "add --disagg")):
        status, out, err = cli("pattern", "--model", "llama-3.1-70b", "--prompt", "64",
                               "--decode", "8", *argv)
        assert (status, out) == (2, "") and words in err and len(err.splitlines()) == 1
