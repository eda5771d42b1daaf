"""GPU code paths: run on a machine with CUDA (skipped elsewhere by conftest).

One GPU means NCCL at world size 1 (NCCL refuses two ranks on one device) and MPI with
several ranks sharing the device; with two or more GPUs the NCCL replay runs at TP2.
"""

import pytest

from tests.replay_helpers import infercomm, last_json, needs_mpi, tiny_model

pytestmark = pytest.mark.gpu


def _device_count() -> int:
    import torch
    return torch.cuda.device_count()


def test_torch_nccl_replay_checks_data_on_two_gpus(tmp_path):
    if _device_count() < 2:
        pytest.skip("NCCL at TP2 needs two GPUs")
    proc, _ = infercomm("replay", "--model", tiny_model(tmp_path), "--tp", "2", "--prompt",
                        "8", "--decode", "4", "--device", "cuda", "-n", "3", "--check",
                        "--timing", "op", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    line = last_json(proc.stdout)
    assert (line["transport"], line["wrong"]) == ("nccl", 0)
    assert line["e2e_us"] > 0  # CUDA events recorded on the stream


@needs_mpi
@pytest.mark.parametrize("staging", [False, True])
def test_mpi_device_buffers_check_on_one_gpu(tmp_path, staging):
    # 4 ranks share one device: TP2xPP2 exercises allreduce, allgather, gather, send/recv.
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
        assert line["transport"] in ("mpi-staging", "mpi-cuda-aware")
