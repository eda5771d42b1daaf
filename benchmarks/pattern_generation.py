"""Pattern generation time: flat in the output length Sd, and well under a second at scale.

    python benchmarks/pattern_generation.py

Prints the median generation time per Sd and the ratio of the longest to the shortest, then
the time of the issue's large case, and as its last line one JSON object with the figures.
"""

import json
import platform
import statistics
import time

from patterns import Layout, Workload, generate, pattern_rows, resolve_model, volume_bytes


def median_seconds(fn, repeat: int = 7) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def full_pattern(model: str, tp: int, pp: int, prompt: int, decode: int, batch: int) -> None:
    """What `infercomm pattern` does: generate, aggregate rows, compute the volume."""
    pattern = generate("vllm-v0", resolve_model(model), Layout(tp=tp, pp=pp),
                       Workload(prompt, decode, batch))
    pattern_rows(pattern)
    volume_bytes(pattern)


def main() -> None:
    print(f"machine: {platform.node()} {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}")
    print("llama-3.1-70b tp=4 pp=2 batch=8 prompt=512: generate + rows + volume")
    times = {}
    for decode in (2, 128, 2048, 65_536, 130_560):
        times[decode] = median_seconds(lambda d=decode: full_pattern(
            "llama-3.1-70b", 4, 2, 512, d, 8))
        print(f"  Sd={decode:>9,}  {times[decode] * 1e3:8.2f} ms")
    ratio = times[130_560] / times[2]
    # 130,560 = max_position_embeddings 131,072 - prompt 512, the longest the model takes
    print(f"  Sd=130,560 vs Sd=2: {ratio:.2f}x (flat means about 1)")
    big = median_seconds(lambda: full_pattern("llama-3.1-405b", 8, 2, 2480, 2048, 16))
    print(f"llama-3.1-405b tp=8 pp=2 batch=16 prompt=2480 decode=2048: {big * 1e3:.2f} ms")
    print(json.dumps({"seconds_by_decode": {str(k): v for k, v in times.items()},
                      "flat_ratio": ratio, "llama_405b_tp8_pp2_seconds": big}))


if __name__ == "__main__":
    main()
