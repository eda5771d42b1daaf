"""SGLang's own Mooncake sender judges `pattern --disagg --engine sglang` and the batches
`replay --kv-transport mooncake` hands Mooncake's engine.

SGLang's sender functions (`send_kvcache`, `send_kvcache_slice`, `_send_kvcache_generic`,
`group_concurrent_contiguous`, `get_mha_kv_ptrs_with_pp`: pure Python in SGLang's wheel,
loaded by tests/sglang_sender.py) run against a stand-in of SGLang's transfer engine that
records each `batch_transfer_sync` call; infercomm's Mooncake transport runs against a
stand-in of Mooncake's `TransferEngine` that records each `batch_transfer_sync_write`. Both
see the same buffers: each rank's K and V buffers of every layer one after another
(`[pages x page_size, heads, head_dim]` each, token-major, as SGLang's MHATokenToKVPool), the
request's pages 0 .. n-1 on both sides (a fresh pool), so an address less its rank's base is
the offset the pattern names. The blocks of each (prefill rank, decode rank) agree as sets,
and so do the batches, each a set.

Which decode ranks a prefill rank sends to is SGLang's (`_resolve_rank_mapping`,
disaggregation/common/conn.py:485-527 @ 8905cbd4): decode rank d takes from prefill rank
d // (decode tp / prefill tp), or from the prefill tp / decode tp ranks starting at
d x (prefill tp / decode tp).
"""

import concurrent.futures
from types import SimpleNamespace

import numpy as np
import pytest

from microbench.backends.mooncake_transport import Mooncake
from microbench.replay.kv_transfer import pair_descs, role_of
from patterns import EngineOptions, Workload, resolve_model
from patterns.disagg import generate_disagg, parse_disagg
from tests.replay_helpers import tiny_model
from tests.sglang_sender import RecordingEngine, sender_class

# tests/replay_helpers TINY_CONFIG: 4 layers, 4 KV heads of 16 dims, bf16: 32 bytes a head
# and token in K (and in V).
LAYERS, KV_HEADS, HEAD_BYTES = 4, 4, 16 * 2
REMOTE_BASE = 1 << 44  # where the stand-ins put rank r's buffer: (r + 1) x this


@pytest.fixture(scope="module")
def sender() -> type:
    return sender_class()


class RecordingMooncake:
    """Mooncake's TransferEngine as infercomm's transport calls it, each batch recorded."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, list[tuple[int, int, int]]]] = []

    def initialize(self, host: str, metadata: str, protocol: str, device: str) -> int:
        assert (host, metadata, protocol, device) == ("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
        return 0

    def register_memory(self, ptr: int, length: int) -> int:
        return 0

    def unregister_memory(self, ptr: int) -> int:
        return 0

    def get_rpc_port(self) -> int:
        return 15000

    def batch_transfer_sync_write(self, session: str, src: list[int], dst: list[int],
                                  lengths: list[int]) -> int:
        self.batches.append((session, list(zip(src, dst, lengths, strict=True))))
        return 0


def deployment(tmp_path, spec: str, prompt: int, page: int | None, chunk: int | None):
    model = resolve_model(tiny_model(tmp_path))
    return generate_disagg("sglang", model, parse_disagg(spec), Workload(prompt=prompt, decode=4),
                           EngineOptions(max_batched_tokens=chunk), "mooncake", "auto", page)


def kv_ptrs(base: int, heads: int, pages: int, page: int) -> list[int]:
    """SGLang's kv_data_ptrs of one rank: K of each layer, then V of each (the layout
    get_mha_kv_ptrs_with_pp splits, common/conn.py:707-738); buffer (layer, K|V) sits at
    (2 layer + region) x pages x page x heads x HEAD_BYTES, the pattern's SideCache order."""
    region = pages * page * heads * HEAD_BYTES
    return ([base + 2 * layer * region for layer in range(LAYERS)]
            + [base + (2 * layer + 1) * region for layer in range(LAYERS)])


def sglang_batches(sender: type, prefill_tp: int, decode_tp: int, pages: int, page: int,
                   chunks: tuple[int, ...]) -> dict[tuple[int, int], list[frozenset]]:
    """Each (prefill rank, decode rank)'s batches as SGLang's sender issues them: one call of
    send_kvcache (equal tp) or send_kvcache_slice a chunk (prefill.py send_kv_chunk, the
    transfer worker, mooncake/conn.py:1373, 1400), offsets from each rank's base."""
    p_heads, d_heads = KV_HEADS // prefill_tp, KV_HEADS // decode_tp
    out: dict[tuple[int, int], list[frozenset]] = {}
    executor = concurrent.futures.ThreadPoolExecutor(1)  # 4 // 4 threads (conn.py:176-195)
    for p in range(prefill_tp):
        if decode_tp >= prefill_tp:
            ratio = decode_tp // prefill_tp
            targets = range(p * ratio, (p + 1) * ratio)
        else:
            targets = range(p // (prefill_tp // decode_tp), p // (prefill_tp // decode_tp) + 1)
        manager = sender()
        manager.kv_args = SimpleNamespace(
            kv_data_ptrs=kv_ptrs(0, p_heads, pages, page),
            kv_item_lens=[page * p_heads * HEAD_BYTES] * 2 * LAYERS,
            page_size=page, engine_rank=p, kv_head_num=p_heads, total_kv_head_num=KV_HEADS,
            prefill_start_layer=0)
        manager.attn_tp_size = prefill_tp
        manager.is_mla_backend = manager.is_hybrid_mla_backend = False
        manager.enable_custom_mem_pool = False
        manager.engine = RecordingEngine()
        for d in targets:
            base = (prefill_tp + d + 1) * REMOTE_BASE
            dst = kv_ptrs(base, d_heads, pages, page)
            first = 0
            for count in chunks or (pages,):
                indices = np.arange(first, first + count, dtype=np.int32)
                if prefill_tp == decode_tp:
                    status = manager.send_kvcache(f"rank{prefill_tp + d}", indices, dst,
                                                  indices, executor)
                else:
                    status = manager.send_kvcache_slice(
                        f"rank{prefill_tp + d}", indices, dst, indices, d, decode_tp,
                        page * d_heads * HEAD_BYTES, executor)
                assert status == 0
                first += count
            out[p, d] = [frozenset((s, t - base, n) for s, t, n in blocks)
                         for session, blocks in manager.engine.batches
                         if session == f"rank{prefill_tp + d}"]
    executor.shutdown()
    return out


def infercomm_batches(d) -> dict[tuple[int, int], list[frozenset]]:
    """Each (prefill rank, decode rank)'s batches as the replay's Mooncake transport issues
    them (prepare + one transfer on each prefill rank), offsets from each rank's base."""
    offset, world = d.disagg.decode_offset, d.disagg.world_size
    pairs = pair_descs(d)
    out: dict[tuple[int, int], list[frozenset]] = {}
    for p in range(offset):
        engine = RecordingMooncake()
        transport = Mooncake(p, engine=engine)
        role = role_of(d, p, pairs)
        buffer = transport.allocate(role.nbytes)
        mine = int(buffer.ctypes.data)

        def allgather(value, mine=mine, p=p):
            if isinstance(value, str):  # host names: one host
                return [value] * world
            return [(f"rank{r}", mine if r == p else (r + 1) * REMOTE_BASE)
                    for r in range(world)]

        transport.prepare(role, buffer, allgather)
        transport.transfer()
        for session, blocks in engine.batches:
            r = int(session.removeprefix("rank"))
            out.setdefault((p, r - offset), []).append(frozenset(
                (s - mine, t - (r + 1) * REMOTE_BASE, n) for s, t, n in blocks))
    return out


def as_multiset(batches: list[frozenset]) -> list[list[tuple[int, int, int]]]:
    return sorted(sorted(b) for b in batches)


# (layout, prompt, page, chunk, batches a pair, blocks a batch), by hand:
# - tp1 -> tp1, pages of 1, 20 tokens: one batch of a run a layer and K or V: 4 x 2 = 8;
# - the same with chunks of 8 tokens (--max-batched-tokens 8): chunks of 8, 8, 4 pages, a
#   batch each of 8 runs;
# - tp1 -> tp2: a batch a layer and K or V (8), a slice a token slot in each (20);
# - tp2 -> tp1: the same from each prefill rank;
# - tp1 -> tp2, pages of 4, 10 tokens: 3 pages, every slot sent, 12 slices a batch;
# - tp1 -> tp2 in chunks of 8 tokens: a batch a chunk, layer and K or V: 2 x 8, of 8 and 2.
CASES = [
    ("prefill=tp1,decode=tp1", 20, None, None, [8]),
    ("prefill=tp1,decode=tp1", 20, None, 8, [8, 8, 8]),
    ("prefill=tp1,decode=tp2", 20, None, None, [20] * 8),
    ("prefill=tp2,decode=tp1", 20, None, None, [20] * 8),
    ("prefill=tp1,decode=tp2", 10, 4, None, [12] * 8),
    ("prefill=tp1,decode=tp2", 10, None, 8, [8] * 8 + [2] * 8),
]


@pytest.mark.parametrize("spec, prompt, page, chunk, sizes", CASES)
def test_sglang_sender_writes_the_pattern_s_blocks_in_its_batches(tmp_path, sender, spec,
                                                                 prompt, page, chunk, sizes):
    d = deployment(tmp_path, spec, prompt, page, chunk)
    t = d.transfer
    theirs = sglang_batches(sender, t.prefill.tp, t.decode.tp, t.prefill.blocks,
                            t.prefill.block_tokens, t.chunks)
    ours = infercomm_batches(d)
    assert sorted(ours) == sorted(theirs) == sorted((p.prefill, p.decode) for p in t.pairs)
    for pair in t.pairs:
        key = (pair.prefill, pair.decode)
        # the pattern's descriptors, as a set, are what SGLang writes
        blocks = set().union(*theirs[key])
        assert set(t.descriptors(pair)) == blocks
        assert len(blocks) == t.descriptor_count(pair)  # no block twice
        # and the replay hands Mooncake SGLang's batches
        assert as_multiset(ours[key]) == as_multiset(theirs[key])
        assert sorted(len(b) for b in theirs[key]) == sorted(sizes)


def test_the_head_slices_land_where_sglang_puts_them(tmp_path, sender):
    # tp1 -> tp2, pages of 1: prefill rank 0 holds 4 heads (128 bytes a token and layer in K);
    # decode rank 1 takes heads 2 and 3 (64 bytes from byte 64 of each token) into its own 2
    # heads (64 bytes a token). Token 5 of layer 0's K: from 5 x 128 + 64 = 704, to 5 x 64 =
    # 320. Layer 1's V (region 3 of each rank's 8; 20 tokens a region): from 3 x 20 x 128 +
    # 704 = 8,384, to 3 x 20 x 64 + 320 = 4,160.
    d = deployment(tmp_path, "prefill=tp1,decode=tp2", 20, None, None)
    theirs = sglang_batches(sender, 1, 2, 20, 1, ())
    blocks = set().union(*theirs[0, 1])
    assert {(704, 320, 64), (8_384, 4_160, 64)} <= blocks
    assert {(704, 320, 64), (8_384, 4_160, 64)} <= set(d.transfer.descriptors(d.transfer.pairs[1]))
