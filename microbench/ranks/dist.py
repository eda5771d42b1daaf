"""The distributed environment, read in one place.

Rank and world size come from the first launcher whose variables are set, in this order:
torchrun, Open MPI, PMI (MPICH's hydra, srun --mpi=pmi2), Slurm. The local rank comes from
the same launcher, except under PMI: Hydra sets MPI_LOCALRANKID, Slurm's pmi2 plugin does not
(it sets PMI_FD, PMI_JOBID, PMI_RANK, PMI_SIZE only: SchedMD/slurm
src/plugins/mpi/pmi2/mpi_pmi2.c p_mpi_hook_slurmstepd_task @ 084787c0), so a task srun started
(SLURM_PROCID equal to PMI_RANK) takes SLURM_LOCALID whatever --mpi. SLURM_LOCALID is never
read for a task another launcher started inside an allocation: there it is the local id of the
launcher's own proxy (0 on every node), not the rank's. The rendezvous
address of the torch backend comes from MASTER_ADDR/MASTER_PORT, else from Slurm's node list
and job id, else, under mpirun/mpiexec across hosts, from rank 0 through MPI
(`rendezvous_address`), else the local host.
"""

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_MASTER_PORT = 29500

# (launcher, rank, world size, local rank) variable names, in order of precedence.
_LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)


@dataclass(frozen=True)
class DistEnv:
    launcher: str
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    local_var: str = ""  # the variable the local rank was read from; "" when none was set


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm node list: 'gpu[003-005,009],login1' -> 'gpu003',
    'gpu[01-02]-ib' -> 'gpu01-ib', 'r[1-2]n[07-08]' -> 'r1n07'. A host expression is text
    with any number of bracketed ranges, each standing for its first value (zero padding
    kept); expressions are separated by commas outside brackets (Slurm's hostlist syntax,
    scontrol show hostnames)."""
    text = nodelist.strip()
    first, depth = [], 0
    for char in text:
        if char == "," and depth == 0:
            break
        depth += (char == "[") - (char == "]")
        first.append(char)
    host = "".join(first)
    return re.sub(r"\[([^\]]*)\]", lambda m: m.group(1).split(",")[0].split("-")[0],
                  host) or nodelist


def slurm_port(job_id: str) -> int:
    """A port derived from the job id, so concurrent jobs on shared nodes do not collide."""
    return 20000 + int(job_id) % 20000 if job_id.isdigit() else DEFAULT_MASTER_PORT


def detect(environ: Mapping[str, str] | None = None) -> DistEnv | None:
    """The environment a launcher set up for this process, or None when none did."""
    env = os.environ if environ is None else environ
    found = next((names for names in _LAUNCHERS if names[1] in env and names[2] in env), None)
    if found is None:
        return None
    launcher, rank_var, size_var, local_var = found
    rank, size = int(env[rank_var]), int(env[size_var])
    if launcher == "pmi" and local_var not in env and "PMI_LOCAL_RANK" in env:
        # Cray PMI: srun --mpi=cray_shasta sets PMI_RANK, PMI_SIZE and PMI_LOCAL_RANK (SchedMD
        # slurm src/plugins/mpi/cray_shasta/mpi_cray_shasta.c, mpi_p_slurmstepd_task @ b5076411)
        local_var = "PMI_LOCAL_RANK"
    elif (launcher == "pmi" and local_var not in env and "SLURM_LOCALID" in env
            and env.get("SLURM_PROCID") == env[rank_var]):
        local_var = "SLURM_LOCALID"  # srun --mpi=pmi2 started this task
    local = int(env.get(local_var, "0") or 0)
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    addr = env.get("MASTER_ADDR") or (first_slurm_host(nodelist) if nodelist else "127.0.0.1")
    if "MASTER_PORT" in env:
        port = int(env["MASTER_PORT"])
    else:
        port = slurm_port(env.get("SLURM_JOB_ID", ""))
    return DistEnv(launcher, rank, size, local, addr, port,
                   local_var if local_var in env else "")


# The launcher's count of ranks on this host: Open MPI's mpirun, MPICH/Intel Hydra's mpiexec.
_LOCAL_SIZES = {"openmpi": "OMPI_COMM_WORLD_LOCAL_SIZE", "pmi": "MPI_LOCALNRANKS"}


def rendezvous_address(env: DistEnv, environ: Mapping[str, str] | None = None) -> str:
    """Where the torch backend's ranks meet. Under mpirun/mpiexec across hosts with neither
    MASTER_ADDR nor a Slurm node list, `env.master_addr` is the 127.0.0.1 fallback, where a
    second host's ranks would meet only each other (and wait until --timeout): rank 0's host
    name is then asked through MPI (mpi4py), or the run refused naming MASTER_ADDR."""
    from microbench.argtypes import UsageError

    e = os.environ if environ is None else environ
    if (env.launcher not in _LOCAL_SIZES or e.get("MASTER_ADDR")
            or e.get("SLURM_STEP_NODELIST") or e.get("SLURM_JOB_NODELIST")):
        return env.master_addr
    local = e.get(_LOCAL_SIZES[env.launcher], "")
    if local.isdigit() and int(local) >= env.world_size:  # every rank on this host
        return env.master_addr
    try:
        from mpi4py import MPI
    except ImportError:
        raise UsageError(
            f"the ranks span hosts ({_LOCAL_SIZES[env.launcher]}={local or 'unset'} of "
            f"{env.world_size}) but MASTER_ADDR is not set, so the torch backend cannot find "
            "rank 0; set MASTER_ADDR to rank 0's host (mpirun -x MASTER_ADDR=host, mpiexec "
            "-genv MASTER_ADDR host) or install mpi4py") from None
    import socket
    return str(MPI.COMM_WORLD.bcast(socket.gethostname() if env.rank == 0 else None, root=0))


def resolve_master_addr(addr: str) -> str:
    """`addr` if it resolves; else the NodeAddr Slurm knows for it (nodes named apart from
    their host names, as on a local test cluster); else `addr` unchanged."""
    import socket
    import subprocess

    try:
        socket.gethostbyname(addr)
        return addr
    except OSError:
        pass
    try:
        shown = subprocess.run(["scontrol", "show", "node", addr], capture_output=True,
                               text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return addr
    match = re.search(r"NodeAddr=(\S+)", shown)
    return match.group(1) if match else addr
