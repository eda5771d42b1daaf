"""A request workload over DP ranks: the pattern of 10,000 requests over DeepSeek-V3 at
--dp 8 --ep (vLLM V1: least-loaded routing, the ranks' lockstep and waves; SGLang DP
attention), in CPU seconds, beside the same workload on one replica (TP8) built by the
single-engine path.

    python benchmarks/dp_workload.py [--rounds 3]

The workload is the Poisson one of benchmarks/workload.py (rate 20/s, prompts 100..2000,
outputs 20..400 tokens, step time 25 ms): prompts above vLLM's 512-token capture size run
eager, so DP ranks run uneven steps (all-gatherv) in most of its 20,000 global steps. Goal:
the vLLM DP8-EP8 pattern in under 5 s of CPU (process time, median of the rounds). Prints
each figure, the ratio DP8 / TP8, then one JSON line; each build runs in a fresh process,
as a command makes it.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from patterns import EngineOptions, Layout, resolve_model  # noqa: E402
from patterns.engines.workloads import workload_pattern  # noqa: E402
from patterns.workload.requests import read_requests  # noqa: E402

POISSON = "poisson:rate=20,count=10000,prompt=100..2000,output=20..400,seed=1"
GOAL_S = 5.0


def build(engine: str, dp: int, tp: int) -> dict:
    """One build in this process, as `infercomm pattern` makes it: its CPU seconds."""
    requests = read_requests(POISSON)
    start = time.process_time()
    p = workload_pattern(engine, resolve_model("deepseek-v3"),
                         Layout(tp=tp, dp=dp, ep=dp > 1), requests, None, EngineOptions(),
                         0.025, source=POISSON)
    seconds = time.process_time() - start
    timeline = getattr(p, "timeline", None)
    return {"cpu_s": seconds, "requests": len(p.requests),
            "steps": timeline.steps if timeline else p.schedule.steps,
            "runs": len(timeline.segments) if timeline else len(p.schedule.segments),
            "waves": timeline.waves if timeline else 0,
            "tail": timeline.tail_steps if timeline else 0,
            "distinct": len({id(s) for steps in getattr(p, "rank_steps", ()) for s in steps})}


def cpu_seconds(engine: str, dp: int, tp: int, rounds: int) -> tuple[float, dict]:
    """The median over `rounds` fresh processes (a build's garbage collections depend on
    what else the process holds)."""
    runs = []
    for _ in range(rounds):
        out = subprocess.run([sys.executable, __file__, "--one", engine, str(dp), str(tp)],
                             capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    return statistics.median(r["cpu_s"] for r in runs), runs[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", nargs=3, metavar=("ENGINE", "DP", "TP"), default=None,
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        engine, dp, tp = args.one
        print(json.dumps(build(engine, int(dp), int(tp))))
        return 0
    vllm_dp, p = cpu_seconds("vllm", 8, 1, args.rounds)
    sglang_dp, q = cpu_seconds("sglang", 8, 1, args.rounds)
    single, one = cpu_seconds("vllm", 1, 8, args.rounds)
    print(f"DeepSeek-V3, {p['requests']:,} requests ({POISSON}), step time 25 ms; "
          f"median CPU seconds of {args.rounds} builds, each in a fresh process")
    print(f"  vllm   --dp 8 --ep: {vllm_dp:6.2f} s  {p['steps']:,} global steps in "
          f"{p['runs']:,} runs, {p['waves']} wave(s), {p['tail']} wave-tail steps, "
          f"{p['distinct']:,} distinct rank steps")
    print(f"  sglang --dp 8 --ep: {sglang_dp:6.2f} s  {q['steps']:,} global steps, "
          f"{q['distinct']:,} distinct rank steps")
    print(f"  vllm   --tp 8     : {single:6.2f} s  {one['steps']:,} steps (one replica)")
    verdict = "meets" if vllm_dp < GOAL_S else "misses"
    print(f"  vllm DP8 / TP8 = {vllm_dp / single:.2f}; {verdict} the goal of < {GOAL_S:g} s")
    print(json.dumps({"vllm_dp8_ep_cpu_s": round(vllm_dp, 3),
                      "sglang_dp8_ep_cpu_s": round(sglang_dp, 3),
                      "vllm_tp8_cpu_s": round(single, 3),
                      "ratio_dp8_tp8": round(vllm_dp / single, 3),
                      "global_steps": p["steps"], "goal_s": GOAL_S}, separators=(",", ":")))
    return 0 if vllm_dp < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
