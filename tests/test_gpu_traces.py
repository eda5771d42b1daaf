"""Round trip on GPUs: `replay --backend nccl|torch` with NCCL_DEBUG=INFO and
NCCL_DEBUG_SUBSYS=INIT,COLL writes NCCL's own log of every call; `validate` reads it back
and must find exactly the pattern's calls (skipped without CUDA by conftest, and below two
GPUs: NCCL refuses two ranks on one device, and at world size 1 the pattern has no call).

The replay runs one inference eagerly (`--graph none`: a graph's calls are logged only at
capture) with no warm-up: the barrier before it and the result exchange after it are
calls outside the inference, which `validate` reports and does not compare.
"""

import importlib.util
from pathlib import Path

import pytest

from tests.replay_helpers import infercomm, last_json, tiny_model

pytestmark = pytest.mark.gpu

needs_cupy = pytest.mark.skipif(importlib.util.find_spec("cupy") is None,
                                reason="the nccl backend needs CuPy ('infercomm[cuda]')")


def _device_count() -> int:
    import torch
    return torch.cuda.device_count()


@pytest.mark.parametrize("backend", ["torch", pytest.param("nccl", marks=needs_cupy)])
def test_replay_log_validates_equal(tmp_path: Path, backend: str) -> None:
    if _device_count() < 2:
        pytest.skip(f"needs 2 GPUs (one a rank); this node has {_device_count()}")
    model = tiny_model(tmp_path)
    pattern = ["--model", model, "--tp", "2", "--prompt", "4", "--decode", "3",
               "--engine", "vllm-v0", "--eager"]
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,COLL",
           "NCCL_DEBUG_FILE": str(logs / "nccl.%h.%p.log")}
    proc, _ = infercomm("replay", *pattern, "--backend", backend, "--device", "cuda",
                        "--graph", "none", "-w", "0", "-n", "1", "--out",
                        str(tmp_path / "results"), env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[infercomm] -w 0 on a GPU" in proc.stderr  # one-time costs in the timed run
    files = sorted(str(p) for p in logs.glob("nccl.*.log"))
    assert len(files) == 2  # one per rank
    proc, _ = infercomm("trace", *files)
    assert proc.returncode == 0, proc.stderr
    proc, _ = infercomm("validate", "--trace", *files, *pattern)
    assert proc.returncode == 0, proc.stdout[-3000:]
    summary = last_json(proc.stdout)
    assert summary["match"] is True and summary["ranks"] == 2
    # rows per rank: prefill all-reduces (9 of [4,64]), decode all-reduces (18 of [1,64]),
    # and the gather in each phase (a Gather, or its grouped Recv on rank 0 / Send on rank 1
    # before NCCL 2.30): 4 rows a rank, all equal
    assert summary["equal"] == 8
    assert summary["different"] == summary["missing"] == summary["extra"] == 0
