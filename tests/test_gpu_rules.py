"""The GPU paths' decisions that need no device (second GPU review, N3-N6, N11, the bf16
label): plans built on the recording backend (microbench/replay/agreement.py), refusals made
before any rank starts, and the rendezvous address."""

import types

import pytest

from microbench.argtypes import UsageError
from microbench.ranks.dist import DistEnv, rendezvous_address
from microbench.replay.agreement import RecordingBackend
from microbench.replay.graph_spans import graph_pieces, mixes_graphs_and_eager, piece_keys
from microbench.replay.graphs import check_mixing, use_graphs
from microbench.replay.output import transport_of
from microbench.replay.plan import build_plan
from patterns import EngineOptions, Layout, Workload, generate, resolve_model
from patterns.engines.workloads import workload_pattern
from patterns.ops import Transport
from patterns.workload.requests import read_requests
from tests.replay_helpers import tiny_model

MOE, DENSE = "qwen3-30b-a3b", "llama-3.1-8b"


def _poisson(count: int):
    requests = read_requests(f"poisson:rate=20,count={count},prompt=16..64,output=4..16,seed=1")
    return workload_pattern("vllm", resolve_model(DENSE), Layout(tp=2), requests, None,
                            EngineOptions(), 0.02)  # 20 ms a step


@pytest.mark.parametrize(("engine", "layout"), [("vllm", Layout(tp=1, dp=2, ep=True)),
                                                ("sglang", Layout(tp=2, dp=2, ep=True))])
def test_host_path_ops_stay_eager_and_are_read_back(engine, layout):
    """N4: vLLM's per-step DP sync and SGLang's MLPSyncBatchInfo all-gather run on a CPU
    group in the engine, outside the graph, then read back on the host: eager here, each
    followed by a synchronize (vllm/v1/worker/dp_utils.py @ c8109375 lines 18-98)."""
    pattern = generate(engine, resolve_model(MOE), layout, Workload(prompt=64, decode=4),
                       EngineOptions())
    backend = RecordingBackend(0, layout.world_size)
    plan = build_plan(pattern, backend)
    assert use_graphs(plan, backend, backend.capture) > 0
    host = 0
    for run in plan.runs:
        if run.phase.value != "decode":
            continue
        for op in run.ops:
            if op.op.transport == Transport.GLOO:
                host += 1
                at = run.calls.index(op.call)  # its own call, not inside a graph
                assert run.calls[at + 1] == backend.synchronize
    assert host > 0


def test_identical_pieces_share_graphs_and_each_capture_is_progress():
    """N5: a Poisson workload's captured pieces repeat (same batch on every rank): one graph
    set per distinct piece content, and the watchdog sees each capture."""
    pattern = _poisson(60)
    pieces = graph_pieces(pattern)
    keys = piece_keys(pattern, pieces)
    distinct = {key for key, (_, _, on) in zip(keys, pieces, strict=True) if on}
    captured = sum(on for _, _, on in pieces)
    assert len(distinct) < captured  # reuse is possible at all in this workload
    backend = RecordingBackend(0, 2)
    plan = build_plan(pattern, backend)
    count = types.SimpleNamespace(n=0)
    graphs = use_graphs(plan, backend, backend.capture,
                        progress=lambda: setattr(count, "n", count.n + 1))
    # a TP-only dense step has no P2P or host-path op: one graph per distinct piece content
    assert graphs == count.n == len(distinct)


def test_mixing_support_zero_is_refused_where_eager_calls_follow_graphs(monkeypatch):
    """N6: NCCL_GRAPH_MIXING_SUPPORT=0 does not support an eager call during an outstanding
    graph launch on the same communicator (NCCL env.rst @ 5067397c): a request workload's
    prefills follow its decode graphs; a plain prompt/decode pattern only goes eager ->
    captured."""
    workload = _poisson(6)
    plain = generate("vllm", resolve_model(DENSE), Layout(tp=2), Workload(prompt=16, decode=4),
                     EngineOptions())
    assert mixes_graphs_and_eager(workload, graph_pieces(workload))
    assert not mixes_graphs_and_eager(plain, graph_pieces(plain))
    zero = {"NCCL_GRAPH_MIXING_SUPPORT": "0"}
    with pytest.raises(UsageError, match="NCCL_GRAPH_MIXING_SUPPORT=0"):
        check_mixing(workload, "decode", "torch", "cuda", zero)
    check_mixing(workload, "none", "torch", "cuda", zero)  # no graphs, nothing mixes
    check_mixing(workload, "decode", "torch", "cuda", {"NCCL_GRAPH_MIXING_SUPPORT": "1"})
    check_mixing(plain, "decode", "torch", "cuda", zero)


def test_allreduce_algo_on_torch_refuses_graphs_before_any_rank(cli, tmp_path):
    """N3: a built all-reduce on torch is send/recv, which ProcessGroupNCCL cannot capture
    (pytorch/pytorch#133984)."""
    status, out, err = cli("replay", "--model", tiny_model(tmp_path), "--tp", "2", "--prompt",
                           "8", "--decode", "4", "--backend", "torch", "--device", "cuda",
                           "--graph", "decode", "--allreduce-algo", "ring",
                           "--out", str(tmp_path))
    assert (status, out) == (2, "")
    assert len(err.strip().splitlines()) == 1 and "pytorch/pytorch#133984" in err


def test_a_cuda_aware_bf16_run_says_its_sums_are_staged():
    def staged(kind: str, dtype: str) -> bool:  # MpiBackend.staged_reduction's rule for bf16
        return kind in ("allreduce", "reducescatter") and dtype in ("bf16", "fp16")

    aware = types.SimpleNamespace(transport="mpi-cuda-aware", staged_reduction=staged)
    assert transport_of(aware, "bf16") == "mpi-cuda-aware+staged-bf16"
    assert transport_of(types.SimpleNamespace(transport="mpi-cuda-aware",
                                              staged_reduction=lambda k, d: False),
                        "fp32") == "mpi-cuda-aware"
    assert transport_of(types.SimpleNamespace(transport="nccl"), "bf16") == "nccl"


def test_torch_under_mpirun_across_hosts_asks_rank_0_or_names_master_addr(monkeypatch):
    """N11: without MASTER_ADDR or a Slurm node list, 127.0.0.1 is right on one host only."""
    env = DistEnv("openmpi", 1, 4, 1, "127.0.0.1", 29500, "OMPI_COMM_WORLD_LOCAL_RANK")
    one_host = {"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    assert rendezvous_address(env, one_host) == "127.0.0.1"
    assert rendezvous_address(env, {**one_host, "MASTER_ADDR": "n1"}) == "127.0.0.1"
    two_hosts = {"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    fake_mpi = types.SimpleNamespace(COMM_WORLD=types.SimpleNamespace(
        bcast=lambda value, root: "node-a"))  # rank 0's host name, as MPI_Bcast hands it
    monkeypatch.setitem(__import__("sys").modules, "mpi4py",
                        types.SimpleNamespace(MPI=fake_mpi))
    monkeypatch.setitem(__import__("sys").modules, "mpi4py.MPI", fake_mpi)
    assert rendezvous_address(env, two_hosts) == "node-a"
    monkeypatch.setitem(__import__("sys").modules, "mpi4py", None)  # not installed
    monkeypatch.delitem(__import__("sys").modules, "mpi4py.MPI")
    with pytest.raises(UsageError, match="MASTER_ADDR is not set"):
        rendezvous_address(env, two_hosts)


def test_op_timing_on_a_gpu_says_how_many_events_a_rank_creates():
    """R14: CudaMarks holds one event per call of the busiest rank plus the start
    (replay/replayer.py: capacity calls + 1)."""
    import argparse

    from microbench.cli.replay import op_events_note
    pattern = generate("vllm", resolve_model(DENSE), Layout(tp=2), Workload(prompt=16, decode=4),
                       EngineOptions())
    calls = pattern.calls_per_inference(0)
    note = op_events_note(pattern, argparse.Namespace(device="cuda", backend="torch"))
    assert note == f"; on a GPU, {calls + 1:,} CUDA events a rank (one per call), created " \
                   "before the run"
    assert op_events_note(pattern, argparse.Namespace(device="cpu", backend="torch")) == ""
    assert op_events_note(pattern, argparse.Namespace(device="cuda", backend="mpi")) == ""
