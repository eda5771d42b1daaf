"""Faults an outside battery found (items 1-4): memory counted for every rank of the host
whatever --device, --out checked on every rank a launcher started, the disk --timing op needs
checked before measuring, and labels that cannot name a folder refused up front."""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from microbench.cli import main
from microbench.cli import replay as replay_cli
from microbench.replay import footprint
from microbench.replay.plan import buffer_bytes
from patterns import Layout, Workload, generate, resolve_model
from tests.replay_helpers import infercomm, needs_mpi, tiny_model

GIB = 1 << 30


@contextlib.contextmanager
def mounted(target: Path, *options: str):
    """A file system mounted for the test (root only); skips where mounting is refused."""
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", *options, str(target)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here: {done.stderr.decode().strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True, check=False)


@pytest.fixture
def read_only(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    with mounted(tmp_path / "ro", "--bind", str(source)):
        done = subprocess.run(["mount", "-o", "remount,bind,ro", str(tmp_path / "ro")],
                              capture_output=True, check=False)
        if done.returncode != 0:
            pytest.skip("cannot remount read-only here")
        yield tmp_path / "ro"


MOE = ["--model", "qwen3-30b-a3b", "--dp", "2", "--ep", "--prompt", "64", "--decode", "2"]


def moe_rank_bytes() -> int:
    pattern = generate("vllm", resolve_model("qwen3-30b-a3b"), Layout(dp=2, ep=True),
                       Workload(prompt=64, decode=2))
    return buffer_bytes(pattern, 0)


def test_device_auto_counts_every_local_rank_before_starting_them(monkeypatch, capsys,
                                                                  tmp_path):
    # Item 1: only --device cpu ran the combined check; auto on a CPU host skipped it, each
    # rank then checked its own share alone. Memory set to 1.5 shares: one fits, two do not.
    one = moe_rank_bytes()
    monkeypatch.setattr(footprint, "available_host_bytes", lambda: one * 3 // 2)
    started = []
    monkeypatch.setattr(replay_cli.launch, "spawn_local", lambda *a: started.append(a) or 0)
    monkeypatch.setattr(replay_cli, "buffers_on_cpu", lambda *a: True,  # a host without GPUs
                        raising=False)
    status = main(["replay", *MOE, "--device", "auto", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert status == 2 and started == [], err
    assert "host memory for 2 ranks" in err


def test_a_launched_rank_counts_the_ranks_on_its_host(monkeypatch, capsys, tmp_path):
    one = moe_rank_bytes()
    monkeypatch.setattr(footprint, "available_host_bytes", lambda: one * 3 // 2)
    ran = []
    monkeypatch.setattr(replay_cli, "run_rank", lambda *a: ran.append(a) or 0)
    monkeypatch.setattr(replay_cli, "buffers_on_cpu", lambda *a: True, raising=False)
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    status = main(["replay", *MOE, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert status == 2 and ran == [], err
    assert "for the 2 ranks on this host" in err
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # alone on its host: 1 share of 1.5 fits
    assert main(["replay", *MOE, "--out", str(tmp_path / "o")]) == 0 and len(ran) == 1


@needs_mpi
def test_every_mpi_rank_refuses_a_read_only_out_at_once(tmp_path, read_only):
    # Item 2: rank 0 refused, rank 1 waited in MPI start-up for the whole --timeout.
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    cmd = [mpiexec, "-n", "2", sys.executable, "-m", "microbench", "replay", "--backend",
           "mpi", "--model", tiny_model(tmp_path), "--tp", "2", "--prompt", "4", "--decode",
           "2", "-n", "1", "-w", "0", "--timeout", "60", "--out", str(read_only / "runs")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "--out" in proc.stderr
    assert "not writable" in proc.stderr or "cannot be created" in proc.stderr


def test_op_timing_refuses_a_temporary_folder_too_small_before_measuring(tmp_path):
    # Item 3: a full TMPDIR was found after the measurement (OSError naming no file, exit 1,
    # a partial infercomm-ops-*.csv left). llama-3.1-8b TP2, 128 + 128 tokens: 8,448 calls a
    # rank and inference (README sample), x 2 ranks x 50 inferences x 8 bytes = 6.4 MiB of
    # call times, beyond a 1 MiB TMPDIR.
    with mounted(tmp_path / "tmp", "-t", "tmpfs", "-o", "size=1m", "tmpfs") as small:
        proc, _ = infercomm("replay", "--model", "llama-3.1-8b", "--tp", "2", "--prompt", "128",
                            "--decode", "128", "--timing", "op", "-n", "50", "--device", "cpu",
                            "--out", str(tmp_path / "o"), env={"TMPDIR": str(small)},
                            timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert f"in the temporary folder {small} (TMPDIR)" in proc.stderr
        assert "free" in proc.stderr and "--timing step" in proc.stderr
        assert list(small.iterdir()) == []
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["replay", "sweep"])
def test_a_label_too_long_to_name_a_folder_is_refused_up_front(tmp_path, capsys, command):
    # Item 4: 10,000 characters ran the whole replay, then nothing could be kept (exit 74).
    args = (["--model", tiny_model(tmp_path), "--tp", "2", "--prompt", "4", "--decode", "2"]
            if command == "replay" else ["-b", "8", "-e", "8"])
    with pytest.raises(SystemExit) as ended:
        main([command, *args, "--label", "x" * 10_000, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and "a label of 10,000 characters; use at most 120" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


SAMPLES = Path(__file__).resolve().parent.parent / "results" / "examples" / "samples"
REPLAY = next(SAMPLES.glob("*-replay-llama-3.2-1b-tp2-mpi"))
SAMPLE_MPI = next(SAMPLES.glob("*-replay-llama-3.2-1b-tp2-torch"))


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs holding one 64 KiB file: nothing more fits."""
    with mounted(tmp_path / "full", "-t", "tmpfs", "-o", "size=64k", "tmpfs") as disk:
        with contextlib.suppress(OSError), (disk / "filler").open("wb") as f:
            f.write(b"x" * (64 << 10))
        yield disk


@pytest.mark.parametrize("command", [
    ["report", str(REPLAY), "-o", "{disk}/report.html"],
    ["plot", str(REPLAY), "-o", "{disk}/figures"],
    ["compare", str(SAMPLE_MPI), str(REPLAY), "--inconclusive-ok", "-o", "{disk}/cmp.md"],
])
def test_outputs_on_a_full_disk_leave_no_partial_file(cli, full_disk, command):
    # Item 12: a 100 KB report.html, a 0-byte PNG (plot with a traceback) were left behind.
    status, _, err = cli(*[a.format(disk=full_disk) for a in command])
    assert status == 2 and "Traceback" not in err, err
    assert "cannot write" in err and "No space left on device" in err, err
    left = [p for p in full_disk.rglob("*") if p.is_file() and p.name != "filler"]
    assert left == [], left


def test_compare_output_on_a_read_only_disk_is_one_line(cli, read_only):
    # Item 12: the clean-up inside the error handler raised (unlink on a read-only disk).
    status, _, err = cli("compare", str(SAMPLE_MPI), str(REPLAY), "--inconclusive-ok", "-o",
                         str(read_only / "cmp.md"))
    assert status == 2 and "Traceback" not in err, err
    assert err.strip().endswith("(Read-only file system); pass a writable place"), err


def test_a_sweep_size_beyond_memory_is_refused_before_any_rank(capsys, tmp_path):
    # Item 15: `sweep --sizes 64G` started ranks that died of MemoryError. An all-reduce of
    # 64 GiB holds its input and output: 128 GiB a rank, 256 GiB for the 2 default ranks.
    status = main(["sweep", "--sizes", "64G", "--device", "cpu", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err, err
    assert "largest case (allreduce of 64.00 GiB) needs about 256.00 GiB" in err
    assert "128.00 GiB each" in err and not (tmp_path / "o").exists()


@needs_mpi
def test_mpis_other_error_says_what_it_usually_is(capsys):
    # Item 15: a buffer MPICH could not map (ulimit -v) was reported as "Other MPI error".
    from mpi4py import MPI

    from microbench.ranks.failures import report_rank_failure
    assert report_rank_failure("replay", 1, MPI.Exception(MPI.ERR_OTHER)) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith("infercomm replay: error: rank 1: Exception: Other MPI error (MPI "
                           "could not allocate or map a buffer")
