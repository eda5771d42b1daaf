"""vLLM V1's automatic prefix caching over a request workload (patterns/workload/prefix.py),
by hand.

vllm-project/vllm @ c8109375 (= modal-projects/vllm): `v1/core/kv_cache_manager.py:259` (a
hit is at most prompt - 1 tokens, in whole blocks), `:555-563` (allocate_slots caches the
blocks of what it schedules, at schedule time), `v1/core/sched/scheduler.py:973` (each WAITING
request is allocated as it is admitted: a later one in the same step hits the blocks an
earlier one is computing), `config/cache.py:47, 93` (block 16, caching on by default),
`platforms/cpu.py:120` (the CPU build's block of 128).
"""

import json

import pytest

from patterns import EngineOptions, Layout
from patterns.engines.vllm.scheduler import schedule_vllm
from patterns.engines.workloads import workload_pattern
from patterns.errors import ConfigError
from patterns.models import resolve_model
from patterns.workload.prefix import PrefixCache
from patterns.workload.requests import Request, read_requests

PATTERN = ["pattern", "--model", "llama-3.1-8b", "--tp", "2"]
# Two requests of one 200-token prompt, 2 tokens each (scripts/vllm_cpu_oracle.py
# same-prompt-tp2 and dense-tp2's shared-prefix)
SAME = [Request(0.0, 200, 2, "p", 200)] * 2


def tokens(schedule) -> list[int]:
    """Tokens of each issued step."""
    return [s.shape.tokens for s in schedule.segments for _ in range(s.repeat)]


def test_a_shared_prompt_computes_its_uncached_tail_in_the_same_step() -> None:
    # budget 4096, 256 seqs (the CPU build's): the first is scheduled its 200 tokens, which
    # caches block 0 (tokens 0-127; 128-199 fill no block); the second, admitted after it,
    # hits min(200, 200, 200 - 1) = 199 -> 1 block = 128, computes 200 - 128 = 72: 272.
    # Then both decode their second token: 2.
    assert tokens(schedule_vllm(SAME, None, 256, 4096, prefix=PrefixCache.of(128))) == [272, 2]
    # block 16: 199 -> 12 blocks = 192 cached, 8 computed: 208
    assert tokens(schedule_vllm(SAME, None, 256, 4096, prefix=PrefixCache.of(16))) == [208, 2]
    # prefix caching off (the code before): 400, what the engine did not run
    assert tokens(schedule_vllm(SAME, None, 256, 4096)) == [400, 2]


def test_a_chunked_prefix_is_hit_as_far_as_it_was_scheduled() -> None:
    # budget 16, 2 seqs (dense-tp2's engine case): A runs 12 chunks of 16 = 192; step 12: A's
    # last 8 (200 scheduled, block 0 cached), B admitted with the budget's 8 left: hit 128,
    # 72 to compute, 8 of them (64 left). Step 13: A decodes 1 + B 15 (49 left); then B
    # 16, 16, 16 (1 left), 1 (prompt done), and its decode 1.
    assert tokens(schedule_vllm(SAME, None, 2, 16, prefix=PrefixCache.of(128))) == [
        *[16] * 12, 8 + 8, 1 + 15, 16, 16, 16, 1, 1]
    # Without the cache B computes 200: 8, then 1 + 15 (177 left), 11 x 16 (1 left), 1, 1
    assert tokens(schedule_vllm(SAME, None, 2, 16)) == [
        *[16] * 12, 8 + 8, 1 + 15, *[16] * 11, 1, 1]


def test_a_hit_is_the_shorter_shared_prefix_and_whole_blocks() -> None:
    # A shares 150 of its 300 tokens; B 300 of 300 under the same prefix_id: they share
    # min(150, 300) = 150 -> 9 blocks of 16 = 144; B computes 300 - 144 = 156: 300 + 156.
    a, b = Request(0.0, 300, 1, "sys", 150), Request(0.0, 300, 1, "sys", 300)
    assert tokens(schedule_vllm([a, b], None, 8, 4096, prefix=PrefixCache.of(16))) == [456]
    # another prefix_id, or none, hits nothing: 300 + 300
    c = Request(0.0, 300, 1, "other", 300)
    assert tokens(schedule_vllm([a, c], None, 8, 4096, prefix=PrefixCache.of(16))) == [600]
    d = Request(0.0, 300, 1)
    assert tokens(schedule_vllm([a, d], None, 8, 4096, prefix=PrefixCache.of(16))) == [600]
    # a prefix shorter than one block hits nothing: 100 shared at block 128
    e, f = Request(0.0, 100, 1, "s", 100), Request(0.0, 100, 1, "s", 100)
    assert tokens(schedule_vllm([e, f], None, 8, 4096, prefix=PrefixCache.of(128))) == [200]


def test_a_prefix_stays_cached_after_its_request_finished() -> None:
    # step 10 ms: A (prompt 64, 1 token) runs at step 0 and is gone; B arrives at 50 ms
    # (step 5) and hits min(64, 64, 63) -> 3 blocks of 16 = 48: it computes 16.
    a, b = Request(0.0, 64, 1, "p", 64), Request(0.05, 64, 1, "p", 64)
    assert tokens(schedule_vllm([a, b], 0.01, 8, 4096, prefix=PrefixCache.of(16))) == [64, 16]


def _write(tmp_path, *lines: dict) -> str:
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"arrival_s": 0.0, "prompt": 200, "output": 2, **d})
                            + "\n" for d in lines))
    return str(path)


def test_a_whole_float_is_read_as_a_prompt_is(tmp_path) -> None:
    # "prompt": 200.0 reads as 200 (requests._tokens); "prefix_tokens": 64.0 likewise.
    [request] = read_requests(_write(tmp_path, {"prompt": 200.0, "prefix_id": "p",
                                                "prefix_tokens": 64.0}))
    assert request == Request(0.0, 200, 2, "p", 64)
    assert type(request.prefix_tokens) is int


def test_the_options_reach_the_scheduler(tmp_path) -> None:
    requests = read_requests(_write(tmp_path, *[{"prefix_id": "p", "prefix_tokens": 200}] * 2))
    assert requests[1] == Request(0.0, 200, 2, "p", 200)
    model, layout = resolve_model("llama-3.1-8b"), Layout(tp=2)

    def first_step(**options) -> int:
        return tokens(workload_pattern("vllm", model, layout, requests, None,
                                       EngineOptions(**options), None).schedule)[0]
    assert first_step() == 208  # vLLM's defaults: caching on, block 16 (192 cached)
    assert first_step(kv_block_size=128) == 272
    assert first_step(prefix_caching=False) == 400
    with pytest.raises(ConfigError, match="kv-block-size 17: no attention backend"):
        first_step(kv_block_size=17)  # a size no dense backend takes (nixl_connector.py)


@pytest.mark.parametrize("extra, words", [
    ({"prefix_id": "p"}, "w.jsonl:1: prefix_id without prefix_tokens; give both"),
    ({"prefix_tokens": 5}, "w.jsonl:1: prefix_tokens without prefix_id"),
    ({"prefix_id": 7, "prefix_tokens": 5}, "w.jsonl:1: prefix_id must be a string"),
    ({"prefix_id": "", "prefix_tokens": 5}, "w.jsonl:1: prefix_id must be a string"),
    ({"prefix_id": "p", "prefix_tokens": 201}, "prefix_tokens 201 must be a whole number of "
                                               "tokens from 1 to the prompt's 200"),
    ({"prefix_id": "p", "prefix_tokens": True}, "prefix_tokens True must be"),
    ({"prefix_id": "p", "prefix_tokens": 2.5}, "prefix_tokens 2.5 must be"),
])
def test_bad_prefix_keys_are_one_line(cli, tmp_path, extra, words) -> None:
    status, out, err = cli(*PATTERN, "--requests", _write(tmp_path, extra))
    assert status == 2 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and words in err, err


@pytest.mark.parametrize("argv, words", [
    (["--prompt", "200", "--decode", "2", "--no-prefix-caching"],
     "--prefix-caching / --no-prefix-caching go with --requests"),
    (["--prompt", "200", "--decode", "2", "--kv-block-size", "128"],
     "--kv-block-size describe(s) the KV transfer of --disagg"),
    (["--engine", "sglang", "SHARED"], "modelled for vLLM's prefix cache; sglang's own is not"),
    (["--pp", "2", "--no-async-scheduling", "--model-runner", "v1", "SHARED"],
     "not under pp(2) > 1; give --no-prefix-caching"),
    (["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}',
      "--acceptance-length", "2", "SHARED"], "not under speculative decoding"),
])
def test_what_is_not_modelled_is_refused(cli, tmp_path, argv, words) -> None:
    shared = _write(tmp_path, *[{"prefix_id": "p", "prefix_tokens": 200}] * 2)
    argv = [a for b in argv for a in (["--requests", shared] if b == "SHARED" else [b])]
    status, out, err = cli(*PATTERN, *argv)
    assert status == 2 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and words in err, err
