"""DP x EP replays with --check on real local ranks over MPI, from the rules' test stand-in
(the profiles' replays over MPI and gloo are in test_moe_replay_cli.py).

Each rank runs tests/moe_ranks.py: the stand-in vLLM step of a tiny MoE model (3 layers,
the first dense, 8 experts, top-2; prompt 3, 3 output tokens: 1 prefill + 2 decode steps)
bound by the replay plan and checked call by call with known integers.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from microbench.ranks.launch import free_port
from tests.replay_helpers import needs_mpi

RANK_SCRIPT = str(Path(__file__).with_name("moe_ranks.py"))
ROOT = str(Path(__file__).resolve().parent.parent)


def launch(tmp: Path, backend: str, nproc: int, *args: str, fault: str = "") -> list[dict]:
    out = tmp / f"run{len(list(tmp.iterdir()))}"
    out.mkdir()
    args = (*args, str(out))
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PMI_RANK", "PMI_SIZE")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    if fault:
        env["INFERCOMM_FAULT"] = fault
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    procs = [subprocess.Popen([mpiexec, "-n", str(nproc), sys.executable, RANK_SCRIPT,
                               backend, *args], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


BACKENDS = [pytest.param("mpi", marks=needs_mpi)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_dp4_ep_uneven_batches_check_passes(tmp_path, backend):
    ranks = launch(tmp_path, backend, 4, "4", "1", "3,5,2,8", "allgather_reducescatter")
    # Per step: 1 DP coordination all-reduce + 2 MoE layers x (3 dispatch all-gathers +
    # 1 combine reduce-scatter) = 9; 3 steps = 27 calls per rank, 0 wrong elements.
    assert [r["calls"] for r in ranks] == [27] * 4
    assert [r["wrong"] for r in ranks] == [0] * 4
    # The eager prefill (3,5,2,8 x 3 tokens) is uneven: all-gatherv and reduce-scatterv.
    kinds = {tuple(k) for k in ranks[0]["kinds"]}
    assert ("allgather", "dp", True) in kinds and ("reducescatter", "dp", True) in kinds
    assert ("allgather", "dp", False) in kinds  # graphed decode: padded to 8, equal


@pytest.mark.parametrize("backend", BACKENDS)
def test_dp2_tp2_sequence_parallel_and_alltoall(tmp_path, backend):
    # SP-MoE over the EP group {0,1,2,3}: per step 1 coordination + layer 0 (2 TP
    # all-reduces) + 2 MoE layers x (o_proj all-reduce + 3 gathers + combine + TP gather) =
    # 1 + 2 + 12 = 15; 45 calls over 3 steps.
    ranks = launch(tmp_path, backend, 4, "2", "2", "3,5", "allgather_reducescatter")
    assert [(r["calls"], r["wrong"]) for r in ranks] == [(45, 0)] * 4
    assert ["allgather", "ep", True] in ranks[0]["kinds"]
    # DeepEP-style all-to-all: per step 1 + 2 x 2 = 5 calls, 15 in all.
    ranks = launch(tmp_path, backend, 4, "4", "1", "3,5,2,8", "alltoall")
    assert [(r["calls"], r["wrong"]) for r in ranks] == [(15, 0)] * 4


@needs_mpi
def test_corrupted_dispatch_is_found(tmp_path):
    # Rank 2 corrupts the first element of its hidden-state dispatch inputs only: every
    # rank of the DP group receives the bad element in each of its 3 steps x 2 MoE layers.
    ranks = launch(tmp_path, "mpi", 4, "4", "1", "3,5,2,8", "allgather_reducescatter",
                   fault="corrupt:2:dispatch.hidden_states")
    assert [r["wrong"] for r in ranks] == [6] * 4
    # The same fault aimed at a tag no call carries changes nothing.
    ranks = launch(tmp_path, "mpi", 4, "4", "1", "3,5,2,8", "allgather_reducescatter",
                   fault="corrupt:2:no-such-call")
    assert [r["wrong"] for r in ranks] == [0] * 4


@needs_mpi
def test_dp4_tp2_ep_on_8_mpi_ranks(tmp_path):
    # 8 ranks: EP group of DP4 x TP2; per step 1 + 2 + 2 x 6 = 15 calls, 45 over 3 steps.
    ranks = launch(tmp_path, "mpi", 8, "4", "2", "3,5,2,8", "allgather_reducescatter")
    assert [(r["calls"], r["wrong"]) for r in ranks] == [(45, 0)] * 8


def test_uneven_calls_on_the_nccl_backend_through_fake_cupy(monkeypatch):
    """One rank (the fake is one device): the grouped broadcasts / reduces of an uneven
    all-gather and reduce-scatter bind, run inside one NCCL group, and pass --check."""
    from microbench.backends import open_backend
    from microbench.ranks.dist import DistEnv
    from microbench.replay import check
    from microbench.replay.plan import BoundOp
    from patterns import Op, OpKind
    from tests import fake_cupy

    for name, module in fake_cupy.make_modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    env = DistEnv("torchrun", 0, 1, 0, "127.0.0.1", free_port())
    backend = open_backend("nccl", env=env, device="cuda", timeout=20)
    try:
        group = backend.new_group("ep", [0])
        for kind in (OpKind.ALLGATHER, OpKind.REDUCESCATTER):
            op = Op(kind=kind, group="ep", group_size=1, shape=(5, 3), out_shape=(5, 3),
                    dtype="bf16", tag="dispatch", counts=(15,))
            send, recv = backend.empty(15, "bf16"), backend.empty(15, "bf16")
            bound = BoundOp(op, group, send, recv,
                            backend.bind(kind.value, group, send, recv, None, op.counts))
            assert check.verify(bound, backend.write, backend.read, corrupt=False) == 0
            assert check.verify(bound, backend.write, backend.read, corrupt=True) == 1
    finally:
        backend.close()
