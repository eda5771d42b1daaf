"""What the replay harness adds: infercomm's replay vs a bare loop of exactly the same calls.

    python benchmarks/replay_overhead.py --backend mpi      # 2 ranks under the wheel's mpiexec
    python benchmarks/replay_overhead.py --backend torch    # 2 ranks, gloo

Pattern: Llama-3.1-8B, TP2, prompt 128, decode 128 (vllm-v0): a decode step is 65
allreduces of [1,4096] bf16 and one gather of [1,64128] to TP rank 0. Both loops use the same
buffers, datatypes and reduction; the bare loop calls the library directly, step after step,
with a clock read per step like the replay's step level. Runs alternate (replay, bare, ...)
so that drift on a noisy machine hits both alike. Prints the median decode-step time of each
and their ratio (goal: replay / bare <= 1.05), then one JSON line.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PATTERN = dict(model="llama-3.1-8b", tp=2, prompt=128, decode=128)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("mpi", "torch"), default="mpi")
    parser.add_argument("-n", "--rounds", type=int, default=10,
                        help="alternating rounds; each times one inference of each loop")
    parser.add_argument("-w", "--warmup", type=int, default=2)
    return parser.parse_args()


def launch(args: argparse.Namespace) -> int:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29611"}
    return subprocess.call([str(mpiexec), "-n", "2", sys.executable, __file__, *sys.argv[1:]],
                           env=env)


def bare_steps(backend: object, plan: object, steps: int) -> list[float]:
    """The decode steps as a plain loop over the library, no harness objects in between."""
    decode_ops = [op for run in plan.runs if run.phase == "decode" for op in run.ops]
    allreduce_buf = next(op.send for op in decode_ops if op.op.kind == "allreduce")
    gather = next(op for op in decode_ops if op.op.kind == "gather")
    n_allreduce = sum(op.op.kind == "allreduce" for op in decode_ops)
    times = []
    if backend.name == "mpi":
        from mpi4py import MPI
        comm = gather.group.handle
        spec = [allreduce_buf.host, backend.types.mpi_type("bf16")]
        op = backend.types.sum_op("bf16")
        send = [gather.send.host, backend.types.mpi_type("bf16")]
        recv = [gather.recv.host, backend.types.mpi_type("bf16")] if gather.recv else None
        for _ in range(steps):
            t0 = time.perf_counter_ns()
            for _ in range(n_allreduce):
                comm.Allreduce(MPI.IN_PLACE, spec, op)
            comm.Gather(send, recv, root=0)
            times.append((time.perf_counter_ns() - t0) / 1e3)
    else:
        import torch.distributed as dist
        pg = gather.group.handle
        slices = list(gather.recv.view(2, -1).unbind(0)) if gather.recv is not None else None
        for _ in range(steps):
            t0 = time.perf_counter_ns()
            for _ in range(n_allreduce):
                dist.all_reduce(allreduce_buf, group=pg)
            dist.gather(gather.send, slices, dst=0, group=pg)
            times.append((time.perf_counter_ns() - t0) / 1e3)
    return times


def rank_main(args: argparse.Namespace) -> None:
    from microbench.backends import open_backend
    from microbench.ranks import dist
    from microbench.ranks.watchdog import Watchdog
    from microbench.replay.plan import build_plan
    from microbench.replay.replayer import Replayer
    from patterns import Layout, Workload, generate, resolve_model

    env = dist.detect()
    pattern = generate("vllm-v0", resolve_model(PATTERN["model"]), Layout(tp=PATTERN["tp"]),
                       Workload(PATTERN["prompt"], PATTERN["decode"]))
    watchdog = Watchdog(300, env.rank).start()  # before the backend: it spawns a sentinel
    backend = open_backend(args.backend, env=env, device="cpu", timeout=300)
    plan = build_plan(pattern, backend)
    replayer = Replayer(plan, backend, "step", watchdog)
    decode_steps = pattern.workload.decode_steps
    replay, bare = [], []
    for i in range(args.warmup + args.rounds):
        marks = replayer.inference()
        steps = np.diff(marks)[plan.prefill_steps:]
        backend.barrier()
        bare_times = bare_steps(backend, plan, decode_steps)
        if i >= args.warmup:
            replay.extend(steps.tolist())
            bare.extend(bare_times)
    gathered = backend.allgather_object((replay, bare))
    watchdog.stop()
    if backend.rank != 0:
        return
    # The figure of a step is its slowest rank's, as in the replay's results.
    replay_max = np.max([np.array(r) for r, _ in gathered], axis=0)
    bare_max = np.max([np.array(b) for _, b in gathered], axis=0)
    r_med, b_med = float(np.median(replay_max)), float(np.median(bare_max))
    ratio = r_med / b_med
    print(f"machine: {platform.node()} ({os.cpu_count()} cpus), backend {backend.name} "
          f"({backend.transport}), 2 ranks")
    print(f"pattern: {PATTERN['model']} tp=2 prompt=128 decode=128; decode step = 65 "
          f"allreduce [1,4096] bf16 + gather [1,64128]")
    print(f"{args.rounds} rounds x {decode_steps} decode steps each")
    print(f"  replay decode step  median {r_med:10.1f} us")
    print(f"  bare loop           median {b_med:10.1f} us")
    print(f"  ratio replay / bare        {ratio:10.3f}   (goal <= 1.05)")
    print(json.dumps({"backend": backend.name, "transport": backend.transport,
                      "replay_decode_step_us": r_med, "bare_decode_step_us": b_med,
                      "ratio": ratio, "rounds": args.rounds, "steps": decode_steps}))


if __name__ == "__main__":
    arguments = parse()
    if "PMI_RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ:
        sys.exit(launch(arguments))
    rank_main(arguments)
