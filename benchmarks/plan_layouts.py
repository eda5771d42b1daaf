"""`infercomm plan` at any scale: every layout of Llama-3.1-405B on 1,024, 16,384 and 131,072
GPUs (8 a node, vLLM V1, prompt 2048, decode 256) from the shipped sweeps, each goal under
1 s; and DeepSeek-V3 on 64 GPUs (its dp x ep layouts beside tp x pp), decode 256 and 100,000.

    python benchmarks/plan_layouts.py [--before REV] [--sweep RUN --sweep-inter RUN]

Times what `plan` does after reading its sweeps (each layout's pattern, its simulation
through the stages, volume, memory, compute floors), the median of 3 runs, in wall and CPU
seconds (CPU is the fair figure on a shared machine: the VM's load moves the wall time, not
the work). With --before REV (default 88814ec, the code before issue 40's speed work) the
same is measured in a temporary git worktree of REV in the same run, and the ratio printed.
The last line is one JSON object.

Measured on the 2-core VM (2026-11-27, Python 3.11.7, load 20-30 from other work): before,
405B over 1,024 / 16,384 / 131,072 GPUs took 2.2 / 3.9 / 3.8 s wall (groups enumerated rank
by rank, 7.3 M rank_of calls at 16,384; dense replicas walked one by one; deep pipelines
simulated pp + 4 steps); after, 0.32-0.38 / 0.38-0.46 / 0.42-0.49 s of CPU.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = ROOT / "results" / "examples" / "plan-sweeps"
MODEL, SCALES, PER_NODE, DECODE = "llama-3.1-405b", (1024, 16384, 131072), 8, 256
MOE_MODEL, MOE_GPUS = "deepseek-v3", 64
BEFORE = "88814ec"

# What one measurement runs, in this tree or the worktree of --before: plan() of one model
# over every layout of N GPUs, 3 times; prints the median wall and CPU seconds as JSON.
TIMER = r'''
import json, statistics, sys, time
from microbench.analysis.fits import topology_from
from microbench.analysis.layouts import Budget, plan
from microbench.results.runs import load_run, sweep_table
from patterns import EngineOptions, Workload, generate, resolve_model
model_name, gpus, engine, decode, intra, inter = sys.argv[1:7]
model = resolve_model(model_name)
topology = topology_from(sweep_table(load_run(intra)), sweep_table(load_run(inter)), 8)
def make(layout):
    return generate(engine, model, layout, Workload(2048, int(decode)), EngineOptions())
walls, cpus, layouts = [], [], 0
for _ in range(3):
    w, c = time.perf_counter(), time.process_time()
    priced, _ = plan(model, int(gpus), make, topology, Budget())
    walls.append(time.perf_counter() - w)
    cpus.append(time.process_time() - c)
    layouts = len(priced)
print(json.dumps({"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus),
                  "layouts": layouts}))
'''


def measure(tree: Path, model: str, gpus: int, engine: str, decode: int,
            args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", TIMER, model, str(gpus), engine, str(decode),
                           args.sweep, args.sweep_inter], capture_output=True, text=True,
                          env=env, cwd=tree, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"plan_layouts: the timing run in {tree} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def before_tree(rev: str, keep: list) -> Path | None:
    if rev == "none":
        return None
    folder = tempfile.TemporaryDirectory(prefix="infercomm-before-")
    keep.append(folder)
    tree = Path(folder.name) / "tree"
    proc = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree),
                           rev], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"plan_layouts: no worktree of {rev}: {proc.stderr.strip()}")
    return tree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE,
                        help=f"the revision to compare with (default {BEFORE}; none: skip)")
    parser.add_argument("--sweep", default=str(next(SWEEPS.glob("*-intra-shm"))))
    parser.add_argument("--sweep-inter", default=str(next(SWEEPS.glob("*-inter-veth-1gbit"))))
    args = parser.parse_args()
    keep: list = []
    before = before_tree(args.before, keep)
    figures: dict[str, float] = {}
    try:
        cases = [(MODEL, g, "vllm", DECODE) for g in SCALES]
        cases += [(MOE_MODEL, MOE_GPUS, "vllm", d) for d in (256, 100_000)]
        for model, gpus, engine, decode in cases:
            name = f"{model}_{gpus}_d{decode}"
            after = measure(ROOT, model, gpus, engine, decode, args)
            figures[f"{name}_cpu_s"] = round(after["cpu_s"], 3)
            figures[f"{name}_wall_s"] = round(after["wall_s"], 3)
            line = (f"plan: {model} on {gpus:,} GPUs ({PER_NODE} a node), {engine}, decode "
                    f"{decode:,}: {after['layouts']} layouts in {after['wall_s']:.3f} s "
                    f"({after['cpu_s']:.3f} s of CPU)")
            if before is not None:
                old = measure(before, model, gpus, engine, decode, args)
                figures[f"{name}_before_cpu_s"] = round(old["cpu_s"], 3)
                line += (f"; before ({args.before}) {old['wall_s']:.3f} s ({old['cpu_s']:.3f} s "
                         f"of CPU): {old['cpu_s'] / after['cpu_s']:.1f}x the CPU")
            print(line)
    finally:
        if before is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(before)], capture_output=True, check=False)
    worst = max(figures[f"{MODEL}_{g}_d{DECODE}_cpu_s"] for g in SCALES)
    print(json.dumps({"benchmark": "plan_layouts", "model": MODEL, "scales": SCALES,
                      "python": platform.python_version(), "load": round(os.getloadavg()[0], 1),
                      **figures, "goal_s": 1.0, "met": worst < 1.0,
                      "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}))
    return 0 if worst < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
