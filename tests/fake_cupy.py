"""A stand-in for the few CuPy names the nccl backend, its graphs and CudaMarks use, on host
memory: at world size 1 NCCL calls are memory copies (a sum over one rank is its input) and
send and receive pair up at groupEnd; a communicator of several ranks (separate processes)
moves the bytes over gloo (tests/fake_nccl_wire.py). A capturing stream records calls that
its graph replays on the buffers' current contents, as a CUDA graph does.

Not CuPy: it checks the backend's pointers, sizes, grouping and stream use on a CPU, and it
refuses what the real libraries refuse or hang on (docs/../shared/reference/gpu_review.md,
section 6):
- a communicator is not destroyed while a graph that captured one of its calls is alive:
  ncclCommDestroy/ncclCommFinalize loop in commDestroySync until every such graph is gone
  (NVIDIA/nccl src/init.cc @ 5067397c), i.e. hang; here it raises instead;
- while a stream captures, host syncs (Stream.synchronize), memory queries (memGetInfo),
  host copies (Array.get/set), communicator creation, CUDA events and any call on another
  stream raise CaptureError, as CUDA invalidates or refuses them inside a capture;
- the NcclCommunicator methods have the parameter names of CuPy's own
  cupy_backends/cuda/libs/nccl.pyx (NCCL_PYX_SIGNATURES below; tests/test_fake_cupy.py
  compares them with the .pyx when CuPy's source is at hand);
- every pointer a call or a graph uses lies in a live array (CuPy returns a freed array's
  block to its pool and hands it out again: cupy/cuda/memory.pyx `_arena` @ v14.2.0);
- elapsed time needs two events recorded on one stream, no call issued on another stream
  between them, and that stream synchronized after the later one (cudaEventElapsedTime
  answers cudaErrorNotReady before; cupy/cuda/stream.pyx get_elapsed_time);
- no capture on the legacy stream (stream.pyx begin_capture: "cannot capture on the default
  (legacy) stream" @ v14.2.0);
- with NCCL_GRAPH_MIXING_SUPPORT=0, an eager call on a communicator while a launched graph
  that captured it may still run (no synchronize since) raises: NCCL's env.rst says that
  case is not supported ("observed hangs") @ 5067397c.
"""

import importlib.machinery
import os
import types
from functools import partial

from tests import fake_nccl_wire
from tests.fake_cupy_cuda import (  # noqa: F401  (names the tests use)
    Array,
    CaptureError,
    Event,
    Graph,
    NotReady,
    Stream,
    _copy,
    _Device,
    _on,
    _refuse_in_capture,
    get_elapsed_time,
)
from tests.fake_cupy_nccl import (  # noqa: F401
    NCCL_PYX_SIGNATURES,
    NCCL_PYX_SIGNATURES_13,
    REDUCTIONS,
    Communicator,
    NcclError,
    group_end,
    group_start,
)

NVRTC_ENV = "INFERCOMM_GPU_STANDIN_NVRTC"  # "0": a node whose CuPy finds no libnvrtc


def _nvrtc_version() -> tuple[int, int]:
    """cupy.cuda.nvrtc.getVersion(); without NVRTC, what CuPy says when libnvrtc does not
    load (the cupy-cuda12x wheel does not bring it; its `ctk` extra does)."""
    if os.environ.get(NVRTC_ENV) == "0":
        raise RuntimeError("CuPy failed to load libnvrtc.so.12: OSError: libnvrtc.so.12: "
                           "cannot open shared object file: No such file or directory")
    return 12, 4


def make_modules(version: str = "14.2.0", devices: int = 1,
                 wire: bool | None = None) -> dict[str, types.ModuleType]:
    """sys.modules entries for cupy, cupy.cuda and cupy.cuda.nccl, on `devices` GPUs; `wire`
    (default: more than one GPU) makes unique ids that communicators of several processes
    meet by (tests/fake_nccl_wire.py), which a node of one GPU each needs too."""
    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.available = True
    for name, value in dict(**REDUCTIONS, NCCL_UINT8=1, NCCL_INT32=2, NCCL_INT64=4,
                            NCCL_FLOAT16=6, NCCL_FLOAT32=7, NCCL_BFLOAT16=9).items():
        setattr(nccl, name, value)
    nccl.NcclCommunicator, nccl.NcclError = Communicator, NcclError
    wired = devices > 1 if wire is None else wire
    nccl.get_unique_id = fake_nccl_wire.unique_id if wired else (lambda: bytes(range(128)))
    nccl.get_version = lambda: 22703
    nccl.groupStart, nccl.groupEnd = group_start, group_end

    def memcpy_async(dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        assert kind == 3
        _on(stream, _copy(dst, src, nbytes))

    def mem_get_info() -> tuple[int, int]:
        _refuse_in_capture("cudaMemGetInfo")
        return 8 << 30, 16 << 30

    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: devices, memcpyAsync=memcpy_async, memcpyDeviceToDevice=3,
        memGetInfo=mem_get_info,
        getDeviceProperties=lambda dev: {"name": b"Stand-in GPU (tests/fake_cupy.py)"},
        runtimeGetVersion=lambda: 12040, driverGetVersion=lambda: 12080)
    cuda = types.ModuleType("cupy.cuda")
    cuda.nccl, cuda.runtime, cuda.Stream, cuda.Event = nccl, runtime, Stream, Event
    cuda.nvrtc = types.SimpleNamespace(getVersion=_nvrtc_version)
    cuda.Device = partial(_Device, devices)
    cuda.get_elapsed_time = get_elapsed_time
    cupy = types.ModuleType("cupy")
    cupy.__version__, cupy.cuda = version, cuda
    cupy.zeros = lambda numel, dtype: Array(numel, dtype)
    modules = {"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.nccl": nccl}
    for name, module in modules.items():  # importlib.util.find_spec reads it
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    return modules
