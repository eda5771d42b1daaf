"""Execution side of infercomm: distributed environment, backends, replay, results, CLI.

torch, mpi4py and cupy are imported lazily, inside the modules that need them, so that a
machine without one of them can still use the others.
"""

import os

__version__ = "0.1.0"


def _gpu_standin_hook() -> None:
    """The one test hook of the product: with INFERCOMM_GPU_STANDIN=1 (set by the test suite,
    `make test-gpu-standin`), the test suite's stand-in CUDA, CuPy and NCCL (tests/
    gpu_standin.py, in a source checkout only) replace the real libraries in this process
    before any of them is imported, so every rank a test launches runs on them too."""
    if os.environ.get("INFERCOMM_GPU_STANDIN", "") in ("", "0"):
        return
    import importlib
    import sys
    try:
        standin = importlib.import_module("tests.gpu_standin")
    except ImportError:
        sys.stderr.write("infercomm: error: INFERCOMM_GPU_STANDIN is set, but the test suite's "
                         "stand-ins (tests/gpu_standin.py of a source checkout) cannot be "
                         "imported here; unset INFERCOMM_GPU_STANDIN\n")
        raise SystemExit(2) from None
    standin.install()


_gpu_standin_hook()
