"""Shared helpers: run the CLI in-process and read its last JSON line."""

import json

import pytest

from microbench.cli import main


@pytest.fixture
def cli(capsys):
    """Run `infercomm ARGS...` in-process; return (exit status, stdout, stderr)."""
    def run(*argv: str) -> tuple[int, str, str]:
        try:
            status = main(list(argv))
        except SystemExit as exc:  # argparse errors exit through SystemExit
            status = exc.code
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


def pytest_collection_modifyitems(config, items):
    """gpu-marked tests skip on machines without CUDA (every CI machine)."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and _cuda_devices() == 0:
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in gpu_items:
            item.add_marker(skip)
