"""The third GPU review's findings (issue 42) that a CPU can decide: each fixed path run or
asked here, each test failing on the code before it (the GPU tests of the same fixes are in
tests/test_gpu_device.py and tests/test_gpu_standin.py, on the stand-ins)."""

import importlib.util
import os
import subprocess
import sys
import time
import types
from datetime import timedelta
from pathlib import Path

import pytest

from microbench.argtypes import UsageError
from microbench.ranks.dist import DistEnv, first_slurm_host
from microbench.ranks.launch import free_port
from tests.replay_helpers import tiny_model

REPO = Path(__file__).resolve().parent.parent
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
               "SLURM_PROCID", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_NODELIST",
               "SLURM_STEP_NODELIST", "TORCHELASTIC_USE_AGENT_STORE", "INFERCOMM_LAUNCHER",
               "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")


@pytest.fixture
def clean_env(monkeypatch):
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# --- LIKELY: srun --gpus-per-task ---

def test_isolated_gpus_are_warned_with_the_fix_and_never_suggested():
    """Each task of `srun --gpus-per-task=1` sees only its own GPU: NCCL cannot see NVLink
    ("NCCL needs to see all GPUs on the same node for all NVLink detection to work
    properly", NVIDIA/nccl#1066) and falls back silently, so the run is warned, naming the
    fix; alone on its node (nothing to isolate it from) or seeing all GPUs, it is not."""
    from microbench.ranks.device import check_device_index, isolated_gpus_warning
    task = DistEnv("slurm", 0, 8, 0, "h", 1, "SLURM_LOCALID")
    per_task = {"SLURM_GPUS_PER_TASK": "1", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
                "SLURM_NODEID": "0"}
    warning = isolated_gpus_warning(task, 1, per_task)
    assert warning is not None and warning.count("\n") == 1
    assert "NVIDIA/nccl#1066" in warning and "--gpus-per-node=N --gpu-bind=none" in warning
    # one task a node (SLURM_STEP_TASKS_PER_NODE '1(x8)'), or every GPU seen: no warning
    assert isolated_gpus_warning(task, 1, {**per_task, "SLURM_STEP_TASKS_PER_NODE": "1(x8)"}) \
        is None
    assert isolated_gpus_warning(task, 4, per_task) is None
    assert isolated_gpus_warning(DistEnv("slurm", 0, 1, 0, "h", 1, "SLURM_LOCALID"), 1,
                                 per_task) is None
    # node 2 of '4(x2),1': the third node holds 1 task
    assert isolated_gpus_warning(task, 1, {**per_task, "SLURM_STEP_TASKS_PER_NODE": "4(x2),1",
                                           "SLURM_NODEID": "2"}) is None
    # the refusal of a local rank beyond the GPUs no longer suggests --gpus-per-task
    with pytest.raises(UsageError) as refused:
        check_device_index(DistEnv("slurm", 3, 4, 3, "h", 1, "SLURM_LOCALID"), 1, {})
    assert "gpus-per-task" not in str(refused.value)
    assert "--gpus-per-node=N --gpu-bind=none" in str(refused.value)


def test_the_benchmark_suggests_no_gpus_per_task_and_warns_of_it():
    text = (REPO / "benchmarks" / "gpu_overhead.py").read_text()
    usage = text[:text.index('"""', 3)]
    assert "--gpus-per-task 1 python" not in usage
    assert "isolated_gpus_warning(env," in text


# --- LIKELY: --backend nccl under torchrun ---

def test_under_torchrun_the_nccl_ids_go_through_the_agents_store(clean_env):
    """torchrun's agent serves a TCPStore on MASTER_PORT and sets
    TORCHELASTIC_USE_AGENT_STORE=True in its workers: every rank is then a client of it
    (as torch's own rendezvous is), its keys under the attempt's prefix. Here the agent's
    store is served by this test; rank 0's exchange writes through it."""
    from torch.distributed import TCPStore

    from microbench.backends.nccl_exchange import agent_store_serves, open_exchange
    agent = TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=30), wait_for_workers=False)
    port = agent.port
    clean_env.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    clean_env.setenv("MASTER_PORT", str(port))
    clean_env.setenv("TORCHELASTIC_RUN_ID", "job7")
    clean_env.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    env = DistEnv("torchrun", 0, 2, 0, "127.0.0.1", port, "LOCAL_RANK")
    assert agent_store_serves(env)
    assert not agent_store_serves(DistEnv("torchrun", 0, 2, 0, "127.0.0.1", port + 1))
    assert not agent_store_serves(DistEnv("slurm", 0, 2, 0, "127.0.0.1", port))
    exchange = open_exchange(env, 30)
    assert exchange.share("k", 0, lambda: b"id", member=True) == b"id"
    assert agent.get("infercomm/job7/2/k") == b"id"  # the attempt's prefix: job7, restart 2
    exchange.close()


def test_the_benchmarks_torch_rendezvous_stays_on_master_port(clean_env):
    """Under torchrun a torch rendezvous on any port but MASTER_PORT is client-only and waits
    for a server that never comes (torch/distributed/rendezvous.py _create_c10d_store);
    without the agent, nccl's own store takes the next port beside torch's."""
    spec = importlib.util.spec_from_file_location("gpu_overhead",
                                                  REPO / "benchmarks" / "gpu_overhead.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    env = DistEnv("torchrun", 0, 2, 0, "127.0.0.1", 29400, "LOCAL_RANK")
    assert [bench.backend_port(env, n, ["nccl", "torch"]) for n in ("nccl", "torch")] \
        == [29401, 29400]
    assert bench.backend_port(env, "nccl", ["nccl"]) == 29400
    clean_env.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    clean_env.setenv("MASTER_PORT", "29400")
    assert [bench.backend_port(env, n, ["nccl", "torch"]) for n in ("nccl", "torch")] \
        == [29400, 29400]


# --- POSSIBLE: the nccl store across hosts without mpi4py ---

def test_the_nccl_store_across_hosts_without_mpi4py_names_master_addr(clean_env):
    """mpirun across two hosts with no MASTER_ADDR, no Slurm and no mpi4py: 127.0.0.1 would
    pair each host's ranks with themselves (a wait until --timeout); refused, naming it."""
    from microbench.backends.nccl_exchange import open_exchange
    clean_env.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    clean_env.setitem(sys.modules, "mpi4py", None)  # not installed
    env = DistEnv("openmpi", 1, 4, 1, "127.0.0.1", free_port(), "OMPI_COMM_WORLD_LOCAL_RANK")
    start = time.monotonic()
    with pytest.raises(UsageError, match="MASTER_ADDR is not set"):
        open_exchange(env, 5)
    assert time.monotonic() - start < 2  # at once, not after the store's timeout


# --- POSSIBLE: NCCL_GRAPH_MIXING_SUPPORT=0 and eager calls between graphs ---

def test_mixing_support_zero_is_refused_for_eager_pp_calls_between_graphs():
    """TP2 x PP2: the PP sends and receives and the sampled tokens' broadcast run eagerly
    between the stages' graphs, on communicators split from the world's (or the world's own),
    which NCCL_GRAPH_MIXING_SUPPORT=0 does not support "(or split-shared communicators)",
    NCCL env.rst @ 0186f08d. TP2 alone only goes eager -> captured: allowed."""
    from microbench.replay.graphs import check_mixing
    from patterns import EngineOptions, Layout, Workload, generate, resolve_model
    zero = {"NCCL_GRAPH_MIXING_SUPPORT": "0"}
    model, work = resolve_model("llama-3.1-8b"), Workload(prompt=16, decode=4)
    staged = generate("vllm", model, Layout(tp=2, pp=2), work, EngineOptions())
    plain = generate("vllm", model, Layout(tp=2), work, EngineOptions())
    with pytest.raises(UsageError, match="NCCL_GRAPH_MIXING_SUPPORT=0"):
        check_mixing(staged, "decode", "nccl", "cuda", zero)
    check_mixing(plain, "decode", "nccl", "cuda", zero)
    check_mixing(staged, "none", "nccl", "cuda", zero)


# --- POSSIBLE: the closing barrier while rank 0 writes ---

def _record_order(monkeypatch, module: str, writer: str, backend_class: str) -> list[str]:
    order: list[str] = []
    import importlib
    written = importlib.import_module(module)
    real_write = getattr(written, writer)

    def write(*args, **kwargs):
        order.append("write")
        return real_write(*args, **kwargs)
    monkeypatch.setattr(written, writer, write)
    owner, name = backend_class.rsplit(".", 1)
    cls = getattr(importlib.import_module(owner), name)
    real_close = cls.close

    def close(self):
        order.append("close")
        return real_close(self)
    monkeypatch.setattr(cls, "close", close)
    return order


def _one_rank(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))


def test_every_rank_closes_before_rank_0_writes_the_replay(cli, tmp_path, clean_env):
    """The nccl backend's close is a barrier: ranks that reach it wait for rank 0, which
    wrote its results first (a large ops.csv, a slow disk) while their watchdogs counted
    toward --timeout. Now the close comes first, the write after."""
    _one_rank(clean_env)
    order = _record_order(clean_env, "microbench.replay.output", "write_replay",
                          "microbench.backends.torch_backend.TorchBackend")
    status, _, err = cli("replay", "--model", tiny_model(tmp_path), "--prompt", "4",
                           "--decode", "2", "--backend", "torch", "--device", "cpu", "-n", "1",
                           "-w", "0", "--out", str(tmp_path / "out"))
    assert status == 0, err
    assert order == ["close", "write"]


def test_every_rank_closes_before_rank_0_writes_the_sweep(cli, tmp_path, clean_env):
    _one_rank(clean_env)
    order = _record_order(clean_env, "microbench.sweep.output", "write_sweep",
                          "microbench.backends.torch_backend.TorchBackend")
    status, _, err = cli("sweep", "--op", "allreduce", "-b", "8", "-e", "8", "--backend",
                         "torch", "--device", "cpu", "-n", "1", "-w", "0",
                         "--out", str(tmp_path / "out"))
    assert status == 0, err
    assert order == ["close", "write"]


# --- POSSIBLE: sweep and NCCL's asynchronous errors ---

_SWEEP_BROKEN_LINK = """
import sys, time
from tests import fake_cupy
sys.modules.update(fake_cupy.make_modules())
from microbench.sweep import cases

def run(self, *args, **kwargs):
    fake_cupy.Communicator.async_error = (
        "NCCL_ERROR_REMOTE_ERROR: remote process exited or there was a network error")
    time.sleep(3600)  # an NCCL call that never returns: the peer is gone

cases.Sweeper.run = run
from microbench.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_sweep_reports_an_nccl_async_error_at_once(tmp_path):
    """The watchdog polls ncclCommGetAsyncError each second in sweep as in replay: a broken
    link is NCCL's error within seconds, not 300 s of no progress."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "PYTHONPATH": str(REPO)}
    env.pop("INFERCOMM_GPU_STANDIN", None)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _SWEEP_BROKEN_LINK, "sweep", "--op",
                           "allreduce", "-b", "8", "-e", "8", "--backend", "nccl", "--device",
                           "cuda", "--timeout", "300", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=90, env=env, cwd=REPO,
                          check=False)
    assert proc.returncode == 1, proc.stderr
    assert time.monotonic() - start < 60
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "infercomm sweep: error: rank 0: NcclError: NCCL_ERROR_REMOTE_ERROR: remote process")


# --- POSSIBLE: --allreduce-algo on nccl needs NVRTC ---

def test_an_allreduce_algorithm_on_nccl_is_refused_without_nvrtc():
    """CuPy compiles the sum kernel with NVRTC, which the cupy-cuda12x wheel does not bring:
    refused in one line before any call, saying what to install."""
    from microbench.algorithms.execute import require_nvrtc

    def missing():
        raise RuntimeError("CuPy failed to load libnvrtc.so.12: OSError: libnvrtc.so.12: "
                           "cannot open shared object file: No such file or directory")
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
        nvrtc=types.SimpleNamespace(getVersion=missing)))
    with pytest.raises(UsageError) as refused:
        require_nvrtc(cupy)
    text = str(refused.value)
    assert "\n" not in text and "cupy-cuda12x[ctk]" in text and "libnvrtc.so.12" in text
    cupy.cuda.nvrtc.getVersion = lambda: (12, 4)
    require_nvrtc(cupy)


# --- POSSIBLE: make test-gpu passing with every test skipped ---

@pytest.mark.parametrize("standin", ["", "1"])
def test_make_test_gpu_refuses_a_node_whose_torch_sees_no_gpu(standin):
    """`make test-gpu` sets INFERCOMM_GPU_REQUIRED=1: where torch sees no GPU (here, a CPU
    torch) every gpu test would skip and the target pass; on the stand-ins it would pass on
    no GPU. Both end before any test, in one line."""
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile[makefile.index("\ntest-gpu: "):makefile.index("\ntest-gpu-standin: ")]
    assert "INFERCOMM_GPU_REQUIRED=1 $(BIN)/python -m pytest -m gpu" in recipe
    env = {**os.environ, "INFERCOMM_GPU_REQUIRED": "1", "INFERCOMM_GPU_STANDIN": standin}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p",
                           "no:cacheprovider", "--collect-only", "tests/test_gpu.py"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO,
                          check=False)
    assert proc.returncode == 4, proc.stdout[-2000:]
    said = "stand-ins in place of the GPUs" if standin else "torch sees no GPU"
    assert "ERROR: make test-gpu: " in proc.stderr and said in proc.stderr, proc.stderr


# --- POSSIBLE: first_slurm_host with a suffix ---

@pytest.mark.parametrize(("nodelist", "first"), [
    ("gpu[01-02]-ib", "gpu01-ib"),  # the review's case: the suffix was dropped (gpu01)
    ("gpu[003-005,009]-ib,login1", "gpu003-ib"),
    ("rack[1-2]-node[07-08]", "rack1-node07"),
    ("gpu-a,gpu-b", "gpu-a"),
])
def test_the_first_slurm_host_keeps_what_follows_its_ranges(nodelist, first):
    assert first_slurm_host(nodelist) == first
