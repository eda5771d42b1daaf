"""Execution side of infercomm: distributed environment, backends, replay, results, CLI.

torch, mpi4py and cupy are imported lazily, inside the modules that need them, so that a
machine without one of them can still use the others.
"""

import os
from pathlib import Path

__version__ = "0.1.0"

GPU_STANDIN_ENV = "INFERCOMM_GPU_STANDIN"
# True once the test suite's stand-ins replace CUDA, CuPy and NCCL in this process: every
# result made here is then marked as made on them (results/store.py).
GPU_STANDIN = False


def _refuse(text: str) -> None:
    import sys
    sys.stderr.write(f"infercomm: error: {text}\n")
    raise SystemExit(2)


def source_checkout() -> Path | None:
    """The source checkout this `microbench` was imported from (the folder holding its
    pyproject.toml and the test suite's tests/gpu_standin.py), or None for an installed copy:
    a wheel installs `microbench` and `patterns` only (pyproject.toml packages.find), so
    nothing beside an installed `microbench` holds the stand-ins."""
    root = Path(__file__).resolve().parent.parent
    try:
        named = 'name = "infercomm"' in (root / "pyproject.toml").read_text()
    except OSError:
        return None
    return root if named and (root / "tests" / "gpu_standin.py").is_file() else None


def _import_standins(root: Path) -> object:
    """tests/gpu_standin.py of `root`, whatever `tests` package sys.path would find first."""
    import importlib
    import importlib.util
    import sys
    package = root / "tests" / "__init__.py"
    loaded = sys.modules.get("tests")
    if loaded is None:
        spec = importlib.util.spec_from_file_location(
            "tests", package, submodule_search_locations=[str(package.parent)])
        assert spec is not None and spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        sys.modules["tests"] = loaded
        spec.loader.exec_module(loaded)
    where = Path(getattr(loaded, "__file__", None) or "").resolve()
    if where != package.resolve():
        _refuse(f"{GPU_STANDIN_ENV}=1: another `tests` package ({where}) is imported in place "
                f"of this checkout's ({package}); unset {GPU_STANDIN_ENV}")
    return importlib.import_module("tests.gpu_standin")


def _gpu_standin_hook() -> None:
    """The one test hook of the product: INFERCOMM_GPU_STANDIN=1 (set by the test suite,
    `make test-gpu-standin`) puts the test suite's stand-in CUDA, CuPy and NCCL (tests/
    gpu_standin.py of a source checkout) in place of the real libraries in this process,
    before any of them is imported, so every rank a test launches runs on them too. Only "1"
    turns them on ("" and "0" are off): any other value is refused in one line, as is "1"
    where no source checkout holds the stand-ins, so no shell setting can fake a GPU run."""
    value = os.environ.get(GPU_STANDIN_ENV, "")
    if value in ("", "0"):
        return
    if value != "1":
        shown = value if len(value) <= 20 else value[:20] + "..."
        _refuse(f"{GPU_STANDIN_ENV}={shown!r}: only 1 (the test suite's GPU stand-ins, in a "
                f"source checkout) or 0/unset (real devices) is accepted; unset it")
    root = source_checkout()
    if root is None:
        _refuse(f"{GPU_STANDIN_ENV}=1 runs on the test suite's stand-ins for CUDA, CuPy and "
                "NCCL, which only a source checkout of infercomm has (tests/gpu_standin.py "
                f"beside microbench/, not in {Path(__file__).resolve().parent.parent}); "
                f"unset {GPU_STANDIN_ENV}")
        return
    standin = _import_standins(root)
    standin.install()  # type: ignore[attr-defined]
    global GPU_STANDIN
    GPU_STANDIN = True


_gpu_standin_hook()
