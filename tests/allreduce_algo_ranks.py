"""One rank of tests/test_allreduce_algos.py: every algorithm, group, size and dtype in turn.

Launched by mpiexec (PMI_RANK/PMI_SIZE); `python -m tests.allreduce_algo_ranks BACKEND SIZES OUTDIR`
where SIZES are comma-separated group sizes (groups of the first k ranks, and one group of
the odd ranks when the world has 4 or more, so group index and global rank differ). Writes
OUTDIR/rankR.json per rank: the failures found ([] when every result was right).

Checked per case:
- --check's data (replay/check.py: element i of group index g holds (i mod 7) + g + 1): the
  sum over the group is k (i mod 7) + k (k + 1) / 2, exact in bf16 for k <= 8 (at most
  8 * 6 + 36 = 84 < 256);
- random data (bf16 and fp32): every rank of the group holds the same bits; for k = 2 they are
  the library all-reduce's bits (one add of two vectors, rounded once, whatever the
  algorithm); for k > 2 within k roundings of the fp64 sum.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from microbench.algorithms.registry import AlgoBackend
from microbench.backends import open_backend
from microbench.ranks.dist import detect

ALGOS = ("ring", "recursive-doubling", "rabenseifner", "hierarchical")


def sizes_for(k: int) -> list[int]:
    # 1 element, fewer elements than ranks, odd counts, and 8 MiB of fp32 (2 Mi elements) /
    # bf16 (4 Mi elements) at the largest group only (the rest keeps the test fast).
    return sorted({1, 2, 3, max(k - 1, 1), k + 1, 7, 1001, 65537})


def placements(k: int) -> list[int | None]:
    """Ranks per node for hierarchical: every divisor of k below k (several nodes) and k."""
    return [d for d in range(1, k + 1) if k % d == 0]


def main() -> int:
    backend_name, group_sizes = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
    env = detect()
    inner = open_backend(backend_name, env=env, device="cpu", timeout=120.0)
    world, rank = inner.world_size, inner.rank
    groups = [(f"first{k}", list(range(k))) for k in group_sizes]
    if world >= 4:
        groups.append(("odd", list(range(1, world, 2))))
    made = [inner.new_group(name, ranks) for name, ranks in groups]
    failures: list[str] = []
    biggest = max(g.size for g in made)
    rng = np.random.default_rng(1234)
    for group in made:
        k = group.size
        sizes = sizes_for(k)
        for dtype in ("fp32", "bf16"):
            cases = [(n, None) for n in sizes]
            if k == biggest and group.name.startswith("first"):
                cases.append(((8 << 20) // (4 if dtype == "fp32" else 2), None))
            for algo in ALGOS:
                rpns = placements(k) if algo == "hierarchical" else [None]
                for rpn in rpns:
                    nodes = [0] * world  # hierarchical's nodes: rpn group ranks a node
                    for gi, r in enumerate(group.ranks):
                        nodes[r] = gi // (rpn or k)
                    wrapped = AlgoBackend(inner, algo, nodes)
                    for numel, _ in cases:
                        seed = int(rng.integers(1 << 30))  # the same on every rank
                        failures += _one(inner, wrapped, group, algo, rpn, numel, dtype, seed)
    inner.barrier()
    # a file per rank: mpiexec may interleave the ranks' stdout lines
    Path(sys.argv[3], f"rank{rank}.json").write_text(
        json.dumps({"rank": rank, "failures": failures[:20], "count": len(failures)}))
    inner.close()
    return 0


def _one(inner, wrapped, group, algo, rpn, numel, dtype, seed) -> list[str]:
    k, g = group.size, group.index
    where = f"{algo}(rpn={rpn}) k={k} group={group.name} numel={numel} {dtype}"
    out: list[str] = []
    if g < 0:  # not a member: only the world-wide gather below
        if numel <= 70000:
            inner.allgather_object(None)
        return out
    buf = inner.empty(numel, dtype)
    call = wrapped.bind("allreduce", group, buf, None, None)
    base = (np.arange(numel) % 7).astype(np.float64)
    inner.write(buf, base + g + 1)
    call()
    got = inner.read(buf)
    want = k * base + k * (k + 1) / 2
    bad = int(np.count_nonzero(got != want))
    if bad:
        out.append(f"{where}: {bad} wrong of --check's data")
    if numel > 70000:
        return out  # the 8 MiB case: --check's data only
    # random data: identical on every rank; for k = 2 the library's own bits
    data = np.random.default_rng(seed + g).standard_normal(numel) * 8
    inner.write(buf, data)
    call()
    got = inner.read(buf)
    everyone = inner.allgather_object(got.tobytes())
    members = [everyone[r] for r in group.ranks]
    if any(m != members[0] for m in members):
        out.append(f"{where}: ranks disagree on random data")
    if k == 2:
        lib = inner.empty(numel, dtype)
        inner.bind("allreduce", group, lib, None, None)
        inner.write(lib, data)
        inner.bind("allreduce", group, lib, None, None)()
        if not np.array_equal(inner.read(lib), got):
            out.append(f"{where}: not the library all-reduce's bits")
    else:
        exact = sum(np.random.default_rng(seed + j).standard_normal(numel) * 8
                    for j in range(k))
        ulp = 2.0 ** -7 if dtype == "bf16" else 2.0 ** -23
        scale = sum(np.abs(np.random.default_rng(seed + j).standard_normal(numel) * 8)
                    for j in range(k))
        if np.any(np.abs(got - exact) > k * ulp * scale + 1e-30):
            out.append(f"{where}: random sum off by more than {k} roundings")
    return out


if __name__ == "__main__":
    sys.exit(main())
