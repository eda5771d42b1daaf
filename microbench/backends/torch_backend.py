"""torch.distributed: NCCL on CUDA devices, gloo on CPUs."""

import warnings
from datetime import timedelta
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from microbench.backends import BoundCall, Group, register
from microbench.ranks.device import check_device_index
from microbench.ranks.dist import DistEnv, rendezvous_address, resolve_master_addr

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8,
                "bool": torch.bool}

# torch 2.13 renamed the *_into_tensor / *_tensor calls to *_single (same arguments) and warns
# on the old names; take whichever this torch has.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@register("torch")
class TorchBackend:
    name = "torch"

    def __init__(self, env: DistEnv, device: str, timeout: float, **_: Any) -> None:
        self.device = device
        bound: dict[str, Any] = {}
        if device == "cuda":
            index = check_device_index(env, torch.cuda.device_count())  # no wrap-around
            torch.cuda.set_device(index)
            self.transport = "nccl"
            self._torch_device = torch.device("cuda", index)
            # device_id binds the process group to this rank's GPU: without it a barrier on
            # a group no call has used guesses `rank % GPUs` from the global rank
            # (ProcessGroupNCCL::guessDeviceForRank), another GPU than this rank's on a
            # second node; with it the communicator is created eagerly on the right device.
            bound["device_id"] = self._torch_device
        else:
            self.transport = "gloo"
            self._torch_device = torch.device("cpu")
        addr = resolve_master_addr(rendezvous_address(env))  # mpirun across hosts: rank 0's
        warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
        dist.init_process_group(self.transport, init_method=f"tcp://{addr}:{env.master_port}",
                                rank=env.rank, world_size=env.world_size,
                                timeout=timedelta(seconds=timeout), **bound)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    @property
    def stream(self) -> Any:
        """Where CUDA events go: the current stream, which waits for every NCCL call (and
        where CUDA-graph launches run); None on CPUs."""
        return torch.cuda.current_stream() if self.device == "cuda" else None

    def new_group(self, name: str, ranks: list[int]) -> Group:
        handle = dist.new_group(ranks) if len(ranks) < self.world_size else dist.group.WORLD
        index = ranks.index(self.rank) if self.rank in ranks else -1
        return Group(name, tuple(ranks), index, handle)

    def empty(self, numel: int, dtype: str) -> torch.Tensor:
        return torch.zeros(numel, dtype=TORCH_DTYPES[dtype], device=self._torch_device)

    def bind(self, kind: str, group: Group, send: Any, recv: Any,
             peer_or_root: int | None, counts: tuple[int, ...] | None = None) -> BoundCall:
        pg = group.handle
        other = group.ranks[peer_or_root] if peer_or_root is not None else None
        match kind:
            case "allgather" if counts is not None:
                parts = list(recv.split(list(counts)))
                if self.transport == "gloo":  # gloo's allgather refuses unequal parts
                    return partial(_allgatherv_by_broadcasts, send, parts, group)
                return partial(dist.all_gather, parts, send, group=pg)
            case "reducescatter" if counts is not None:
                return partial(dist.reduce_scatter, recv, list(send.split(list(counts))),
                               group=pg)
            case "allreduce":
                return partial(dist.all_reduce, send, group=pg)
            case "allgather":
                return partial(_ALL_GATHER, recv, send, group=pg)
            case "reducescatter":
                return partial(_REDUCE_SCATTER, recv, send, group=pg)
            case "alltoall":
                return partial(dist.all_to_all_single, recv, send, group=pg)
            case "broadcast":
                return partial(dist.broadcast, send, src=other, group=pg)
            case "gather":
                # The root receives one slice per rank, in group order, into one buffer.
                slices = list(recv.view(group.size, -1).unbind(0)) if recv is not None else None
                return partial(dist.gather, send, slices, dst=other, group=pg)
            case "send":
                return partial(dist.send, send, dst=other, group=pg)
            case "recv":
                return partial(dist.recv, recv, src=other, group=pg)
        raise ValueError(f"torch backend cannot issue {kind!r}")

    def write(self, buffer: torch.Tensor, values: np.ndarray) -> None:
        buffer.copy_(torch.from_numpy(values).to(buffer.dtype))

    def read(self, buffer: torch.Tensor) -> np.ndarray:
        return buffer.detach().to("cpu", torch.float64).numpy()

    def barrier(self) -> None:
        if self.device == "cuda":  # this rank's GPU, never one guessed from the global rank
            dist.barrier(device_ids=[self._torch_device.index])
        else:
            dist.barrier()

    def synchronize(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def allgather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def versions(self) -> dict[str, Any]:
        info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
        if self.device == "cuda":
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            info["gpu"] = torch.cuda.get_device_name()
            # torch's ProcessGroupNCCL chooses (native ncclGather/ncclAlltoAll where its
            # build and NCCL have them); the nccl backend records "grouped send/recv".
            info["gather_alltoall"] = "ProcessGroupNCCL"
        return info

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _allgatherv_by_broadcasts(send: torch.Tensor, parts: list[torch.Tensor],
                              group: Group) -> None:
    """An uneven all-gather as vLLM's PyNcclCommunicator.all_gatherv issues it: one broadcast
    per rank of the group, each rank the root of its own part."""
    parts[group.index].copy_(send)
    for root, part in enumerate(parts):
        dist.broadcast(part, src=group.ranks[root], group=group.handle)
