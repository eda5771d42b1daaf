"""Executing an all-reduce schedule (algorithms/schedules.py) over a backend's point-to-point.

One executor per backend, each with the backend's own send/receive and its own sum:
- mpi: MPI_Sendrecv (MPI_Send / MPI_Recv for the fold's one-way steps) on the communicator of
  the group, and MPI_Reduce_local with the very datatype and operation the library all-reduce
  of this backend uses (backends/mpi_reduce.py): MPICH's native bf16 sum where it has one,
  else the user-defined sum that widens both operands to fp32 and rounds back (ties to even).
  Device buffers are staged through their host mirror around the whole all-reduce.
- torch (gloo, or NCCL through torch.distributed): batch_isend_irecv of the two halves of a
  step, then `Tensor.add_`: for bf16, torch's CPU and CUDA kernels add in fp32 and round to
  nearest even once per pair, which is what gloo's sum (c10::BFloat16's operator+) and NCCL's
  bf16 sum do per received chunk.
- nccl (CuPy): ncclSend/ncclRecv inside ncclGroupStart/End on the backend's stream, and an
  element-wise kernel on that stream: bf16 widened to fp32, added, rounded to nearest even.

So every step adds two vectors once and rounds once, as the library's ring does; results are
bit-identical on every rank (each element's sum is computed on one rank, or symmetrically
as a + b and b + a), and exact for --check's small integers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from microbench.algorithms.schedules import Step

BoundCall = Callable[[], None]


def scratch_count(steps: list[Step]) -> int:
    return max((s.recv[1] for s in steps if s.reduce), default=0)


def _live(steps: list[Step]) -> list[Step]:
    """The steps with what they move: a direction with no elements is dropped (a zero-length
    chunk of a vector shorter than the group), on both of its ends, since the sender's count
    of a message is its receiver's; a step left with neither direction is dropped."""
    out = []
    for s in steps:
        to = s.send_to if s.send[1] else None
        frm = s.recv_from if s.recv[1] else None
        if to is not None or frm is not None:
            out.append(Step(to, s.send, frm, s.recv, s.reduce and frm is not None, s.local))
    return out


# --- mpi ---

def mpi_call(backend: Any, group: Any, buffer: Any, steps: list[Step],
             scratch: Any = None) -> BoundCall:
    import numpy as np

    comm, types, dtype = group.handle, backend.types, buffer.dtype
    host = buffer.host
    dt, op = types.mpi_type(dtype), types.sum_op(dtype)
    scratch = (np.zeros(scratch_count(steps), dtype=host.dtype) if scratch is None
               else scratch.host)
    staged = hasattr(buffer, "pull")
    live = _live(steps)

    def run() -> None:
        if staged:
            buffer.pull()
        for st in live:
            (s0, sc), (r0, rc) = st.send, st.recv
            target = scratch[:rc] if st.reduce else host[r0:r0 + rc]
            if st.send_to is not None and st.recv_from is not None:
                comm.Sendrecv([host[s0:s0 + sc], dt], st.send_to, 0, [target, dt],
                              st.recv_from, 0)
            elif st.send_to is not None:
                comm.Send([host[s0:s0 + sc], dt], st.send_to, 0)
            else:
                comm.Recv([target, dt], st.recv_from, 0)
            if st.reduce:
                op.Reduce_local([scratch[:rc], dt], [host[r0:r0 + rc], dt])
        if staged:
            buffer.push()
    return run


# --- torch.distributed (gloo, or NCCL through torch) ---

def torch_call(backend: Any, group: Any, tensor: Any, steps: list[Step],
               scratch: Any = None) -> BoundCall:
    import torch
    import torch.distributed as dist

    pg, ranks = group.handle, group.ranks
    if scratch is None:
        scratch = torch.zeros(scratch_count(steps), dtype=tensor.dtype, device=tensor.device)
    plan = []
    for st in _live(steps):
        (s0, sc), (r0, rc) = st.send, st.recv
        ops = []
        if st.send_to is not None:
            ops.append(dist.P2POp(dist.isend, tensor.narrow(0, s0, sc), ranks[st.send_to], pg))
        into = scratch.narrow(0, 0, rc) if st.reduce else tensor.narrow(0, r0, rc)
        if st.recv_from is not None:
            ops.append(dist.P2POp(dist.irecv, into, ranks[st.recv_from], pg))
        plan.append((ops, tensor.narrow(0, r0, rc) if st.reduce else None, into))

    def run() -> None:
        for ops, acc, incoming in plan:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            if acc is not None:
                acc.add_(incoming)
    return run


# --- NCCL through CuPy ---

BF16_ADD = """
float a = __uint_as_float(((unsigned int)x) << 16);
float b = __uint_as_float(((unsigned int)y) << 16);
unsigned int bits = __float_as_uint(a + b);
bits += 0x7FFFu + ((bits >> 16) & 1u);
z = (unsigned short)(bits >> 16);
"""


def require_nvrtc(cupy: Any) -> None:
    """CuPy compiles its element-wise kernels (the sum below) at first use with NVRTC
    (cupy_backends/cuda/libs/nvrtc.pyx @ 1cc03dd1), which the `cuda` extra's cupy-cuda12x
    wheel does not bring (its `ctk` extra does; so do a CUDA toolkit and the
    nvidia-cuda-nvrtc-cu12 wheel a CUDA build of torch installs): refused here, before any
    call, rather than failing in the first all-reduce."""
    try:
        nvrtc = getattr(cupy.cuda, "nvrtc", None)
        if nvrtc is None:
            import importlib
            nvrtc = importlib.import_module("cupy_backends.cuda.libs.nvrtc")
        nvrtc.getVersion()
    except Exception as err:  # CuPy raises its own errors when libnvrtc does not load
        from microbench.argtypes import UsageError
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise UsageError(f"--allreduce-algo on --backend nccl adds what arrives with a CuPy "
                         f"kernel that NVRTC compiles, and CuPy cannot load NVRTC here "
                         f"({reason}); pip install 'cupy-cuda12x[ctk]' (or "
                         "nvidia-cuda-nvrtc-cu12), or use --backend torch") from None


def cupy_adder(cupy: Any, stream: Any) -> Callable[[Any, int, Any, int, str], None]:
    """add(dst_array, dst_start, src_array, count, dtype): dst[start:start+count] += src[:count]
    on `stream`; bf16 (stored as uint16) through BF16_ADD."""
    require_nvrtc(cupy)
    kernel = cupy.ElementwiseKernel("uint16 x, uint16 y", "uint16 z", BF16_ADD,
                                    "infercomm_bf16_add")

    def add(dst: Any, start: int, src: Any, count: int, dtype: str) -> None:
        acc, incoming = dst[start:start + count], src[:count]
        with stream:
            if dtype == "bf16":
                kernel(incoming, acc, acc)
            else:
                cupy.add(acc, incoming, out=acc)
    return add


def nccl_call(backend: Any, group: Any, buffer: Any, steps: list[Step],
              scratch: Any = None,
              add: Callable[[Any, int, Any, int, str], None] | None = None) -> BoundCall:
    """ncclSend/ncclRecv of each step in one NCCL group (ncclSendrecv's pattern), then the
    sum of what arrived, all on the backend's stream; peers are indices of the group's
    communicator."""
    nccl, comm, stream = backend._nccl, group.handle, backend.stream
    dt, size, dtype = backend._types[buffer.dtype], buffer.array.itemsize, buffer.dtype
    if scratch is None:
        scratch = backend.empty(max(scratch_count(steps), 1), dtype)
    add = add or cupy_adder(backend._cp, stream)
    live = _live(steps)

    def run() -> None:
        s = stream.ptr
        for st in live:
            (s0, sc), (r0, rc) = st.send, st.recv
            target = scratch.ptr if st.reduce else buffer.ptr + r0 * size
            nccl.groupStart()
            try:
                if st.send_to is not None:
                    comm.send(buffer.ptr + s0 * size, sc, dt, st.send_to, s)
                if st.recv_from is not None:
                    comm.recv(target, rc, dt, st.recv_from, s)
            finally:
                nccl.groupEnd()
            if st.reduce:
                add(buffer.array, r0, scratch.array, rc, dtype)
    return run


EXECUTORS: dict[str, Callable[..., BoundCall]] = {
    "mpi": mpi_call, "torch": torch_call, "nccl": nccl_call}
