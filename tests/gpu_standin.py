"""The GPU tests' stand-ins, put in place of CUDA, CuPy and NCCL for a whole process.

With INFERCOMM_GPU_STANDIN=1 in the environment, `microbench` (its package __init__, the one
hook the product has for this) calls `install()` before anything touches torch.cuda or CuPy,
in the pytest process and in every rank it launches (launchers pass the environment on:
torchrun, mpiexec, the replay's own --nproc launcher). Then:

- `import cupy` gives tests/fake_cupy.py, on INFERCOMM_GPU_STANDIN_GPUS devices (default 4);
- `import torch` gives the real (CPU) torch with torch.cuda replaced by the stand-in of
  tests/fake_torch_cuda.py and tests/fake_torch_graphs.py (that many GPUs, streams, events,
  graphs, the capture rules) and torch.distributed's NCCL by tests/fake_torch_nccl.py;
- `torch.distributed.TCPStore` refuses, as torch 2.3-2.6 do (pyproject allows >= 2.3), a
  server on the port where torchrun's agent already serves its store: its bind fails
  "address already in use", forgiven only by later torch (TCPStore.cpp: the bind error is
  ignored when TORCHELASTIC_USE_AGENT_STORE is on and the port is MASTER_PORT,
  pytorch/pytorch#147465), so code that passes on the CPU torch here passes on those too.

Nothing is imported until asked for: a process that never imports torch (the watchdog's
sentinel) pays nothing.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from typing import Any

ENV = "INFERCOMM_GPU_STANDIN"
GPUS_ENV = "INFERCOMM_GPU_STANDIN_GPUS"
_CUPY_NAMES = ("cupy", "cupy.cuda", "cupy.cuda.nccl")


def enabled(environ: Any = None) -> bool:
    """Only "1" turns the stand-ins on (microbench/__init__.py refuses any other value but
    "" and "0")."""
    return (os.environ if environ is None else environ).get(ENV, "") == "1"


def gpus() -> int:
    return int(os.environ.get(GPUS_ENV, "4"))


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """cupy: the stand-in modules; torch: the real one, patched once it has loaded."""

    def __init__(self) -> None:
        self.cupy: dict[str, Any] | None = None

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name in _CUPY_NAMES:
            return importlib.machinery.ModuleSpec(name, self, is_package=name != "cupy.cuda.nccl")
        if name == "torch":
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec("torch")
            finally:
                sys.meta_path.insert(0, self)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchAfter(spec.loader)
            return spec
        return None

    def create_module(self, spec: Any) -> Any:
        if self.cupy is None:
            from tests import fake_cupy
            self.cupy = fake_cupy.make_modules(devices=gpus(), wire=True)
        return self.cupy[spec.name]

    def exec_module(self, module: Any) -> None:
        pass


class _PatchAfter(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        patch_torch(module)


def patch_torch(torch: Any) -> None:
    if getattr(torch.cuda, "_infercomm_standin", False):
        return
    import torch.distributed as dist

    from tests import fake_torch_nccl
    from tests.fake_torch_cuda import FakeCuda
    cuda = FakeCuda(gpus()).install_standin(torch)
    fake_torch_nccl.install(dist, cuda)
    dist.TCPStore = _agent_port_refused(dist.TCPStore)
    torch.cuda._infercomm_standin = True


def _agent_port_refused(real: Any) -> Any:
    """TCPStore(...) as torch 2.3-2.6 build it: no second server on the agent's port."""
    def make(host_name: str, port: int, *args: Any, **kwargs: Any) -> Any:
        is_master = kwargs.get("is_master", args[1] if len(args) > 1 else False)
        if (is_master and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
                and str(port) == os.environ.get("MASTER_PORT")):
            raise RuntimeError(
                f"The server socket has failed to listen on any local network address. port: "
                f"{port}, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already "
                "in use (torchrun's agent serves its store there; torch before "
                "pytorch/pytorch#147465 does not forgive this bind)")
        return real(host_name, port, *args, **kwargs)
    return make


def install() -> None:
    """Idempotent; torch is patched now if it is loaded already, else when it loads."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())
    if "torch" in sys.modules:
        patch_torch(sys.modules["torch"])
