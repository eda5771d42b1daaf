"""PyTorch profiler traces (Kineto JSON, `.json` or `.json.gz`, one file per rank), read
incrementally: the `traceEvents` array is decoded one event at a time from chunks of text,
so a file is never held whole in memory.

What torch emits, seen on torch 2.13 (CPU, gloo) and in `torch/csrc/profiler/util.h`:
- c10d ops as `cpu_op` events: `c10d::allreduce_`, `c10d::_allgather_base_`,
  `c10d::_reduce_scatter_base_`, `c10d::gather_`, `c10d::broadcast_`, `c10d::send`,
  `c10d::recv_`, `c10d::alltoall_base_`, with `Input Dims`, `Input type` and `Concrete Inputs`
  (root / peer). A TensorList argument's type is written "TensorList": its dtype comes from
  the backend's own event (`gloo:all_reduce` ...), paired by kind and order (GLOO_RECORDED_AS).
- On NCCL, `record_param_comms` with `Collective name`, `dtype`, `In msg nelems`,
  `Out msg nelems`, `Group size`, `Process Group Name`: preferred where present.
- `ProfilerStep#N` annotations (a profiler schedule, `prof.step()`) mark step boundaries.
- vLLM V1's own custom ops, registered in `vllm/distributed/parallel_state.py` (vllm-project/
  vllm @ 0c175ae9, `direct_register_custom_op` of `all_reduce(tensor, group_name)`,
  `reduce_scatter(tensor, dim, world_size, group_name)`, `all_gather(tensor, dim, world_size,
  group_name)`, and `patched_fused_scaled_matmul_reduce_scatter`, named only):
  `vllm::all_reduce`, `vllm::all_gather`, `vllm::reduce_scatter` cpu_ops with exact shapes;
  they wrap whatever runs below (`symm_mem::multimem_all_reduce_`, custom all-reduce, or
  c10d), so the events nested inside them are not counted again.
- torch up to about 2.1: `record_param_comms` without `Collective name`, c10d ops whose
  TensorList has no dims; the sizes live in the backend's `nccl:all_reduce`, `nccl:all_to_all`,
  `nccl:_all_gather_base` ... user annotations (`torch/csrc/distributed/c10d/
  ProcessGroupNCCL.cpp` of v1.13/v2.0 names them "nccl:" + the op in `collective()`). Of the
  three sources, the one that sizes the most calls is read.
- Traces recorded without `record_shapes=True` carry no dims: the calls are counted, with
  size unknown (0 elements, dtype "unknown"), and a note says so.
- DeepEP's kernels (`deep_ep::internode::dispatch<...>`, `...::combine<...>`, intranode and
  internode_ll alike; deepseek-ai/DeepEP csrc/kernels) are EP dispatch / combine all-to-alls
  whose sizes no kernel event records: counted and named in `Trace.ep_kernels`.
"""

import json
import re
import zlib
from bisect import bisect_right
from collections import Counter, defaultdict
from math import prod
from pathlib import Path
from typing import Any

from patterns.errors import ConfigError
from patterns.traces.calls import Call, RankCalls, Trace
from patterns.traces.kineto_shm import SHM_NOT_CALLS, SHM_OPS, shm_calls
from patterns.traces.kineto_stream import iter_events

# torch scalar type names, as `Input type` (C++ names) and record_param_comms `dtype` spell them.
TORCH_DTYPES = {
    "c10::BFloat16": "bf16", "BFloat16": "bf16", "c10::Half": "fp16", "Half": "fp16",
    "float": "fp32", "Float": "fp32", "double": "fp64", "Double": "fp64",
    "long int": "int64", "long": "int64", "Long": "int64", "int": "int32", "Int": "int32",
    "unsigned char": "uint8", "Byte": "uint8", "signed char": "int8", "Char": "int8",
    "bool": "bool", "Bool": "bool", "c10::Float8_e4m3fn": "fp8e4m3", "Float8_e4m3fn": "fp8e4m3",
    "c10::Float8_e5m2": "fp8e5m2", "Float8_e5m2": "fp8e5m2",
}

# c10d op -> (project op, index of the input tensor in Input Dims, index of root/peer in
# Concrete Inputs or None). Signatures: torch/csrc/distributed/c10d/Ops.cpp.
C10D_OPS: dict[str, tuple[str, int, int | None]] = {
    "c10d::allreduce_": ("allreduce", 0, None),
    "c10d::_allgather_base_": ("allgather", 1, None),
    "c10d::allgather_into_tensor_coalesced_": ("allgather", 1, None),
    "c10d::_reduce_scatter_base_": ("reducescatter", 1, None),
    "c10d::gather_": ("gather", 1, 3),
    "c10d::broadcast_": ("broadcast", 0, 2),
    "c10d::send": ("send", 0, 2),
    "c10d::recv_": ("recv", 0, 2),
    "c10d::alltoall_base_": ("alltoall", 1, None),
    "c10d::reduce_": ("reduce", 0, 3),  # (tensors, pg, reduce_op, root_rank, ...)
    "c10d::allgather_": ("allgather", 1, None),  # (output lists, inputs, pg, ...)
}

# The backends' own events: gloo:all_reduce, nccl:all_reduce, ...
BACKEND_OPS = {"all_reduce": "allreduce", "all_gather": "allgather",
               "all_gather_into_tensor": "allgather", "_allgather_base": "allgather",
               "_all_gather_base": "allgather",
               "reduce_scatter": "reducescatter", "reduce_scatter_tensor": "reducescatter",
               "_reduce_scatter_base": "reducescatter", "gather": "gather",
               "broadcast": "broadcast", "send": "send", "recv": "recv",
               "all_to_all": "alltoall", "alltoall_base": "alltoall", "reduce": "reduce",
               "scatter": "scatter"}

# The backend event a c10d op's work is recorded under, where not its own kind: gloo runs
# `_reduce_scatter_base_` as an all-reduce of its input (torch 2.13: `reduce_scatter_tensor(out
# [3, 8], in [6, 8])` records `gloo:all_reduce` [[6, 8]]), taking a turn among all-reduces.
GLOO_RECORDED_AS = {"reducescatter": "allreduce"}

# record_param_comms `Collective name` -> project op (ProcessGroupNCCL.cpp RECORD_PARAM_COMMS).
PARAM_COMMS_OPS = {"allreduce": "allreduce", "allreduce_coalesced": "allreduce",
                   "allgather": "allgather", "_allgather_base": "allgather",
                   "all_gather_into_tensor_coalesced": "allgather",
                   "allgather_into_tensor_coalesced": "allgather",
                   "reduce_scatter": "reducescatter", "_reduce_scatter_base": "reducescatter",
                   "reduce_scatter_tensor_coalesced": "reducescatter", "broadcast": "broadcast",
                   "_broadcast_oop": "broadcast", "gather": "gather", "send": "send",
                   "recv": "recv", "all_to_all": "alltoall", "alltoall_base": "alltoall",
                   "reduce": "reduce", "scatter": "scatter"}


# record_param_comms records that are not calls: the work's wait (torch's ProcessGroupNCCL.cpp,
# WorkNCCL::wait: RECORD_PARAM_COMMS(..., "wait", 0, 0, at::kByte, ...), one a waited call);
# neither counted nor "not understood".
PARAM_COMMS_NOT_CALLS = frozenset({"wait"})


# vLLM's custom ops -> (project op, index of world_size in Concrete Inputs or None).
VLLM_OPS: dict[str, tuple[str, int | None]] = {
    "vllm::all_reduce": ("allreduce", None), "vllm::all_gather": ("allgather", 2),
    "vllm::reduce_scatter": ("reducescatter", 2)}

# the other collective ops parallel_state.py registers (the fused matmul + reduce-scatter)
_VLLM_FUSED = ("_reduce_scatter", "_all_gather", "_all_reduce")
_DEEPEP = re.compile(r"ep::(?:internode_ll|internode|intranode)::(dispatch|combine)\b(?!_)")
NO_SHAPES = ("sizes unknown: the trace was recorded without shapes; profile with "
             "torch.profiler.profile(record_shapes=True) to read them")


def _dims(args: dict[str, Any], index: int) -> list[Any] | None:
    dims = args.get("Input Dims")
    if not isinstance(dims, list) or index >= len(dims):
        return None
    return dims[index]


def _numel(dims: Any) -> int | None:
    """Elements of a tensor's dims, or of a TensorList's (sum over its tensors)."""
    if not isinstance(dims, list):
        return None
    if dims and isinstance(dims[0], list):
        if not all(isinstance(d, list) and all(isinstance(x, int) for x in d) for d in dims):
            return None  # a list of lists of tensors: not one rank's input
        return sum(prod(d) for d in dims)
    return prod(dims) if all(isinstance(x, int) for x in dims) else None


def _concrete_int(args: dict[str, Any], index: int | None) -> int | None:
    values = args.get("Concrete Inputs")
    if index is None or not isinstance(values, list) or index >= len(values):
        return None
    try:
        return int(values[index])
    except (TypeError, ValueError):
        return None


def _torch_dtype(name: Any) -> str | None:
    return TORCH_DTYPES.get(name) if isinstance(name, str) else None


def _pg_sizes(info: dict[str, Any] | None, rank: int) -> set[int]:
    """Sizes of the process groups this rank belongs to (distributedInfo.pg_config); where
    the trace has no process-group table (torch before 2.3 writes none), the job's
    `world_size`: its one group."""
    sizes = set()
    if info and not info.get("pg_config") and isinstance(info.get("world_size"), int) \
            and info["world_size"] > 1:
        return {info["world_size"]}
    for pg in (info or {}).get("pg_config") or []:
        ranks = pg.get("ranks")
        if isinstance(ranks, list) and len(ranks) < 2:
            continue  # a group of one rank (a PP group at pp=1) says nothing of the others
        if isinstance(ranks, list) and rank in ranks:
            sizes.add(len(ranks))
        elif isinstance(pg.get("pg_size"), int) and not isinstance(ranks, list):
            sizes.add(pg["pg_size"])
    return sizes


def read_kineto(path: Path, trace: Trace, default_rank: int) -> RankCalls:
    """Read one rank's Kineto trace into `trace`; return that rank's calls."""
    header: dict[str, Any] = {"distributedInfo": None, "host_name": None}
    raw = _Raw()
    try:
        for event in iter_events(path, header):
            if isinstance(event, dict) and event.get("ph") == "X":
                raw.add(event, trace)
    except (json.JSONDecodeError, ValueError, UnicodeDecodeError, OSError, EOFError,
            RecursionError, zlib.error) as err:
        raise ConfigError(f"{path}: not a readable Kineto JSON trace ({err}); pass the "
                          ".json or .json.gz that torch.profiler exported") from None
    except (TypeError, KeyError, AttributeError, IndexError) as err:
        raise ConfigError(f"{path}: a Kineto event field of an unexpected type ({err!r}); "
                          "pass the .json or .json.gz that torch.profiler exported") from None

    info = header["distributedInfo"] if isinstance(header["distributedInfo"], dict) else None
    rank = info.get("rank") if info else None
    rank = rank if isinstance(rank, int) else default_rank
    try:
        sizes = _pg_sizes(info, rank)
        only_size = next(iter(sizes)) if len(sizes) == 1 else None
        host = header["host_name"] if isinstance(header["host_name"], str) else None
        # the host where the trace names one (most Kineto files do not)
        calls = RankCalls(rank=rank, name=f"{host}:rank{rank} ({path.name})" if host
                          else f"rank{rank} ({path.name})")
        timed = raw.calls(only_size, trace)
    except (TypeError, KeyError, AttributeError, IndexError, ValueError) as err:
        raise ConfigError(f"{path}: a Kineto field of an unexpected type ({err!r}); pass "
                          "the .json or .json.gz that torch.profiler exported") from None
    for kind, count in raw.ep.items():
        trace.ep_kernels[kind] += count
    timed.sort(key=lambda tc: tc[0])  # stable: one event's calls keep their order
    calls.shm_send_lists = raw.shm_send_lists
    for _, call in timed:
        calls.ids.append(trace.intern(call))
    if raw.steps:
        raw.steps.sort()
        starts, i = [], 0
        for start in raw.steps:
            while i < len(timed) and timed[i][0] < start:
                i += 1
            starts.append(i)
        # calls before the first annotation belong to no step; they start the list
        calls.step_starts = sorted(set(([0] if starts and starts[0] > 0 else []) + starts))
        calls.step_starts = [s for s in calls.step_starts if s < len(timed)]
    return calls


class _Raw:
    """The events of one file that may be calls, by source, before one source is chosen."""

    def __init__(self) -> None:
        self.vllm: list[tuple[float, float, Call]] = []  # (start, end, call)
        self.shm: list[tuple[float, str, dict[str, Any]]] = []  # vLLM CPU's _C::shm_* ops
        self.shm_send_lists: list[int] = []  # the tensors of each shm send, in order
        self.param: list[tuple[float, Call | None, str]] = []
        self.c10d: list[tuple[float, str, dict[str, Any]]] = []
        self.backend: list[tuple[float, str, int | None, str | None]] = []
        self.gloo = False  # the backend events are gloo's (GLOO_RECORDED_AS)
        self.steps: list[float] = []
        self.ep: Counter = Counter()

    def add(self, event: dict[str, Any], trace: Trace) -> None:
        name = event.get("name")
        if not isinstance(name, str):
            return
        args = event.get("args") or {}
        if not isinstance(args, dict):
            raise ValueError(f"event {name!r} has args of type {type(args).__name__}")
        for key in ("Input Dims", "Input type", "Concrete Inputs"):
            if not isinstance(args.get(key, []), list):
                raise TypeError(f"{key} of event {name!r} is a "
                                f"{type(args[key]).__name__}, not a list")
        ts = event.get("ts") or 0.0
        if not isinstance(ts, (int, float)):
            raise ValueError(f"event {name!r} has a ts of type {type(ts).__name__}")
        if name == "record_param_comms":
            self.param.append((ts, _param_comms_call(args), str(args.get("Collective name"))))
        elif name.startswith("c10d::"):
            if name in C10D_OPS:
                self.c10d.append((ts, name, args))
            else:
                trace.unparsed += 1
                trace.unknown[name] += 1
        elif name.startswith(("gloo:", "nccl:")):
            if event.get("cat") == "gpu_user_annotation":
                return  # the GPU-side copy of the same annotation
            op = BACKEND_OPS.get(name.split(":", 1)[1])
            if op is None:
                trace.unparsed += 1
                trace.unknown[name] += 1
                return
            types = args.get("Input type") or [None]
            dims = args.get("Input Dims") or [None]
            self.gloo = self.gloo or name.startswith("gloo:")
            self.backend.append((ts, op, _numel(dims[0]), _torch_dtype(types[0])))
        elif name in VLLM_OPS:
            op, size_at = VLLM_OPS[name]
            types = args.get("Input type") or [None]
            numel = _numel(_dims(args, 0))
            dur = event.get("dur") or 0.0
            self.vllm.append((ts, ts + (dur if isinstance(dur, (int, float)) else 0.0), Call(
                op=op, numel=numel or 0, dtype=_torch_dtype(types[0]) or "unknown",
                group_size=_concrete_int(args, size_at))))
        elif name in SHM_OPS:
            self.shm.append((ts, name, args))
        elif name.startswith("_C::shm_") and name not in SHM_NOT_CALLS:
            trace.unparsed += 1
            trace.unknown[name] += 1
        elif name.startswith("vllm::") and name.endswith(_VLLM_FUSED):
            # e.g. vllm::patched_fused_scaled_matmul_reduce_scatter: a matmul fused with its
            # reduce-scatter inside symmetric memory; the reduced tensor is not an argument
            trace.unparsed += 1
            trace.unknown[f"{name} (vLLM matmul fused with a collective, not sized)"] += 1
        elif name.startswith("ProfilerStep#"):
            self.steps.append(ts)
        elif event.get("cat") == "kernel" and "ep::" in name:
            m = _DEEPEP.search(name)
            if m:
                self.ep[f"EP {m[1]}"] += 1

    def calls(self, only_size: int | None, trace: Trace) -> list[tuple[float, Call]]:
        """vLLM's ops, then the source (record_param_comms, c10d, backend annotations) that
        sizes the most of the calls outside them."""
        spans = sorted((s, e) for s, e, _ in self.vllm)
        starts = [s for s, _ in spans]

        def outside(ts: float) -> bool:
            i = bisect_right(starts, ts) - 1
            return i < 0 or ts > spans[i][1]

        # vllm::all_reduce names its group only by vLLM's unique name: the size is the
        # trace's one process-group size where there is one
        timed = [(s, c if c.group_size is not None else
                  Call(c.op, c.numel, c.dtype, only_size)) for s, _, c in self.vllm]
        for ts, name, args in sorted(self.shm, key=lambda e: e[0]):
            found = shm_calls(name, args, _torch_dtype, only_size)
            if found is None:
                trace.unparsed += 1
                trace.unknown[f"{name} (arguments not as its signature)"] += 1
            elif found[0].op == "send":
                self.shm_send_lists.append(len(found))
            timed += [(ts, call) for call in found or ()]
        param = [(ts, c, n) for ts, c, n in self.param if outside(ts)]
        c10d = [e for e in self.c10d if outside(e[0])]
        backend = [e for e in self.backend if outside(e[0])]
        from_param = [(ts, c) for ts, c, _ in param if c is not None]
        from_c10d = _from_c10d(c10d, backend, only_size, self.gloo)
        sized_c10d = [(ts, c) for ts, c in from_c10d if c is not None]
        from_backend = [(ts, Call(op=op, numel=numel or 0, dtype=dtype or "unknown",
                                  group_size=only_size)) for ts, op, numel, dtype in backend]
        sized_backend = sum(1 for e in backend if e[2] is not None)
        best = max((len(from_param), 2, "param"), (len(sized_c10d), 1, "c10d"),
                   (sized_backend, 0, "backend"))
        if best[0] == 0:  # no size anywhere: count the calls of the fullest source
            unsized = max((len(backend), 1, "backend"), (len(c10d), 0, "c10d"))
            if unsized[0]:
                trace.notes.append(NO_SHAPES)
                return timed + (from_backend if unsized[2] == "backend" else [
                    (ts, Call(op=C10D_OPS[name][0], numel=0, dtype="unknown",
                              group_size=only_size)) for ts, name, _ in c10d])
            return timed
        if best[2] == "param":
            for _, c, collective in param:
                if c is None and collective not in PARAM_COMMS_NOT_CALLS:
                    trace.unparsed += 1
                    trace.unknown[f"record_param_comms {collective}"] += 1
            return timed + from_param
        if best[2] == "c10d":
            for (_, c), (_, name, _) in zip(from_c10d, sorted(c10d, key=lambda e: e[0]),
                                            strict=True):
                if c is None:
                    trace.unparsed += 1
                    trace.unknown[f"{name} without Input Dims (record_shapes off?)"] += 1
            return timed + sized_c10d
        return timed + from_backend


def _param_comms_call(args: dict[str, Any]) -> Call | None:
    op = PARAM_COMMS_OPS.get(args.get("Collective name"))
    dtype = _torch_dtype(args.get("dtype"))
    numel = args.get("In msg nelems")
    if op is None or dtype is None or not isinstance(numel, int):
        return None
    size = args.get("Group size")
    peer = args.get("Rank") if op in ("send", "recv") else None
    return Call(op=op, numel=numel, dtype=dtype,
                group_size=size if isinstance(size, int) else None,
                group=str(args.get("Process Group Name")) if "Process Group Name" in args
                else None, peer=peer if isinstance(peer, int) else None)


def _from_c10d(events: list[tuple[float, str, dict[str, Any]]],
               backend: list[tuple[float, str, int | None, str | None]],
               only_size: int | None, gloo: bool = False) -> list[tuple[float, Call | None]]:
    """c10d events (None where unsized); a TensorList's dtype comes from the k-th backend event
    of the kind its work is recorded under (GLOO_RECORDED_AS); gloo runs them in order."""
    of_kind: dict[str, list[tuple[int | None, str | None]]] = defaultdict(list)
    for _, op, numel, dtype in sorted(backend, key=lambda e: e[0]):
        of_kind[op].append((numel, dtype))
    used: dict[str, int] = defaultdict(int)
    recorded_as = GLOO_RECORDED_AS if gloo and "reducescatter" not in of_kind else {}
    out: list[tuple[float, Call | None]] = []
    for ts, name, args in sorted(events, key=lambda e: e[0]):
        op, index, target = C10D_OPS[name]
        types = args.get("Input type") or []
        numel = _numel(_dims(args, index))
        if numel == 1 and index < len(types) and types[index] == "TensorList" \
                and _dims(args, index) == []:
            numel = None  # torch <= 2.1 writes a TensorList's dims as []: no size
        dtype = _torch_dtype(types[index]) if index < len(types) else None
        kind = recorded_as.get(op, op)
        k = used[kind]
        used[kind] += 1
        if dtype is None and k < len(of_kind.get(kind, ())):
            b_numel, b_dtype = of_kind[kind][k]
            if b_numel == numel:
                dtype = b_dtype
        if numel is None:
            out.append((ts, None))
            continue
        size = only_size
        if op in ("allgather", "reducescatter"):
            other = _numel(_dims(args, 0))
            if other and numel:
                size = other // numel if op == "allgather" else numel // other
        value = _concrete_int(args, target)
        out.append((ts, Call(op=op, numel=numel, dtype=dtype or "unknown", group_size=size,
                             peer=value if op in ("send", "recv") else None,
                             root=value if op in ("gather", "broadcast", "reduce") else None)))
    return out
