"""A stand-in for `torch.cuda` on a CPU machine that enforces the order a real node needs.

Installed over the real module's functions with `monkeypatch` (`FakeCuda(2).install(mp)`):

- `device_count`/`is_available` are free (cudaGetDeviceCount creates no context);
- `set_device(i)` refuses i >= count (cudaSetDevice returns cudaErrorInvalidDevice) and logs
  whether MPI was already initialised at that moment (UCX binds its NIC from the device current
  at MPI_Init: NVIDIA HPC-X docs, multi-gpu support);
- every query that creates or reads a context (`current_device`, `mem_get_info`,
  `get_device_name`, `synchronize`, `current_stream`) before any `set_device` raises: on a real
  node it would create a context on GPU 0 for every rank (torch/cuda/memory.py mem_get_info
  takes `current_device()` when no device is given), which is what the tests must catch;
- `mem_get_info(d)` for a device other than the selected one raises too: it would read, and
  make a context on, another rank's GPU.

`calls` is the order of everything asked, for the tests to assert on.

For the GPU tests run on stand-ins (INFERCOMM_GPU_STANDIN=1, tests/gpu_standin.py),
`install_standin` also gives it streams, timing events and CUDA graphs with the rules torch and
CUDA enforce (tests/fake_torch_graphs.py), and makes `torch.zeros(..., device="cuda")` a host
tensor, only on this rank's selected device.
"""

import sys
from typing import Any


class CudaOrderError(AssertionError):
    """What a real node would have done wrong, named."""


class _Stream:
    def __init__(self, cuda: "FakeCuda") -> None:
        self._cuda = cuda

    def synchronize(self) -> None:
        self._cuda.calls.append(("stream.synchronize", self._cuda.current))

    def wait_stream(self, other: Any) -> None:
        pass


def mpi_initialized() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    return bool(mpi is not None and mpi.Is_initialized())


class FakeCuda:
    def __init__(self, count: int, free: int = 80 << 30) -> None:
        self.count, self.free = count, free
        self.current: int | None = None
        self.calls: list[tuple[Any, ...]] = []

    # --- free of a context ---
    def is_available(self) -> bool:
        return self.count > 0

    def device_count(self) -> int:
        return self.count

    def set_device(self, device: Any) -> None:
        index = device if isinstance(device, int) else device.index
        self.calls.append(("set_device", index, mpi_initialized()))
        if not 0 <= index < self.count:
            raise CudaOrderError(f"cudaErrorInvalidDevice: device {index} of {self.count}")
        self.current = index

    # --- a context is needed ---
    def _need_device(self, what: str) -> int:
        if self.current is None:
            raise CudaOrderError(f"{what} before set_device: a context on GPU 0 for this rank")
        return self.current

    def current_device(self) -> int:
        self.calls.append(("current_device",))
        return self._need_device("current_device()")

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        self.calls.append(("mem_get_info", device))
        current = self._need_device("mem_get_info()")
        asked = current if device is None else (device if isinstance(device, int)
                                                else device.index)
        if asked != current:
            raise CudaOrderError(f"mem_get_info({asked}) reads another GPU than this rank's "
                                 f"({current})")
        return self.free, self.free * 2

    def get_device_name(self, device: Any = None) -> str:
        self._need_device("get_device_name()")
        return "Stand-in GPU (tests/fake_torch_cuda.py)"

    def synchronize(self) -> None:
        self.calls.append(("synchronize", self._need_device("synchronize()")))

    def current_stream(self, device: Any = None) -> Any:
        self._need_device("current_stream()")
        return self.streams.current() if self.streams is not None else _Stream(self)

    streams: Any = None  # tests/fake_torch_graphs.Streams once install_standin ran

    def install_standin(self, torch: Any) -> "FakeCuda":
        """Replace torch.cuda's device, stream, event and graph calls for good (a rank of
        the stand-in GPU tests), and make CUDA tensors host tensors on this rank's device."""
        from tests import fake_torch_graphs
        self.streams = fake_torch_graphs.Streams(self)
        for name in ("is_available", "device_count", "set_device", "current_device",
                     "mem_get_info", "get_device_name", "current_stream"):
            setattr(torch.cuda, name, getattr(self, name))
        fake_torch_graphs.install(torch, self)
        return self

    def install(self, monkeypatch: Any) -> "FakeCuda":
        import torch
        for name in ("is_available", "device_count", "set_device", "current_device",
                     "mem_get_info", "get_device_name", "synchronize", "current_stream"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        return self

    def first(self, name: str) -> tuple[Any, ...]:
        """The first call named `name`, and its position: (index, call)."""
        return next((i, c) for i, c in enumerate(self.calls) if c[0] == name)
