"""The stand-in NCCL process group of torch.distributed, for the GPU tests run on stand-ins.

`init_process_group("nccl", device_id=...)` becomes a gloo group on the host (the bytes really
move, so --check compares real sums), and every collective of torch.distributed is issued
through the stand-in streams (tests/fake_torch_graphs.py): recorded into the graph that
captures, run now otherwise, and logged as NCCL logs it (tests/fake_nccl_wire.py). What
ProcessGroupNCCL refuses or does differently is enforced:
- point-to-point under capture: ProcessGroupNCCL's send/recv return no Work while a stream
  captures, so `dist.send`/`dist.recv` fail on `.wait()` of None ("'NoneType' object has no
  attribute 'wait'", pytorch/pytorch#133984 on torch 2.4, vllm-project/vllm#4412 on 2.3) and
  `isend`/`irecv`/`batch_isend_irecv` hand back None for a Work (the async path PR #148462
  addressed later);
- `device_id` and `barrier(device_ids=...)` must name this rank's own GPU (ProcessGroupNCCL
  would otherwise guess `rank % GPUs`, guessDeviceForRank);
- `destroy_process_group` while a graph that captured one of its collectives is alive raises:
  ProcessGroupNCCL's shutdown finalizes its communicators, and NCCL's commDestroySync waits
  for every such graph (NVIDIA/nccl src/init.cc @ 5067397c), i.e. a hang.
"""

import functools
import time
from typing import Any

from tests import fake_nccl_wire
from tests.fake_torch_graphs import Graph, Streams

# torch.distributed name -> NCCL's name of the call in its log (ncclFuncToString)
COLLECTIVES = {"all_reduce": "AllReduce", "all_gather": "AllGather",
               "all_gather_into_tensor": "AllGather", "all_gather_single": "AllGather",
               "reduce_scatter": "ReduceScatter", "reduce_scatter_tensor": "ReduceScatter",
               "reduce_scatter_single": "ReduceScatter", "all_to_all_single": "AlltoAll",
               "broadcast": "Broadcast", "gather": "Gather", "reduce": "Reduce"}
P2P = ("send", "recv", "isend", "irecv", "batch_isend_irecv")
_DTYPE_CODES = {"torch.bfloat16": 9, "torch.float16": 6, "torch.float32": 7, "torch.int64": 4,
                "torch.int32": 2, "torch.uint8": 1, "torch.int16": 9, "torch.int8": 0}


class _State:
    nccl = False  # the default group is the stand-in NCCL one
    log: fake_nccl_wire.NcclLog | None = None


def install(dist: Any, cuda: Any) -> None:
    streams: Streams = cuda.streams
    real_init = dist.init_process_group

    def init_process_group(backend: str | None = None, *args: Any, device_id: Any = None,
                           **kwargs: Any) -> None:
        if backend != "nccl":
            return real_init(backend, *args, device_id=device_id, **kwargs)
        current = cuda._need_device("init_process_group('nccl')")
        if device_id is not None and device_id.index != current:
            raise AssertionError(f"device_id {device_id} is not this rank's GPU {current}")
        real_init("gloo", *args, **kwargs)
        _State.nccl, _State.log = True, fake_nccl_wire.NcclLog()
        _State.log.comm_init(id(dist.group.WORLD), dist.get_rank(), dist.get_world_size(),
                             current)

    dist.init_process_group = init_process_group
    for name, nccl_name in COLLECTIVES.items():
        if hasattr(dist, name):
            setattr(dist, name, _collective(getattr(dist, name), nccl_name, dist, streams,
                                            cuda))
    import torch.distributed.distributed_c10d as c10d
    for name in P2P:
        wrapped = _p2p(getattr(dist, name), name, dist, streams, cuda)
        setattr(dist, name, wrapped)
        if name in ("isend", "irecv"):  # P2POp checks its op against c10d's own names
            setattr(c10d, name, wrapped)
    dist.barrier = _barrier(dist.barrier, dist, streams, cuda)
    dist.destroy_process_group = _destroy(dist.destroy_process_group)


def _group_of(dist: Any, kwargs: dict[str, Any]) -> Any:
    return kwargs.get("group") or dist.group.WORLD


def _log(dist: Any, cuda: Any, name: str, group: Any, tensor: Any, root: int = 0) -> None:
    if _State.log is None or tensor is None or not hasattr(tensor, "numel"):
        return
    size = dist.get_world_size(group) if group is not None else dist.get_world_size()
    _State.log.call(name, id(group), size, cuda.current or 0, tensor.numel(),
                    _DTYPE_CODES.get(str(tensor.dtype), 7), root, tensor.data_ptr(),
                    tensor.data_ptr(), cuda.streams.current().id)


def _collective(real: Any, nccl_name: str, dist: Any, streams: Streams,
                cuda: Any) -> Any:
    @functools.wraps(real)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not _State.nccl:
            return real(*args, **kwargs)
        group = _group_of(dist, kwargs)
        tensor = args[1] if nccl_name in ("AllGather", "ReduceScatter") and len(args) > 1 \
            and not isinstance(args[1], list) else (args[0] if args else None)
        root = kwargs.get("src", kwargs.get("dst", 0)) or 0

        def work() -> None:
            _log(dist, cuda, nccl_name, group, tensor, root)
            real(*args, **kwargs)
        streams.run(work, group, f"torch.distributed.{real.__name__}")
        return None
    return call


def _p2p(real: Any, name: str, dist: Any, streams: Streams, cuda: Any) -> Any:
    @functools.wraps(real)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not _State.nccl:
            return real(*args, **kwargs)
        if streams.capturing is not None:  # ProcessGroupNCCL hands back no Work
            if name in ("send", "recv"):
                raise AttributeError("'NoneType' object has no attribute 'wait'")
            return [None] if name == "batch_isend_irecv" else None
        streams.issued.append(streams.current().id)
        if name in ("send", "recv"):
            tensor = args[0] if args else kwargs.get("tensor")
            _log(dist, cuda, name.capitalize(), _group_of(dist, kwargs), tensor)
        return real(*args, **kwargs)
    return call


def _barrier(real: Any, dist: Any, streams: Streams, cuda: Any) -> Any:
    @functools.wraps(real)
    def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None) -> Any:
        if not _State.nccl:
            return real(group=group, async_op=async_op, device_ids=device_ids)
        streams.refuse("torch.distributed.barrier")  # it waits on the host
        if device_ids is not None and list(device_ids) != [cuda.current]:
            raise AssertionError(f"barrier(device_ids={device_ids}) is not this rank's GPU "
                                 f"{cuda.current}")
        streams.issued.append(streams.current().id)
        return real(group=group, async_op=async_op)
    return barrier


def dist_barrier() -> None:
    import torch.distributed.distributed_c10d as c10d
    c10d.barrier()


def _destroy(real: Any) -> Any:
    @functools.wraps(real)
    def destroy(group: Any = None) -> None:
        alive = [g for g in Graph.live if g.groups]
        if _State.nccl and alive:
            raise AssertionError(
                f"destroy_process_group would block: {len(alive)} live CUDA graph(s) captured "
                "its collectives (ProcessGroupNCCL shutdown -> NCCL commDestroySync)")
        if group is not None or not _State.nccl:
            real(group) if group is not None else real()
            return
        # The stand-in's own need, not NCCL's: rank 0 serves the store its peers' gloo
        # teardown still talks to, so it leaves only after every rank has torn down.
        import torch.distributed.distributed_c10d as c10d
        store, rank, size = c10d._get_default_store(), c10d.get_rank(), c10d.get_world_size()
        dist_barrier()
        real()
        _State.nccl = False
        store.add("infercomm-standin/destroyed", 1)
        deadline = time.monotonic() + 30
        while rank == 0 and time.monotonic() < deadline and \
                store.add("infercomm-standin/destroyed", 0) < size:
            time.sleep(0.01)
    return destroy
