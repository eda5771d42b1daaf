"""Teardown with CUDA graphs alive, and capture rules, through the strict stand-in CuPy.

NCCL's ncclCommDestroy/ncclCommFinalize wait until every graph that captured the
communicator is destroyed (commDestroySync, NVIDIA/nccl src/init.cc @ 5067397c): a replay
that closes its backend while its graphs live hangs for ever on a GPU. `tests/fake_cupy.py`
raises there instead, so the real `infercomm replay` rank flow (capture, timed inferences,
results, close) fails here on the code that closes too early (gpu_review.md W1).
"""

import sys
from typing import ClassVar

import pytest

from microbench.backends import open_backend
from microbench.ranks.dist import DistEnv
from microbench.ranks.launch import free_port
from microbench.replay import plan as plan_module
from microbench.replay.graphs import capture_function
from microbench.replay.plan import BoundRun
from tests import fake_cupy
from tests.backend_helpers import bound_op
from tests.replay_helpers import tiny_model


@pytest.fixture
def cupy(monkeypatch):
    for name, module in fake_cupy.make_modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    return fake_cupy


def _env() -> DistEnv:
    return DistEnv("torchrun", 0, 1, 0, "127.0.0.1", free_port())


def _graphed_replay_rank(cli, tmp_path, monkeypatch) -> tuple[int, str]:
    """`infercomm replay` as a launched rank of a world of one (the fake is one device):
    every step gets two all-reduces on the world communicator, so the decode graphs capture
    it, as they capture the TP communicator on a GPU. The `cli` fixture turns the rank's
    os._exit into a status, so a failing rank is a failed test with its message, never the
    end of pytest (gpu_rereview.md 2.4)."""
    build = plan_module.build_plan

    def with_world_calls(pattern, backend):
        plan = build(pattern, backend)
        world = backend.new_group("world", [0])
        for i, run in enumerate(plan.runs):
            ops = [bound_op(backend, world, "allreduce", 8 + i, "bf16") for _ in range(2)]
            plan.runs[i] = BoundRun(run.phase, run.repeat, ops, [o.call for o in ops])
        return plan

    monkeypatch.setattr(plan_module, "build_plan", with_world_calls)
    monkeypatch.setattr("microbench.cli.replay.check_rank_fits", lambda *a, **k: None)
    port = free_port()
    for var, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
        monkeypatch.setenv(var, value)
    status, _, err = cli("replay", "--model", tiny_model(tmp_path), "--prompt", "8",
                         "--decode", "4", "--backend", "nccl", "--device", "cuda",
                         "--graph", "decode", "-n", "2", "--warmup", "1",
                         "--out", str(tmp_path))
    return status, err


def test_a_graphed_replay_rank_closes_its_backend_after_releasing_the_graphs(
        cli, cupy, tmp_path, monkeypatch):
    """W1: the rank ends with status 0 and every communicator destroyed."""
    status, err = _graphed_replay_rank(cli, tmp_path, monkeypatch)
    assert "would block" not in err, err
    assert status == 0, err
    assert fake_cupy.Communicator.live and all(c.destroyed for c in fake_cupy.Communicator.live)


def test_the_w1_check_fails_with_its_message_when_graphs_are_not_released(
        cli, cupy, tmp_path, monkeypatch):
    """The mutation: without release_graphs the close meets live graphs (the real
    ncclCommDestroy would wait for ever, NCCL src/init.cc commDestroySync @ 5067397c); the
    rank reports it in one line and ends with status 1, and pytest goes on."""
    monkeypatch.setattr("microbench.replay.graphs.release_graphs", lambda plan, backend: None)
    status, err = _graphed_replay_rank(cli, tmp_path, monkeypatch)
    assert status == 1
    assert "ncclCommDestroy would block" in err.strip().splitlines()[-1]
    import gc
    gc.collect()  # the abandoned plan's graphs go, so later tests' communicators close


def test_the_stand_in_refuses_to_destroy_a_communicator_a_live_graph_captured(cupy):
    backend = open_backend("nccl", env=_env(), device="cuda", timeout=20)
    group = backend.new_group("tp", [0])
    op = bound_op(backend, group, "allreduce", 4, "fp32")  # kept: the graph holds pointers
    launch = capture_function(backend)([op.call])
    with pytest.raises(AssertionError, match="ncclCommDestroy would block: 1 live"):
        backend.close()
    launch()  # still usable: nothing was destroyed
    del launch
    backend.close()


@pytest.mark.parametrize("what", ["synchronize", "memGetInfo", "get", "communicator",
                                  "event", "other stream"])
def test_a_capture_refuses_what_cuda_refuses(cupy, what):
    backend = open_backend("nccl", env=_env(), device="cuda", timeout=20)
    group = backend.new_group("tp", [0])
    op = bound_op(backend, group, "allreduce", 4, "fp32")
    cuda = sys.modules["cupy.cuda"]
    other = cuda.Stream(non_blocking=True)
    actions = {
        "synchronize": backend.stream.synchronize,
        "memGetInfo": cuda.runtime.memGetInfo,
        "get": lambda: op.send.array.get(),
        "communicator": lambda: cuda.nccl.NcclCommunicator(1, bytes(128), 0),
        "event": lambda: cuda.Event().record(backend.stream),
        "other stream": lambda: group.handle.allReduce(op.send.ptr, op.send.ptr, 4, 7, 0,
                                                       other.ptr),
    }
    backend.stream.begin_capture()
    try:
        op.call()  # joins the capture
        with pytest.raises(fake_cupy.CaptureError):
            actions[what]()
    finally:
        graph = backend.stream.end_capture()
    del graph
    backend.close()


def test_graph_decode_on_an_eager_pattern_is_refused_and_eager_is_the_default(cli, tmp_path):
    """R12: an --eager engine runs no CUDA graphs; its pattern replays eagerly."""
    from microbench.replay.graphs import eager_pattern_mode
    from patterns import EngineOptions, Layout, Workload, generate, resolve_model

    status, out, err = cli("replay", "--model", tiny_model(tmp_path), "--tp", "2",
                           "--prompt", "8", "--decode", "4", "--eager", "--graph", "decode",
                           "--backend", "torch", "--device", "cuda", "--out", str(tmp_path))
    assert (status, out) == (2, "")
    assert len(err.strip().splitlines()) == 1 and "generated with --eager" in err
    pattern = generate("vllm", resolve_model("llama-3.1-8b"), Layout(tp=2),
                       Workload(prompt=8, decode=4), EngineOptions(eager=True))
    assert eager_pattern_mode(pattern, None) == "none"
    assert eager_pattern_mode(pattern, "none") == "none"


class _FakeTorchGraph:
    """torch.cuda.CUDAGraph as `_capture_torch` uses it; `reset` is the real method's name
    (it frees the graph and its memory pool)."""

    live: ClassVar[set[int]] = set()

    def __init__(self) -> None:
        _FakeTorchGraph.live.add(id(self))

    def replay(self) -> None:
        assert id(self) in _FakeTorchGraph.live, "replay of a reset graph"

    def reset(self) -> None:
        _FakeTorchGraph.live.discard(id(self))


def test_torch_graphs_are_reset_before_the_process_group_is_destroyed(monkeypatch):
    """W1 on the torch path: the graphs `_capture_torch` made are reset (graph and pool
    freed) by the teardown, so ProcessGroupNCCL's shutdown finds none alive."""
    import contextlib

    import torch

    from microbench.replay.agreement import RecordingBackend
    from microbench.replay.graphs import release_graphs, use_graphs
    from microbench.replay.plan import build_plan
    from patterns import EngineOptions, Layout, Workload, generate, resolve_model

    assert all(hasattr(torch.cuda.CUDAGraph, name) for name in ("replay", "reset"))
    stream = type("S", (), {"wait_stream": lambda self, other: None})
    monkeypatch.setattr(torch.cuda, "Stream", stream)
    monkeypatch.setattr(torch.cuda, "current_stream", stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph", lambda g, **kw: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeTorchGraph)
    _FakeTorchGraph.live.clear()

    class TorchRecording(RecordingBackend):
        name = "torch"

    pattern = generate("vllm", resolve_model("llama-3.1-8b"), Layout(tp=2, pp=2),
                       Workload(prompt=16, decode=4), EngineOptions())
    backend = TorchRecording(0, 4)
    plan = build_plan(pattern, backend)
    graphs = use_graphs(plan, backend)
    # Every rank decodes steps 1-3 in one run (graph_pieces: (0, 1, eager), (1, 4, captured)):
    # on stage 0 the TP all-reduces before the PP send are one graph; the send and the
    # pp_broadcast calls stay eager. 1 piece x 1 graph = 1.
    assert graphs == 1 and len(_FakeTorchGraph.live) == 1
    release_graphs(plan, backend)
    assert _FakeTorchGraph.live == set() and plan.graphs == []
    assert all(not isinstance(getattr(c, "__self__", None), _FakeTorchGraph)
               for run in plan.runs for c in run.calls)


_FAILING_RANK = """
import sys, time
from tests import fake_cupy
sys.modules.update(fake_cupy.make_modules())

def wait_for_the_dead_peer(self):
    # ncclCommDestroy from CuPy's __dealloc__ (nccl.pyx @ v14.2.0) waits for the kernels still
    # spinning on a dead peer (ncclCommPollEventCallbacks, NCCL src/init.cc @ 5067397c)
    time.sleep(3600)

fake_cupy.Communicator.__del__ = wait_for_the_dead_peer
from microbench.replay import replayer

def run(self, *args, **kwargs):
    raise RuntimeError("NCCL error: remote process exited or there was a network error")

replayer.Replayer.run = run
import microbench.cli.replay as cli_replay
cli_replay.check_rank_fits = lambda *a, **k: None
from microbench.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_failing_gpu_rank_ends_without_waiting_in_communicator_destructors(tmp_path):
    """R3: after its one-line report, a rank failing on a CUDA device leaves by os._exit; a
    communicator destructor that waits for a dead peer would hold it for ever."""
    import os
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "PYTHONPATH": str(repo)}
    proc = subprocess.run([sys.executable, "-c", _FAILING_RANK, "replay", "--model",
                           tiny_model(tmp_path), "--prompt", "8", "--decode", "4", "--backend",
                           "nccl", "--device", "cuda", "--graph", "decode", "--timeout", "300",
                           "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, env=env, cwd=repo,
                          check=False)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "infercomm replay: error: rank 0: RuntimeError: NCCL error: remote process exited")


_BROKEN_LINK = _FAILING_RANK.replace('''def run(self, *args, **kwargs):
    raise RuntimeError("NCCL error: remote process exited or there was a network error")''',
                                     '''def run(self, *args, **kwargs):
    fake_cupy.Communicator.async_error = (
        "NCCL_ERROR_REMOTE_ERROR: remote process exited or there was a network error")
    time.sleep(3600)  # an NCCL call that never returns: the peer is gone''')


def test_an_nccl_async_error_ends_the_rank_at_once_with_its_message(tmp_path):
    """R4: the watchdog polls ncclCommGetAsyncError (CuPy's check_async_error) each second,
    so a broken link is reported as NCCL's error, not as 300 s of no progress."""
    import os
    import subprocess
    import time
    from pathlib import Path

    assert "time.sleep(3600)  # an NCCL call" in _BROKEN_LINK
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "PYTHONPATH": str(repo)}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _BROKEN_LINK, "replay", "--model",
                           tiny_model(tmp_path), "--prompt", "8", "--decode", "4", "--backend",
                           "nccl", "--device", "cuda", "--timeout", "300",
                           "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, env=env, cwd=repo,
                          check=False)
    assert proc.returncode == 1, proc.stderr
    assert time.monotonic() - start < 50  # one poll a second, not the 300 s --timeout
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "infercomm replay: error: rank 0: NcclError: NCCL_ERROR_REMOTE_ERROR: remote process")


_FAILING_SWEEP = _FAILING_RANK.replace("""from microbench.replay import replayer

def run(self, *args, **kwargs):
    raise RuntimeError("NCCL error: remote process exited or there was a network error")

replayer.Replayer.run = run""", """from microbench.sweep import cases

def run(self, *args, **kwargs):
    raise RuntimeError("NCCL error: remote process exited or there was a network error")

cases.Sweeper.run = run""")


def test_a_failing_gpu_sweep_rank_ends_without_waiting_in_communicator_destructors(tmp_path):
    """N7: sweep's failure path ends a GPU rank like replay's (os._exit after the report),
    so CuPy's NcclCommunicator.__dealloc__ -> ncclCommDestroy (nccl.pyx @ v14.2.0), which
    waits for a dead peer (NCCL src/init.cc @ 5067397c), never runs."""
    import os
    import subprocess
    import time
    from pathlib import Path

    assert "cases.Sweeper.run = run" in _FAILING_SWEEP
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "PYTHONPATH": str(repo)}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _FAILING_SWEEP, "sweep", "--op", "allreduce",
                           "--sizes", "1K", "--backend", "nccl", "--device", "cuda",
                           "--timeout", "300", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, env=env, cwd=repo,
                          check=False)
    assert proc.returncode == 1, proc.stderr
    assert time.monotonic() - start < 50  # not the destructor's sleep of an hour
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "infercomm sweep: error: rank 0: RuntimeError: NCCL error: remote process exited")
