"""The stand-ins refuse what the real libraries refuse (the second GPU review's section 4):
each rule shown failing on a misuse, in the pytest process the stand-ins were installed in
(INFERCOMM_GPU_STANDIN=1; gpu-marked, so `make test-gpu-standin` and `make test` run them, and
skipped on a real GPU node, where the libraries themselves are the rule)."""

import sys
from datetime import timedelta

import pytest

from microbench.ranks.launch import free_port
from tests import gpu_standin

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_standin.enabled(),
                                 reason="rules of the stand-ins; a GPU node runs the libraries")]


@pytest.fixture
def torch_pg():
    """torch's NCCL process group of one rank on GPU 0, on the stand-in."""
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1, timeout=timedelta(seconds=30),
                            device_id=torch.device("cuda", 0))
    yield torch, dist
    for graph in list(torch.cuda.CUDAGraph.live):
        graph.reset()
    dist.destroy_process_group()


def _capture(torch, body):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        body()
    return graph


def test_a_captured_torch_p2p_gives_no_work(torch_pg):
    """pytorch/pytorch#133984: dist.send fails on .wait() of None; isend hands back None."""
    torch, dist = torch_pg
    x = torch.zeros(4, device="cuda")
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'wait'"):
        _capture(torch, lambda: dist.send(x, dst=0))
    works = []
    _capture(torch, lambda: works.append(dist.isend(x, dst=0)))
    assert works == [None]


@pytest.mark.parametrize("what", ["synchronize", "item", "event", "legacy stream", "other"])
def test_a_torch_capture_refuses_host_syncs_and_strays(torch_pg, what):
    torch, dist = torch_pg
    x = torch.zeros(4, device="cuda")
    other = torch.cuda.Stream()
    actions = {"synchronize": torch.cuda.synchronize, "item": lambda: x[0].item(),
               "event": lambda: torch.cuda.Event(enable_timing=True).record(),
               "other": lambda: _on(torch, other, lambda: dist.all_reduce(x))}
    if what == "legacy stream":
        with pytest.raises(RuntimeError, match="non-default stream"), \
                torch.cuda.graph(torch.cuda.CUDAGraph(), stream=torch.cuda.current_stream()):
            pass
        return
    with pytest.raises(RuntimeError):
        _capture(torch, actions[what])


def _on(torch, stream, body):
    with torch.cuda.stream(stream):
        body()


def test_torch_timing_events_are_bound_to_their_stream_and_completed(torch_pg):
    torch, dist = torch_pg
    x = torch.zeros(4, device="cuda")
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    start.record()
    dist.all_reduce(x)
    end.record()
    with pytest.raises(RuntimeError, match="cudaErrorNotReady"):
        start.elapsed_time(end)  # no synchronize yet
    torch.cuda.synchronize()
    assert start.elapsed_time(end) >= 0
    start.record()
    _on(torch, torch.cuda.Stream(), lambda: dist.all_reduce(x))  # a call the events miss
    end.record()
    torch.cuda.synchronize()
    with pytest.raises(AssertionError, match="do not time them"):
        start.elapsed_time(end)


def test_torch_teardown_with_a_live_graph_would_block(torch_pg):
    torch, dist = torch_pg
    x = torch.zeros(4, device="cuda")
    graph = _capture(torch, lambda: dist.all_reduce(x))
    graph.replay()
    with pytest.raises(AssertionError, match="destroy_process_group would block"):
        dist.destroy_process_group()
    graph.reset()  # the fixture's destroy then succeeds


@pytest.fixture
def nccl():
    """The nccl backend at world size one on the stand-in CuPy."""
    from microbench.backends import open_backend
    from microbench.ranks.dist import DistEnv
    backend = open_backend("nccl", env=DistEnv("torchrun", 0, 1, 0, "127.0.0.1", free_port()),
                           device="cuda", timeout=20)
    yield backend, sys.modules["cupy"]
    backend.close()


def test_a_call_on_a_freed_buffer_is_refused(nccl):
    """CuPy's pool hands a freed block out again (memory.pyx _arena @ v14.2.0)."""
    from tests.backend_helpers import bound_op
    backend, _ = nccl
    group = backend.new_group("tp", [0])
    op = bound_op(backend, group, "allreduce", 8, "fp32")
    call = op.call
    call()
    del op  # the buffers go; the bound call keeps raw pointers only
    with pytest.raises(AssertionError, match="no live array holds"):
        call()


def test_cupy_capture_on_the_legacy_stream_and_stray_events_are_refused(nccl):
    backend, cupy = nccl
    with pytest.raises(RuntimeError, match="legacy"):
        cupy.cuda.Stream.null.begin_capture()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(backend.stream)
    backend.barrier()  # an all-reduce on the stream, then its synchronize
    end.record(backend.stream)
    with pytest.raises(RuntimeError, match="cudaErrorNotReady"):
        cupy.cuda.get_elapsed_time(start, end)
    backend.synchronize()
    assert cupy.cuda.get_elapsed_time(start, end) >= 0
    other = cupy.cuda.Event()
    other.record(cupy.cuda.Stream(non_blocking=True))
    with pytest.raises(AssertionError, match="events on streams"):
        cupy.cuda.get_elapsed_time(start, other)


def test_mixing_support_zero_flags_an_eager_call_during_a_graph(nccl, monkeypatch):
    """NCCL env.rst NCCL_GRAPH_MIXING_SUPPORT @ 5067397c: with 0, an eager call on a
    communicator whose launched graph may still run is not supported."""
    from microbench.replay.graphs import capture_function, release_graphs
    from microbench.replay.plan import Plan
    from tests.backend_helpers import bound_op
    backend, _ = nccl
    monkeypatch.setenv("NCCL_GRAPH_MIXING_SUPPORT", "0")
    group = backend.new_group("tp", [0])
    op = bound_op(backend, group, "allreduce", 8, "fp32")
    launch = capture_function(backend)([op.call])
    launch()
    with pytest.raises(AssertionError, match="NCCL_GRAPH_MIXING_SUPPORT=0"):
        op.call()
    backend.synchronize()
    op.call()  # after a synchronize: supported
    release_graphs(Plan(0, 0, [], {}, graphs=[launch]), backend)


def test_every_multi_rank_gpu_test_skips_with_the_count_on_a_one_gpu_node():
    """N2: one rank a GPU (ranks/device.py refuses a second on one device), so every GPU
    test that launches N > 1 ranks must skip, saying N, where the node has fewer; run here
    on a stand-in node of one GPU, every gpu test but the world-size-one ones."""
    import os
    import re
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    files = ["tests/test_gpu.py", "tests/test_gpu_device.py", "tests/test_gpu_nccl.py",
             "tests/test_gpu_traces.py"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
         "-x", "-o", "timeout=60",  # a test that launches instead of skipping fails fast
         "-k", "not one_gpu and not world_size_one", *files],
        capture_output=True, text=True, timeout=240, cwd=repo, check=False,
        env={**os.environ, gpu_standin.GPUS_ENV: "1"})
    summary = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ skipped, \d+ deselected in .*", summary), proc.stdout[-3000:]
    reasons = re.findall(r"^SKIPPED \[\d+\] \S+: (.*)$", proc.stdout, re.M)
    assert reasons and all(re.fullmatch(r"needs [2-9] GPUs \(one a rank\); this node has 1", r)
                           for r in reasons), reasons


def test_the_fake_nccl_reduces_as_its_op_names_it():
    """ncclRedOp_t as CuPy numbers it (cupy_backends/cuda/libs/nccl.pxd @ 8f4c987d): a
    backend passing another op than it means gets other data. Two ranks of one communicator
    (threads here, each its own gloo member), inputs [1, 5] and [3, 2] in fp32:
    sum [4, 7], prod [3, 10], max [3, 5], min [1, 2], avg [2, 3.5]; op 5 is no op NCCL knows
    (src/misc/argcheck.cc @ 0f900e1b: "invalid reduction operation")."""
    import threading

    import cupy  # the stand-in (tests/gpu_standin.py)
    import numpy as np

    from tests import fake_cupy, fake_nccl_wire
    nccl = cupy.cuda.nccl
    uid = fake_nccl_wire.unique_id()
    inputs = ([1.0, 5.0], [3.0, 2.0])
    stream = cupy.cuda.Stream(non_blocking=True)
    ops = {"NCCL_SUM": [4, 7], "NCCL_PROD": [3, 10], "NCCL_MAX": [3, 5], "NCCL_MIN": [1, 2],
           "NCCL_AVG": [2, 3.5]}
    got: dict[tuple[int, str], list[float]] = {}
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            comm = nccl.NcclCommunicator(2, uid, r)
            for name in ops:
                array = cupy.zeros(2, dtype=np.float32)
                array.host[:] = inputs[r]
                comm.allReduce(array.data.ptr, array.data.ptr, 2, nccl.NCCL_FLOAT32,
                               getattr(nccl, name), stream.ptr)
                got[r, name] = array.get().tolist()
            comm.destroy()
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert got == {(r, name): want for r in (0, 1) for name, want in ops.items()}
    alone = nccl.NcclCommunicator(1, bytes(128), 0)
    array = cupy.zeros(2, dtype=np.float32)
    with pytest.raises(fake_cupy.NcclError, match="invalid reduction operation 5"):
        alone.allReduce(array.data.ptr, array.data.ptr, 2, nccl.NCCL_FLOAT32, 5, stream.ptr)


def test_device_memory_goes_to_an_mpi_only_if_it_is_cuda_aware(monkeypatch):
    """mpi4py hands a tensor to MPI through its DLPack export, unchecked ("whether or not a
    MPI call can work for GPU arrays depends on the underlying MPI implementation", mpi4py
    docs/source/overview.rst @ 1e12c8cc): the stand-in's CUDA memory refuses the export to
    an MPI library that is not CUDA-aware, and only then."""
    import torch

    from tests import fake_device_memory
    torch.cuda.set_device(0)
    device = torch.zeros(4, dtype=torch.int32, device="cuda")
    host = torch.zeros(4, dtype=torch.int32)
    monkeypatch.setattr(fake_device_memory, "mpi_cuda_aware", lambda: False)
    with pytest.raises(BufferError, match="not CUDA-aware"):
        device.__dlpack__()
    host.__dlpack__()  # host memory goes to any MPI
    device.cpu().numpy()  # a host copy of it too
    monkeypatch.setattr(fake_device_memory, "mpi_cuda_aware", lambda: True)
    device.__dlpack__()
