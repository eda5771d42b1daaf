"""What infercomm's replay adds on a GPU: NCCL calls in a bare loop vs the replay, eager and
with CUDA graphs, for the decode messages of Llama-3.1-8B.

    python benchmarks/gpu_overhead.py                        # world size 1 on one GPU
    torchrun --nproc-per-node 4 benchmarks/gpu_overhead.py   # any world size, one GPU a rank
    srun -N 1 --ntasks-per-node 4 --gpus-per-node 4 --gpu-bind=none \\
        python benchmarks/gpu_overhead.py

Every task must see all its node's GPUs: under `srun --gpus-per-task=1` each sees its own
only, NCCL cannot find the NVLink between them and falls back to PCIe or shared memory
(NVIDIA/nccl#1066), and the figures are not the node's (a warning says so).

Cases (bf16): allreduce [B,4096] for B in 1, 2, 4, ..., 64 (a decode step's TP allreduces);
gather [1,64128] to rank 0 (TP2's logits slice); allgather of a [2048] slice (a TP2xPP2
decode step's re-assembly); send/recv of [2048] (its PP hop; from world size 2, pairs
0->1, 2->3, ...). Every case runs over all ranks. Libraries: NCCL through torch.distributed
(--backend torch) and through CuPy (the nccl backend), each timed four ways, per call, with
CUDA events on the library's stream around `--steps` steps of `--calls` calls:

  bare          the library call in a plain Python loop
  bare graph    that step captured once in a CUDA graph and launched per step
  replay        infercomm's Replayer (inference timing) issuing the same calls eagerly
  replay graph  the Replayer with --graph decode

Goal: replay / bare and replay graph / bare graph both <= 1.05; graph / bare shows what
capture saves. send/recv over torch has no graph ways (null in the JSON): ProcessGroupNCCL
returns no Work for a captured send or receive, so `dist.send` fails on `.wait()` of None
(pytorch/pytorch#133984, torch 2.3-2.6), and the replay keeps P2P out of its graphs anyway.
Rounds alternate the four ways so that drift hits all alike; each figure is the median
over rounds of the slowest rank's. Prints a table and one JSON line; writes a file only with
--out.
"""

import argparse
import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from microbench.ranks import dist
from microbench.ranks.dist import DistEnv

WAYS = ("bare", "bare_graph", "replay", "replay_graph")
GOAL = 1.05
HIDDEN, VOCAB_SLICE, PP_SLICE = 4096, 64128, 2048


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="torch,nccl",
                        help="comma-separated: torch, nccl (default both; nccl needs CuPy)")
    parser.add_argument("-n", "--rounds", type=int, default=10, help="timed rounds (10)")
    parser.add_argument("-w", "--warmup", type=int, default=2, help="warm-up rounds (2)")
    parser.add_argument("--steps", type=int, default=20, help="steps per sample (20)")
    parser.add_argument("--calls", type=int, default=64,
                        help="calls per step (64: a decode step has ~65 TP allreduces)")
    parser.add_argument("--out", default=None, help="also write the JSON document here")
    return parser.parse_args()


def cases(world: int) -> list[tuple[str, str, int]]:
    """(label, kind, input elements) at this world size."""
    out = [(f"allreduce [{b},{HIDDEN}]", "allreduce", b * HIDDEN) for b in (1, 2, 4, 8, 16,
                                                                          32, 64)]
    out.append((f"gather [1,{VOCAB_SLICE}]", "gather", VOCAB_SLICE))
    out.append((f"allgather [{PP_SLICE}]", "allgather", PP_SLICE))
    if world >= 2 and world % 2 == 0:
        out.append((f"send/recv [{PP_SLICE}]", "sendrecv", PP_SLICE))
    return out


def bind(backend, group, kind: str, numel: int) -> tuple[object, object, tuple]:
    """(our bound call, a bare call of the library, the buffers) for one case on this rank:
    the caller keeps the buffers for as long as the calls and graphs live (a bound nccl call
    holds raw pointers only, and CuPy's pool hands a freed block out again)."""
    send = backend.empty(numel, "bf16")
    recv, target = None, 0
    if kind == "allgather" or (kind == "gather" and group.index == 0):
        recv = backend.empty(numel * group.size, "bf16")
    if kind == "sendrecv":
        kind = "send" if backend.rank % 2 == 0 else "recv"
        target = backend.rank + 1 if kind == "send" else backend.rank - 1
        send, recv = (send, None) if kind == "send" else (None, send)
    ours = backend.bind(kind, group, send, recv, target)
    return ours, bare_call(backend, group, kind, send, recv, target), (send, recv)


def bare_call(backend, group, kind: str, send, recv, target: int):
    """The library call itself, written out as a user of the library would."""
    if backend.name == "torch":
        import torch.distributed as tdist

        from microbench.backends.torch_backend import _ALL_GATHER
        pg = group.handle
        calls = {
            "allreduce": lambda: tdist.all_reduce(send, group=pg),
            "allgather": lambda: _ALL_GATHER(recv, send, group=pg),
            "send": lambda: tdist.send(send, dst=target, group=pg),
            "recv": lambda: tdist.recv(recv, src=target, group=pg),
        }
        if kind == "gather":
            slices = list(recv.view(group.size, -1).unbind(0)) if recv is not None else None
            return lambda: tdist.gather(send, slices, dst=0, group=pg)
        return calls[kind]
    from cupy.cuda import nccl
    comm, s = group.handle, backend.stream.ptr
    dt = nccl.NCCL_BFLOAT16
    if kind == "allreduce":
        return lambda: comm.allReduce(send.ptr, send.ptr, send.numel, dt, nccl.NCCL_SUM, s)
    if kind == "allgather":
        return lambda: comm.allGather(send.ptr, recv.ptr, send.numel, dt, s)
    if kind == "send":
        return lambda: comm.send(send.ptr, send.numel, dt, target, s)
    if kind == "recv":
        return lambda: comm.recv(recv.ptr, recv.numel, dt, target, s)
    return backend.bind("gather", group, send, recv, 0)  # grouped send/recv + own copy


class Case:
    """One case on one library: the four ways, ready to time."""

    def __init__(self, backend, group, kind: str, numel: int, args, watchdog) -> None:
        from microbench.replay.graphs import capture_function
        from microbench.replay.plan import BoundOp, BoundRun, Plan
        from microbench.replay.replayer import Replayer
        from microbench.replay.timing import make_marks
        from patterns import Phase

        self.backend, self.steps, self.calls = backend, args.steps, args.calls
        ours, bare, self.buffers = bind(backend, group, kind, numel)
        self.bare = [bare] * args.calls
        # no torch P2P in a graph: ProcessGroupNCCL gives no Work under capture (#133984)
        self.graphs = not (kind == "sendrecv" and backend.name == "torch")
        capture = capture_function(backend)
        self.bare_graph = capture(self.bare) if self.graphs else None
        self.replayers = {}
        for way, graph in (("replay", "none"), ("replay_graph", "decode"))[:1 + self.graphs]:
            ops = [BoundOp(None, group, None, None, ours)] * args.calls
            plan = Plan(backend.rank, 0, [BoundRun(Phase.DECODE, args.steps, ops,
                                                   [ours] * args.calls)], {})
            self.replayers[way] = Replayer(plan, backend, "inference", watchdog, graph)
        self.marks = make_marks("cuda", 2, backend.stream)

    def release(self) -> None:
        """Drop every graph of this case: NCCL's destroy/finalize waits for every graph
        that captured the communicator (commDestroySync, nccl src/init.cc @ 5067397c)."""
        import gc

        from microbench.replay.graphs import release_graphs

        self.backend.synchronize()
        for replayer in self.replayers.values():
            release_graphs(replayer.plan, self.backend)
        self.replayers.clear()
        reset = getattr(getattr(self.bare_graph, "__self__", None), "reset", None)
        if reset is not None:  # torch.cuda.CUDAGraph: its pool too
            reset()
        self.bare_graph = None
        gc.collect()

    def _loop(self, body) -> float:
        self.backend.barrier()
        self.marks.reset()
        self.marks.mark()
        for _ in range(self.steps):
            body()
        self.marks.mark()
        self.backend.synchronize()
        return float(self.marks.elapsed_us()[-1])

    def time(self, way: str) -> float | None:
        """Microseconds per call, this rank (None: a graph way of a case without graphs)."""
        if not self.graphs and way in ("bare_graph", "replay_graph"):
            return None
        if way == "bare":
            calls = self.bare

            def step() -> None:
                for call in calls:
                    call()
            total = self._loop(step)
        elif way == "bare_graph":
            total = self._loop(self.bare_graph)
        else:
            total = float(self.replayers[way].inference()[-1])
        return total / (self.steps * self.calls)


def backend_port(env: DistEnv, name: str, names: list[str]) -> int:
    """Where each library meets: torch's rendezvous always at MASTER_PORT (under torchrun a
    client of the store torchrun's agent serves there, and only there: a torch rendezvous on
    another port is client-only under the agent and waits for a server that never comes,
    torch/distributed/rendezvous.py `_create_c10d_store`); the nccl backend's id exchange on
    the agent's store too, else on the next port when torch's rank 0 serves MASTER_PORT."""
    from microbench.backends.nccl_exchange import agent_store_serves
    if name == "nccl" and "torch" in names and not agent_store_serves(env):
        return env.master_port + 1
    return env.master_port


def main() -> int:
    args = parse()
    import torch
    if not torch.cuda.is_available():
        sys.stderr.write("gpu_overhead: error: needs a CUDA device (none is visible)\n")
        return 2
    from microbench.backends import open_backend
    from microbench.ranks.launch import free_port
    from microbench.ranks.watchdog import Watchdog

    env = dist.detect() or DistEnv("none", 0, 1, 0, "127.0.0.1", free_port())
    names = [n for n in args.backends.split(",") if n]
    if "nccl" in names and importlib.util.find_spec("cupy") is None:
        sys.stderr.write("gpu_overhead: CuPy is not installed, so no nccl backend rows "
                         "(pip install 'infercomm[cuda]')\n")
        names.remove("nccl")
    if not names:
        sys.stderr.write("gpu_overhead: error: no backend to measure; use --backends torch\n")
        return 2
    watchdog = Watchdog(600, env.rank).start()  # before the backends: it spawns a sentinel
    from microbench.ranks.device import device_count, isolated_gpus_warning
    warning = isolated_gpus_warning(env, device_count("torch")) if env.rank == 0 else None
    if warning is not None:
        sys.stderr.write(warning)
    backends = [open_backend(name, env=replace(env, master_port=backend_port(env, name, names)),
                             device="cuda", timeout=600) for name in names]
    world = backends[0].world_size
    table: list[tuple[str, str, int, dict[str, list[float]]]] = []
    for label, kind, numel in cases(world):
        for backend in backends:
            group = backend.new_group(f"all-{label}", list(range(world)))
            case = Case(backend, group, kind, numel, args, watchdog)
            samples: dict[str, list[float]] = {way: [] for way in WAYS}
            for i in range(args.warmup + args.rounds):
                for way in WAYS:
                    t = case.time(way)
                    if i >= args.warmup:
                        samples[way].append(t)
                watchdog.steps += 1
            table.append((label, backend.name, numel * 2, samples))
            case.release()  # before any communicator is destroyed (below)
    gathered = backends[0].allgather_object([s for *_, s in table])
    rows = []
    for i, (label, lib, nbytes, _) in enumerate(table):
        med = {way: (float(np.median(np.max([rank[i][way] for rank in gathered], axis=0)))
                     if gathered[0][i][way] and None not in gathered[0][i][way] else None)
               for way in WAYS}
        graphed = med["bare_graph"] is not None
        rows.append({"case": label, "library": lib, "bytes": nbytes,
                     **{f"{way}_us": None if med[way] is None else round(med[way], 3)
                        for way in WAYS},
                     "replay_ratio": round(med["replay"] / med["bare"], 4),
                     "graph_ratio": round(med["replay_graph"] / med["bare_graph"], 4)
                     if graphed else None,
                     "graph_speedup": round(med["bare"] / med["bare_graph"], 3)
                     if graphed else None})
    info = backends[0].versions()
    for backend in reversed(backends):
        backend.close()
    watchdog.stop()  # after the closes: a close that waits is still bounded
    if env.rank != 0:
        return 0
    print_table(rows, info, world, args)
    doc = {"gpu": info.get("gpu"), "nccl": info.get("nccl"), "world_size": world,
           "steps": args.steps, "calls": args.calls, "rounds": args.rounds, "goal": GOAL,
           "within_goal": all(max(r["replay_ratio"], r["graph_ratio"] or 0) <= GOAL
                              for r in rows),
           "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, separators=(",", ":")))
    return 0


def print_table(rows: list[dict], info: dict, world: int, args: argparse.Namespace) -> None:
    print(f"gpu {info.get('gpu')}, NCCL {info.get('nccl')}, world size {world}; "
          f"{args.rounds} rounds x {args.steps} steps x {args.calls} calls; us per call, "
          "median of the slowest rank's")
    head = (f"{'case':<22} {'library':<7} {'bare':>8} {'replay':>8} {'ratio':>6} "
            f"{'graph':>8} {'r.graph':>8} {'ratio':>6} {'saved':>6}")
    print(head)
    print("-" * len(head))
    def cell(value: float | None, width: int, digits: int) -> str:
        return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"
    for r in rows:
        print(f"{r['case']:<22} {r['library']:<7} {r['bare_us']:>8.2f} {r['replay_us']:>8.2f} "
              f"{r['replay_ratio']:>6.3f} {cell(r['bare_graph_us'], 8, 2)} "
              f"{cell(r['replay_graph_us'], 8, 2)} {cell(r['graph_ratio'], 6, 3)} "
              f"{cell(r['graph_speedup'], 5, 2)}x")
    print(f"goal: ratio <= {GOAL} (replay vs bare, eager and graphed); saved = bare / graph")


if __name__ == "__main__":
    sys.exit(main())
