"""Stand-in CUDA memory: what `torch.zeros(..., device="cuda")` gives on the stand-ins
(tests/fake_torch_graphs.py), host memory that only a CUDA-aware library may be handed.

On a GPU a CUDA tensor's address is device memory. mpi4py hands a tensor to MPI through
DLPack (its `__dlpack__`) with no check of its own: "Whether or not a MPI call can work for
GPU arrays depends on the underlying MPI implementation, not on mpi4py" (mpi4py
docs/source/overview.rst, "Support for GPU-aware MPI" @ 1e12c8cc). An MPI library that is not
CUDA-aware then reads the device pointer as host memory: a crash or garbage, never a clean
error. Here the stand-in tensor's DLPack export raises instead when the MPI library this
process loaded says it is not CUDA-aware (MPIX_Query_cuda_support() is 0, or the library has
no such function: MPICH and Open MPI export it where they are built with CUDA), so a backend
that hands device buffers to such an MPI fails its test rather than passing on host memory.

The subclass adds nothing else: every operation on it gives a plain tensor (torch's
`_disabled_torch_function_impl`), so only the device allocation itself carries the rule.
"""

import ctypes
import functools
from typing import Any

import torch


@functools.cache
def _cuda_support_of(path: str) -> bool | None:
    try:
        query = ctypes.CDLL(path).MPIX_Query_cuda_support
    except (OSError, AttributeError):
        return None
    return bool(query())


def mpi_cuda_aware() -> bool | None:
    """What the MPI library loaded in this process says (None: no MPI library is loaded)."""
    with open("/proc/self/maps") as maps:
        libs = sorted({line.split()[-1] for line in maps if "libmpi" in line and ".so" in line})
    if not libs:
        return None
    return any(_cuda_support_of(path) for path in libs)


class DeviceTensor(torch.Tensor):
    """A stand-in CUDA tensor (host memory underneath)."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        if mpi_cuda_aware() is False:
            raise BufferError(
                "device memory handed to an MPI library that is not CUDA-aware "
                "(MPIX_Query_cuda_support() is 0 or absent): it would read the device "
                "pointer as host memory (a crash or garbage); stage through host buffers")
        return super().__dlpack__(*args, **kwargs)


def on_device(tensor: Any) -> Any:
    """`tensor` (made on the host) as the stand-in's CUDA memory."""
    return tensor.as_subclass(DeviceTensor)
