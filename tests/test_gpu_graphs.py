"""CUDA graphs on two real GPUs: teardown, PP, uneven DP (skipped without two GPUs).

What CPUs cannot show (gpu_review.md section 5): NCCL's destroy waits for every graph that
captured the communicator only at world size >= 2 (at one rank it runs no plan, so nothing
captures it), and ranks that disagree on graphs hang only on real communicators. Each replay
here gets a short --timeout and a wall-clock limit, so a hang fails the test instead of
holding the machine: before the teardown fix, TP2 --graph decode ended at the watchdog with
status 124 instead of 0.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.replay_helpers import infercomm, last_json, tiny_model

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _two_gpus():
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: NCCL refuses two ranks on one device")


def _replay(tmp_path, *args: str) -> dict:
    proc, wall = infercomm("replay", "--device", "cuda", "--timeout", "60", "-n", "3",
                           "--out", str(tmp_path), *args, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert wall < 200, wall  # the replay's own watchdog would have ended a hang at 60 s
    return last_json(proc.stdout)


@pytest.mark.parametrize("backend", ["torch", "nccl"])
def test_tp2_with_graphs_ends_cleanly(tmp_path, backend):
    if backend == "nccl":
        pytest.importorskip("cupy")
    line = _replay(tmp_path, "--backend", backend, "--graph", "decode", "--check",
                   "--model", tiny_model(tmp_path), "--tp", "2", "--prompt", "8",
                   "--decode", "8")
    assert line["wrong"] == 0


@pytest.mark.parametrize("backend", ["torch", "nccl"])
def test_pp2_with_graphs_sends_eagerly_between_them(tmp_path, backend):
    if backend == "nccl":
        pytest.importorskip("cupy")
    line = _replay(tmp_path, "--backend", backend, "--graph", "decode", "--check",
                   "--model", tiny_model(tmp_path), "--pp", "2", "--prompt", "8",
                   "--decode", "8")
    assert line["wrong"] == 0


def test_uneven_dp_with_graphs_agrees_and_ends(tmp_path):
    """DP rank 1 prefills 4 prompts in chunks while DP rank 0 decodes (gpu_review.md W2)."""
    _replay(tmp_path, "--backend", "torch", "--graph", "decode", "--model", "qwen3-30b-a3b",
            "--dp", "2", "--ep", "--dp-batches", "1,4", "--prompt", "2048", "--decode", "8",
            "--max-batched-tokens", "2048")


def test_gpu_overhead_under_torchrun_ends(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           "2", str(REPO / "benchmarks" / "gpu_overhead.py"), "--rounds", "2",
                           "--steps", "3", "--calls", "8"],
                          capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["world_size"] == 2
