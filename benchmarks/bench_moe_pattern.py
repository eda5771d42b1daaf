"""`infercomm pattern` for DeepSeek-V3 DP32-EP32 (batch 128 per DP rank, 2048 tokens in and
out): generate, the table and the JSON document, under a second. The replay plan's build on
8 MPI ranks is timed by `python benchmarks/moe_pattern.py` (it launches the ranks).

    python -m pytest -c benchmarks/pytest.ini benchmarks/bench_moe_pattern.py
"""

import pytest

from benchmarks.moe_pattern import full_pattern


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def bench_deepseek_v3_dp32_ep32(benchmark, engine):
    benchmark.group = "MoE pattern, deepseek-v3 dp=32 --ep"
    benchmark.extra_info.update(model="deepseek-v3", dp=32, ep=True, batch=128, prompt=2048,
                                decode=2048)
    benchmark.pedantic(full_pattern, args=(engine, 32, 128, 2048, 2048), rounds=5,
                       warmup_rounds=1)
