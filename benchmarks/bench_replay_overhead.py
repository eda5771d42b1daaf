"""What the replay harness adds: infercomm's replay vs a bare loop of exactly the same calls.

    make bench     (or: mpiexec -n 2 python -m pytest -c benchmarks/pytest.ini
                    benchmarks/bench_replay_overhead.py; both ranks run pytest)

Pattern: Llama-3.1-8B, TP2, prompt 128, decode 128 (vllm-v0): a decode step is 65
allreduces of [1,4096] bf16 and one gather of [1,64128] to TP rank 0. One round is the 127
decode steps of one inference, issued over MPI (mpi4py, the mpich wheel) and over gloo
(torch.distributed), either by infercomm's Replayer (step timing, on the plan's decode runs)
or by a bare loop calling the library directly with the same buffers, datatypes and
reduction and a clock read per step. Each round starts with a barrier, as a replayed
inference does. Rounds alternate (a bare round before each timed replay round and the
other way round, in pytest-benchmark's untimed setup) so that drift on a noisy machine hits
both alike; the ratio printed after pytest-benchmark's table pools every round of both
ways, each timed with the same clock: replay / bare per library (goal <= 1.05). Both ranks
run the same rounds in the same order; rank 0's times are reported (the collectives hold
the ranks together).
"""

import os
import time
from dataclasses import replace

import pytest

from benchmarks.conftest import MEDIANS, RATIOS, rank

PATTERN = dict(model="llama-3.1-8b", tp=2, prompt=128, decode=128)
# Rounds (timed) and warm-up rounds per library: one gloo round is several seconds here.
ROUNDS = {"mpi": (10, 1), "torch": (3, 1)}
GOAL = "goal <= 1.05"

if "PMI_RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ:
    pytest.skip("needs 2 ranks: mpiexec -n 2 python -m pytest -c benchmarks/pytest.ini "
                "benchmarks/bench_replay_overhead.py (make bench does)",
                allow_module_level=True)


class Loops:
    """One library's backend, the pattern's decode plan, and the two ways to issue it."""

    def __init__(self, name: str):
        from microbench.backends import open_backend
        from microbench.ranks import dist
        from microbench.ranks.watchdog import Watchdog
        from microbench.replay.plan import build_plan
        from microbench.replay.replayer import Replayer
        from patterns import Layout, Workload, generate, resolve_model

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29611")
        env = dist.detect()
        pattern = generate("vllm-v0", resolve_model(PATTERN["model"]),
                           Layout(tp=PATTERN["tp"]),
                           Workload(PATTERN["prompt"], PATTERN["decode"]))
        self.watchdog = Watchdog(600, env.rank).start()
        self.backend = open_backend(name, env=env, device="cpu", timeout=600)
        plan = build_plan(pattern, self.backend)
        self.steps = pattern.workload.decode_steps
        self.decode_ops = [op for run in plan.runs if run.phase == "decode" for op in run.ops]
        # The Replayer on the decode runs only: a round is the decode of one inference.
        decode_plan = replace(plan, runs=[r for r in plan.runs if r.phase == "decode"])
        self.replayer = Replayer(decode_plan, self.backend, "step", self.watchdog)
        self.bare = self._bare_loop()

    def replay(self) -> None:
        self.replayer.inference()  # barrier, then the decode steps with a mark per step

    def _bare_loop(self):
        decode_ops, steps, backend = self.decode_ops, self.steps, self.backend
        allreduce_buf = next(op.send for op in decode_ops if op.op.kind == "allreduce")
        gather = next(op for op in decode_ops if op.op.kind == "gather")
        n_allreduce = sum(op.op.kind == "allreduce" for op in decode_ops)
        marks = [0] * (steps + 1)
        if backend.name == "mpi":
            from mpi4py import MPI

            comm = gather.group.handle
            spec = [allreduce_buf.host, backend.types.mpi_type("bf16")]
            op = backend.types.sum_op("bf16")
            send = [gather.send.host, backend.types.mpi_type("bf16")]
            recv = [gather.recv.host, backend.types.mpi_type("bf16")] if gather.recv else None

            def loop() -> None:
                backend.barrier()
                marks[0] = time.perf_counter_ns()
                for s in range(steps):
                    for _ in range(n_allreduce):
                        comm.Allreduce(MPI.IN_PLACE, spec, op)
                    comm.Gather(send, recv, root=0)
                    marks[s + 1] = time.perf_counter_ns()
        else:
            import torch.distributed as tdist

            pg = gather.group.handle
            slices = (list(gather.recv.view(2, -1).unbind(0)) if gather.recv is not None
                      else None)

            def loop() -> None:
                backend.barrier()
                marks[0] = time.perf_counter_ns()
                for s in range(steps):
                    for _ in range(n_allreduce):
                        tdist.all_reduce(allreduce_buf, group=pg)
                    tdist.gather(gather.send, slices, dst=0, group=pg)
                    marks[s + 1] = time.perf_counter_ns()
        return loop

    def close(self) -> None:
        self.watchdog.stop()


@pytest.fixture(scope="module", params=list(ROUNDS))
def loops(request):
    made = Loops(request.param)
    yield request.param, made
    made.close()


# (library, way) -> seconds of every timed round of that way, from both benchmarks.
SAMPLES: dict[tuple[str, str], list[float]] = {}


def _timed(fn, into: list[float]):
    def run() -> None:
        start = time.perf_counter()
        fn()
        into.append(time.perf_counter() - start)
    return run


def _bench(benchmark, loops, way: str) -> None:
    import statistics

    name, made = loops
    group = f"replay overhead {name} ({made.backend.transport}), decode of one inference"
    RATIOS[group] = ("replay", "bare", GOAL + "; rounds of both ways pooled")
    rounds, warmup = ROUNDS[name]
    other = "bare" if way == "replay" else "replay"
    ways = {"replay": made.replay, "bare": made.bare}
    timed: list[float] = []
    untimed: list[float] = []
    benchmark.group = group
    benchmark.name = way
    # The other way runs before each round, untimed by pytest-benchmark but by the same clock.
    benchmark.pedantic(_timed(ways[way], timed), setup=_timed(ways[other], untimed),
                       rounds=rounds, warmup_rounds=warmup, iterations=1)
    SAMPLES.setdefault((name, way), []).extend(timed[warmup:])
    SAMPLES.setdefault((name, other), []).extend(untimed[warmup:])
    for w in ways:
        if SAMPLES.get((name, w)):
            MEDIANS[(group, w)] = statistics.median(SAMPLES[(name, w)])
    median = float(benchmark.stats.stats.median)
    benchmark.extra_info.update(backend=name, transport=made.backend.transport, rank=rank(),
                                steps=made.steps, decode_step_us=median * 1e6 / made.steps)


def bench_replay(benchmark, loops):
    _bench(benchmark, loops, "replay")


def bench_bare(benchmark, loops):
    _bench(benchmark, loops, "bare")
