"""MoE at scale: `pattern` for DeepSeek-V3 DP32-EP32 (batch 128 per DP rank, 2048 tokens in
and out) under a second, and the replay plan's build time on 8 local MPI ranks (DP8-EP8).

    python benchmarks/moe_pattern.py [--engine vllm] [--ranks 8]

Prints each figure, then as its last line one JSON object with all of them. The plan build
(groups of every kind, buffers, bound calls) uses a small prompt and batch so that 8 ranks'
buffers fit in a laptop's memory: group creation and binding do not grow with them.
"""

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from microbench.views.pattern import pattern_document, pattern_table  # noqa: E402
from patterns import EngineOptions, Layout, Workload, generate, resolve_model  # noqa: E402


def median_seconds(fn, repeat: int = 5) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def full_pattern(engine: str, dp: int, batch: int, prompt: int, decode: int) -> int:
    """What `infercomm pattern` does: generate, then the table and the JSON document."""
    pattern = generate(engine, resolve_model("deepseek-v3"), Layout(dp=dp, ep=True),
                       Workload(prompt, decode, batch), EngineOptions())
    pattern_table(pattern)
    pattern_document(pattern)
    return pattern.calls_per_inference(0)


def plan_rank(engine: str, out: str) -> None:
    """One of the ranks: time build_plan for DeepSeek-V3 DP-EP over MPI (host buffers)."""
    from microbench.backends import open_backend
    from microbench.ranks import dist
    from microbench.replay.plan import build_plan

    env = dist.detect()
    backend = open_backend("mpi", env=env, device="cpu")
    pattern = generate(engine, resolve_model("deepseek-v3"),
                       Layout(dp=env.world_size, ep=True), Workload(16, 64, 8),
                       EngineOptions())
    backend.barrier()
    start = time.perf_counter()
    plan = build_plan(pattern, backend)
    seconds = time.perf_counter() - start
    times = backend.allgather_object(seconds)
    if backend.rank == 0:
        Path(out).write_text(json.dumps({"seconds": max(times),
                                         "calls": plan.calls_per_inference}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", default="vllm")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--plan-rank", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plan_rank:
        plan_rank(args.engine, args.plan_rank)
        return
    print(f"machine: {platform.node()} {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}")
    calls = full_pattern(args.engine, 32, 128, 2048, 2048)
    seconds = median_seconds(lambda: full_pattern(args.engine, 32, 128, 2048, 2048))
    print(f"{args.engine} deepseek-v3 dp=32 --ep batch=128/rank prompt=2048 decode=2048: "
          f"{seconds * 1e3:.1f} ms (generate + table + JSON; {calls:,} calls per rank)")
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "plan.json")
        mpiexec = str(Path(sys.executable).parent / "mpiexec")
        start = time.perf_counter()
        subprocess.run([mpiexec, "-n", str(args.ranks), sys.executable, __file__, "--engine",
                        args.engine, "--plan-rank", out], check=True,
                       env={"OMP_NUM_THREADS": "1", "PATH": str(Path(sys.executable).parent)})
        launch = time.perf_counter() - start
        plan = json.loads(Path(out).read_text())
    print(f"replay plan build, deepseek-v3 dp={args.ranks} --ep on {args.ranks} MPI ranks "
          f"(prompt 16, decode 64, batch 8): {plan['seconds'] * 1e3:.1f} ms, slowest rank "
          f"({plan['calls']:,} calls bound; whole launch {launch:.1f} s)")
    print(json.dumps({"engine": args.engine, "pattern_dp32_ep32_seconds": seconds,
                      "calls_per_rank": calls, "plan_build_ranks": args.ranks,
                      "plan_build_seconds": plan["seconds"]}))


if __name__ == "__main__":
    main()
