"""Shared helpers: run the CLI in-process and read its last JSON line; the GPU tests' device:
a real one, or the stand-ins (INFERCOMM_GPU_STANDIN=1, tests/gpu_standin.py)."""

import json
import os
from pathlib import Path

import pytest

from tests import gpu_standin, real_engine_serving

if gpu_standin.enabled():  # every rank a test launches imports `tests` from this checkout
    _ROOT = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [_ROOT, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])
    gpu_standin.install()

from microbench.cli import main


class RankExited(Exception):
    """A rank run in-process ended itself (ranks/teardown.exit_now): on a device that would
    be os._exit, which here would end pytest with no report."""

    def __init__(self, status: int) -> None:
        super().__init__(f"the rank ended itself with status {status}")
        self.status = status


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run `infercomm ARGS...` in-process; return (exit status, stdout, stderr)."""
    def exit_now(status: int):
        raise RankExited(status)

    monkeypatch.setattr("microbench.ranks.teardown.exit_now", exit_now)

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            status = main(list(argv))
        except SystemExit as exc:  # argparse errors exit through SystemExit
            status = exc.code
        except RankExited as exc:
            status = exc.status
        out, err = capsys.readouterr()
        return status, out, err
    return run


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_report_header(config):
    if gpu_standin.enabled():
        return (f"GPU tests on stand-ins ({gpu_standin.ENV}=1): {gpu_standin.gpus()} fake "
                "GPUs, fake CuPy/NCCL, fake torch.cuda and NCCL process group")
    return None


GPU_REQUIRED_ENV = "INFERCOMM_GPU_REQUIRED"  # set by `make test-gpu`


def pytest_configure(config):
    """`make test-gpu` on a node where torch sees no GPU (a CPU build of torch) would pass
    with every gpu test skipped, and on the stand-ins it would pass on no GPU at all: both
    refused before any test runs."""
    if os.environ.get(GPU_REQUIRED_ENV) != "1":
        return
    if gpu_standin.enabled():
        raise pytest.UsageError(f"make test-gpu: {gpu_standin.ENV}=1 puts the test suite's "
                                "stand-ins in place of the GPUs; unset it (make "
                                "test-gpu-standin runs the stand-ins)")
    if _cuda_devices() == 0:
        raise pytest.UsageError("make test-gpu: torch sees no GPU (a CPU build of torch, or "
                                "a step without GPUs), so every gpu test would skip; install "
                                "a CUDA build of torch (docs/gpu.md)")


def pytest_collection_modifyitems(config, items):
    """gpu-marked tests skip on machines without CUDA, unless the stand-ins are on; the
    tests of the engines served in the background run last (tests/real_engine_serving.py)."""
    items[:] = real_engine_serving.engine_tests_last(items)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and _cuda_devices() == 0:
        skip = pytest.mark.skip(reason="needs a CUDA device (or INFERCOMM_GPU_STANDIN=1)")
        for item in gpu_items:
            item.add_marker(skip)


def pytest_collection_finish(session):
    """The engine cases the selected tests will ask for, served in the background from now
    on (tests/real_engine_serving.py)."""
    if not session.config.option.collectonly:
        real_engine_serving.start(session.config, session.items)


def pytest_sessionfinish(session):
    real_engine_serving.stop(session.config)
