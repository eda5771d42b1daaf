"""`infercomm plan` at scale: every layout of Llama-3.1-405B on 1024 GPUs, goal under 5 s;
and of the MoE DeepSeek-V3 on 64 GPUs (8 per node, vLLM V1: dp x ep layouts beside tp x pp).

    python benchmarks/plan_layouts.py [--sweep SWEEP_RUN] [--sweep-inter SWEEP_RUN]

Times what `plan` does after reading its sweeps (generate each layout's pattern, simulate it
through its stages, its volume), for decode 256 and decode 100,000: patterns are run-length
encoded and the simulation extrapolates each run once the pipeline is steady, so the time
must not grow with the decode length. Prints the time, the time per layout against one
`generate` call of the largest layout, and as its last line one JSON object.

Without --sweep, synthetic fits (alpha 10 us, 100 GB/s within a node; 30 us, 25 GB/s across)
stand in: the time of planning does not depend on the figures fitted.
"""

import argparse
import json
import platform
import statistics
import sys
import time

from microbench.analysis.fits import Topology, fit_points, topology_from
from microbench.analysis.layouts import Budget, plan, valid_layouts
from microbench.results.runs import load_run, sweep_table
from microbench.sweep.busbw import SweepOp
from patterns import EngineOptions, Layout, ModelConfig, Workload, generate, resolve_model

MODEL, GPUS, PER_NODE, PROMPT, GOAL_S = "llama-3.1-405b", 1024, 8, 2048, 5.0
MOE_MODEL, MOE_GPUS, MOE_ENGINE = "deepseek-v3", 64, "vllm"
SIZES = [8 * 4 ** k for k in range(13)]


def synthetic(alpha: float, gbps: float) -> dict:
    return {(op.value, 2): fit_points(op.value, 2, SIZES, [alpha + s / (gbps * 1e3)
                                                            for s in SIZES])
            for op in SweepOp}


def topology(args: argparse.Namespace) -> Topology:
    if args.sweep is None:
        return Topology(synthetic(10.0, 100.0), synthetic(30.0, 25.0), PER_NODE)
    inter = sweep_table(load_run(args.sweep_inter)) if args.sweep_inter else None
    return topology_from(sweep_table(load_run(args.sweep)), inter, PER_NODE)


def plan_seconds(args: argparse.Namespace, model: ModelConfig, gpus: int, engine: str,
                 decode: int) -> float:
    """Median of 3 `plan` runs over every layout of `gpus` ranks."""
    workload = Workload(PROMPT, decode)

    def make(layout: Layout):
        return generate(engine, model, layout, workload, EngineOptions())

    runs = []
    for _ in range(3):
        start = time.perf_counter()
        plan(model, gpus, make, topology(args), Budget())
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", default=None)
    parser.add_argument("--sweep-inter", default=None)
    args = parser.parse_args()
    model = resolve_model(MODEL)
    layouts, _ = valid_layouts(model, GPUS)
    figures: dict[str, float] = {}
    for decode in (256, 100_000):
        figures[f"plan_s_decode_{decode}"] = plan_seconds(args, model, GPUS, "vllm-v0", decode)
    widest = max(layouts, key=lambda s: s.pp)
    gen = []
    for _ in range(5):
        start = time.perf_counter()
        generate("vllm-v0", model, Layout(tp=widest.tp, pp=widest.pp, dp=widest.dp),
                 Workload(PROMPT, 256))
        gen.append(time.perf_counter() - start)
    figures["generate_s"] = statistics.median(gen)
    per_layout = figures["plan_s_decode_256"] / len(layouts)
    print(f"plan: {MODEL} on {GPUS} GPUs ({PER_NODE} per node), prompt {PROMPT}: "
          f"{len(layouts)} valid layouts "
          f"({', '.join(f'dp{s.dp}tp{s.tp}pp{s.pp}' for s in layouts)})")
    for decode in (256, 100_000):
        print(f"  decode {decode:>7,}: {figures[f'plan_s_decode_{decode}']:.3f} s "
              f"(goal < {GOAL_S:.0f} s)")
    print(f"  per layout {per_layout * 1e3:.1f} ms = {per_layout / figures['generate_s']:.1f} "
          f"x one generate call of tp{widest.tp}pp{widest.pp} "
          f"({figures['generate_s'] * 1e3:.1f} ms)")
    moe = resolve_model(MOE_MODEL)
    moe_layouts, _ = valid_layouts(moe, MOE_GPUS)
    for decode in (256, 100_000):
        figures[f"moe_plan_s_decode_{decode}"] = plan_seconds(args, moe, MOE_GPUS, MOE_ENGINE,
                                                              decode)
    print(f"plan: {MOE_MODEL} on {MOE_GPUS} GPUs ({PER_NODE} per node), engine {MOE_ENGINE}, "
          f"prompt {PROMPT}: {len(moe_layouts)} valid layouts, "
          f"{sum(s.dp > 1 for s in moe_layouts)} with dp > 1")
    for decode in (256, 100_000):
        print(f"  decode {decode:>7,}: {figures[f'moe_plan_s_decode_{decode}']:.3f} s "
              f"(goal < {GOAL_S:.0f} s)")
    worst = max(figures[f"{m}plan_s_decode_{d}"] for d in (256, 100_000) for m in ("", "moe_"))
    print(json.dumps({"benchmark": "plan_layouts", "model": MODEL, "gpus": GPUS,
                      "layouts": len(layouts), "moe_model": MOE_MODEL, "moe_gpus": MOE_GPUS,
                      "moe_layouts": len(moe_layouts), "python": platform.python_version(),
                      **{k: round(v, 4) for k, v in figures.items()},
                      "per_layout_over_generate": round(per_layout / figures["generate_s"], 2),
                      "goal_s": GOAL_S, "met": worst < GOAL_S}))
    return 0 if worst < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
