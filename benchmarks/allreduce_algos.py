"""--allreduce-algo against the library's all-reduce, as ratios measured in one run.

    python benchmarks/allreduce_algos.py          (starts itself under mpiexec)

Part 1, MPI (MPICH) on 2 ranks of this machine: at decode sizes of a TP2 all-reduce (hidden
4096 x bf16: 1 token 8 KiB, 32 tokens 256 KiB, 128 tokens 1 MiB; the 256 KB-1 MB range where
MPI and NVRAR beat NCCL across nodes), each algorithm of microbench/algorithms against the
library's MPI_Allreduce on the same buffer. Rounds alternate between them (each round a
barrier, then CALLS calls back to back, the slowest rank's time / CALLS); ratio = median
algorithm / median library (below 1: the algorithm is faster).

Part 2, two network namespaces standing in for two nodes (root only; skipped otherwise):
4 ranks, 2 in each namespace, joined by a veth pair limited to RATE (tbf, as scripts/
compare-interconnect.sh does), over gloo (torch.distributed, GLOO_SOCKET_IFNAME the veth;
the ranks of one namespace reach each other over its own stack). Not MPICH: its UCX refused
4 ranks in two namespaces here ("no active messages transport": UCX matches the ranks of one
host by boot id and then finds their loopback flags incompatible). Hierarchical (nodes of
2 ranks) against the flat ring, recursive doubling and gloo's all-reduce, ratio = flat /
hierarchical (above 1: hierarchical is faster).
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY, MPIEXEC = sys.executable, str(Path(sys.executable).parent / "mpiexec")
SIZES = (8 << 10, 256 << 10, 1 << 20)
ALGOS = ("ring", "recursive-doubling", "rabenseifner", "hierarchical")
ROUNDS, WARMUP, CALLS = 15, 2, 20
RATE = os.environ.get("RATE", "1gbit")
NS = ("infercomm-ba", "infercomm-bb")


def worker(part: str) -> None:
    import numpy as np

    from microbench.algorithms.registry import AlgoBackend
    from microbench.backends import open_backend
    from microbench.ranks.dist import detect

    backend = open_backend("mpi" if part == "1" else "torch", env=detect(), device="cpu",
                           timeout=300.0)
    world = backend.new_group("world", list(range(backend.world_size)))
    nodes = [r // 2 for r in range(backend.world_size)]  # part 2: 2 ranks a namespace
    algos = ALGOS if part == "1" else ("hierarchical", "ring", "recursive-doubling")
    results = {}
    for size in SIZES:
        buf = backend.empty(size // 2, "bf16")
        calls = {"library": backend.bind("allreduce", world, buf, None, None)}
        for algo in algos:
            calls[algo] = AlgoBackend(backend, algo, nodes).bind("allreduce", world, buf,
                                                                 None, None)
        times: dict[str, list[float]] = {name: [] for name in calls}
        for r in range(WARMUP + ROUNDS):
            for name, call in calls.items():
                backend.barrier()
                start = time.perf_counter()
                for _ in range(CALLS):
                    call()
                took = max(backend.allgather_object(
                    (time.perf_counter() - start) / CALLS * 1e6))
                if r >= WARMUP:
                    times[name].append(took)
        results[size] = {name: float(np.median(t)) for name, t in times.items()}
    if backend.rank == 0:
        print("RESULT " + json.dumps(results), flush=True)


def run_part(cmd: list[str], env: dict[str, str]) -> dict:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900,
                         cwd=ROOT, check=False)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if out.returncode or line is None:
        raise SystemExit(f"benchmark ranks failed ({out.returncode}): {out.stderr[-2000:]}")
    return {int(k): v for k, v in json.loads(line[7:]).items()}


def namespaces_up() -> bool:
    if os.geteuid() != 0:
        return False
    sh = ["ip netns add {a}", "ip netns add {b}",
          "ip link add vBA netns {a} type veth peer name vBB netns {b}",
          "ip -n {a} addr add 10.78.0.1/24 dev vBA", "ip -n {b} addr add 10.78.0.2/24 dev vBB",
          "ip -n {a} link set lo up", "ip -n {b} link set lo up",
          "ip -n {a} link set vBA up", "ip -n {b} link set vBB up",
          "ip netns exec {a} tc qdisc add dev vBA root tbf rate {r} burst 256kb latency 5ms",
          "ip netns exec {b} tc qdisc add dev vBB root tbf rate {r} burst 256kb latency 5ms"]
    namespaces_down()
    for line in sh:
        cmd = line.format(a=NS[0], b=NS[1], r=RATE).split()
        if subprocess.run(cmd, capture_output=True, check=False).returncode:
            namespaces_down()
            return False
    return True


def namespaces_down() -> None:
    for ns in NS:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def table(title: str, results: dict, base: str, names: tuple[str, ...]) -> list[dict]:
    print(f"\n{title}")
    print(f"{'size':>9}  {base + ' (us)':>16}  " + "  ".join(f"{n:>20}" for n in names))
    rows = []
    for size, t in results.items():
        ratios = {n: t[n] / t[base] for n in names}
        print(f"{size >> 10:>6} KiB  {t[base]:>16.1f}  "
              + "  ".join(f"{t[n]:>10.1f} us x{ratios[n]:<6.2f}" for n in names))
        rows.append({"size_bytes": size, f"{base}_us": round(t[base], 2),
                     **{n: round(ratios[n], 3) for n in names}})
    return rows


def main() -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("MPIR_CVAR_NOLOCAL", None)
    one = run_part([MPIEXEC, "-n", "2", PY, __file__, "--worker", "1"], env)
    doc = {"mpi_2_ranks": table(
        "Part 1: MPI on 2 ranks, algorithm / library (below 1: the algorithm is faster)",
        one, "library", ALGOS)}
    if namespaces_up():
        try:
            net = {**env, "MASTER_ADDR": "10.78.0.1", "MASTER_PORT": "29731"}
            cmd = [MPIEXEC]
            for ns, dev in ((NS[0], "vBA"), (NS[1], "vBB")):
                cmd += ["-n", "2", "ip", "netns", "exec", ns, "env", f"GLOO_SOCKET_IFNAME={dev}",
                        PY, __file__, "--worker", "2", ":"]
            two = run_part(cmd[:-1], net)
        finally:
            namespaces_down()
        hier = {s: {**t, "flat ring": t["ring"], "flat recursive-doubling":
                    t["recursive-doubling"], "flat library": t["library"]}
                for s, t in two.items()}
        names = ("flat ring", "flat recursive-doubling", "flat library")
        rows = table(f"Part 2: 2 namespaces x 2 ranks over a {RATE} veth, flat / "
                     "hierarchical (above 1: hierarchical is faster)",
                     {s: {**{n: t[n] for n in names}, "hierarchical": t["hierarchical"]}
                      for s, t in hier.items()}, "hierarchical", names)
        doc["two_namespaces"] = rows
    else:
        print("\nPart 2 skipped: needs root for ip netns and tc")
        doc["two_namespaces"] = None
    print(json.dumps(doc, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        sys.exit(0)
    sys.exit(main())
