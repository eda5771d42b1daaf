"""MPI through mpi4py: host (numpy) buffers, device buffers where the MPI is CUDA-aware, or
explicit staging of device buffers through the host (`--mpi-staging`), labelled as such."""

import ctypes
import os
from functools import partial
from typing import Any

import mpi4py
import numpy as np

from microbench.argtypes import UsageError
from microbench.backends import BoundCall, Group, displacements, register
from microbench.backends.host_memory import written_zeros
from microbench.ranks import rank_stop, shm
from microbench.ranks.device import check_device_index
from microbench.ranks.dist import DistEnv

mpi4py.rc.threads = False  # one thread issues every call; no MPI_THREAD_MULTIPLE locking
# MPI_Init (this import) makes MPICH's /dev/shm segment: a stop signal meanwhile waits until
# the segment is noted for removal, then ends the rank (ranks/rank_stop.py)
with rank_stop.held():
    from mpi4py import MPI
    shm.note_segments(MPI.COMM_WORLD.Get_rank())
    rank_stop.reclaim()  # before a SIGUSR1 or SIGHUP held meanwhile reaches MPICH's handler
rank_stop.release()

from microbench.backends import mpi_transport  # noqa: E402
from microbench.backends.mpi_reduce import MpiTypes  # noqa: E402


def cuda_aware() -> bool | None:
    """MPIX_Query_cuda_support() of the loaded MPI library (MPICH, Open MPI), None if absent."""
    with open("/proc/self/maps") as maps:
        libs = {line.split()[-1] for line in maps if "libmpi" in line and ".so" in line}
    for path in sorted(libs):
        try:
            query = ctypes.CDLL(path).MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        return bool(query())
    return None


def _srun_mpi_hint() -> str:
    return ("launch with srun --mpi=pmi2 for MPICH, --mpi=pmix for Open MPI or "
            "--mpi=cray_shasta for Cray MPICH"
            if "SLURM_JOB_ID" in os.environ else "launch with the MPI library's mpiexec")


@register("mpi")
class MpiBackend:
    name = "mpi"

    def __init__(self, env: DistEnv, device: str, staging: bool = False, **_: Any) -> None:
        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.world_size = self.comm.Get_size()
        if self.world_size != env.world_size:
            # The classic failure: srun --mpi=none starts N tasks that each see a world of 1.
            raise UsageError(
                f"the launcher started {env.world_size} ranks ({env.launcher} variables) but "
                f"MPI sees a world of {self.world_size}; {_srun_mpi_hint()}")
        self.types = MpiTypes()
        # collective, so here on every rank; versions() runs on rank 0 only
        self.node_ranks = mpi_transport.node_ranks(self.comm)
        # every rank is past MPI_Init, so each maps MPICH's segment: its name can go now, and
        # a run ended any way at all (SIGKILL of every process included) leaves none
        shm.unlink_mapped()
        self._groups_made = 0  # a distinct tag per Create_group call
        self.device = device
        self.cuda_aware = cuda_aware()
        self.staging = device == "cuda" and (staging or not self.cuda_aware)
        if device == "cuda":
            import torch
            self._torch = torch
            # run_rank selected this device before this module's import ran MPI_Init
            # (ranks/device.py); set again for a backend opened directly, never wrapped round.
            torch.cuda.set_device(check_device_index(env, torch.cuda.device_count()))
        self.transport = ("mpi-staging" if self.staging
                          else "mpi-cuda-aware" if device == "cuda" else "mpi-host")

    def new_group(self, name: str, ranks: list[int]) -> Group:
        self._groups_made += 1
        if self.rank not in ranks:
            return Group(name, tuple(ranks), -1, None)
        if len(ranks) == self.world_size:
            comm = self.comm
        else:
            comm = self.comm.Create_group(self.comm.Get_group().Incl(ranks),
                                           tag=self._groups_made)
        return Group(name, tuple(ranks), comm.Get_rank(), comm)

    def empty(self, numel: int, dtype: str) -> Any:
        host = written_zeros(numel, self.types.storage(dtype))
        if self.device == "cpu":
            return _HostBuffer(host, dtype)
        torch = self._torch
        device_tensor = torch.zeros(numel, dtype=torch.uint8 if host.itemsize == 1 else
                                    {2: torch.int16, 4: torch.int32, 8: torch.int64}[host.itemsize],
                                    device="cuda")
        # The zero fill is asynchronous and mpi4py hands MPI the tensor through DLPack with
        # stream=-1, no synchronisation (asdlpack.pxi @ 7c8dac2c): "GPU buffers must be fully
        # ready before any MPI routines operate on them" (mpi4py docs/source/tutorial.rst).
        torch.cuda.current_stream().synchronize()
        return _DeviceBuffer(device_tensor, host, dtype)

    def _spec(self, buffer: Any, staged: bool) -> list[Any]:
        data = buffer.host if staged or self.device == "cpu" else buffer.device
        return [data, self.types.mpi_type(buffer.dtype)]

    def staged_reduction(self, kind: str, dtype: str) -> bool:
        """A user-defined sum (bf16; fp16 without MPIX_C_FLOAT16) runs in Python on host
        memory: with device buffers its reductions go through the host even when MPI is
        CUDA-aware (the library would hand the operation device pointers).

        The library's own 16-bit sums (MPIX_BFLOAT16, MPIX_C_FLOAT16 with MPI_SUM) are
        staged too on device buffers: `sum_rounding` checked them on host memory only, and
        whether a GPU reduction path (MPICH's yaksa, UCX) sums these types on device memory is
        not known until it runs there; meta.json's staged_reductions lists them."""
        return (self.device == "cuda" and kind in ("allreduce", "reducescatter")
                and (self.types.sum_op(dtype) != MPI.SUM or dtype in ("bf16", "fp16")))

    def bind(self, kind: str, group: Group, send: Any, recv: Any,
             peer_or_root: int | None, counts: tuple[int, ...] | None = None) -> BoundCall:
        comm = group.handle
        dtype = send.dtype if send is not None else recv.dtype
        staged = self.staging or self.staged_reduction(kind, dtype)
        s = self._spec(send, staged) if send is not None else None
        r = self._spec(recv, staged) if recv is not None else None
        uneven = counts is not None
        match kind:
            case "allgather" if uneven:
                call = partial(comm.Allgatherv, s, [r[0], list(counts), displacements(counts),
                                                     r[1]])
            case "reducescatter" if uneven:
                call = partial(comm.Reduce_scatter, s, r, list(counts), self.types.sum_op(dtype))
            case "allreduce":
                call = partial(comm.Allreduce, MPI.IN_PLACE, s, self.types.sum_op(dtype))
            case "allgather":
                call = partial(comm.Allgather, s, r)
            case "reducescatter":
                call = partial(comm.Reduce_scatter_block, s, r, self.types.sum_op(dtype))
            case "alltoall":
                call = partial(comm.Alltoall, s, r)
            case "broadcast":
                call = partial(comm.Bcast, s, root=peer_or_root)
            case "gather":
                call = partial(comm.Gather, s, r, root=peer_or_root)
            case "send":
                call = partial(comm.Send, s, dest=peer_or_root)
            case "recv":
                call = partial(comm.Recv, r, source=peer_or_root)
            case _:
                raise ValueError(f"mpi backend cannot issue {kind!r}")
        if not staged:
            return call
        # Copy out only what the call writes: in place for allreduce and broadcast; nothing
        # for a send or off the root of a gather.
        in_place = kind in ("allreduce", "broadcast")
        written = recv if recv is not None else (send if in_place else None)
        return partial(_staged, call, send, written)

    def write(self, buffer: Any, values: np.ndarray) -> None:
        buffer.host[:] = self.types.to_storage(buffer.dtype, values)
        if isinstance(buffer, _DeviceBuffer):
            buffer.push()

    def read(self, buffer: Any) -> np.ndarray:
        if isinstance(buffer, _DeviceBuffer):
            buffer.pull()
        return self.types.from_storage(buffer.dtype, buffer.host)

    def barrier(self) -> None:
        self.comm.Barrier()

    def synchronize(self) -> None:
        if self.device == "cuda":
            self._torch.cuda.synchronize()

    def allgather_object(self, obj: Any) -> list[Any]:
        return self.comm.allgather(obj)

    def versions(self) -> dict[str, Any]:
        library = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]
        info: dict[str, Any] = {"mpi_library": library, "mpi4py": mpi4py.__version__,
                                "mpi_standard": "{}.{}".format(*MPI.Get_version()),
                                "numpy": np.__version__, "cuda_aware": self.cuda_aware,
                                "float16_reductions": self.types.reductions()}
        info.update(mpi_transport.transport_facts(MPI.Get_library_version(), self.node_ranks))
        if self.device == "cuda" and not self.staging:
            info["staged_reductions"] = [d for d in ("bf16", "fp16")
                                         if self.staged_reduction("allreduce", d)]
        if self.device == "cuda":
            info["torch"] = self._torch.__version__
            info["gpu"] = self._torch.cuda.get_device_name()
        return info

    def close(self) -> None:
        pass


class _HostBuffer:
    __slots__ = ("dtype", "host")

    def __init__(self, host: np.ndarray, dtype: str) -> None:
        self.host, self.dtype = host, dtype


class _DeviceBuffer:
    """A device tensor and its host mirror (used for staging and for --check)."""

    __slots__ = ("device", "dtype", "host")

    def __init__(self, device: Any, host: np.ndarray, dtype: str) -> None:
        self.device, self.host, self.dtype = device, host, dtype

    def push(self) -> None:
        import torch
        self.device.copy_(torch.from_numpy(self.host.view(_same_width_int(self.host))))

    def pull(self) -> None:
        self.host.view(_same_width_int(self.host))[:] = self.device.cpu().numpy()


def _same_width_int(array: np.ndarray) -> type:
    return {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[array.itemsize]


def _staged(call: BoundCall, send: Any, written: Any) -> None:
    """Host staging: device -> host, the MPI call on host memory, host -> device."""
    if send is not None:
        send.pull()
    call()
    if written is not None:
        written.push()
