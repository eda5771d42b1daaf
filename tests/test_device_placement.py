"""Device placement through the real `infercomm replay` path, on a stand-in `torch.cuda`.

Each rank is driven as a launcher would start it (its variables set, `main` in-process), the
backend's opening replaced by a stop, and `tests/fake_torch_cuda.FakeCuda` refusing what a real
node would punish: a memory query before the rank's device is selected (L1), a device the host
lacks (R11), a local rank from the wrong variable (L3), MPI initialised before the device
(R6). The nccl path runs on real CPU torch, whose `torch.cuda.mem_get_info` raises
AssertionError, beside a stand-in CuPy (L2).
"""

import importlib.machinery
import sys
import types

import pytest
import torch

from microbench import backends
from microbench.argtypes import UsageError
from microbench.ranks.dist import DistEnv
from microbench.replay.timing import CpuMarks, make_marks
from tests.fake_torch_cuda import FakeCuda
from tests.replay_helpers import tiny_model

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                 "MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                 "SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK",
                 "SLURM_GPUS", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES",
                 "SLURM_JOB_ID", "INFERCOMM_LAUNCHER")


@pytest.fixture
def clean_env(monkeypatch):
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _stop_at_open(monkeypatch, log):
    """open_backend replaced by a stop that logs when it was reached (status 2, one line)."""
    def stop(name, **options):
        log.append(("open_backend", name, options["env"].local_rank))
        raise UsageError(f"stopped at open_backend ({name})")
    monkeypatch.setattr(backends, "open_backend", stop)


def _replay(cli, tmp_path, *extra):
    return cli("replay", "--model", tiny_model(tmp_path), "--tp", "2", "--prompt", "8",
               "--decode", "2", "--graph", "none", "--out", str(tmp_path), *extra)


def _torchrun_rank(env, rank, local):
    env.setenv("RANK", str(rank))
    env.setenv("WORLD_SIZE", "2")
    env.setenv("LOCAL_RANK", str(local))


def test_memory_check_runs_on_the_ranks_own_device_after_selecting_it(cli, tmp_path,
                                                                       clean_env):
    """L1: rank 1 selects GPU 1, then reads GPU 1's free memory, then opens its backend."""
    cuda = FakeCuda(2).install(clean_env)
    _stop_at_open(clean_env, cuda.calls)
    _torchrun_rank(clean_env, 1, 1)
    status, _, err = _replay(cli, tmp_path, "--device", "cuda")
    assert (status, err.strip()) == (2, "infercomm replay: error: stopped at open_backend "
                                        "(torch)"), err
    names = [c[0] for c in cuda.calls]
    assert names.index("set_device") < names.index("mem_get_info") < names.index("open_backend")
    assert cuda.first("set_device")[1][1] == 1 and cuda.first("mem_get_info")[1][1] == 1


def test_a_local_rank_without_a_device_is_refused_in_one_line(cli, tmp_path, clean_env):
    """R11: local rank 2 on a host with 2 GPUs is refused, not wrapped round onto GPU 0."""
    cuda = FakeCuda(2).install(clean_env)
    _stop_at_open(clean_env, cuda.calls)
    _torchrun_rank(clean_env, 1, 2)
    status, _, err = _replay(cli, tmp_path, "--device", "cuda")
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert "local rank 2 (from LOCAL_RANK) but this host sees 2 GPUs" in err
    assert not [c for c in cuda.calls if c[0] in ("set_device", "open_backend")]


def test_srun_pmi2_task_uses_slurm_localid_for_its_device(cli, tmp_path, clean_env):
    """L3: srun --mpi=pmi2 sets PMI_RANK but no MPI_LOCALRANKID; the task's GPU is
    SLURM_LOCALID's, not GPU 0 for every task."""
    cuda = FakeCuda(2).install(clean_env)
    _stop_at_open(clean_env, cuda.calls)
    for name, value in (("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("SLURM_PROCID", "1"),
                        ("SLURM_NTASKS", "2"), ("SLURM_LOCALID", "1")):
        clean_env.setenv(name, value)
    status, _, err = _replay(cli, tmp_path, "--device", "cuda")
    assert status == 2 and "stopped at open_backend" in err, err
    assert cuda.first("set_device")[1][1] == 1
    assert ("open_backend", "torch", 1) in cuda.calls


def test_nccl_beside_cpu_torch_starts(cli, tmp_path, clean_env):
    """L2: real CPU torch (torch.cuda.mem_get_info raises AssertionError) beside CuPy: the
    nccl path selects and measures its device through CuPy and reaches the backend."""
    assert not torch.cuda.is_available()  # the point: torch here is a CPU build
    log: list = []
    cupy = _fake_cupy(log, count=2)
    clean_env.setitem(sys.modules, "cupy", cupy)
    _stop_at_open(clean_env, log)
    _torchrun_rank(clean_env, 1, 1)
    status, _, err = _replay(cli, tmp_path, "--backend", "nccl", "--device", "cuda")
    assert (status, err.strip()) == (2, "infercomm replay: error: stopped at open_backend "
                                        "(nccl)"), err
    assert log == [("use", 1), ("memGetInfo", 1), ("open_backend", "nccl", 1)]


def _fake_cupy(log, count):
    """Just enough of CuPy's device API: memGetInfo refuses to run before a device is used."""
    state = {"current": None}

    class Device:
        def __init__(self, index):
            self.index = index

        def use(self):
            log.append(("use", self.index))
            state["current"] = self.index

        def __enter__(self):
            state["saved"], state["current"] = state["current"], self.index
            return self

        def __exit__(self, *exc):
            state["current"] = state["saved"]

    def mem_get_info():
        assert state["current"] is not None, "memGetInfo before any Device.use()"
        log.append(("memGetInfo", state["current"]))
        return (40 << 30, 80 << 30)

    runtime = types.SimpleNamespace(getDeviceCount=lambda: count, memGetInfo=mem_get_info)
    cupy = types.ModuleType("cupy")
    cupy.__spec__ = importlib.machinery.ModuleSpec("cupy", None)  # found by find_spec
    cupy.cuda = types.SimpleNamespace(runtime=runtime, Device=Device)
    return cupy


def test_torch_process_group_is_bound_to_the_ranks_device(clean_env):
    """R5: init_process_group gets device_id, and the barrier names the rank's device."""
    import torch.distributed as dist

    from microbench.backends.torch_backend import TorchBackend

    cuda = FakeCuda(4).install(clean_env)
    seen: dict = {}
    clean_env.setattr(dist, "init_process_group", lambda *a, **k: seen.update(init=k))
    clean_env.setattr(dist, "get_rank", lambda: 5)
    clean_env.setattr(dist, "get_world_size", lambda: 8)
    clean_env.setattr(dist, "barrier", lambda **k: seen.update(barrier=k))
    from microbench.ranks.dist import detect
    env = detect({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    backend = TorchBackend(env, "cuda", 10.0)
    backend.barrier()
    # rank 5 with local rank 1: GPU 1, where guessDeviceForRank would take 5 % 4 = GPU 1 only
    # by chance; on 8-GPU nodes with 4 ranks a node it takes GPU 5.
    assert seen["init"]["device_id"] == torch.device("cuda", 1)
    assert seen["barrier"] == {"device_ids": [1]}
    assert cuda.current == 1


def test_mpi_on_a_gpu_times_with_the_host_clock():
    """R9: a backend on a GPU without a stream (MPI, host-blocking calls) gets CpuMarks."""
    assert isinstance(make_marks("cuda", 3, None), CpuMarks)


def test_native_16_bit_sums_on_device_buffers_are_staged():
    """R8: MPI_SUM on MPIX_BFLOAT16 / MPIX_C_FLOAT16 was checked on host memory only, so device
    buffers of those types reduce through the host; other types and host buffers do not."""
    pytest.importorskip("mpi4py")
    from mpi4py import MPI

    from microbench.backends.mpi_backend import MpiBackend
    from microbench.backends.mpi_reduce import MpiTypes

    backend = object.__new__(MpiBackend)
    backend.types = MpiTypes({"bf16": (MPI.UINT16_T, "native"), "fp16": (MPI.UINT16_T, "n")})
    backend.device = "cuda"
    assert backend.types.sum_op("bf16") == MPI.SUM  # the native sum, as with MPICH's types
    assert backend.staged_reduction("allreduce", "bf16")
    assert backend.staged_reduction("reducescatter", "fp16")
    assert not backend.staged_reduction("allreduce", "fp32")
    assert not backend.staged_reduction("allgather", "bf16")  # no sum, no reduction
    backend.device = "cpu"
    assert not backend.staged_reduction("allreduce", "bf16")


@pytest.mark.parametrize("asked", [("SLURM_GPUS_ON_NODE", "4"), ("CUDA_VISIBLE_DEVICES", "0,1")])
def test_a_gpu_job_that_finds_no_gpu_is_refused(cli, tmp_path, clean_env, asked):
    """--device auto in a job that asked for GPUs, on a torch that sees none: one line, exit
    2, no rank started and no result; --device cpu still replays on CPUs."""
    clean_env.setenv(*asked)
    status, out, err = _replay(cli, tmp_path, "--nproc", "2")
    assert (status, out) == (2, "")
    assert err.strip() == (f"infercomm replay: error: this job asked for GPUs ({asked[0]}="
                           f"{asked[1]}) but torch.cuda.device_count() is 0; load a CUDA build "
                           "of the library, ask for GPUs on the step (srun --gpus-per-node), "
                           "or pass --device cpu to replay on CPUs")
    assert not list(tmp_path.glob("replay-*"))


R6_SCRIPT = """
import json, sys
from _pytest.monkeypatch import MonkeyPatch
from microbench import backends
from microbench.argtypes import UsageError
from microbench.cli import main
from tests.fake_torch_cuda import FakeCuda

mp = MonkeyPatch()
cuda = FakeCuda(1).install(mp)
real_open = backends.open_backend

def open_then_stop(name, **options):
    real_open(name, **options)  # the real mpi backend: its import runs MPI_Init
    raise UsageError("stopped after open_backend")

mp.setattr(backends, "open_backend", open_then_stop)
status = main(["replay", "--model", sys.argv[1], "--prompt", "8", "--decode", "2",
               "--backend", "mpi", "--device", "cuda", "--out", sys.argv[2]])
print(json.dumps([status, cuda.calls]))
"""


@pytest.mark.mpi
def test_mpi_initialised_after_the_device_is_selected(tmp_path):
    """R6: the first set_device happens while MPI is not yet initialised (UCX picks its NIC
    from the device current at MPI_Init); a fresh process, since MPI initialises once."""
    pytest.importorskip("mpi4py")
    import json
    import os
    import subprocess
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", OMP_NUM_THREADS="1")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", R6_SCRIPT, tiny_model(tmp_path),
                           str(tmp_path / "out")], capture_output=True, text=True, env=env,
                          cwd=root, timeout=120, check=False)
    status, calls = json.loads(proc.stdout.strip().splitlines()[-1])
    assert status == 2 and "stopped after open_backend" in proc.stderr, proc.stderr
    set_devices = [c for c in calls if c[0] == "set_device"]
    assert set_devices[0] == ["set_device", 0, False]  # device chosen, MPI not started yet


def test_gpu_memory_check_keeps_a_reserve_for_context_and_communicators(cli, tmp_path,
                                                                        clean_env):
    """R10: TP2 at world 2 holds one communicator (the tp group is the world): reserve
    512 MiB + 1 x 512 MiB = 1 GiB (ranks/device.py). 1 GiB free is refused though the tiny
    buffers are a few KiB; 1.5 GiB free leaves 0.5 GiB and starts."""
    cuda = FakeCuda(2, free=1 << 30).install(clean_env)
    _stop_at_open(clean_env, cuda.calls)
    _torchrun_rank(clean_env, 1, 1)
    status, _, err = _replay(cli, tmp_path, "--device", "cuda")
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert "of GPU 1 memory beyond a 1.00 GiB reserve for its context and 1 NCCL " \
           "communicators" in err and "but 0 B are available" in err
    cuda.free = 3 << 29  # 1.5 GiB
    status, _, err = _replay(cli, tmp_path, "--device", "cuda")
    assert "stopped at open_backend (torch)" in err


def test_communicators_counted_per_rank(tmp_path):
    """TP2 x PP2 on 4 ranks: world, the rank's tp pair and its pp pair = 3."""
    from microbench.ranks.device import communicators_of
    from patterns import Layout, Workload, generate, resolve_model
    pattern = generate("vllm", resolve_model(tiny_model(tmp_path)), Layout(tp=2, pp=2),
                       Workload(prompt=8, decode=2))
    assert communicators_of(pattern, 0) == 3


def test_srun_gpus_per_task_gives_each_task_its_own_first_gpu():
    """srun --gpus-per-task=1: each task sees only its own GPU, so local rank 3 takes device 0
    of what it sees; without that binding local rank 3 on 1 visible GPU is refused."""
    from microbench.ranks.device import check_device_index
    task = DistEnv("slurm", 3, 4, 3, "h", 1, "SLURM_LOCALID")
    assert check_device_index(task, 1, {"SLURM_GPUS_PER_TASK": "1"}) == 0
    with pytest.raises(UsageError, match=r"local rank 3 .* sees 1 GPU;"):
        check_device_index(task, 1, {})
    assert check_device_index(task, 8, {}) == 3


def test_sweep_on_nccl_beside_cpu_torch_selects_its_device_through_cupy(cli, tmp_path,
                                                                         clean_env):
    """The sweep's rank path: --backend nccl --device cuda beside a CPU torch counts and
    selects the GPU through CuPy (torch would say no GPU is visible), before the backend."""
    log: list = []
    clean_env.setitem(sys.modules, "cupy", _fake_cupy(log, count=2))
    _stop_at_open(clean_env, log)
    _torchrun_rank(clean_env, 1, 1)
    status, _, err = cli("sweep", "--op", "allreduce", "-b", "8", "-e", "64", "--backend",
                         "nccl", "--device", "cuda", "--out", str(tmp_path))
    assert (status, err.strip()) == (2, "infercomm sweep: error: stopped at open_backend "
                                        "(nccl)"), err
    assert log == [("use", 1), ("open_backend", "nccl", 1)]


def test_mpi_device_buffer_is_synced_before_mpi_sees_it():
    """R7: torch.zeros on a GPU is an asynchronous fill and mpi4py takes the tensor through
    DLPack with stream=-1 (no sync): the backend waits on the stream after allocating."""
    pytest.importorskip("mpi4py")
    from microbench.backends.mpi_backend import MpiBackend
    from microbench.backends.mpi_reduce import MpiTypes

    cuda = FakeCuda(1)
    cuda.set_device(0)

    def zeros(numel, dtype, device):
        cuda.calls.append(("zeros", numel, device))
        return torch.zeros(numel, dtype=dtype)

    backend = object.__new__(MpiBackend)
    backend.device, backend.types = "cuda", MpiTypes()
    backend._torch = types.SimpleNamespace(uint8=torch.uint8, int16=torch.int16,
                                           int32=torch.int32, int64=torch.int64, zeros=zeros,
                                           cuda=cuda)
    backend.empty(4, "bf16")
    assert [c[0] for c in cuda.calls[1:]] == ["zeros", "stream.synchronize"]


def test_a_rank_without_a_local_rank_variable_is_refused_on_gpus():
    """PMI_RANK without MPI_LOCALRANKID nor a task srun started (a launcher that says nothing
    of the node): the local rank is unknown, so rank 3 of 4 would silently take GPU 0."""
    from microbench.ranks.device import check_device_index
    from microbench.ranks.dist import detect
    env = detect({"PMI_RANK": "3", "PMI_SIZE": "4"})
    with pytest.raises(UsageError, match="rank 3 of 4: no launcher variable gives its local"):
        check_device_index(env, 8, {})
    alone = detect({"PMI_RANK": "0", "PMI_SIZE": "1"})
    assert check_device_index(alone, 8, {}) == 0  # one rank: GPU 0 is its own
