"""One request's KV-cache transfer: which prefill TP rank sends which ranges to which decode
TP rank, per region (layer, K or V, or K+V packed), per block, as each connector moves it.

Rank mapping (the same in both engines): with tp ratio r = decode tp / prefill tp, decode
rank d takes from prefill rank d // r (r >= 1), or from the |r| prefill ranks d|r| ..
d|r| + |r| - 1 (prefill tp larger). vLLM `TransferTopology.tp_ratio`,
`handshake_target_ranks` (kv_connector/utils.py:523-543, 572-582 @ c8109375); SGLang
`_resolve_rank_mapping` (disaggregation/common/conn.py:485-527 @ 8905cbd4).

vLLM NixlConnector: patterns/engines/vllm/nixl_connector.py (versions, heads, block sizes,
the hybrid manager's sliding-window clipping). One descriptor per (region, block) of the
request, read by the decode rank: r >= 1, the decode rank's heads of each prefill block,
unless the prefill cache is replicated (MLA, or prefill tp > KV heads), then the whole
block; r < 0, each of the |r| reads fills 1/|r| of the decode block; with MLA only the first
prefill rank is read (`compute_tp_mapping`, nixl/tp_mapping.py:79-84) and the others get a
notification.

SGLang Mooncake and NIXL: patterns/engines/sglang/disagg_connectors.py.

When: no connector moves a layer while the prefill computes. vLLM: the prefill side
finishes the request after its prefill step (max_tokens 1) and keeps the blocks; the decode
side reads them at the start of its next step and schedules the request once every read is
done; that first step recomputes the last prompt token. SGLang: the prefill side sends each
chunk of a chunked prefill once computed, into pages the decode side pre-allocated; the
decode side runs the request after the last chunk arrives.
"""

from collections.abc import Iterator
from dataclasses import dataclass

from patterns.disagg.kvcache import SideCache, is_mla, side_cache
from patterns.disagg.layouts import Connector, DisaggLayout
from patterns.engines.sglang.disagg_connectors import (
    chunk_tokens,
    mooncake_batches,
    page_size,
    sglang_writes,
    swa_window,
)
from patterns.engines.vllm.nixl_connector import (
    cache_groups,
    dense_block_size,
    mla_block_size,
    vllm_push_writes,
    vllm_reads,
)
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
    dummy: bool = False  # MLA with more prefill ranks: a notification only, no data


@dataclass(frozen=True)
class KVTransfer:
    connector: Connector
    tokens: int  # prompt tokens of the request
    prefill: SideCache
    decode: SideCache
    granularity: str  # BLOCK, RUN or TOKEN
    pairs: tuple[Pair, ...]
    when: str
    chunks: tuple[int, ...] = ()  # blocks (pages) each transfer carries; () : one transfer
    backend: str = ""  # the attention backend that set the block size (vLLM MLA, SGLang b200)
    # SGLang's hybrid SWA pool: the buffer's last `swa_layers` layers move only their last
    # `swa_blocks` pages, one run a layer and region, in a transfer of their own.
    swa_layers: int = 0
    swa_blocks: int = 0

    @property
    def direction(self) -> str:
        return self.connector.direction

    @property
    def transfers(self) -> int:
        """Transfers a rank pair issues for one request (a chunked prefill: one a chunk;
        SGLang's sliding-window layers one more)."""
        return max(len(self.chunks), 1) + (1 if self.swa_layers else 0)

    def descriptor_groups(self, pair: Pair) -> list[tuple[int, int]]:
        """(descriptors, bytes each) of the pair, one group a descriptor size."""
        if pair.dummy:
            return []
        p = self.prefill
        per_token = pair.heads * p.head_bytes
        layers = p.layers - self.swa_layers
        sizes: dict[int, int] = {}

        def add(count: int, size: int) -> None:
            sizes[size] = sizes.get(size, 0) + count

        if self.granularity == BLOCK:
            add(layers * p.regions * p.blocks, per_token * p.block_tokens)
        elif self.granularity == TOKEN:
            add(layers * p.regions * p.blocks * p.block_tokens, per_token)
        else:
            for pages in self.chunks or (p.blocks,):
                add(layers * p.regions, pages * p.block_bytes)
        if self.swa_layers:
            add(self.swa_layers * p.regions, self.swa_blocks * p.block_bytes)
        return [(n, size) for size, n in sizes.items()]

    def descriptor_count(self, pair: Pair) -> int:
        return sum(n for n, _ in self.descriptor_groups(pair))

    def descriptor_bytes(self, pair: Pair) -> int:
        """Bytes of each of the pair's descriptors (of the largest where they differ)."""
        return max((size for _, size in self.descriptor_groups(pair)), default=0)

    def pair_bytes(self, pair: Pair) -> int:
        return sum(n * size for n, size in self.descriptor_groups(pair))

    @property
    def total_bytes(self) -> int:
        """One request's KV moved, every rank pair together."""
        return sum(self.pair_bytes(p) for p in self.pairs)

    def batches(self, pair: Pair) -> list[tuple[int, int]]:
        """(first descriptor, descriptors) of each list the connector hands its library in
        one call, in issue order: SGLang's Mooncake sender's batches
        (patterns/engines/sglang/disagg_connectors.py `mooncake_batches`); every other
        connector posts a pair's descriptors as one transfer."""
        count = self.descriptor_count(pair)
        if not count:
            return []
        if self.connector.engine != "sglang" or self.connector.name != "mooncake":
            return [(0, count)]
        p = self.prefill
        return mooncake_batches(self.granularity != TOKEN, p.layers - self.swa_layers,
                                p.regions, p.blocks, p.block_tokens, self.chunks,
                                self.swa_layers)

    def descriptors(self, pair: Pair) -> Iterator[tuple[int, int, int]]:
        """(offset in the prefill rank's buffer, offset in the decode rank's, bytes)."""
        if pair.dummy:
            return
        p, d = self.prefill, self.decode
        layers = p.layers - self.swa_layers
        if self.granularity == RUN:
            first = 0
            for pages in self.chunks or (p.blocks,):
                for layer in range(layers):
                    for region in range(p.regions):
                        yield (p.offset(layer, region, first, 0), d.offset(layer, region, first, 0),
                               pages * p.block_bytes)
                first += pages
        else:
            length = pair.heads * p.head_bytes * (
                1 if self.granularity == TOKEN else p.block_tokens)
            for layer in range(layers):
                for region in range(p.regions):
                    for block in range(p.blocks):
                        slots = range(p.block_tokens) if self.granularity == TOKEN else (0,)
                        for slot in slots:
                            yield (p.offset(layer, region, block, pair.src_head, slot),
                                   d.offset(layer, region, block, pair.dst_head, slot), length)
        first = p.blocks - self.swa_blocks  # the window's pages, the request's last
        for layer in range(layers, p.layers):
            for region in range(p.regions):
                yield (p.offset(layer, region, first, 0), d.offset(layer, region, first, 0),
                       self.swa_blocks * p.block_bytes)


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


WHEN = {
    "vllm": "after the prefill step: the decode ranks READ every block at the start of their "
            "next step; the request's first decode-side step (which recomputes the last "
            "prompt token) waits for the reads",
    "vllm-push": "after the prefill step: the prefill ranks WRITE every block into the blocks "
                 "the decode side registered; the decode side runs the request once every "
                 "write has landed",
    "sglang": "after each prefill chunk (one chunk for prompts within chunked_prefill_size): "
              "the prefill ranks WRITE into pages the decode side pre-allocated; decoding "
              "starts once the last chunk has arrived",
}


def plan_transfer(model: ModelConfig, disagg: DisaggLayout, connector: Connector, prompt: int,
                  dtype: str, kv_cache_dtype: str = "auto", block_tokens: int | None = None,
                  gpu: str = "h100", chunk: int | None = None) -> KVTransfer:
    """One request of `prompt` tokens, from one prefill replica to one decode replica
    (chunk: SGLang's chunked_prefill_size; None, one transfer)."""
    for name, side in (("prefill", disagg.prefill), ("decode", disagg.decode)):
        try:
            side.check_model(model)
        except ConfigError as err:
            raise ConfigError(f"{name} side: {err}") from None
    engine, mla = connector.engine, is_mla(model)
    if block_tokens is not None and not 1 <= block_tokens <= 1 << 16:
        raise ConfigError(f"kv-block-size {block_tokens} must be between 1 and 65536 tokens")
    backend = ""
    if engine == "vllm" and mla:
        block, backend = mla_block_size(gpu, kv_cache_dtype, block_tokens)
    elif engine == "vllm":
        block = dense_block_size(block_tokens)
    else:  # sglang
        block, backend = page_size(gpu, mla, model.model_type, block_tokens)
    ratio = tp_ratio(disagg.prefill.tp, disagg.decode.tp)
    kv = model.num_key_value_heads
    if engine == "vllm":
        groups = cache_groups(model)
        shape = {"packed": connector.version != "cda19ecf", "layers": groups.regions,
                 "blocks": groups.blocks(prompt, block)}
        p = side_cache(model, disagg.prefill.tp, prompt, block, dtype, kv_cache_dtype, True,
                       "prefill", **shape)
        d = side_cache(model, disagg.decode.tp, prompt, block, dtype, kv_cache_dtype, True,
                       "decode", **shape)
        if connector.name == "nixl-push":
            moves, when = vllm_push_writes(kv, mla, p.tp, d.tp), WHEN["vllm-push"]
        else:
            moves, when = vllm_reads(kv, mla, p.tp, d.tp, ratio, connector.version), WHEN[engine]
        return KVTransfer(connector, prompt, p, d, BLOCK, tuple(Pair(*m) for m in moves), when,
                          (), backend)
    p = side_cache(model, disagg.prefill.tp, prompt, block, dtype, kv_cache_dtype, False,
                   "prefill")
    d = side_cache(model, disagg.decode.tp, prompt, block, dtype, kv_cache_dtype, False,
                   "decode")
    writes = sglang_writes(kv, mla, p.tp, d.tp, ratio, connector.name)
    whole = mla or p.tp == d.tp
    swa_layers, swa_blocks = swa_window(model.model_type, model.sliding_window,
                                        len(model.sliding_layers), prompt, block, whole)
    granularity = TOKEN if not whole else RUN if connector.name == "mooncake" else BLOCK
    chunks = tuple(-(-n // block) for n in chunk_tokens(prompt, chunk or prompt, block))
    return KVTransfer(connector, prompt, p, d, granularity,
                      tuple(Pair(*w) for w in writes), WHEN[engine],
                      chunks if len(chunks) > 1 else (), backend, swa_layers, swa_blocks)
