"""One side's KV cache of one request on one TP rank: how many bytes, and where each lies.

Bytes per token and layer on a rank come from `patterns/weights.py`
(`kv_bytes_per_token_layer`, the figure plan's memory check uses): K and V of the rank's KV
heads (one where TP exceeds the KV heads, as vLLM's `QKVParallelLinear` replicates them), or
MLA's cached latent (kv_lora_rank + qk_rope_head_dim), the same on every TP rank.

Where the bytes lie follows each engine's cache, because the connectors move contiguous
ranges of it:

- vLLM: head-major blocks (HND), so inside a block of `block_size` tokens each head's tokens
  are contiguous and a run of heads of a block is one range. Today (c8109375) K and V are
  packed into each token's content (one region a layer, `head_bytes` covering K and V:
  patterns/engines/vllm/nixl_connector.py); before #44455 (cda19ecf) they were two regions a layer
  (`TpKVTopology.split_k_and_v`, kv_connector/utils.py:385 @ cda19ecf). MLA has one region
  a layer (the latent). Under the hybrid KV cache manager a region is one of the tensors
  the groups share and holds every group's blocks of the request (`layers` counts regions).
- SGLang: per layer a K and a V buffer of [tokens, heads, head_dim] (token-major): a page of
  `page_size` tokens is contiguous, a run of heads is contiguous only within one token.

The request's blocks sit one after another on each side (a fresh request in an empty pool);
the engines' block ids differ, the byte counts do not.
"""

from dataclasses import dataclass

from patterns.dtypes import DTYPE_BYTES
from patterns.errors import ConfigError
from patterns.models import ModelConfig
from patterns.weights import kv_bytes_per_token_layer

KV_CACHE_DTYPES = ("auto", "fp8")


@dataclass(frozen=True)
class SideCache:
    """One request's cache on one TP rank of one side."""

    tp: int
    layers: int
    regions: int  # 2 (K and V) or 1 (MLA's latent)
    heads: int  # KV heads a rank holds (MLA: the one latent, counted as one head)
    head_bytes: int  # one token of one head in one region
    block_tokens: int
    blocks: int
    heads_outer: bool  # HND (vLLM): head-major inside a block; else token-major (SGLang)
    replicated: bool  # tp > KV heads, or MLA: other ranks hold the same heads

    @property
    def block_bytes(self) -> int:
        return self.block_tokens * self.heads * self.head_bytes

    @property
    def region_bytes(self) -> int:
        return self.blocks * self.block_bytes

    @property
    def rank_bytes(self) -> int:
        """The request's cache on this rank: every layer, region and block."""
        return self.layers * self.regions * self.region_bytes

    def offset(self, layer: int, region: int, block: int, head: int, slot: int = 0) -> int:
        """Byte offset of (layer, region, block, head, token slot) in the rank's buffer."""
        base = ((layer * self.regions + region) * self.blocks + block) * self.block_bytes
        if self.heads_outer:
            return base + (head * self.block_tokens + slot) * self.head_bytes
        return base + (slot * self.heads + head) * self.head_bytes


def kv_element_bytes(model: ModelConfig, dtype: str, kv_cache_dtype: str) -> int:
    """Bytes of one cached element: the serving dtype's (auto), or 1 (fp8)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError(f"kv-cache-dtype {kv_cache_dtype!r} is not modelled; use one of "
                          f"{', '.join(KV_CACHE_DTYPES)}")
    return 1 if kv_cache_dtype == "fp8" else DTYPE_BYTES[dtype]


def is_mla(model: ModelConfig) -> bool:
    return model.mla and bool(model.kv_lora_rank)


def check_kv_heads(model: ModelConfig, tp: int, side: str) -> None:
    """vLLM and SGLang split KV heads evenly, or replicate each over tp / heads ranks."""
    kv = model.num_key_value_heads
    if is_mla(model) or kv % tp == 0 or tp % kv == 0:
        return
    raise ConfigError(f"{side} tp({tp}) neither divides nor is a multiple of "
                      f"num_key_value_heads({kv}) of {model.name}: its KV heads cannot be "
                      f"split over the ranks; use a tp that divides {kv} or a multiple of it")


def side_cache(model: ModelConfig, tp: int, tokens: int, block_tokens: int, dtype: str,
               kv_cache_dtype: str, heads_outer: bool, side: str, packed: bool = False,
               layers: int | None = None, blocks: int | None = None) -> SideCache:
    """packed: K and V in one region (vLLM since #44455); layers, blocks: regions a rank
    and blocks of the request in each (default: every layer, every block of `tokens`)."""
    check_kv_heads(model, tp, side)
    mla = is_mla(model)
    # weights.py counts in the dtype it is given; fp8 is one byte, as uint8 is.
    element = kv_element_bytes(model, dtype, kv_cache_dtype)
    per_token_layer = kv_bytes_per_token_layer(model, tp, "uint8" if element == 1 else dtype)
    regions = 1 if mla or packed else 2
    heads = 1 if mla else max(model.num_key_value_heads // tp, 1)
    head_bytes = per_token_layer // (regions * heads)
    if blocks is None:
        blocks = -(-tokens // block_tokens)
    return SideCache(tp=tp, layers=layers or model.num_hidden_layers, regions=regions,
                     heads=heads,
                     head_bytes=head_bytes, block_tokens=block_tokens, blocks=blocks,
                     heads_outer=heads_outer,
                     replicated=mla or tp > model.num_key_value_heads)
