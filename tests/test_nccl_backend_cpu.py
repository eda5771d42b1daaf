"""The nccl backend and --graph on a CPU: refusals, and the code paths through a stand-in CuPy.

Real NCCL and CUDA graphs are in tests/test_gpu_nccl.py (gpu marker). Here `fake_cupy`
replaces CuPy at world size 1 so that every line between the replay and the library calls
(pointers, slices, grouping, stream, capture, CUDA-event marks) runs on every CI machine.
"""

import importlib.util
import sys

import numpy as np
import pytest
import torch

from microbench.argtypes import UsageError
from microbench.backends import nccl_backend, open_backend
from microbench.ranks.dist import DistEnv
from microbench.ranks.launch import free_port
from microbench.ranks.watchdog import Watchdog
from microbench.replay import check
from microbench.replay.graphs import capture_function, resolve_mode, use_graphs
from microbench.replay.plan import BoundOp, BoundRun, Plan
from microbench.replay.replayer import Replayer
from microbench.replay.timing import CudaMarks, make_marks
from patterns import Phase
from tests import fake_cupy
from tests.backend_helpers import KINDS, bound_op
from tests.replay_helpers import tiny_model

no_cupy = pytest.mark.skipif(importlib.util.find_spec("cupy") is not None,
                             reason="CuPy is installed here")
DTYPES = ("bf16", "fp16", "fp32", "int64", "int32", "uint8")


def _env() -> DistEnv:
    return DistEnv("torchrun", 0, 1, 0, "127.0.0.1", free_port())


def _replay(cli, tmp_path, *extra):
    return cli("replay", "--model", tiny_model(tmp_path), "--tp", "2", "--prompt", "8",
               "--decode", "4", "--out", str(tmp_path), *extra)


# --- refusals: one line, exit 2, before any rank starts ---

@no_cupy
def test_nccl_backend_without_cupy_is_a_usage_error(cli, tmp_path):
    status, out, err = _replay(cli, tmp_path, "--backend", "nccl")
    assert status == 2 and out == ""
    assert err.strip().splitlines() == [f"infercomm replay: error: {nccl_backend.CUPY_MISSING}"]
    assert not list(tmp_path.glob("2*"))


@no_cupy
def test_nccl_backend_without_cupy_in_a_launched_rank(cli, tmp_path, monkeypatch):
    # Under torchrun/srun no parent checks first: the rank itself says it, once.
    for var, value in dict(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0").items():
        monkeypatch.setenv(var, value)
    status, _, err = _replay(cli, tmp_path, "--backend", "nccl", "--device", "cpu")
    assert status == 2
    assert err.strip().splitlines() == [f"infercomm replay: error: {nccl_backend.CUPY_MISSING}"]
    with pytest.raises(UsageError, match="needs CuPy"):
        open_backend("nccl", env=_env(), device="cuda", timeout=5)


@pytest.mark.parametrize("extra, words", [
    (["--graph", "decode", "--device", "cpu"], "needs a CUDA device"),
    (["--graph", "decode", "--backend", "mpi"], "needs --backend torch or nccl"),
    (["--graph", "decode", "--timing", "op", "--device", "cuda"], "cannot time calls one by one"),
])
def test_graph_refusals(cli, tmp_path, extra, words):
    status, out, err = _replay(cli, tmp_path, *extra)
    assert status == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_graph_decode_on_a_machine_without_cuda_is_refused_once(cli, tmp_path):
    status, _, err = _replay(cli, tmp_path, "--graph", "decode")  # --device auto -> cpu
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and "needs a CUDA device" in err


def test_graph_default_and_explicit_modes():
    assert resolve_mode(None, "torch", "cuda", "step") == "decode"
    assert resolve_mode(None, "nccl", "cuda", "inference") == "decode"
    assert resolve_mode(None, "torch", "cuda", "op") == "none"  # op timing stays eager
    assert resolve_mode(None, "mpi", "cuda", "step") == "none"
    assert resolve_mode(None, "torch", "cpu", "step") == "none"
    assert resolve_mode("none", "mpi", "cpu", "op") == "none"
    assert resolve_mode("decode", "torch", "auto", "step") == "decode"  # parent: not yet known


# --- graph substitution, with a recording capture ---

def _plan_with(runs: list[tuple[Phase, int, int]]) -> tuple[Plan, list[str]]:
    issued: list[str] = []

    def call(name: str):
        return lambda: issued.append(name)

    bound = []
    for i, (phase, repeat, n) in enumerate(runs):
        ops = [BoundOp(None, None, None, None, call(f"r{i}c{j}")) for j in range(n)]
        bound.append(BoundRun(phase, repeat, ops, [op.call for op in ops]))
    return Plan(0, 0, bound, {}), issued


def test_use_graphs_swaps_each_decode_run_for_one_launch():
    plan, issued = _plan_with([(Phase.PREFILL, 1, 3), (Phase.DECODE, 5, 2),
                               (Phase.DECODE, 2, 0), (Phase.DECODE, 4, 1)])
    plan.runs[1].calls.append(lambda: issued.append("fault hook"))
    captured = []

    def capture(calls):
        for c in calls:  # the warm-up a real capture does
            c()
        name = f"graph{len(captured)}"
        captured.append(len(calls))
        return lambda: issued.append(name)

    class Backend:
        def synchronize(self):
            issued.append("sync")

    assert use_graphs(plan, Backend(), capture) == 2
    assert captured == [2, 1]
    assert issued == ["r1c0", "r1c1", "r3c0", "sync"]
    issued.clear()
    for run in plan.runs:
        for _ in range(run.repeat):
            for c in run.calls:
                c()
    assert issued == (["r0c0", "r0c1", "r0c2"] + ["graph0", "fault hook"] * 5 + ["graph1"] * 4)
    assert plan.calls_per_inference == 3 + 5 * 2 + 4  # the pattern's calls, not launches


# --- the nccl backend through the stand-in CuPy ---

@pytest.fixture
def fake(monkeypatch):
    for name, module in fake_cupy.make_modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    backend = open_backend("nccl", env=_env(), device="cuda", timeout=20)
    yield backend
    backend.close()


def test_nccl_backend_every_kind_eager_and_graphed(fake):
    world = fake.new_group("tp", [0])
    assert world.handle is fake._world.handle  # the world communicator is reused
    capture = capture_function(fake)
    for kind in KINDS:
        for dtype in DTYPES:
            op = bound_op(fake, world, kind, 12, dtype)
            assert check.verify(op, fake.write, fake.read, corrupt=False) == 0, (kind, dtype)
            graphed = BoundOp(op.op, op.group, op.send, op.recv, capture([op.call]))
            assert check.verify(graphed, fake.write, fake.read, corrupt=False) == 0, kind
            assert check.verify(graphed, fake.write, fake.read, corrupt=True) > 0, kind


def test_nccl_backend_objects_versions_and_marks(fake):
    assert fake.allgather_object({"a": 1}) == [{"a": 1}]
    assert fake.allgather_object(2) == [2]
    fake.barrier()
    info = fake.versions()
    assert (info["nccl"], info["cuda"], info["gpu"]) == (
        "2.27.3", "12.4", "Stand-in GPU (tests/fake_cupy.py)")
    assert info["unique_id_exchange"] == "tcp-store"
    # gather/all-to-all as grouped send/recv, said so a torch-vs-nccl comparison names it
    assert info["gather_alltoall"] == "grouped send/recv"
    marks = make_marks("cuda", 3, fake.stream)
    assert isinstance(marks, CudaMarks)
    for _ in range(3):
        marks.mark()
    fake.synchronize()  # as the replayer does: an event's time is read once it completed
    elapsed = marks.elapsed_us()
    assert elapsed[0] == 0 and np.all(np.diff(elapsed) >= 0)


def test_replayer_with_decode_graphs_on_the_nccl_backend(fake):
    group = fake.new_group("tp", [0])
    prefill = [bound_op(fake, group, "allreduce", 8, "bf16") for _ in range(3)]
    decode = [bound_op(fake, group, "allreduce", 4, "bf16"),
              bound_op(fake, group, "gather", 6, "bf16")]
    plan = Plan(0, 0, [BoundRun(Phase.PREFILL, 1, prefill, [o.call for o in prefill]),
                       BoundRun(Phase.DECODE, 7, decode, [o.call for o in decode])], {})
    watchdog = Watchdog(30, 0)
    with pytest.raises(UsageError, match="--timing op"):
        Replayer(plan, fake, "op", watchdog, graph="decode")
    replayer = Replayer(plan, fake, "step", watchdog, graph="decode")
    launches = plan.runs[1].calls[0].func.__self__  # the fake graph behind the launch
    before = fake_cupy.Communicator.calls
    marks = replayer.inference()
    assert len(marks) == 1 + 1 + 7  # start, prefill step, each decode step
    assert launches.launches == 7
    # The host issued the barrier and the prefill; each decode step was one launch.
    assert fake_cupy.Communicator.calls - before == 1 + 3
    assert replayer.check() == 0  # --check issues the same calls eagerly


# --- pure helpers ---

def test_bf16_storage_rounds_to_nearest_even():
    values = np.array([1.0, 15.0, 1.00390625, 1.01171875, -2.5])
    stored = nccl_backend._to_storage("bf16", values)
    assert stored.dtype == np.uint16
    assert nccl_backend._from_storage("bf16", stored).tolist() == [1.0, 15.0, 1.0, 1.015625, -2.5]


def test_version_codes():
    assert nccl_backend._nccl_version(22703) == "2.27.3"
    assert nccl_backend._nccl_version(2708) == "2.7.8"


def test_unique_id_bytes_for_every_cupy_version():
    assert nccl_backend._id_bytes_of(lambda: (-1, 0, 127, -128))() == bytes([255, 0, 127, 128])
    assert nccl_backend._id_bytes_of(lambda: b"\x01\xff")() == b"\x01\xff"

    class Nccl:
        signed = True

        @classmethod
        def NcclCommunicator(cls, n, uid, rank):  # CuPy's name
            if isinstance(uid, tuple) and any((b < 0) if not cls.signed else (b > 127)
                                              for b in uid):
                raise OverflowError("value too large to convert to char")
            return uid

    class Cupy:
        __version__ = "13.6.0"

    data = bytes([0, 200, 127])
    assert nccl_backend._communicator(Cupy, Nccl, 2, data, 0) == (0, -56, 127)  # x86: signed char
    Nccl.signed = False
    assert nccl_backend._communicator(Cupy, Nccl, 2, data, 0) == (0, 200, 127)  # ARM: unsigned char
    Cupy.__version__ = "14.2.0"
    assert nccl_backend._communicator(Cupy, Nccl, 2, data, 0) == data
