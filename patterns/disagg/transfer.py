"""One request's KV-cache transfer: which prefill TP rank sends which ranges to which decode
TP rank, per layer, per region (K, V or MLA's latent), per block, as each connector moves it.

Rank mapping (the same in both engines): with tp ratio r = decode tp / prefill tp, decode
rank d takes from prefill rank d // r (r >= 1), or from the |r| prefill ranks d|r| ..
d|r| + |r| - 1 (prefill tp larger). vLLM `TpKVTopology.tp_ratio` and
`get_target_remote_ranks` (kv_connector/utils.py:403, 470 @ cda19ecf); SGLang
`_resolve_rank_mapping` (disaggregation/common/conn.py:262 @ 5fe238c4).

vLLM NixlConnector (`nixl/worker.py` @ cda19ecf, `add_remote_agent` line 1097):
- one descriptor per (layer, region, block) of the request, read by the decode rank;
- r >= 1: the decode rank reads its heads' slice of each prefill block, at offset
  (d mod r) x its block length, unless the prefill cache is replicated (MLA, or prefill tp >
  KV heads), then the whole block (`rank_offset`, line 1298);
- r < 0: each of the |r| reads fills 1/|r| of the decode block; with MLA only the first
  prefill rank is read (line 1924) and the others get a notification;
- refused: prefill tp > KV heads with prefill tp > decode tp (line 1417), and a prefill
  block that is not r decode blocks long (the block-length asserts of
  `_validate_remote_agent_handshake`, line 1398).
- blocks: `block_size` 16 (config/cache.py:45 DEFAULT_BLOCK_SIZE), 64 for MLA (FlashMLA's
  only kernel block size, v1/attention/backends/mla/flashmla.py:59).

SGLang Mooncake and NIXL (`mooncake/conn.py` @ 5fe238c4): the prefill rank writes.
- equal tp, or MLA: `send_kvcache` (line 1209): per layer and K/V, the request's contiguous
  pages as one range (`group_concurrent_contiguous`);
- otherwise `send_kvcache_slice` (line 682): per layer, K/V and token slot of every page, the
  run of heads the decode rank holds, num_heads_to_send x head bytes (GQA replication:
  src_replication = prefill tp / KV heads);
- MLA with prefill tp > decode tp: only the first of the |r| prefill ranks sends data, the
  others a status message (common/conn.py:296-303, "is_dummy").
- pages: `page_size` 1 unless an attention backend forces one (server_args.py:3304).

When: no connector moves a layer while the prefill computes (vLLM's `save_kv_layer` is a
no-op, nixl/connector.py:247). vLLM: the prefill side finishes the request after its prefill
step (max_tokens 1) and keeps the blocks; the decode side reads them at the start of its next
step (`start_load_kv`) and schedules the request once every read is done; that first step
recomputes the last prompt token (v1/core/sched/scheduler.py:2065). SGLang: the prefill side
sends each chunk of a chunked prefill once computed (prefill.py:773, the last partial page
with the last chunk), into pages the decode side pre-allocated; the decode side runs the
request after the last chunk arrives.
"""

from collections.abc import Iterator
from dataclasses import dataclass

from patterns.disagg.kvcache import SideCache, is_mla, side_cache
from patterns.disagg.layouts import Connector, DisaggLayout
from patterns.errors import ConfigError
from patterns.models import ModelConfig

BLOCK, RUN, TOKEN = "block", "run", "token"  # what one descriptor covers


@dataclass(frozen=True)
class Pair:
    """What one prefill TP rank sends to one decode TP rank (ranks within their replicas)."""

    prefill: int
    decode: int
    src_head: int  # first head moved, within the prefill rank's heads
    dst_head: int  # where it lands, within the decode rank's heads
    heads: int  # heads moved (MLA: the latent, one)
    dummy: bool = False  # SGLang MLA: a status message only, no data


@dataclass(frozen=True)
class KVTransfer:
    connector: Connector
    tokens: int  # prompt tokens of the request
    prefill: SideCache
    decode: SideCache
    granularity: str  # BLOCK, RUN or TOKEN
    pairs: tuple[Pair, ...]
    when: str

    @property
    def direction(self) -> str:
        return self.connector.direction

    def descriptor_count(self, pair: Pair) -> int:
        if pair.dummy:
            return 0
        p = self.prefill
        per_region = {BLOCK: p.blocks, RUN: 1, TOKEN: p.blocks * p.block_tokens}
        return p.layers * p.regions * per_region[self.granularity]

    def descriptor_bytes(self, pair: Pair) -> int:
        """Bytes of each of the pair's descriptors (they are all alike)."""
        p = self.prefill
        per_token = pair.heads * p.head_bytes
        return {BLOCK: per_token * p.block_tokens, RUN: p.region_bytes,
                TOKEN: per_token}[self.granularity]

    def pair_bytes(self, pair: Pair) -> int:
        return self.descriptor_count(pair) * self.descriptor_bytes(pair)

    @property
    def total_bytes(self) -> int:
        """One request's KV moved, every rank pair together."""
        return sum(self.pair_bytes(p) for p in self.pairs)

    def descriptors(self, pair: Pair) -> Iterator[tuple[int, int, int]]:
        """(offset in the prefill rank's buffer, offset in the decode rank's, bytes)."""
        if pair.dummy:
            return
        p, d = self.prefill, self.decode
        length = self.descriptor_bytes(pair)
        for layer in range(p.layers):
            for region in range(p.regions):
                if self.granularity == RUN:
                    yield (p.offset(layer, region, 0, 0), d.offset(layer, region, 0, 0), length)
                    continue
                for block in range(p.blocks):
                    slots = range(p.block_tokens) if self.granularity == TOKEN else (0,)
                    for slot in slots:
                        yield (p.offset(layer, region, block, pair.src_head, slot),
                               d.offset(layer, region, block, pair.dst_head, slot), length)


def tp_ratio(prefill_tp: int, decode_tp: int) -> int:
    """decode/prefill when decode tp is the larger, else -(prefill/decode); refuses sizes
    where neither divides the other (vLLM asserts it, SGLang's mapping assumes it)."""
    if decode_tp >= prefill_tp and decode_tp % prefill_tp == 0:
        return decode_tp // prefill_tp
    if prefill_tp > decode_tp and prefill_tp % decode_tp == 0:
        return -(prefill_tp // decode_tp)
    raise ConfigError(f"prefill tp({prefill_tp}) and decode tp({decode_tp}): neither divides "
                      "the other, so the KV heads cannot map between the sides (each decode "
                      "rank takes from one prefill rank, or from a whole number of them); "
                      "use tp sizes where one divides the other")


def targets(decode_rank: int, ratio: int) -> list[int]:
    if ratio > 0:
        return [decode_rank // ratio]
    return [decode_rank * -ratio + i for i in range(-ratio)]


def _vllm_pairs(model: ModelConfig, p: SideCache, d: SideCache, ratio: int) -> list[Pair]:
    mla = is_mla(model)
    kv = model.num_key_value_heads
    if not mla:
        if ratio < 0 and p.replicated:
            raise ConfigError(f"prefill tp({p.tp}) exceeds num_key_value_heads({kv}) and the "
                              f"decode tp({d.tp}) is smaller: vLLM's NixlConnector refuses a "
                              "replicated prefill cache read by fewer decode ranks; use prefill "
                              f"tp <= {kv} or decode tp >= prefill tp")
        whole_blocks = (p.heads == d.heads * ratio if ratio > 0
                        else d.heads == p.heads * -ratio)
        if not p.replicated and not whole_blocks:
            raise ConfigError(f"prefill tp({p.tp}) holds {p.heads} KV head(s) a rank and decode "
                              f"tp({d.tp}) {d.heads}: vLLM's NixlConnector needs a prefill "
                              f"block of exactly tp-ratio decode blocks (num_key_value_heads "
                              f"{kv}); use decode tp <= {kv} or prefill tp > {kv}")
    pairs = []
    for dr in range(d.tp):
        for i, pr in enumerate(targets(dr, ratio)):
            if ratio > 0:
                # The decode rank's heads inside the prefill rank's, unless replicated.
                src = (dr % ratio) * d.heads if not p.replicated else 0
                pairs.append(Pair(pr, dr, src, 0, d.heads))
            elif mla:
                pairs.append(Pair(pr, dr, 0, 0, 1, dummy=i > 0))  # notification only
            else:
                pairs.append(Pair(pr, dr, 0, i * p.heads, p.heads))
    return pairs


def _sglang_pairs(model: ModelConfig, p: SideCache, d: SideCache, ratio: int) -> list[Pair]:
    mla = is_mla(model)
    whole = mla or p.tp == d.tp
    total = model.num_key_value_heads
    replication = max(1, p.tp // total)  # prefill ranks that hold the same head
    pairs = []
    for dr in range(d.tp):
        for i, pr in enumerate(targets(dr, ratio)):
            if whole:
                pairs.append(Pair(pr, dr, 0, 0, p.heads, dummy=mla and ratio < 0 and i > 0))
            elif p.tp > d.tp:  # several prefill ranks fill one decode rank's heads
                dst = (pr // replication * p.heads) % d.heads
                pairs.append(Pair(pr, dr, 0, dst, p.heads))
            else:  # one prefill rank's heads split over several decode ranks
                pairs.append(Pair(pr, dr, (dr * d.heads) % p.heads, 0, d.heads))
    return pairs


def block_size_of(model: ModelConfig, engine: str) -> int:
    """The engine's default tokens a block (vLLM) or page (SGLang) on an H100."""
    if engine == "vllm":
        return 64 if is_mla(model) else 16
    return 1


WHEN = {
    "vllm": "after the prefill step: the decode ranks READ every block at the start of their "
            "next step; the request's first decode-side step (which recomputes the last "
            "prompt token) waits for the reads",
    "sglang": "after each prefill chunk (one chunk for prompts within chunked_prefill_size): "
              "the prefill ranks WRITE into pages the decode side pre-allocated; decoding "
              "starts once the last chunk has arrived",
}


def plan_transfer(model: ModelConfig, disagg: DisaggLayout, connector: Connector, prompt: int,
                  dtype: str, kv_cache_dtype: str = "auto",
                  block_tokens: int | None = None) -> KVTransfer:
    """One request of `prompt` tokens, from one prefill replica to one decode replica."""
    for name, side in (("prefill", disagg.prefill), ("decode", disagg.decode)):
        try:
            side.check_model(model)
        except ConfigError as err:
            raise ConfigError(f"{name} side: {err}") from None
    engine = connector.engine
    block = block_tokens if block_tokens is not None else block_size_of(model, engine)
    if not 1 <= block <= 1 << 16:
        raise ConfigError(f"kv-block-size {block} must be between 1 and 65536 tokens")
    hnd = engine == "vllm"
    p = side_cache(model, disagg.prefill.tp, prompt, block, dtype, kv_cache_dtype, hnd,
                   "prefill")
    d = side_cache(model, disagg.decode.tp, prompt, block, dtype, kv_cache_dtype, hnd, "decode")
    ratio = tp_ratio(p.tp, d.tp)
    if engine == "vllm":
        pairs, granularity = _vllm_pairs(model, p, d, ratio), BLOCK
    else:
        pairs = _sglang_pairs(model, p, d, ratio)
        granularity = RUN if is_mla(model) or p.tp == d.tp else TOKEN
    return KVTransfer(connector, prompt, p, d, granularity, tuple(pairs), WHEN[engine])
