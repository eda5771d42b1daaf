"""Request workloads: what building their patterns costs, and what replaying one adds.

    python benchmarks/workload.py                 (generation, then replay under mpiexec -n 2)
    python benchmarks/workload.py --generation    (the generation part only, one process)

Generation (one process): the pattern of Llama-3.1-8B at TP8 under vLLM V1 (default token
budget 8192, max_num_seqs 1024, step time 25 ms) for
- a 10,000-request Poisson workload (rate 20/s, prompts 100..2000, outputs 20..400 tokens),
- a 1,000-line trace file (an Azure-format CSV written here with the same generator),
- and, to show the cost is flat in identical steps, 10,000 identical requests at 0 against
  1,000 of them;
each built ROUNDS times: median wall time, and peak Python memory (tracemalloc) of one build.

Replay overhead (2 ranks over MPI, the mpich wheel): a workload pattern (Llama-3.2-1B TP2, a
40-request Poisson workload of short prompts) bound by the replay plan, then issued by the
Replayer (step timing) or by a bare loop written here against mpi4py with the same buffers,
datatypes and reduction and a clock read per step. Rounds alternate; the ratio of medians of
the slowest rank, replay / bare, is printed (goal <= 1.05).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROUNDS = 3
GOAL = 1.05
REPLAY_ROUNDS, REPLAY_WARMUP = 20, 3
POISSON = "poisson:rate=20,count=10000,prompt=100..2000,output=20..400,seed=1"


def build(source: str, model: str = "llama-3.1-8b", tp: int = 8,
          step_time_s: float | None = 0.025):
    from patterns import EngineOptions, Layout, resolve_model
    from patterns.engines.workloads import workload_pattern
    from patterns.workload.requests import read_requests
    return workload_pattern("vllm", resolve_model(model), Layout(tp=tp),
                            read_requests(source), None, EngineOptions(), step_time_s,
                            source=source)


def azure_trace(folder: Path, lines: int) -> Path:
    from patterns.workload.requests import poisson
    start = 1_700_000_000.0
    path = folder / "trace.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for r in poisson(f"poisson:rate=20,count={lines},prompt=100..2000,output=20..400,seed=2"):
        t = time.gmtime(start + r.arrival_s)
        frac = f"{(start + r.arrival_s) % 1:.7f}"[2:]
        rows.append(f"{time.strftime('%Y-%m-%d %H:%M:%S', t)}.{frac},{r.prompt},{r.output}")
    path.write_text("\n".join(rows) + "\n")
    return path


def measure(name: str, make) -> dict:
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        p = make()
        times.append(time.perf_counter() - start)
    tracemalloc.start()
    make()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    s = p.schedule
    return {"case": name, "requests": len(s.spans), "steps": s.steps,
            "segments": len(s.segments), "seconds": round(statistics.median(times), 3),
            "peak_mib": round(peak / 2**20, 1)}


def generation() -> list[dict]:
    from patterns import EngineOptions, Layout, resolve_model
    from patterns.engines.workloads import workload_pattern
    from patterns.workload.requests import Request

    def identical(n: int):
        return lambda: workload_pattern("vllm", resolve_model("llama-3.1-8b"), Layout(tp=8),
                                        [Request(0.0, 512, 256)] * n, None, EngineOptions(),
                                        None)

    with tempfile.TemporaryDirectory() as tmp:
        trace = str(azure_trace(Path(tmp), 1000))
        rows = [measure("poisson 10,000 requests", lambda: build(POISSON)),
                measure("Azure-format trace, 1,000 lines", lambda: build(trace)),
                measure("1,000 identical requests", identical(1000)),
                measure("10,000 identical requests", identical(10000))]
    print("pattern generation, vLLM V1, Llama-3.1-8B TP8 (median of "
          f"{ROUNDS} builds; peak = tracemalloc of one build)")
    for r in rows:
        print(f"  {r['case']:<34} {r['requests']:>6} requests {r['steps']:>7} steps in "
              f"{r['segments']:>6} runs: {r['seconds']:7.3f} s, peak {r['peak_mib']:7.1f} MiB")
    return rows


class Bare:
    """The same calls as the plan's, in the same order, straight through mpi4py."""

    def __init__(self, plan, backend):
        from mpi4py import MPI
        self.backend, self.steps = backend, []
        for run in plan.runs:
            calls = []
            for b in run.ops:
                comm = b.group.handle
                dtype = backend.types.mpi_type(b.op.dtype)
                if b.op.kind == "allreduce":
                    calls.append((comm.Allreduce, (MPI.IN_PLACE, [b.send.host, dtype],
                                                   backend.types.sum_op(b.op.dtype))))
                elif b.op.kind == "allgather":
                    calls.append((comm.Allgather, ([b.send.host, dtype],
                                                   [b.recv.host, dtype])))
                else:
                    raise SystemExit(f"the bare loop has no {b.op.kind}")
            self.steps.append((calls, run.repeat))
        self.marks = [0] * (plan.steps_per_inference + 1)

    def round(self) -> float:
        self.backend.barrier()
        marks, i = self.marks, 1
        start = marks[0] = time.perf_counter_ns()
        for calls, repeat in self.steps:
            for _ in range(repeat):
                for fn, args in calls:
                    fn(*args)
                marks[i] = time.perf_counter_ns()
                i += 1
        return (marks[-1] - start) / 1e3


def replay_overhead() -> None:
    import numpy as np
    from mpi4py import MPI

    from microbench.backends import open_backend
    from microbench.ranks import dist
    from microbench.ranks.watchdog import Watchdog
    from microbench.replay.plan import build_plan
    from microbench.replay.replayer import Replayer

    pattern = build("poisson:rate=100,count=40,prompt=8..64,output=4..24,seed=5",
                    model="llama-3.2-1b", tp=2, step_time_s=0.01)
    env = dist.detect()
    watchdog = Watchdog(600, env.rank).start()
    backend = open_backend("mpi", env=env, device="cpu", timeout=600)
    plan = build_plan(pattern, backend)
    replayer = Replayer(plan, backend, "step", watchdog)
    bare = Bare(plan, backend)

    def replay_round() -> float:
        marks = replayer.inference()
        return float(marks[-1])

    times = {"replay": [], "bare": []}
    for i in range(REPLAY_WARMUP + REPLAY_ROUNDS):
        order = (("bare", bare.round), ("replay", replay_round)) if i % 2 else (
            ("replay", replay_round), ("bare", bare.round))
        for way, issue in order:
            slowest = MPI.COMM_WORLD.allreduce(issue(), op=MPI.MAX)
            if i >= REPLAY_WARMUP:
                times[way].append(slowest)
    watchdog.stop()
    if backend.rank == 0:
        med = {w: float(np.median(v)) for w, v in times.items()}
        ratio = med["replay"] / med["bare"]
        s = pattern.schedule
        print(f"replay overhead, MPI, 2 ranks: {len(s.spans)} requests, {s.steps} steps "
              f"({len(s.segments)} runs), {plan.calls_per_inference} calls a round; "
              f"{REPLAY_ROUNDS} rounds a way, alternating; median of the slowest rank")
        verdict = "meets" if ratio <= GOAL else "misses"
        print(f"  replay {med['replay']:10.1f} us  bare {med['bare']:10.1f} us  ratio "
              f"{ratio:.3f} ({verdict} goal <= {GOAL})")
        print(json.dumps({"replay_us": round(med["replay"], 1),
                          "bare_us": round(med["bare"], 1), "ratio": round(ratio, 3)},
                         separators=(",", ":")))


if __name__ == "__main__":
    under_mpi = "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ
    if under_mpi:
        replay_overhead()
        sys.exit(0)
    rows = generation()
    print(json.dumps(rows, separators=(",", ":")))
    if "--generation" not in sys.argv:
        mpiexec = Path(sys.executable).parent / "mpiexec"
        sys.exit(subprocess.call([str(mpiexec), "-n", "2", sys.executable, __file__],
                                 env={**os.environ, "OMP_NUM_THREADS": "1"}))
