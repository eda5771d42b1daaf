"""vLLM's NixlConnector: the geometry of each version modelled, the block size vLLM picks,
the hybrid KV cache manager's groups, and which heads each decode rank reads.

Versions (`--connector-version`), each a vLLM commit of vllm-project/vllm (read at the
public copy modal-projects/vllm):

- c8109375 (main of 2026-08-03, the default). Since #44455 (51878e5b, 2026-07-11) an
  attention layer's cache is [num_blocks, num_kv_heads, block_size, 2 x head_size]: K and V
  packed in the content dim (`kv_connector/utils.py:441-446` @ c8109375), registered as one
  NIXL region a layer (`nixl/base_worker.py:1097-1100`); one descriptor a block covers the
  block's K and V of the heads read (`_build_fa_local`, `_build_fa_remote`,
  base_worker.py:1384-1445): a head's tokens of a block, K and V, are one contiguous range.
  Since #45879 (0d339cf1, 2026-06-17) a decode TP above the KV head count fed by a smaller
  prefill TP is accepted: the handshake compares per-rank head counts, not the tp ratio
  (base_worker.py:1803-1865), and decode rank d reads its head
  d x K // decode_tp from prefill rank d x prefill_tp // decode_tp, at offset
  (that head - the prefill rank's first head) x the decode block length
  (`nixl/tp_mapping.py:79-84, 125-135`).
- cda19ecf (main of 2026-04-17, before #44455 and #45879): K and V are two regions a layer
  (`TpKVTopology.split_k_and_v`, kv_connector/utils.py:385 @ cda19ecf), twice the
  descriptors of half the size; a decode side that replicates heads the prefill side splits
  is refused (the block-length asserts of `_validate_remote_agent_handshake`,
  nixl/worker.py:1398 @ cda19ecf).

Both versions clip sliding-window groups under the hybrid KV cache manager, which stays on
with NIXL (the connector is `SupportsHMA`, nixl/connector.py:79 @ c8109375; config/vllm.py:
1643-1665; the clip applies wherever a group is not full attention, a model all of whose
layers slide included, base_scheduler.py:83-89): the request's blocks of a sliding-window
group are cut to the last cdiv(window, block_size) + 1 (`blocks_per_sw`,
nixl/base_scheduler.py:122-135, clipped at 266-267; cda19ecf: nixl/scheduler.py:117,
128-148), and to the blocks inside the window the decode side allocates
(`sliding_blocks_read`). The manager's groups (`_get_kv_cache_groups_uniform_page_size`,
v1/core/kv_cache_utils.py:1198-1246): group size the fewest layers of one attention type
(the most when under 1.5 x the fewest), each type in cdiv(its layers, group size) groups;
layers of different groups share one tensor, so a region is one of group-size tensors and
every group's blocks are read in every region (`_compute_desc_ids`, base_worker.py:113-125).

MLA block size: vLLM sets the block size from the first attention backend that takes the
configuration (`_get_backend_priorities`, platforms/cuda.py:93-143 @ c8109375), unless
--block-size is given: `get_preferred_block_size` (v1/attention/backend.py:195-203) keeps 16
where the backend takes it, else the smallest kernel size. SM90: FLASH_ATTN_MLA (multiples
of 16, bf16/fp16 cache only, flashattn_mla.py:45-53, 80-81), then FLASHMLA (64, fp8 too,
flashmla.py:49-59); SM100: FLASHINFER_MLA (32 or 64, flashinfer_mla.py:124-134), then
CUTLASS_MLA (128, cutlass_mla.py:40-50), FLASHMLA, TRITON_MLA; SM80:
TRITON_MLA (multiples of 16; an fp8 cache needs SM89, triton_mla.py:97-111, 206-216).
A backend takes a block size that is a multiple of one of its sizes (backend.py:176-193).

NixlPushConnector (`nixl-push`, since #35264, 2026-06-12; at c8109375 only): the prefill
ranks WRITE, after the request's prefill (`request_finished`, nixl/push_scheduler.py:208-
280), into the blocks the decode side registered, with the same descriptors; the TP mapping
is vLLM's `compute_tp_mapping` seen from the prefill rank (nixl/push_worker.py:499-590):
prefill tp r times the decode tp: prefill rank p writes its block into decode rank p // r at
(p mod r) x its block length (the head it holds, where the prefill side replicates heads);
an MLA latent or a replicated block goes whole, so r prefill ranks write the same decode
block. Decode tp r times the prefill tp: prefill rank p writes 1/r of its block to each of
the decode ranks p r .. p r + r - 1; an MLA latent goes whole to each (`replicate_attn`,
push_worker.py:524-528). A decode side above the KV heads fed by a smaller prefill side is
refused by the handshake seen from the prefill rank (base_worker.py:1716-1722).
"""

from dataclasses import dataclass

from patterns.errors import ConfigError
from patterns.models import ModelConfig

DEFAULT_VERSION = "c8109375"
VERSIONS = {
    "c8109375": "vLLM main 2026-08-03: K and V packed, one region a layer (#44455); decode "
                "TP above the KV heads from a smaller prefill TP (#45879)",
    "cda19ecf": "vLLM main 2026-04-17: K and V two regions a layer; a decode side that "
                "replicates heads the prefill side splits refused",
}
PUSH_SINCE = "c8109375"  # NixlPushConnector (#35264) is not in cda19ecf

_ARCH = {"h100": 9, "h200": 9, "b200": 10, "a100": 8}


@dataclass(frozen=True)
class MLABackend:
    name: str
    sizes: tuple[int, ...]  # kernel block sizes: a block size must be a multiple of one
    fp8: bool  # takes an fp8 KV cache


_FLASH_ATTN_MLA = MLABackend("FLASH_ATTN_MLA", (16,), fp8=False)
_FLASHMLA = MLABackend("FLASHMLA", (64,), fp8=True)
_FLASHINFER_MLA = MLABackend("FLASHINFER_MLA", (32, 64), fp8=True)
_TRITON_MLA = MLABackend("TRITON_MLA", (16,), fp8=True)
_CUTLASS_MLA = MLABackend("CUTLASS_MLA", (128,), fp8=True)
# Dense-MLA priorities by compute capability major, as far as the GPUs modelled reach them
# (SM100's TOKENSPEED_MLA needs an extra package and sits behind FLASHINFER_MLA).
_MLA_PRIORITY = {9: (_FLASH_ATTN_MLA, _FLASHMLA, _TRITON_MLA),
                 10: (_FLASHINFER_MLA, _CUTLASS_MLA, _FLASHMLA, _TRITON_MLA),
                 8: (_TRITON_MLA,)}


def _takes(backend: MLABackend, block: int) -> bool:
    return any(block % size == 0 for size in backend.sizes)


def mla_block_size(gpu: str, kv_cache_dtype: str, requested: int | None) -> tuple[int, str]:
    """(tokens a block, backend) vLLM runs an MLA model with on `gpu`; refuses a
    --kv-block-size no backend there takes, and an fp8 cache on SM80."""
    arch = _ARCH[gpu]
    fp8 = kv_cache_dtype == "fp8"
    if fp8 and arch < 9:
        raise ConfigError(f"an fp8 KV cache of an MLA model needs SM89 or newer (vLLM's "
                          f"TRITON_MLA on the {gpu}); use --kv-cache-dtype auto or --gpu h100")
    usable = [b for b in _MLA_PRIORITY[arch] if b.fp8 or not fp8]
    if requested is None:
        first = usable[0]
        block = 16 if _takes(first, 16) else min(first.sizes)
        return block, first.name
    for backend in usable:
        if _takes(backend, requested):
            return requested, backend.name
    sizes = [str(n) for n in sorted({s for b in usable for s in b.sizes})]
    either = f"{', '.join(sizes[:-1])} or {sizes[-1]}" if len(sizes) > 1 else sizes[0]
    raise ConfigError(f"--kv-block-size {requested}: no MLA attention backend vLLM runs on the "
                      f"{gpu} with a{' fp8' if fp8 else 'n auto'} KV cache takes it "
                      f"({', '.join(b.name for b in usable)}); use a multiple of {either}")


def dense_block_size(requested: int | None) -> int:
    """Tokens a block vLLM runs a dense (non-MLA) model with; refuses a --kv-block-size no
    dense backend takes.

    CacheConfig takes any block_size > 0 (`Field(default=None, gt=0)`, config/cache.py:49 @
    c8109375); a given one goes to backend selection (selector.py:129-130), which drops each
    backend whose kernel sizes it is no multiple of ("block_size not supported",
    v1/attention/backend.py:176-193, 347) and raises "No valid attention backend found"
    when none is left (platforms/cuda.py:446-449). The dense CUDA backends (cuda.py:148-162)
    all start at 16: FLASH_ATTN, TRITON_ATTN and FLEX_ATTENTION multiples of 16
    (flash_attn.py:83-84, triton_attn.py:290-291, flex_attention.py:162-163), FLASHINFER
    16, 32, 64 (and larger on SM100, flashinfer.py:356-375), TURBOQUANT 16-128 (and only
    its own cache dtypes, turboquant_attn.py:102-116). So a multiple of 16 runs, 17 does not.
    """
    if requested is None:
        return 16  # CacheConfig.DEFAULT_BLOCK_SIZE, config/cache.py:47 @ c8109375
    if requested % 16:
        raise ConfigError(f"--kv-block-size {requested}: no attention backend vLLM runs a "
                          f"dense model with takes it (FLASH_ATTN, FLASHINFER, TRITON_ATTN, "
                          f"FLEX_ATTENTION); use a multiple of 16")
    return requested


@dataclass(frozen=True)
class CacheGroups:
    """The hybrid KV cache manager's groups of one model: `regions` tensors a rank (the
    group size), and each group's window in tokens (0: full attention)."""

    regions: int
    windows: tuple[int, ...]

    def blocks(self, tokens: int, block: int) -> int:
        """Blocks of one request read in each region: every group's, sliding ones clipped."""
        whole = -(-tokens // block)
        return sum(sliding_blocks_read(tokens, w, block) if w else whole for w in self.windows)


def sliding_blocks_read(tokens: int, window: int, block: int) -> int:
    """Blocks of a sliding-window group the decode side reads for a prompt of `tokens`.

    The prefill side offers the last cdiv(window, block) + 1 blocks (`blocks_per_sw`,
    nixl/base_scheduler.py:133-135, clipped at 266-267 @ c8109375). The decode side
    allocates for its `tokens` external tokens only the blocks inside the window: the
    first (tokens - window + 1) // block are null padding (`get_num_skipped_tokens`,
    v1/core/single_type_kv_cache_manager.py:1057-1083; `add_local_computed_blocks`,
    256-276; `allocate_external_computed_blocks`, 305-328), which
    `get_unhashed_block_ids_all_groups` leaves out (v1/core/kv_cache_manager.py:98-108;
    clipped in `update_state_after_alloc`, nixl/pull_scheduler.py:153-160), and the read
    trims the remote list to the local one's length from the end (`_apply_prefix_caching`,
    base_worker.py:2416-2422). So a window of 128 in blocks of
    16 reads 9 blocks of a 1000-token prompt but 8 of a 1024-token one (its last 127
    tokens fill blocks 56-63 exactly). cda19ecf reads the same: the null padding in
    `allocate_new_computed_blocks` (v1/core/single_type_kv_cache_manager.py:176-210 @
    cda19ecf) and the trim in `_read_blocks` (nixl/worker.py:2072-2079 @ cda19ecf).
    """
    skipped = max(0, tokens - window + 1) // block
    return min(-(-window // block) + 1, -(-tokens // block) - skipped)


def cache_groups(model: ModelConfig) -> CacheGroups:
    layers = model.num_hidden_layers
    sliding = len(model.sliding_layers) if model.sliding_window else 0
    if sliding == 0 or sliding == layers:
        # One attention type: one group; a model all of whose layers slide is clipped too.
        return CacheGroups(layers, (model.sliding_window if sliding else 0,))
    counts = {0: layers - sliding, model.sliding_window: sliding}
    size = min(counts.values())
    if max(counts.values()) < 1.5 * size:
        size = max(counts.values())
    windows = tuple(w for w, n in counts.items() for _ in range(-(-n // size)))
    return CacheGroups(size, windows)


# One rank pair: (prefill rank, decode rank, first head moved within the prefill rank's,
# where it lands within the decode rank's, heads moved, notification only).
Read = tuple[int, int, int, int, int, bool]


def vllm_reads(kv_heads: int, mla: bool, prefill_tp: int, decode_tp: int, ratio: int,
               version: str) -> list[Read]:
    """Which prefill rank each decode rank reads which heads from; refusals as vLLM's."""
    # MLA: the one latent a token, counted as one head.
    p_heads = 1 if mla else max(kv_heads // prefill_tp, 1)
    d_heads = 1 if mla else max(kv_heads // decode_tp, 1)
    p_replicated = mla or prefill_tp > kv_heads
    d_replicated = decode_tp > kv_heads
    if not mla:
        if ratio < 0 and p_replicated:
            raise ConfigError(f"prefill tp({prefill_tp}) exceeds num_key_value_heads("
                              f"{kv_heads}) and the decode tp({decode_tp}) is smaller: vLLM's "
                              "NixlConnector refuses a replicated prefill cache read by fewer "
                              f"decode ranks; use prefill tp <= {kv_heads} or decode tp >= "
                              "prefill tp")
        whole_blocks = (p_heads == d_heads * ratio if ratio > 0 else d_heads == p_heads * -ratio)
        if version == "cda19ecf" and not p_replicated and not whole_blocks:
            raise ConfigError(f"prefill tp({prefill_tp}) holds {p_heads} KV head(s) a rank and "
                              f"decode tp({decode_tp}) {d_heads}: vLLM's NixlConnector before "
                              f"#45879 needs a prefill block of exactly tp-ratio decode blocks "
                              f"(num_key_value_heads {kv_heads}); use decode tp <= {kv_heads}, "
                              "or --connector-version c8109375")
    reads = []
    for d in range(decode_tp):
        if ratio > 0:
            p = d // ratio
            if p_replicated:
                src = 0
            elif d_replicated:  # tp_mapping.py:129-132: the head d holds, in p's heads
                src = d * kv_heads // decode_tp - p * kv_heads // prefill_tp
            else:
                src = (d % ratio) * d_heads
            reads.append((p, d, src, 0, d_heads, False))
        else:
            for i in range(-ratio):
                p = d * -ratio + i
                if mla:  # one prefill rank read; the others only notified
                    reads.append((p, d, 0, 0, 1, i > 0))
                else:
                    reads.append((p, d, 0, i * p_heads, p_heads, False))
    return reads


def vllm_push_writes(kv_heads: int, mla: bool, prefill_tp: int, decode_tp: int) -> list[Read]:
    """NixlPushConnector: which decode rank each prefill rank writes which heads to."""
    p_heads = 1 if mla else max(kv_heads // prefill_tp, 1)
    d_heads = 1 if mla else max(kv_heads // decode_tp, 1)
    if not mla and decode_tp > prefill_tp and decode_tp > kv_heads:
        raise ConfigError(f"decode tp({decode_tp}) exceeds num_key_value_heads({kv_heads}) and "
                          f"the prefill tp({prefill_tp}) is smaller: vLLM's NixlPushConnector "
                          "refuses it (the prefill rank's handshake); use decode tp <= "
                          f"{kv_heads}, or --connector nixl (pull)")
    writes = []
    for p in range(prefill_tp):
        if prefill_tp >= decode_tp:
            r = prefill_tp // decode_tp
            d = p // r
            if mla or decode_tp > kv_heads:
                dst = 0
            elif prefill_tp > kv_heads:  # tp_mapping.py:129-132, seen from the prefill rank
                dst = p * kv_heads // prefill_tp - d * kv_heads // decode_tp
            else:
                dst = (p % r) * p_heads
            writes.append((p, d, 0, dst, p_heads, False))
        else:
            r = decode_tp // prefill_tp
            for i in range(r):
                if mla:
                    writes.append((p, p * r + i, 0, 0, 1, False))
                else:
                    writes.append((p, p * r + i, i * d_heads, 0, d_heads, False))
    return writes
