"""GPU code paths: run on a machine with CUDA (skipped elsewhere by conftest).

One GPU means NCCL at world size 1 (NCCL refuses two ranks on one device); with two or more
GPUs the NCCL replay runs at TP2; the MPI TP2xPP2 replays need four (one rank a GPU).
"""

import pytest

from tests.replay_helpers import infercomm, last_json, needs_mpi, tiny_model

pytestmark = pytest.mark.gpu


def _device_count() -> int:
    import torch
    return torch.cuda.device_count()


def needs_gpus(count: int) -> None:
    if _device_count() < count:
        pytest.skip(f"needs {count} GPUs (one a rank); this node has {_device_count()}")


def test_torch_nccl_replay_checks_data_on_two_gpus(tmp_path):
    needs_gpus(2)
    proc, _ = infercomm("replay", "--model", tiny_model(tmp_path), "--tp", "2", "--prompt",
                        "8", "--decode", "4", "--device", "cuda", "-n", "3", "--check",
                        "--timing", "op", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    line = last_json(proc.stdout)
    assert (line["transport"], line["wrong"]) == ("nccl", 0)
    assert line["e2e_us"] > 0  # CUDA events recorded on the stream


@needs_mpi
@pytest.mark.parametrize("staging", [False, True])
def test_mpi_device_buffers_check_on_four_gpus(tmp_path, staging):
    # TP2xPP2 exercises allreduce, allgather, gather, send/recv; one rank a GPU.
    needs_gpus(4)
    extra = ["--mpi-staging"] if staging else []
    proc, _ = infercomm("replay", "--engine", "vllm-v0", "--backend", "mpi", "--device",
                        "cuda", "--model",
                        tiny_model(tmp_path), "--tp", "2", "--pp", "2", "--prompt", "8",
                        "--decode", "4", "-n", "3", "--check", "--timing", "op", "--out",
                        str(tmp_path), *extra)
    assert proc.returncode == 0, proc.stderr
    line = last_json(proc.stdout)
    assert line["wrong"] == 0 and line["device"] == "cuda"
    if staging:
        assert line["transport"] == "mpi-staging"
    else:
        assert line["transport"] in ("mpi-staging", "mpi-cuda-aware+staged-bf16")
