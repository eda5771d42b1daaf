"""patterns/disagg: one request's KV transfer between a prefill and a decode layout, bytes and
rank pairs checked by hand against the connectors' code (cited in patterns/disagg/), and the
`pattern --disagg` output and refusals."""

from dataclasses import replace

import pytest

from patterns import ConfigError, EngineOptions, Workload, resolve_model
from patterns.disagg import generate_disagg, parse_disagg, plan_transfer
from patterns.disagg.layouts import connector_of
from tests.conftest import last_json

LLAMA70 = resolve_model("llama-3.1-70b")
DSV3 = resolve_model("deepseek-v3")


def transfer(model, spec, engine="vllm", connector=None, prompt=1000, kv="auto",
             version=None, gpu="h100", chunk=None, block=None):
    return plan_transfer(model, parse_disagg(spec), connector_of(engine, connector, version),
                         prompt, model.default_dtype, kv, block, gpu, chunk)


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
    # head d % 2 of the prefill rank's two (nixl/tp_mapping.py:84, 135 @ c8109375).
    # K and V packed (#44455, nixl/base_worker.py:1097-1100, 1384-1445): one region a layer,
    # one descriptor a block of the head's 16 tokens x (K 128 + V 128) x 2 bytes = 8,192;
    # per pair 80 layers x 63 blocks = 5,040 descriptors: 41,287,680 bytes.
    assert pairs(t) == [(d // 2, d, d % 2, 0, 1, 5_040, 8_192) for d in range(8)]
    assert [t.pair_bytes(p) for p in t.pairs] == [41_287_680] * 8
    # 8 pairs x 41,287,680 = 330,301,440 = 1008 slots x 327,680: the whole cache, once.
    assert t.total_bytes == 330_301_440 == 1008 * 327_680
    assert t.direction == "read" and t.granularity == "block"
    assert t.connector.version == "c8109375"


def test_llama70b_vllm_before_44455_two_regions():
    # vLLM cda19ecf: K and V two regions a layer (utils.py:385 @ cda19ecf): 80 x 2 x 63 =
    # 10,080 descriptors of 16 x 128 x 2 = 4,096 bytes a pair, the same bytes.
    t = transfer(LLAMA70, "prefill=tp4,decode=tp8", version="cda19ecf")
    assert pairs(t) == [(d // 2, d, d % 2, 0, 1, 10_080, 4_096) for d in range(8)]
    assert t.total_bytes == 330_301_440


def test_llama70b_vllm_tp8_to_tp4_by_hand():
    t = transfer(LLAMA70, "prefill=tp8,decode=tp4")
    # tp ratio -2: decode rank d reads from prefill ranks 2d and 2d + 1, each read filling
    # half of its block (its head i of two): the same 8 pairs of 5,040 x 8,192 bytes.
    assert pairs(t) == [(2 * d + i, d, 0, i, 1, 5_040, 8_192) for d in range(4)
                        for i in range(2)]
    assert t.total_bytes == 330_301_440


def test_llama70b_decode_tp_above_kv_heads_45879():
    # #45879: prefill TP4 (2 heads a rank) -> decode TP16 (8 KV heads: each decode rank holds
    # one, replicated on 2 ranks). Decode rank d reads from prefill rank d * 4 // 16 = d // 4
    # (tp_mapping.py:84) its head d * 8 // 16 = d // 2, at offset d // 2 - 2 * (d // 4) in
    # the prefill rank's heads (tp_mapping.py:129-132): 5,040 descriptors of one head's
    # 8,192 bytes a pair, 16 pairs: every head moves twice, 2 x 330,301,440 bytes.
    t = transfer(LLAMA70, "prefill=tp4,decode=tp16")
    assert pairs(t) == [(d // 4, d, (d // 2) % 2, 0, 1, 5_040, 8_192) for d in range(16)]
    assert t.total_bytes == 16 * 41_287_680 == 2 * 330_301_440
    # Prefill TP2 (4 heads a rank) -> decode TP16: head d // 2 of prefill rank d // 8, the
    # (d // 2 - 4 * (d // 8))-th of its four.
    wide = transfer(LLAMA70, "prefill=tp2,decode=tp16")
    assert [(p.prefill, p.src_head) for p in wide.pairs] == [(d // 8, (d // 2) % 4)
                                                            for d in range(16)]
    # Before #45879 (cda19ecf) the handshake refused it: a prefill block is not 4 decode
    # blocks.
    with pytest.raises(ConfigError, match="before #45879"):
        transfer(LLAMA70, "prefill=tp4,decode=tp16", version="cda19ecf")


def test_vllm_push_connector_writes_what_pull_reads():
    # NixlPushConnector (push_worker.py:499-590 @ c8109375): the prefill ranks WRITE. Prefill
    # TP4 -> decode TP8: prefill rank p writes half its block (1 head of 2) to each of decode
    # ranks 2p and 2p + 1: the pull connector's 8 pairs, 5,040 descriptors of 8,192 bytes.
    t = transfer(LLAMA70, "prefill=tp4,decode=tp8", connector="nixl-push")
    assert t.direction == "write"
    assert pairs(t) == [(d // 2, d, d % 2, 0, 1, 5_040, 8_192) for d in range(8)]
    # TP8 -> TP4: prefill rank p writes its head into decode rank p // 2 at head p mod 2.
    fewer = transfer(LLAMA70, "prefill=tp8,decode=tp4", connector="nixl-push")
    assert pairs(fewer) == [(p, p // 2, 0, p % 2, 1, 5_040, 8_192) for p in range(8)]
    # MLA TP8 -> TP16: each prefill rank writes the whole latent to both its decode ranks
    # (replicate_attn, push_worker.py:524-528): 16 pairs of 61 x 63 blocks of 18,432 bytes.
    mla = transfer(DSV3, "prefill=tp8,decode=tp16", connector="nixl-push")
    assert pairs(mla) == [(d // 2, d, 0, 0, 1, 3_843, 18_432) for d in range(16)]
    # MLA TP16 -> TP8: each prefill rank writes its latent to decode rank p // 2, so two
    # prefill ranks write the same decode blocks: 16 pairs, twice the 8 x 70,834,176 bytes.
    dup = transfer(DSV3, "prefill=tp16,decode=tp8", connector="nixl-push")
    assert [(p.prefill, p.decode) for p in dup.pairs] == [(p, p // 2) for p in range(16)]
    assert dup.total_bytes == 16 * 70_834_176
    # A decode side above the KV heads from a smaller prefill side: refused seen from the
    # prefill rank (base_worker.py:1716-1722); and the push connector is not in cda19ecf.
    with pytest.raises(ConfigError, match="NixlPushConnector refuses"):
        transfer(LLAMA70, "prefill=tp4,decode=tp16", connector="nixl-push")
    with pytest.raises(ConfigError, match="#35264"):
        transfer(LLAMA70, "prefill=tp4,decode=tp8", connector="nixl-push", version="cda19ecf")


def test_llama70b_descriptors_by_hand():
    t = transfer(LLAMA70, "prefill=tp4,decode=tp8")
    first, second = list(t.descriptors(t.pairs[1]))[:2]  # prefill 0 -> decode 1
    # HND, K and V packed: a prefill block is 2 heads x 16 tokens x 512 bytes = 16,384
    # bytes, head 1 starts 8,192 bytes in; a decode block holds one head: 8,192 bytes.
    assert first == (8_192, 0, 8_192)
    assert second == (16_384 + 8_192, 8_192, 8_192)
    assert sum(n for _, _, n in t.descriptors(t.pairs[1])) == 41_287_680


def test_sliding_window_layers_clipped_gpt_oss():
    # gpt-oss-120b: 36 layers, 18 sliding (window 128) and 18 full, 8 KV heads of 64.
    # Hybrid manager: group size 18, 2 groups, 18 shared tensors = 18 regions
    # (kv_cache_utils.py:1211-1246 @ c8109375); each region moves the full group's
    # ceil(1000/16) = 63 blocks and the sliding group's last cdiv(128, 16) + 1 = 9
    # (nixl/base_scheduler.py:133-135, 266-267): 18 x 72 = 1,296 descriptors. TP4: 2 heads
    # a rank, a block 16 x 2 x (2 x 64 x 2) = 8,192 bytes; 4 pairs: 42,467,328 bytes, against
    # 36 x 63 x 8,192 x 4 = 74,317,824 unclipped.
    oss = resolve_model("gpt-oss-120b")
    t = transfer(oss, "prefill=tp4,decode=tp4")
    assert pairs(t) == [(d, d, 0, 0, 2, 1_296, 8_192) for d in range(4)]
    assert t.total_bytes == 42_467_328
    # A prompt within the window moves every block of both groups: 100 tokens = 7 blocks,
    # 18 x 14 = 252 descriptors (= 36 layers x 7).
    assert pairs(transfer(oss, "prefill=tp4,decode=tp4", prompt=100))[0][5] == 252
    # The decode memory check counts the same clip: batch 1, 1000 + 128 tokens; full layers
    # 18 x 1128 x 2 heads x 256 bytes, sliding 18 x 144 tokens (9 blocks) x 512.
    d = generate_disagg("vllm", oss, parse_disagg("prefill=tp4,decode=tp4"),
                        Workload(prompt=1000, decode=128), EngineOptions())
    assert d.decode_memory[1] == 18 * 1128 * 512 + 18 * 144 * 512


def test_sliding_window_blocks_the_decode_side_allocates():
    # The decode side allocates, for N external tokens, only the sliding group's blocks
    # inside the window: (N - 128 + 1) // 16 leading blocks are null padding
    # (single_type_kv_cache_manager.py:1057-1083, 256-276, 305-328 @ c8109375), left out
    # of the local list (kv_cache_manager.py:98-108), and the remote list is trimmed to it
    # (base_worker.py:2416-2422). gpt-oss-120b TP4 (18 regions, 2 heads of 8,192-byte blocks):
    oss = resolve_model("gpt-oss-120b")
    # N = 1024: 64 full blocks; sliding 64 - 897 // 16 = 64 - 56 = 8 (not the 9 offered):
    # 18 x (64 + 8) = 1,296 descriptors a pair.
    assert pairs(transfer(oss, "prefill=tp4,decode=tp4", prompt=1024))[0][5] == 1_296
    # N = 1025: 65 full; sliding min(9, 65 - 898 // 16) = min(9, 9) = 9: 18 x 74 = 1,332.
    assert pairs(transfer(oss, "prefill=tp4,decode=tp4", prompt=1025))[0][5] == 1_332
    # N = 143: 9 full; sliding 9 - 16 // 16 = 8: 18 x 17 = 306. cda19ecf reads the same
    # blocks, K and V apart: 2 x 306.
    assert pairs(transfer(oss, "prefill=tp4,decode=tp4", prompt=143))[0][5] == 306
    assert pairs(transfer(oss, "prefill=tp4,decode=tp4", prompt=143,
                          version="cda19ecf"))[0][5] == 612
    # The decode memory check holds the same: 1000 + 24 = 1,024 tokens keep 8 sliding blocks
    # (128 tokens) a layer: 18 x 1,024 x 512 + 18 x 128 x 512 bytes (2 heads x 256 a token).
    d = generate_disagg("vllm", oss, parse_disagg("prefill=tp4,decode=tp4"),
                        Workload(prompt=1000, decode=24), EngineOptions())
    assert d.decode_memory[1] == 18 * 1024 * 512 + 18 * 128 * 512


def test_sliding_layers_read_from_config():
    # tests/data/configs/gpt-oss-20b: 24 layer_types alternating sliding_attention (window
    # 128) and full_attention: 12 of each, one group of 12 each, 12 regions (the fewest, 12,
    # is not under 1.5 x the most).
    from patterns.engines.vllm.nixl_connector import CacheGroups, cache_groups
    from patterns.models import from_hf_config
    model = from_hf_config("tests/data/configs/gpt-oss-20b")
    assert (model.sliding_window, model.sliding_layers) == (128, tuple(range(0, 24, 2)))
    assert cache_groups(model) == CacheGroups(12, (0, 128))
    # 10 full + 20 sliding (the example of kv_cache_utils.py:1131-1133): group size 10, one full
    # group and two sliding ones: 10 regions, windows (0, w, w).
    assert cache_groups(replace(LLAMA70, num_hidden_layers=30, sliding_window=64,
                                sliding_layers=tuple(range(20)))) == CacheGroups(10, (0, 64, 64))


def test_gemma3_sliding_layers_from_its_pattern():
    # tests/data/configs/gemma-3-4b: 34 layers, sliding_window 1024, sliding_window_pattern
    # 6 and no layer_types: transformers makes layer i sliding unless (i + 1) % 6 == 0
    # (Gemma3TextConfig), as vLLM reads them (models/gemma3.py:153-155 @ c8109375): full
    # layers 5, 11, 17, 23, 29, 29 sliding. Groups: 5 full, 29 sliding (29 >= 1.5 x 5):
    # group size 5, one full group and ceil(29 / 5) = 6 sliding ones: 5 regions.
    from patterns.models import from_hf_config
    gemma = from_hf_config("tests/data/configs/gemma-3-4b")
    assert (gemma.sliding_window, len(gemma.sliding_layers)) == (1024, 29)
    assert [i for i in range(34) if i not in gemma.sliding_layers] == [5, 11, 17, 23, 29]
    t = transfer(gemma, "prefill=tp2,decode=tp2", prompt=2000)
    # 2000 tokens: 125 full blocks; a sliding group min(1024 / 16 + 1, 125 - (2000 - 1023)
    # // 16) = min(65, 125 - 61) = 64: 5 x (125 + 6 x 64) = 2,545 descriptors of 2 heads x
    # 16 x (256 + 256) x 2 bytes = 32,768 a pair (34 x 125 = 4,250 with every layer whole).
    assert pairs(t)[0][5:] == (2_545, 32_768)


@pytest.mark.parametrize("gpu, kv, block, backend", [
    # FLASH_ATTN_MLA first on SM90 (cuda.py:136-143), takes 16 (flashattn_mla.py:52-53) but
    # no fp8 cache (45-50); FlashMLA's 64 then (flashmla.py:58-59); SM100 FLASHINFER_MLA
    # first (cuda.py:118), 32 or 64 (flashinfer_mla.py:133-134): 16 is not taken, the
    # smallest, 32 (backend.py:195-203).
    ("h100", "auto", 16, "FLASH_ATTN_MLA"),
    ("h200", "fp8", 64, "FLASHMLA"),
    ("b200", "auto", 32, "FLASHINFER_MLA"),
    ("a100", "auto", 16, "TRITON_MLA"),
])
def test_mla_block_size_from_backend(gpu, kv, block, backend):
    t = transfer(DSV3, "prefill=tp8,decode=tp8", kv=kv, gpu=gpu)
    assert (t.prefill.block_tokens, t.backend) == (block, backend)
    # 1000 tokens in blocks of `block`; 61 layers; one descriptor a block of block x 576
    # values (1,152 bytes bf16, 576 fp8).
    blocks = -(-1000 // block)
    assert pairs(t)[0][5:] == (61 * blocks, block * (576 if kv == "fp8" else 1_152))


def test_kv_block_size_only_what_a_backend_takes():
    # h100 auto: FLASH_ATTN_MLA takes 64 (a multiple of 16); fp8: FlashMLA 64, and Triton
    # MLA 16 behind it; 24 is a multiple of neither 16 nor 64.
    assert transfer(DSV3, "prefill=tp8,decode=tp8", block=64).backend == "FLASH_ATTN_MLA"
    assert transfer(DSV3, "prefill=tp8,decode=tp8", kv="fp8", block=16).backend == "TRITON_MLA"
    with pytest.raises(ConfigError, match="multiple of 16 or 64"):
        transfer(DSV3, "prefill=tp8,decode=tp8", block=24)
    # b200: 16 is FlashInfer's, CUTLASS's (128) and FlashMLA's no multiple: Triton MLA,
    # last of cuda.py:118-127; 24 none's.
    assert transfer(DSV3, "prefill=tp8,decode=tp8", gpu="b200", block=16).backend == \
        "TRITON_MLA"
    with pytest.raises(ConfigError, match="multiple of 16, 32, 64 or 128"):
        transfer(DSV3, "prefill=tp8,decode=tp8", gpu="b200", block=24)
    with pytest.raises(ConfigError, match="SM89"):
        transfer(DSV3, "prefill=tp8,decode=tp8", gpu="a100", kv="fp8")


def test_vllm_dense_block_size_a_multiple_of_16():
    # Every dense CUDA backend of c8109375 takes only multiples of 16 (FLASH_ATTN,
    # TRITON_ATTN, FLEX_ATTENTION MultipleOf(16); FLASHINFER 16, 32, 64: flash_attn.py:83-84,
    # triton_attn.py:290-291, flex_attention.py:162-163, flashinfer.py:356-375), and none
    # left raises "No valid attention backend found" (platforms/cuda.py:446-449): 17 refused.
    with pytest.raises(ConfigError, match=r"--kv-block-size 17: .*use a multiple of 16"):
        transfer(LLAMA70, "prefill=tp4,decode=tp8", block=17)
    # 48 = 3 x 16 runs: ceil(1000 / 48) = 21 blocks, 80 layers x 21 = 1,680 descriptors a
    # pair of one head's 48 tokens x K and V x 128 x 2 bytes = 24,576 bytes.
    t = transfer(LLAMA70, "prefill=tp4,decode=tp8", block=48)
    assert pairs(t) == [(d // 2, d, d % 2, 0, 1, 1_680, 24_576) for d in range(8)]


def test_llama70b_sglang_mooncake_slices_by_hand():
    t = transfer(LLAMA70, "prefill=tp4,decode=tp8", "sglang", "mooncake")
    # Pages of 1 token; tp differs, so send_kvcache_slice: per layer, K/V and token one
    # descriptor of the decode rank's 1 head x 256 bytes: 80 x 2 x 1000 = 160,000 x 256 =
    # 40,960,000 bytes a pair, 8 pairs: 327,680,000 = 1000 x 327,680 (no partial block).
    assert pairs(t) == [(d // 2, d, d % 2, 0, 1, 160_000, 256) for d in range(8)]
    assert t.total_bytes == 327_680_000 and t.direction == "write"
    same = transfer(LLAMA70, "prefill=tp8,decode=tp8", "sglang", "mooncake")
    # Equal tp: send_kvcache, one run of the request's 1000 pages a layer and K/V
    # (mooncake/conn.py:604 @ 8905cbd4): 160 descriptors of 1000 x 256 = 256,000 bytes.
    assert pairs(same) == [(d, d, 0, 0, 1, 160, 256_000) for d in range(8)]


def test_sglang_nixl_per_page_not_runs():
    # NIXL, equal tp: a prepared list of every page slot of every buffer (nixl/conn.py:
    # 643-693, 931-983 @ 8905cbd4), one descriptor a page, a layer and K or V: 80 x 2 x 1000
    # = 160,000 descriptors of one page (1 token x 1 head x 256 bytes) a pair, where
    # Mooncake sends 160 runs; the same 256,000,000... bytes: 8 x 160,000 x 256.
    t = transfer(LLAMA70, "prefill=tp8,decode=tp8", "sglang", "nixl")
    assert pairs(t) == [(d, d, 0, 0, 1, 160_000, 256) for d in range(8)]
    assert t.total_bytes == 327_680_000 and t.granularity == "block"
    # --kv-block-size 64 (SGLang --page-size): ceil(1000 / 64) = 16 pages, 80 x 2 x 16 =
    # 2,560 descriptors of 64 x 256 = 16,384 bytes; Mooncake still 160 runs of 16 pages.
    paged = transfer(LLAMA70, "prefill=tp8,decode=tp8", "sglang", "nixl", block=64)
    assert pairs(paged)[0][5:] == (2_560, 16_384)
    moon = transfer(LLAMA70, "prefill=tp8,decode=tp8", "sglang", "mooncake", block=64)
    assert pairs(moon)[0][5:] == (160, 16 * 16_384)


def test_sglang_pages_on_the_b200():
    # SGLang on SM100 picks trtllm_mha for MHA models and trtllm_mla for DeepSeek V3, which
    # force pages of 64 (server_args.py:4882-4890, overrides.py:403-411, 1704-1712,
    # 1732-1741 @ 8905cbd4); elsewhere pages of 1 (overrides.py:1917-1936).
    llama8 = resolve_model("llama-3.1-8b")
    t = transfer(llama8, "prefill=tp4,decode=tp4", "sglang", "nixl", gpu="b200")
    # 1000 tokens in ceil(1000 / 64) = 16 pages; NIXL one descriptor a page, layer and K/V:
    # 32 x 2 x 16 = 1,024 of 64 tokens x 2 heads x 128 x 2 bytes = 32,768 a pair; whole
    # pages move, 4 x 1,024 x 32,768 = 134,217,728 bytes (1,024 slots, not 1,000).
    assert (t.prefill.block_tokens, t.backend) == (64, "trtllm_mha")
    assert pairs(t)[0][5:] == (1_024, 32_768) and t.total_bytes == 134_217_728
    assert transfer(llama8, "prefill=tp4,decode=tp4", "sglang", "nixl").prefill.block_tokens == 1
    # DeepSeek-V3, Mooncake: one run of the 16 pages a layer: 61 of 16 x 64 x 1,152 bytes.
    moon = transfer(DSV3, "prefill=tp8,decode=tp8", "sglang", "mooncake", gpu="b200")
    assert moon.backend == "trtllm_mla" and pairs(moon)[0][5:] == (61, 16 * 64 * 1_152)
    # Given pages: those the backend takes are kept, others refused (SGLang makes them 64).
    assert transfer(llama8, "prefill=tp4,decode=tp4", "sglang", gpu="b200",
                    block=16).prefill.block_tokens == 16
    with pytest.raises(ConfigError, match="takes pages of 32, 64 tokens"):
        transfer(DSV3, "prefill=tp8,decode=tp8", "sglang", gpu="b200", block=16)
    with pytest.raises(ConfigError, match="takes pages of 16, 32, 64 tokens"):
        transfer(llama8, "prefill=tp4,decode=tp4", "sglang", gpu="b200", block=1)


def test_sglang_gpt_oss_sliding_layers_send_their_window():
    # SGLang's hybrid SWA pool (model_config.py:1903-1963, swa_memory_pool.py:127-142 @
    # 8905cbd4): gpt-oss's 18 full layers move every page; its 18 sliding layers, with the
    # last chunk, the pages of tokens [1000 - 127, 1000) (window sliding_window - 1 = 127,
    # gpt_oss.py:119-120; prefill.py:1102-1114) as one run a layer and K/V, a transfer of
    # their own. TP4: 2 heads of 64 x 2 bytes = 256 bytes a token.
    oss = resolve_model("gpt-oss-120b")
    moon = transfer(oss, "prefill=tp4,decode=tp4", "sglang", "mooncake")
    # Mooncake: 36 runs of 1000 x 256 = 256,000 and 36 of 127 x 256 = 32,512 bytes a pair:
    # 9,216,000 + 1,170,432 = 10,386,432; 4 pairs 41,545,728 (every page of every layer
    # would be 73,728,000).
    assert moon.descriptor_groups(moon.pairs[0]) == [(36, 256_000), (36, 32_512)]
    assert moon.total_bytes == 4 * 10_386_432 == 41_545_728 and moon.transfers == 2
    # NIXL: the full layers one descriptor a page (18 x 2 x 1000 = 36,000 of 256 bytes),
    # the window in runs (nixl/conn.py:2055-2090, 1362-1470): the same bytes.
    nixl = transfer(oss, "prefill=tp4,decode=tp4", "sglang", "nixl")
    assert nixl.descriptor_groups(nixl.pairs[0]) == [(36_000, 256), (36, 32_512)]
    assert nixl.total_bytes == 41_545_728
    # The window's first run: the buffer's layer 18 (the first sliding one), K, token 873:
    # ((18 x 2 + 0) x 1000 + 873) x 256 = 9,439,488 bytes in on both sides.
    runs = [x for x in moon.descriptors(moon.pairs[0]) if x[2] == 32_512]
    assert len(runs) == 36 and runs[0] == (9_439_488, 9_439_488, 32_512)
    # b200 pages of 64: the window starts at 873 cut to 832 = page 13 of 16: 3 pages.
    b200 = transfer(oss, "prefill=tp4,decode=tp4", "sglang", "nixl", gpu="b200")
    assert b200.descriptor_groups(b200.pairs[0]) == [(576, 16_384), (36, 3 * 16_384)]
    # Different tp: SGLang raises (mooncake/conn.py:1049-1057, nixl/conn.py:2061-2064).
    with pytest.raises(ConfigError, match="different prefill and decode tp"):
        transfer(oss, "prefill=tp4,decode=tp8", "sglang", "mooncake")


def test_sglang_head_map_where_decode_replicates():
    # Prefill TP4 (2 heads a rank) -> decode TP16 (1 head a rank, replication 16 / 8 = 2).
    # Mooncake: decode rank d takes head (d // 2) x 1 mod 2 of prefill rank d // 4
    # (mooncake/conn.py:769-774 @ 8905cbd4); NIXL: d x 1 mod 2, no replication
    # (nixl/conn.py:774-776), so its decode rank 1 gets head 1 where Mooncake's gets head 0.
    moon = transfer(LLAMA70, "prefill=tp4,decode=tp16", "sglang", "mooncake")
    assert [(p.prefill, p.src_head) for p in moon.pairs] == [(d // 4, (d // 2) % 2)
                                                            for d in range(16)]
    nixl = transfer(LLAMA70, "prefill=tp4,decode=tp16", "sglang", "nixl")
    assert [(p.prefill, p.src_head) for p in nixl.pairs] == [(d // 4, d % 2) for d in range(16)]
    # Bytes: per token, layer and K/V one head of 256 bytes: 1000 x 160 x 256 a pair.
    assert pairs(moon)[1][5:] == (160_000, 256)
    first = next(iter(moon.descriptors(moon.pairs[2])))  # decode 2 -> prefill 0's head 1
    assert first == (256, 0, 256)  # token-major: head 1 of token 0 starts 256 bytes in


def test_sglang_chunked_prefill_one_transfer_a_chunk():
    # chunked_prefill_size 8192 on the h100 (server_args.py:3922-3926 @ 8905cbd4): a
    # 20,000-token prompt is chunks of 8192, 8192 and 3616 tokens, each sent once computed
    # (prefill.py:1051-1090): Mooncake's runs are per chunk, 3 x 80 x 2 = 480 descriptors a
    # pair: 320 of 8192 x 256 bytes and 160 of 3616 x 256.
    t = transfer(LLAMA70, "prefill=tp8,decode=tp8", "sglang", "mooncake", prompt=20_000,
                 chunk=8192)
    assert t.transfers == 3 and t.chunks == (8192, 8192, 3616)
    assert t.descriptor_groups(t.pairs[0]) == [(320, 8192 * 256), (160, 3616 * 256)]
    assert t.total_bytes == 8 * 160 * 20_000 * 256
    # Pages of 64: chunks end at whole pages, 8192 = 128 pages each, 3616 in 57 pages.
    paged = transfer(LLAMA70, "prefill=tp8,decode=tp8", "sglang", "mooncake", prompt=20_000,
                     chunk=8192, block=64)
    assert paged.chunks == (128, 128, 57)
    # NIXL's per-page descriptors do not change in number: 80 x 2 x 20,000.
    nixl = transfer(LLAMA70, "prefill=tp8,decode=tp8", "sglang", "nixl", prompt=20_000,
                    chunk=8192)
    assert nixl.transfers == 3 and pairs(nixl)[0][5] == 3_200_000
    # A prompt within one chunk is one transfer.
    assert transfer(LLAMA70, "prefill=tp8,decode=tp8", "sglang", chunk=8192).transfers == 1


# DeepSeek-V3: MLA caches kv_lora_rank 512 + qk_rope_head_dim 64 = 576 values a token and
# layer, bf16: 1,152 bytes, on every TP rank; 61 layers. vLLM on an H100 with a bf16 cache
# runs FLASH_ATTN_MLA, blocks of 16: a prompt of 1000 is 63 blocks = 1008 slots.

def test_deepseek_v3_mla_vllm_by_hand():
    t = transfer(DSV3, "prefill=tp8,decode=tp16")
    # ratio 2, cache replicated: decode rank d reads the whole latent from prefill d // 2:
    # 61 layers x 1 region x 63 blocks = 3,843 descriptors of 16 x 1,152 = 18,432 bytes =
    # 70,834,176 bytes a pair, 16 pairs: 1,133,346,816.
    assert pairs(t) == [(d // 2, d, 0, 0, 1, 3_843, 18_432) for d in range(16)]
    assert t.total_bytes == 16 * 70_834_176 == 1_133_346_816
    fewer = transfer(DSV3, "prefill=tp16,decode=tp8")
    # ratio -2: only the first prefill rank of each decode rank is read (tp_mapping.py:
    # 79-84); the other is notified: 8 pairs with data, 8 notifications.
    assert pairs(fewer) == [(2 * d, d, 0, 0, 1, 3_843, 18_432) for d in range(8)]
    assert sum(p.dummy for p in fewer.pairs) == 8
    assert fewer.total_bytes == 8 * 70_834_176


def test_deepseek_v3_fp8_cache_and_sglang_pages():
    # fp8 KV cache: one byte a value, FlashMLA's blocks of 64: 16 blocks = 1024 slots.
    assert transfer(DSV3, "prefill=tp8,decode=tp8", kv="fp8").total_bytes == \
        8 * 61 * 1024 * 576
    t = transfer(DSV3, "prefill=tp8,decode=tp8", "sglang", "mooncake")
    # SGLang pages of 1, Mooncake: one run of 1000 x 1,152 bytes a layer, 61 a pair.
    assert pairs(t) == [(d, d, 0, 0, 1, 61, 1_152_000) for d in range(8)]
    # NIXL: one descriptor a page a layer: 61 x 1000 of 1,152 bytes.
    nixl = transfer(DSV3, "prefill=tp8,decode=tp8", "sglang", "nixl")
    assert pairs(nixl) == [(d, d, 0, 0, 1, 61_000, 1_152) for d in range(8)]


@pytest.mark.parametrize("engine, connector, spec, version, chunk", [
    ("vllm", "nixl", "prefill=tp2,decode=tp4", None, None),
    ("vllm", "nixl", "prefill=tp4,decode=tp2", None, None),
    ("vllm", "nixl", "prefill=tp2,decode=tp4", "cda19ecf", None),
    ("vllm", "nixl-push", "prefill=tp2,decode=tp4", None, None),
    ("vllm", "nixl-push", "prefill=tp4,decode=tp2", None, None),
    ("sglang", "mooncake", "prefill=tp2,decode=tp4", None, None),
    ("sglang", "mooncake", "prefill=tp4,decode=tp2", None, None),
    ("sglang", "mooncake", "prefill=tp2,decode=tp2", None, 8),
    ("sglang", "nixl", "prefill=tp2,decode=tp2", None, 8),
])
def test_every_decode_byte_written_once(engine, connector, spec, version, chunk):
    # Over all pairs, the descriptors tile each decode rank's buffer exactly (tiny sizes).
    model = resolve_model("llama-3.1-8b")
    t = transfer(model, spec, engine, connector, prompt=20, version=version, chunk=chunk)
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
    ("vllm", "nixl", "prefill=tp4,decode=tp8", "c8109375 or cda19ecf"),  # version 2025
    ("vllm", "mooncake", "prefill=tp4,decode=tp8", "not modelled"),
    ("trtllm", "nixl", "prefill=tp4,decode=tp8", "no disaggregated-serving connector"),
    ("sglang", "lmcache", "prefill=tp4,decode=tp8", "has no lmcache connector"),
])
def test_refusals(engine, connector, spec, words):
    version = "2025" if words.startswith("c8109375") else None
    with pytest.raises(ConfigError, match=words):
        generate_disagg(engine, LLAMA70, parse_disagg(spec), Workload(prompt=64, decode=8),
                        EngineOptions(), connector, connector_version=version)


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
    assert read == [{**read[0], "count": 5_040, "bytes": 8_192, "pairs": 8}]
    assert doc["connector"]["version"] == "c8109375"
    assert doc["kv_transfer"]["pairs"][0]["decode_rank"] == 4  # job ranks: prefill first
    for argv, words in (
            (["--disagg", "prefill=tp4,decode=tp8", "--tp", "2"], "drop --tp"),
            (["--disagg", "prefill=tp4,decode=tp8", "--connector", "ucx"], "no ucx connector"),
            (["--disagg", "prefill=tp4,decode=tp16", "--connector-version", "cda19ecf"],
             "before #45879"),
            (["--disagg", "prefill=tp4,decode=tp8", "--connector-version", "v0.9"],
             "use c8109375 or cda19ecf"),
            (["--disagg", "prefill=tp4,decode=tp8", "--prompt", "131072", "--decode", "500"],
             "decode(500)"),
            (["--model", "deepseek-v3", "--disagg", "prefill=tp8,decode=tp8",
              "--kv-block-size", "24"], "multiple of 16 or 64"),
            (["--disagg", "prefill=tp4,decode=tp8", "--kv-block-size", "17"],
             "use a multiple of 16"),
            (["--disagg", "prefill=tp4,decode=tp1"], "does not hold the batch"),
            (["--connector", "nixl"], "add --disagg")):
        status, out, err = cli("pattern", "--model", "llama-3.1-70b", "--prompt", "64",
                               "--decode", "8", *argv)
        assert (status, out) == (2, "") and words in err and len(err.splitlines()) == 1
