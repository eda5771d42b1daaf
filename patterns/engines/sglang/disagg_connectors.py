"""SGLang's disaggregation connectors (sgl-project/sglang main of 2026-07-20, read at the
public copy modal-projects/sglang @ 8905cbd4, `python/sglang/srt/disaggregation/`): what
each descriptor of a transfer covers, and which heads go where.

Both write from the prefill ranks into pages the decode side set aside; per layer a K and a V
buffer of [tokens, heads, head_dim] (token-major), so a page of `page_size` tokens is
contiguous and a run of heads is contiguous only within one token.

- Mooncake, equal tp or MLA: `send_kvcache` -> `_send_kvcache_generic`
  (mooncake/conn.py:583-713): the request's pages grouped into contiguous runs
  (`group_concurrent_contiguous`, line 604), one descriptor a run, a layer and K or V.
- NIXL, equal tp or MLA: since #26406 a prepared descriptor list of every page slot of every
  buffer (`_init_equal_tp_prep_handle` from `_prepare_payload_xfer`, nixl/conn.py:931-983;
  `_prep_equal_tp_dlist`, 643-693), indexed by the request's pages on each layer
  (`repeat_indices_over_layers`, 295-306; `_send_kvcache_generic`'s prepared path,
  1327-1358): one descriptor a page, a layer and K or V (MLA: one buffer a layer).
- Different tp (not MLA), both: one descriptor a token slot of every page, a layer and K or
  V, of the heads the decode rank takes (mooncake/conn.py:715-790 `send_kvcache_slice`;
  nixl/conn.py:730-864 `_init_hetero_tp_prep_handle`, 1536-1580).
- Heads, decode tp larger: Mooncake's source head is (d // replication) x decode heads mod
  prefill heads, replication = decode tp / KV heads where the decode side replicates
  (mooncake/conn.py:764-774); NIXL's is d x decode heads mod prefill heads, without the
  replication (nixl/conn.py:774-776), so where the decode side replicates heads NIXL writes
  decode rank d the head d mod prefill heads of its prefill rank, as its code does. Prefill
  tp larger: the prefill rank's heads land at (its index // src replication) x its heads
  mod decode heads (mooncake/conn.py:756-763; nixl/conn.py:757-765).
- Chunked prefill: each chunk of `chunked_prefill_size` tokens (8192 on H100, H200 and
  A100, 16384 on B200; `--max-batched-tokens` here) is sent once computed (`send_kv_chunk`,
  prefill.py:1051-1090; a partial last page waits for the next chunk, line 1069-1071): one
  transfer a chunk; Mooncake's runs are per chunk.
- Sliding-window layers of gpt-oss: only the window's pages, in a transfer of their own
  (`swa_window`).
- Pages: of 1 token but on the b200, where the attention backend SGLang picks forces 64
  (`page_size`). A request moves whole pages, its last one's padding included.
- Batches handed to the transfer engine (`mooncake_batches`): Mooncake's
  `batch_transfer_sync`, one call a list of blocks, waits for all of them.
"""

from patterns.errors import ConfigError

# SGLang's page size when --page-size is not given (`_page_size_default`,
# arg_groups/overrides.py:1917-1936 @ 8905cbd4: 1 on CUDA), unless the attention backend it
# picks snaps it (`_mla_backend_page_constraints`, overrides.py:1682-1744). On SM100 (the
# b200) that backend is trtllm_mha for MHA models (`_get_default_attn_backend`,
# server_args.py:4882-4890; gpt-oss too, overrides.py:577-584), which takes pages of 16, 32
# or 64 and makes any other 64 (overrides.py:1732-1741), and trtllm_mla for the DeepSeek V3
# family (`_deepseek_family_overrides`, overrides.py:403-411), pages of 32 or 64, else 64
# (overrides.py:1704-1712); other MLA models get flashinfer there (server_args.py:4904-4905).
# SM90 runs fa3 (MHA and MLA, server_args.py:4875-4881, 4902-4903) and SM80 flashinfer,
# triton for MLA or attention sinks (server_args.py:4895-4899, 4915-4916): pages of 1.
_SM100_PAGES = {"trtllm_mha": (16, 32, 64), "trtllm_mla": (32, 64)}


def page_size(gpu: str, mla: bool, model_type: str, requested: int | None
              ) -> tuple[int, str]:
    """(tokens a page, the attention backend that forces it, or "") SGLang runs with on
    `gpu`; refuses a --kv-block-size (--page-size) that backend would change."""
    if gpu != "b200" or (mla and model_type != "deepseek_v3"):
        return (requested or 1), ""
    backend = "trtllm_mla" if mla else "trtllm_mha"
    takes = _SM100_PAGES[backend]
    if requested is None:
        return 64, backend
    if requested not in takes:
        raise ConfigError(f"--kv-block-size {requested}: SGLang's {backend} attention backend on "
                          f"the b200 takes pages of {', '.join(map(str, takes))} tokens (it "
                          f"would make it 64); use one of them")
    return requested, backend


def swa_window(model_type: str, sliding_window: int, sliding_layers: int, prompt: int,
               page: int, equal_tp: bool) -> tuple[int, int]:
    """(sliding-window layers, pages of the request each moves) under SGLang's hybrid SWA
    memory pool, (0, 0) where the model does not get one.

    gpt-oss is a hybrid-SWA architecture (`is_hybrid_swa_model`, configs/model_config.py:
    1903-1928 @ 8905cbd4; its sliding layers from `layer_types`, 1956-1963), and SWAKVPool
    keeps the full-attention layers in the KV pool the connectors move page by page and the
    sliding ones in a pool sent as state (`get_contiguous_buf_infos`, `get_state_buf_infos`,
    mem_cache/swa_memory_pool.py:127-142; disaggregation/utils.py:869-877). With the last
    chunk the prefill side sends the pages of tokens [w, prompt), w = prompt - window cut
    down to a page, window = sliding_window - 1 (gpt_oss.py:119-120; `_swa_payload`,
    prefill.py:1102-1114, decode.py:1098-1110), as contiguous runs of its own transfer
    (`maybe_send_extra` -> `_send_kvcache_generic`: mooncake/conn.py:1043-1095, nixl/conn.py:
    2055-2090 and its non-prepped path, 1362-1470). Different prefill and decode tp are
    refused there (mooncake/conn.py:1049-1057, nixl/conn.py:2061-2064).
    """
    if model_type != "gpt_oss" or not sliding_window or not sliding_layers:
        return 0, 0
    if not equal_tp:
        raise ConfigError("SGLang refuses different prefill and decode tp for a model with "
                          "sliding-window layers in its hybrid SWA pool (gpt-oss): \"PD "
                          "Disaggregation does NOT support PD different TP sizes for non-MLA "
                          "SWA hybrid models yet\"; use the same tp on both sides")
    start = max(0, prompt - (sliding_window - 1))
    start -= start % page
    return sliding_layers, -(-prompt // page) - start // page


def sglang_writes(kv_heads: int, mla: bool, prefill_tp: int, decode_tp: int, ratio: int,
                  connector: str) -> list[tuple[int, int, int, int, int, bool]]:
    """Which prefill rank writes which heads to which decode rank: (prefill rank, decode
    rank, first head within the prefill rank's, where it lands, heads, notification only)."""
    # MLA: the one latent a token, counted as one head.
    p_heads = 1 if mla else max(kv_heads // prefill_tp, 1)
    d_heads = 1 if mla else max(kv_heads // decode_tp, 1)
    whole = mla or prefill_tp == decode_tp
    src_replication = max(1, prefill_tp // kv_heads)
    dst_replication = max(1, decode_tp // kv_heads)
    writes = []
    for d in range(decode_tp):
        sources = ([d // ratio] if ratio > 0 else
                   [d * -ratio + i for i in range(-ratio)])
        for i, p in enumerate(sources):
            if whole:
                writes.append((p, d, 0, 0, p_heads, mla and ratio < 0 and i > 0))
            elif prefill_tp > decode_tp:
                dst = (p // src_replication * p_heads) % d_heads
                writes.append((p, d, 0, dst, p_heads, False))
            else:
                unique = d // dst_replication if connector == "mooncake" else d
                writes.append((p, d, (unique * d_heads) % p_heads, 0, d_heads, False))
    return writes


def chunk_tokens(prompt: int, chunk: int, page: int) -> tuple[int, ...]:
    """Tokens each transfer of a chunked prefill carries: chunk k ends at k x chunk tokens,
    cut back to a whole page but for the last (the partial page goes with the next)."""
    count = -(-prompt // chunk)
    ends = [k * chunk - (k * chunk) % page for k in range(1, count)] + [prompt]
    sizes, sent = [], 0
    for end in ends:
        if end > sent:
            sizes.append(end - sent)
            sent = end
    return tuple(sizes)


def mooncake_batches(whole: bool, layers: int, regions: int, pages: int, tokens_a_page: int,
                     chunks: tuple[int, ...], swa_layers: int) -> list[tuple[int, int]]:
    """(first descriptor, descriptors) of each batch SGLang's Mooncake sender hands
    `batch_transfer_sync` for one request, in the order of `KVTransfer.descriptors` (equal
    tp: chunk, layer, K or V; different tp: layer, K or V, page, token slot), SGLang's order.

    Equal tp or MLA (`whole`): each chunk's `send_kvcache` (mooncake/conn.py:1373 @ 8905cbd4)
    builds every layer's K and V runs into one list, `process_layers`, and makes one
    `_transfer_data` -> `batch_transfer_sync` call of it (conn.py:669-673, 695, 574-581);
    per layer only under a custom memory pool (NVLink, conn.py:675-693), not modelled. The
    sliding-window layers' runs are one more call (`maybe_send_extra`, conn.py:960).
    Different tp: each chunk's `send_kvcache_slice` (conn.py:1400) submits one
    `batch_transfer_sync` a layer for K, then one a layer for V, each holding one slice a
    token slot of the chunk's pages (`process_layer_tp_aware`, conn.py:807-831), to an
    executor of `SGLANG_DISAGGREGATION_THREAD_POOL_SIZE // SGLANG_DISAGGREGATION_QUEUE_SIZE`
    threads: 4 // 4 = 1 on a host of up to 127 CPUs (conn.py:176-195), so one after another.
    """
    if whole:
        per = layers * regions
        out = [(k * per, per) for k in range(max(len(chunks), 1))]
        if swa_layers:
            out.append((len(out) * per, swa_layers * regions))
        return out
    out, first = [], 0
    for chunk_pages in chunks or (pages,):
        for layer in range(layers):
            for region in range(regions):
                start = ((layer * regions + region) * pages + first) * tokens_a_page
                out.append((start, chunk_pages * tokens_a_page))
        first += chunk_pages
    return out
