"""Pattern generation time: flat in the output length Sd, and well under a second at scale.

    make bench
    python -m pytest -c benchmarks/pytest.ini benchmarks/bench_pattern_generation.py

What `infercomm pattern` does (generate, aggregate rows, compute the volume) for
llama-3.1-70b tp=4 pp=2 batch=8 prompt=512 at Sd from 2 to 130,560 (the model's 131,072
positions), and the large case llama-3.1-405b tp=8 pp=2 batch=16 prompt=2480 decode=2048.
After the table: Sd=130,560 / Sd=2 (flat means about 1). The engine is the CLI's default;
`BENCH_ENGINE=sglang make bench` picks another.
"""

import os

import pytest

from benchmarks.conftest import RATIOS, record
from patterns import Layout, Workload, generate, pattern_rows, resolve_model, volume_bytes
from patterns.engines import DEFAULT_ENGINE

ENGINE = os.environ.get("BENCH_ENGINE", DEFAULT_ENGINE)

GROUP = f"pattern generation ({ENGINE})"
DECODES = (2, 128, 2048, 65_536, 130_560)  # 512 + 130,560 = 131,072 positions
RATIOS[GROUP] = (f"Sd={DECODES[-1]}", f"Sd={DECODES[0]}", "flat in Sd means about 1")


def full_pattern(model: str, tp: int, pp: int, prompt: int, decode: int, batch: int) -> None:
    pattern = generate(ENGINE, resolve_model(model), Layout(tp=tp, pp=pp),
                       Workload(prompt, decode, batch))
    pattern_rows(pattern)
    volume_bytes(pattern)


@pytest.mark.parametrize("decode", DECODES, ids=[f"Sd={d}" for d in DECODES])
def bench_llama_70b_tp4_pp2(benchmark, decode):
    benchmark.group = GROUP
    benchmark.extra_info.update(model="llama-3.1-70b", tp=4, pp=2, batch=8, prompt=512,
                                decode=decode)
    benchmark(full_pattern, "llama-3.1-70b", 4, 2, 512, decode, 8)
    record(benchmark, GROUP, f"Sd={decode}")


def bench_llama_405b_tp8_pp2(benchmark):
    benchmark.group = GROUP + " at scale"
    benchmark(full_pattern, "llama-3.1-405b", 8, 2, 2480, 2048, 16)
