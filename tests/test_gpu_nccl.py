"""NCCL without torch.distributed (CuPy), torch's NCCL, CUDA graphs and MPI device buffers, on
real GPUs (skipped without CUDA by conftest).

One GPU: NCCL runs at world size 1 (it refuses two ranks on one device), where a vllm-v0
pattern has no calls, so every op kind is bound straight through the backend API on a 1-rank
group and checked eagerly and through a captured graph; MPI runs several ranks sharing the
device. Two GPUs: the same checks on a 2-rank group, send/recv included, and TP2 replays.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from microbench.backends import Group, open_backend
from microbench.ranks import dist
from microbench.ranks.dist import DistEnv
from microbench.ranks.launch import free_port
from microbench.replay import check
from microbench.replay.graphs import capture_function
from microbench.replay.plan import BoundOp
from patterns import Op, OpKind
from tests.backend_helpers import KINDS, bound_op
from tests.replay_helpers import infercomm, last_json, needs_mpi, tiny_model

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parent.parent
needs_cupy = pytest.mark.skipif(importlib.util.find_spec("cupy") is None,
                                reason="the nccl backend needs CuPy ('infercomm[cuda]')")
BACKENDS = ["torch", pytest.param("nccl", marks=needs_cupy)]
DTYPES = ("bf16", "fp16", "fp32", "int64", "int32", "uint8")


def _device_count() -> int:
    import torch
    return torch.cuda.device_count()


def needs_gpus(count: int) -> None:
    """Skip, saying how many GPUs the test needs and the node has: one rank a GPU."""
    have = _device_count()
    if have < count:
        pytest.skip(f"needs {count} GPUs (one a rank); this node has {have}")


def _graphed(op: BoundOp, capture) -> BoundOp:
    return BoundOp(op.op, op.group, op.send, op.recv, capture([op.call]))


def _check_every_kind(backend, group: Group, numel: int, dtypes=DTYPES) -> int:
    """Wrong elements over every kind and dtype, eager then through a graph; the graph's
    outputs must also equal the eager call's, element for element."""
    capture, wrong = capture_function(backend), 0
    for kind in KINDS:
        for dtype in dtypes:
            op = bound_op(backend, group, kind, numel, dtype)
            wrong += check.verify(op, backend.write, backend.read, corrupt=False)
            out = op.recv if op.recv is not None else op.send
            eager = backend.read(out) if kind != "gather" or op.recv is not None else None
            graphed = _graphed(op, capture)
            wrong += check.verify(graphed, backend.write, backend.read, corrupt=False)
            if eager is not None:
                wrong += int(np.count_nonzero(backend.read(out) != eager))
    return wrong


@pytest.mark.parametrize("name", BACKENDS)
def test_every_kind_eager_and_graphed_on_one_gpu(name):
    env = DistEnv("torchrun", 0, 1, 0, "127.0.0.1", free_port())
    backend = open_backend(name, env=env, device="cuda", timeout=60)
    try:
        group = backend.new_group("tp", [0])
        assert _check_every_kind(backend, group, 4096 * 3) == 0
        info = backend.versions()
        assert info["nccl"] and info["gpu"]
    finally:
        backend.close()


def _two_rank_main() -> None:
    """One rank of test_every_kind_and_p2p_eager_and_graphed_on_two_gpus."""
    env = dist.detect()
    backend = open_backend(os.environ["INFERCOMM_TEST_BACKEND"], env=env, device="cuda",
                           timeout=60)
    group = backend.new_group("pair", [0, 1])
    wrong = _check_every_kind(backend, group, 4096, dtypes=("bf16", "fp32"))
    capture = capture_function(backend)
    for dtype in ("bf16", "fp32"):
        kind = OpKind.SEND if backend.rank == 0 else OpKind.RECV
        op = Op(kind=kind, group="pair", group_size=2, shape=(2048,), out_shape=(2048,),
                dtype=dtype, tag="test.p2p", peer=1 - backend.rank)
        send = backend.empty(2048, dtype) if kind == OpKind.SEND else None
        recv = backend.empty(2048, dtype) if kind == OpKind.RECV else None
        bound = BoundOp(op, group, send, recv, backend.bind(kind.value, group, send, recv,
                                                            op.peer))
        wrong += check.verify(bound, backend.write, backend.read, corrupt=False)
        if backend.name == "nccl":  # NCCL captures P2P (>= 2.9); torch's send/recv gives no
            # Work under capture and fails on .wait() of None (pytorch/pytorch#133984)
            wrong += check.verify(_graphed(bound, capture), backend.write, backend.read, False)
    backend.barrier()
    print(json.dumps({"rank": backend.rank, "wrong": wrong}), flush=True)
    backend.close()


@pytest.mark.parametrize("name", BACKENDS)
def test_every_kind_and_p2p_eager_and_graphed_on_two_gpus(name):
    needs_gpus(2)
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-c", "from tests.test_gpu_nccl import _two_rank_main; "
                               "_two_rank_main()"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
             "INFERCOMM_TEST_BACKEND": name}) for r in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert last_json(out)["wrong"] == 0


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("graph", ["decode", "none"])
def test_replay_at_world_size_one_records_graph_and_versions(tmp_path, name, graph):
    # World size 1 issues no calls, but every piece around them runs: backend, groups,
    # capture (of nothing), CUDA events on the backend's stream, results.
    proc, _ = infercomm("replay", "--backend", name, "--device", "cuda", "--graph", graph,
                        "--model", tiny_model(tmp_path), "--prompt", "8", "--decode", "4",
                        "-n", "3", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    folder = tmp_path / last_json(proc.stdout)["results_dir"].split("/")[-1]
    summary = json.loads((folder / "summary.json").read_text())
    meta = json.loads((folder / "meta.json").read_text())
    assert summary["graph"] == meta["graph"] == graph
    assert meta["versions"]["nccl"]


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("graph", ["decode", "none"])
def test_tp2_replay_on_two_gpus_checks_data(tmp_path, name, graph):
    needs_gpus(2)
    proc, _ = infercomm("replay", "--backend", name, "--device", "cuda", "--graph", graph,
                        "--model", tiny_model(tmp_path), "--tp", "2", "--prompt", "8",
                        "--decode", "4", "-n", "3", "--check", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    line = last_json(proc.stdout)
    assert (line["transport"], line["wrong"]) == ("nccl", 0) and line["e2e_us"] > 0


@needs_mpi
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_mpi_device_buffers_every_reduction_dtype(tmp_path, dtype):
    # 4 ranks, one GPU each (a rank never shares a device: ranks/device.py refuses it). bf16
    # (and fp16 where MPI has no native type) sums run in Python on host memory, so their
    # reductions are staged even when MPI is CUDA-aware.
    needs_gpus(4)
    proc, _ = infercomm("replay", "--backend", "mpi", "--device", "cuda", "--dtype", dtype,
                        "--model", tiny_model(tmp_path), "--tp", "2", "--pp", "2",
                        "--prompt", "8", "--decode", "4", "-n", "2", "--check",
                        "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    line = last_json(proc.stdout)
    assert line["wrong"] == 0 and line["device"] == "cuda"
    meta = json.loads((tmp_path / line["results_dir"].split("/")[-1] / "meta.json").read_text())
    assert meta["graph"] == "none"
    if meta["versions"].get("cuda_aware") and dtype == "bf16":  # its sums go through the host
        assert line["transport"] == "mpi-cuda-aware+staged-bf16"
        assert "bf16" in meta["versions"]["staged_reductions"]


def test_gpu_overhead_benchmark_runs_at_world_size_one():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_overhead.py"),
                           "--rounds", "2", "--steps", "3", "--calls", "8"],
                          capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    result = last_json(proc.stdout)
    # cases at world size 1: 7 all-reduce sizes, the gather and the all-gather (no send/recv
    # below two ranks), on torch and, with CuPy (make test-gpu installs it), on nccl
    libraries = 1 + (importlib.util.find_spec("cupy") is not None)
    assert result["world_size"] == 1 and len(result["rows"]) == 9 * libraries
    assert all(row["bare_graph_us"] is not None for row in result["rows"])


@pytest.mark.parametrize("name", BACKENDS)
def test_bool_gathers_on_one_gpu(name):
    """Megatron's MoE routing map, bool (1 byte an element): NCCL has no bool type, torch and
    the nccl backend send it as ncclUint8; every kind that moves it, eager, delivers it, and
    a corrupted input is seen (check.verify flips element 0 of the rank's input)."""
    env = DistEnv("torchrun", 0, 1, 0, "127.0.0.1", free_port())
    backend = open_backend(name, env=env, device="cuda", timeout=60)
    try:
        group = backend.new_group("tp", [0])
        for kind in ("allgather", "broadcast", "gather", "alltoall"):
            op = bound_op(backend, group, kind, 4096, "bool")
            assert check.verify(op, backend.write, backend.read, corrupt=False) == 0, kind
            assert check.verify(op, backend.write, backend.read, corrupt=True) == 1, kind
    finally:
        backend.close()
