"""The GPU paths the review found breaking or at risk, on real GPUs (`make test-gpu`) or on
the stand-ins (`make test-gpu-standin`, INFERCOMM_GPU_STANDIN=1; skipped with neither).

Each launch has a wall-clock limit well under the hang it guards against, so a machine with
two GPUs answers "ends cleanly" in one command: TP2 with decode graphs (teardown while
graphs are alive), TP2xPP2 on four (PP send/recv eager between the TP graphs), uneven DP
with chunked prefill and a short --timeout (ranks cutting different graphs), each rank on
its own GPU (local rank -> device, recorded in meta.json), and benchmarks/gpu_overhead.py
under torchrun.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.replay_helpers import infercomm, last_json, tiny_model
from tests.test_moe_replay_cli import tiny_moe

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parent.parent
WALL_S = 180  # a replay of these tiny patterns takes seconds; a teardown hang never ends
needs_cupy = pytest.mark.skipif(importlib.util.find_spec("cupy") is None,
                                reason="the nccl backend needs CuPy ('infercomm[cuda]')")
BACKENDS = ["torch", pytest.param("nccl", marks=needs_cupy)]


def _gpus() -> int:
    import torch
    return torch.cuda.device_count()


def needs_gpus(count: int) -> None:
    if _gpus() < count:
        pytest.skip(f"needs {count} GPUs (one a rank); this node has {_gpus()}")


@pytest.fixture
def two_gpus():
    needs_gpus(2)


def _replay(tmp_path, model: str, *extra: str):
    proc, _ = infercomm("replay", "--model", model, "--prompt", "8", "--decode", "4",
                        "--device", "cuda", "-n", "3", "-w", "1", "--check", "--timeout", "30",
                        "--out", str(tmp_path / "out"), *extra, timeout=WALL_S)
    assert proc.returncode == 0, proc.stderr
    line = last_json(proc.stdout)
    meta = json.loads((Path(line["results_dir"]) / "meta.json").read_text())
    return line, meta


@pytest.mark.parametrize("backend", BACKENDS)
def test_tp2_with_decode_graphs_ends_cleanly_each_rank_on_its_gpu(tmp_path, two_gpus, backend):
    line, meta = _replay(tmp_path, tiny_model(tmp_path), "--tp", "2", "--backend", backend,
                         "--graph", "decode")
    assert (line["wrong"], meta["graph"]) == (0, "decode")
    # local ranks 0 and 1 of the launcher, each on the GPU of its local rank
    assert [(r["local_rank"], r["gpu"]) for r in meta["local_ranks"]] == [(0, 0), (1, 1)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_tp2_pp2_with_decode_graphs_ends_cleanly(tmp_path, backend):
    # TP2xPP2: each stage's TP all-reduces are captured, the PP sends and receives and the
    # sampled-token broadcast stay eager between the graphs (at TP1 every decode call is
    # P2P or pp_broadcast, so a PP2-only run captured no graph at all).
    needs_gpus(4)
    line, meta = _replay(tmp_path, tiny_model(tmp_path), "--tp", "2", "--pp", "2",
                         "--backend", backend, "--graph", "decode")
    assert line["wrong"] == 0 and meta["graph"] == "decode"
    # every rank captured its stage's TP all-reduces (meta.json: local_ranks[r].graphs)
    assert [r["graphs"] > 0 for r in meta["local_ranks"]] == [True] * 4


def test_uneven_dp_with_chunked_prefill_ends_within_its_timeout(tmp_path, two_gpus):
    # DP2 with EP, batches 1 and 4 and a 16-token prefill budget: rank 1 prefills 4 x 8 = 32
    # tokens in 2 chunks where rank 0 has 8 tokens in 1, so the ranks' step lists differ.
    line, _ = _replay(tmp_path, tiny_moe(tmp_path), "--dp", "2", "--ep", "--dp-batches", "1,4",
                      "--max-batched-tokens", "16", "--graph", "decode")
    assert line["wrong"] == 0


def test_gpu_overhead_benchmark_under_torchrun_ends(two_gpus):
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    # nccl first: torch's rendezvous then still meets on MASTER_PORT, where torchrun's agent
    # serves the store (on any other port it would wait, client-only, for a server)
    proc = subprocess.run([torchrun, "--nproc-per-node", "2", str(REPO / "benchmarks" /
                           "gpu_overhead.py"), "--rounds", "2", "--steps", "3", "--calls", "8",
                           "--backends", "nccl,torch"],
                          capture_output=True, text=True, timeout=WALL_S, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["world_size"] == 2



def test_allreduce_algo_on_torch_replays_without_graphs(tmp_path, two_gpus):
    # the ring is torch batch_isend_irecv + wait, which ProcessGroupNCCL cannot capture
    # (pytorch/pytorch#133984): the default graph mode on torch is then none
    line, meta = _replay(tmp_path, tiny_model(tmp_path), "--tp", "2", "--backend", "torch",
                         "--allreduce-algo", "ring")
    assert (line["wrong"], meta["graph"]) == (0, "none")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_nodes_rank_takes_the_gpu_of_its_local_rank(backend):
    """Rank 5 of 8 (two nodes of four) is local rank 1 of the second node: its GPU is 1, the
    GPU of its local rank, never of its rank (5, which no node has). Read through the
    launcher's variables, as every rank reads them (ranks/dist.py detect)."""
    needs_gpus(2)
    from microbench.ranks.device import select_device
    from microbench.ranks.dist import detect
    env = detect({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "h",
                  "MASTER_PORT": "1"})
    assert (env.rank, env.local_rank) == (5, 1)
    assert select_device(env, backend) == 1
    if backend == "nccl":
        import cupy
        assert cupy.cuda.Device().id == 1
    else:
        import torch
        assert torch.cuda.current_device() == 1


@needs_cupy
def test_two_nodes_under_torchrun_replay_over_nccl_on_their_local_gpus(tmp_path):
    """Two nodes of one GPU each (two torchrun agents, --nnodes 2): rank 1 is local rank 0
    of the second node and must take that node's GPU 0 (it has no GPU 1). Under torchrun the
    nccl backend shares its NCCL ids through the store torchrun's agent serves on MASTER_PORT
    (a second server there fails on torch 2.3-2.6; the stand-in refuses it as they do)."""
    needs_gpus(2)  # on a GPU node each "node" sees one of two GPUs (CUDA_VISIBLE_DEVICES)
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    out, port = tmp_path / "out", str(_free_port())
    replay = ["-m", "microbench", "replay", "--model", tiny_model(tmp_path), "--tp", "2",
              "--prompt", "8", "--decode", "4", "--backend", "nccl", "--device", "cuda",
              "-n", "2", "-w", "1", "--check", "--timeout", "60", "--out", str(out)]
    procs = [subprocess.Popen(
        [torchrun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
         "--master-addr", "127.0.0.1", "--master-port", port, *replay],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": str(node),
             "INFERCOMM_GPU_STANDIN_GPUS": "1"}) for node in (0, 1)]
    outs = [p.communicate(timeout=WALL_S) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    line = last_json(outs[0][0])
    meta = json.loads((Path(line["results_dir"]) / "meta.json").read_text())
    assert (line["world_size"], line["wrong"]) == (2, 0)
    assert [(r["rank"], r["local_rank"], r["from"], r["gpu"]) for r in meta["local_ranks"]] \
        == [(0, 0, "LOCAL_RANK", 0), (1, 0, "LOCAL_RANK", 0)]
    assert meta["versions"]["unique_id_exchange"] == "tcp-store"


def _free_port() -> int:
    from microbench.ranks.launch import free_port
    return free_port()
