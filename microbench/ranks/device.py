"""Which GPU a rank uses, chosen once, before MPI starts and before any CUDA query.

The rank's device is its local rank (`dist.detect`: the launcher's own variable, SLURM_LOCALID
for a task srun started). Order matters on a real node:

- before any memory query: `torch.cuda.mem_get_info()` with no device reads (and creates a
  context on) `current_device()`, device 0 until `set_device` (torch/cuda/memory.py), so every
  rank would check GPU 0 and ranks > 0 fail under EXCLUSIVE_PROCESS compute mode;
- before MPI_Init: UCX "uses closest NICs to the CUDA GPU which is set before the
  initialization of the library" (NVIDIA HPC-X docs, multi-gpu support); `from mpi4py import
  MPI` runs MPI_Init, so the mpi backend's module is imported only after this selection;
- no wrap-around: a local rank at or above the device count would share a GPU (nccl and torch
  then fail with "Duplicate GPU detected", MPI times two ranks on one device), so it is refused.

The nccl backend uses CuPy, which works beside a CPU build of torch, so its device is chosen
and counted through CuPy there, never through torch.cuda (which raises AssertionError on a CPU
build).
"""

import os
from typing import Any

from microbench.argtypes import UsageError
from microbench.ranks.dist import DistEnv

# What a job asked for when it asked for GPUs, in the order they are reported.
_GPU_REQUESTS = ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK",
                 "SLURM_GPUS", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES")


def gpus_asked(environ: Any = None) -> str | None:
    """The variable saying this job asked for GPUs ('SLURM_GPUS_ON_NODE=4'), or None.

    Slurm sets SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS and SLURM_STEP_GPUS for a job or step that
    asked for GPUs (--gpus-per-node, --gpus, --gpus-per-task; sbatch/srun man pages, OUTPUT
    ENVIRONMENT VARIABLES); a CUDA_VISIBLE_DEVICES naming devices is a request too. An empty
    value, '0', or CUDA_VISIBLE_DEVICES set to '' / '-1' / 'NoDevFiles' (Slurm's value when a
    node has GPUs but the job asked for none) is no request.
    """
    env = os.environ if environ is None else environ
    for name in _GPU_REQUESTS:
        value = env.get(name, "").strip()
        if value and value not in ("0", "-1", "NoDevFiles"):
            return f"{name}={value}"
    return None


def device_count(backend: str) -> int:
    """GPUs this process sees, through the library whose buffers the backend uses."""
    if backend == "nccl":
        try:
            import cupy
            return int(cupy.cuda.runtime.getDeviceCount())
        except Exception:  # no CuPy, no driver or no device: CuPy raises its own errors
            return 0
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def _sees_only_its_own(env: DistEnv, count: int, environ: Any) -> bool:
    """srun --gpus-per-task=K gives each task its own K GPUs (SLURM_GPUS_PER_TASK,
    sbatch/srun OUTPUT ENVIRONMENT VARIABLES; CUDA_VISIBLE_DEVICES and the task's cgroup
    set per task): a task that sees exactly K sees its own GPUs only."""
    per_task = environ.get("SLURM_GPUS_PER_TASK", "")
    return per_task.isdigit() and int(per_task) == count > 0 and env.local_var == "SLURM_LOCALID"


def _tasks_on_this_node(environ: Any) -> int | None:
    """The step's tasks on this node: SLURM_STEP_TASKS_PER_NODE ('4(x2),2') at SLURM_NODEID."""
    spec = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE", "")
    node = environ.get("SLURM_NODEID", "")
    counts: list[int] = []
    for part in filter(None, spec.split(",")):
        number, _, times = part.partition("(x")
        if not number.isdigit() or (times and not times.rstrip(")").isdigit()):
            return None
        counts += [int(number)] * (int(times.rstrip(")")) if times else 1)
    return counts[int(node)] if node.isdigit() and int(node) < len(counts) else None


def isolated_gpus_warning(env: DistEnv, count: int, environ: Any = None) -> str | None:
    """A warning (rank 0's, one line) where each task sees only its own GPU and shares its
    node with other tasks of the run: NCCL then cannot see the NVLink between the node's
    GPUs and falls back to PCIe or shared memory without an error ("NCCL needs to see all
    GPUs on the same node for all NVLink detection to work properly", NVIDIA/nccl#1066),
    and CUDA IPC between the tasks' MPI buffers fails the same way (open-mpi/ompi#11949), so
    the figures would pass for the node's and are not."""
    e = os.environ if environ is None else environ
    if env.world_size < 2 or not _sees_only_its_own(env, count, e):
        return None
    if _tasks_on_this_node(e) == 1:  # alone on its node: nothing to isolate it from
        return None
    return ("[infercomm] srun --gpus-per-task: each task sees only its own GPU, so NCCL cannot "
            "see NVLink between the tasks of a node and falls back to PCIe or shared memory "
            "(NVIDIA/nccl#1066): these are not the node's figures; use srun "
            "--gpus-per-node=N --gpu-bind=none (each task then takes its local rank's GPU)\n")


def check_device_index(env: DistEnv, count: int, environ: Any = None) -> int:
    """The rank's device: its local rank, refused when this host has no such GPU.

    One exception: a task of srun --gpus-per-task=K that sees exactly K GPUs (its own) takes
    the first of them, whatever its local rank; it runs, but isolated_gpus_warning says why
    its figures are not the node's."""
    env_vars = os.environ if environ is None else environ
    if _sees_only_its_own(env, count, env_vars):
        return 0
    if not env.local_var and env.world_size > 1:  # every rank would take GPU 0
        raise UsageError(
            f"rank {env.rank} of {env.world_size}: no launcher variable gives its local rank "
            "(LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID), so its "
            "GPU is unknown; launch with torchrun, mpiexec or srun, or set LOCAL_RANK")
    if env.local_rank >= count:
        source = env.local_var or "no launcher variable (taken as 0)"
        raise UsageError(
            f"rank {env.rank} has local rank {env.local_rank} (from {source}) but this host "
            f"sees {count} GPU{'s' if count != 1 else ''}; every task must see all its "
            "node's GPUs (srun --gpus-per-node=N --gpu-bind=none), with at most one rank a "
            "GPU (--ntasks-per-node, torchrun --nproc-per-node)")
    return env.local_rank


def select_device(env: DistEnv, backend: str) -> int:
    """Make the rank's GPU current, before MPI_Init and before any other CUDA call."""
    count = device_count(backend)
    index = check_device_index(env, count)
    warning = isolated_gpus_warning(env, count) if env.rank == 0 else None
    if warning is not None:
        import sys
        sys.stderr.write(warning)
    if backend == "nccl":
        import cupy
        cupy.cuda.Device(index).use()
        return index
    import torch
    torch.cuda.set_device(index)
    return index


def free_device_bytes(backend: str, index: int) -> int:
    """Free memory of the rank's own device (selected first), through the backend's library."""
    if backend == "nccl":
        import cupy
        with cupy.cuda.Device(index):
            return int(cupy.cuda.runtime.memGetInfo()[0])
    import torch
    return int(torch.cuda.mem_get_info(index)[0])


def refuse_gpu_job_without_gpu(backend: str, environ: Any = None) -> None:
    """`--device auto` in a job that asked for GPUs but sees none (a wrong module, a missing
    --gpus-per-node on the step) is refused rather than replayed on CPUs over gloo."""
    asked = gpus_asked(environ)
    if asked is None:
        return
    found = ("cupy.cuda.runtime.getDeviceCount() is 0 or CuPy is missing" if backend == "nccl"
             else "torch.cuda.device_count() is 0")
    raise UsageError(f"this job asked for GPUs ({asked}) but {found}; load a CUDA build of "
                     "the library, ask for GPUs on the step (srun --gpus-per-node), or pass "
                     "--device cpu to replay on CPUs")


# What a rank's GPU holds besides the replay's buffers (R10 of the GPU review): the CUDA
# context and torch's graph pool ("a few hundred MiB on H100"), and each NCCL communicator's
# channel buffers (NCCL_BUFFSIZE, 4 MiB by default, per channel and peer and protocol; NVLS
# buffers on NVSwitch systems): "hundreds of MiB to >1 GiB per communicator". An estimate, not
# a measurement: it keeps a replay that would fail in ncclCommInitRank from starting.
CONTEXT_RESERVE = 512 << 20
COMM_RESERVE = 512 << 20


def communicators_of(pattern: Any, rank: int) -> int:
    """NCCL communicators `rank` will hold: the world's and its group of each kind the
    pattern's ops use (replay/plan.py make_groups), a group spanning the world counted once."""
    from patterns.groups import GROUP_KINDS, group_of, group_size
    layout = pattern.layout
    used = {op.group for replica in pattern.replicas() for runs in replica for run in runs
            for op in run.step.ops}
    comms = {tuple(range(layout.world_size))}
    comms |= {tuple(group_of(layout, kind, rank)) for kind in GROUP_KINDS
              if kind in used and group_size(layout, kind) > 1}
    return len(comms)


def reserve_bytes(pattern: Any, rank: int) -> tuple[int, int]:
    """(bytes kept back from a rank's free GPU memory, communicators counted)."""
    comms = communicators_of(pattern, rank)
    return CONTEXT_RESERVE + comms * COMM_RESERVE, comms
