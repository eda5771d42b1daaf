"""What differs between the two sides of a comparison, and comparisons that look backwards.

A verdict is only as useful as the knowledge of what changed: library versions (MPI library
and version, NCCL, torch, CuPy), transport, launcher, hosts and nodes, how MPI carries
traffic (netmod, shared memory; backends/mpi_transport.py), and the environment variables
that steer the libraries. Each is read from every run's meta.json; a side whose runs disagree
shows every value it had.
"""

import re
from typing import Any

from microbench.results.runs import RunFolder

# Variables that steer NCCL, MPICH, UCX, libfabric and Open MPI.
STEERING_PREFIXES = ("NCCL_", "MPIR_CVAR_", "UCX_", "FI_", "OMPI_MCA_")
UNSET = "(unset)"


def nodes(run: RunFolder) -> int:
    """Nodes the run spanned: Slurm's count for the step when launched by srun (fake nodes of
    one host share a host name), else the distinct host names."""
    env = run.meta.get("environment") or {}
    for key in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES"):
        if str(env.get(key, "")).isdigit():
            return int(env[key])
    return len(set(run.meta.get("hosts") or [])) or 1


def _library_words(banner: Any) -> str | None:
    """MPI's version banner in words: "MPICH Version:      5.0.2" -> "MPICH 5.0.2" (Open MPI's
    "Open MPI v5.0.11, package: ..." is kept whole: its build details can be what differs)."""
    if not banner:
        return None
    return " ".join(re.sub(r"\bVersion:", " ", str(banner)).split())


def facts(run: RunFolder) -> dict[str, str]:
    """The facts of one run that a comparison names when they differ."""
    m = run.meta
    v = m.get("versions") or {}
    env = m.get("environment") or {}
    out = {
        "MPI library": _library_words(v.get("mpi_library")), "NCCL": v.get("nccl"),
        "torch": v.get("torch"),
        "CuPy": v.get("cupy"), "backend": m.get("backend"), "transport": m.get("transport"),
        "launcher": m.get("launcher"), "MPI netmod": v.get("mpi_netmod"),
        "MPI shared memory": v.get("mpi_shm"), "MPI ranks on node 0": v.get("mpi_node_ranks"),
        "hosts": ",".join(sorted(set(m.get("hosts") or []))) or None, "nodes": nodes(run),
        "ranks": m.get("world_size"),
        # sweep/replay --allreduce-algo (microbench/algorithms); absent: the library's own
        "all-reduce algorithm": v.get("allreduce_algo") or "library",
        # torch's ProcessGroupNCCL or the nccl backend's grouped send/recv (GPU review R13)
        "gather/all-to-all": v.get("gather_alltoall"),
        # a disaggregated replay's KV transfer: NIXL, Mooncake, MPI one-sided or send/recv,
        # torch
        "KV transport": m.get("kv_transport"), "NIXL": v.get("nixl"),
        "Mooncake": v.get("mooncake"), "Mooncake protocol": v.get("mooncake_protocol"),
    }
    out.update({k: env[k] for k in sorted(env) if k.startswith(STEERING_PREFIXES)})
    return {k: UNSET if val is None else str(val) for k, val in out.items()}


def _side_value(runs: list[RunFolder], key: str) -> str:
    values = list(dict.fromkeys(facts(r).get(key, UNSET) for r in runs))
    return values[0] if len(values) == 1 else " | ".join(values)


def differences(a_runs: list[RunFolder], b_runs: list[RunFolder]) -> list[dict[str, str]]:
    """[{what, a, b}] for every fact whose value differs between the sides (in the order of
    `facts`, then the variables by name)."""
    keys = list(dict.fromkeys(k for r in [*a_runs, *b_runs] for k in facts(r)))
    out = []
    for key in keys:
        a, b = _side_value(a_runs, key), _side_value(b_runs, key)
        if a != b:
            out.append({"what": key, "a": a, "b": b})
    return out


def suspects(a_runs: list[RunFolder], b_runs: list[RunFolder],
             comparisons: list[Any]) -> list[str]:
    """Comparisons that contradict how hardware works: the side on fewer nodes slower than the
    side on more, for the same pattern, beyond doubt. Within a node ranks should talk through
    shared memory (or NVLink), faster than any network; when the one-node side loses, the
    likely cause is that its intra-node traffic went through the network module."""
    na = {nodes(r) for r in a_runs}
    nb = {nodes(r) for r in b_runs}
    if len(na) != 1 or len(nb) != 1 or na == nb:
        return []
    fewer_is_a = min(na) < min(nb)
    # ratios are B/A: the fewer-node side slower is B faster (A fewer) or B slower (B fewer)
    backwards = [c for c in comparisons if (c.ci_high < 1 if fewer_is_a else c.ci_low > 1)]
    if not backwards:
        return []
    fewer = a_runs if fewer_is_a else b_runs
    side = "A" if fewer_is_a else "B"
    return [f"suspect: {side} on {min(na | nb)} node(s) is slower than "
            f"{'B' if fewer_is_a else 'A'} on {max(na | nb)} for the same pattern "
            f"({', '.join(c.metric for c in backwards[:4])}); {likely_cause(fewer)}"]


def likely_cause(runs: list[RunFolder]) -> str:
    """Why ranks of one node might not have used shared memory, from what the runs recorded."""
    f = facts(runs[0])
    ranks = int(f["ranks"]) if f["ranks"].isdigit() else None
    node = int(f["MPI ranks on node 0"]) if f["MPI ranks on node 0"].isdigit() else None
    if f["MPI shared memory"].startswith("off"):
        return "likely cause: MPIR_CVAR_NOLOCAL turned MPI's shared memory off"
    if node is not None and ranks is not None and node < ranks:
        return (f"likely cause: MPI counted {node} of {ranks} ranks on the first node, so "
                "the rest went through the network; check the launcher's process map")
    meta = runs[0].meta
    if meta.get("oversubscribed"):
        return (f"likely cause: {meta.get('ranks_on_host')} ranks on {meta.get('host_cpus')} "
                "CPUs: ranks that busy-wait for each other wait for a CPU too; give the "
                "one-node run no more ranks than cores")
    if "MPICH" in f["MPI library"] and f.get("MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM",
                                             UNSET) == UNSET:
        return ("likely cause: MPICH's default shared-memory all-reduce (release_gather), "
                "slower than its network path on few cores; set "
                "MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM=mpir (docs/compare.md, Slurm)")
    return ("likely cause: intra-node traffic off shared memory (or the one-node side was "
            "oversubscribed); check each side's meta.json")

