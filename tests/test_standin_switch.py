"""INFERCOMM_GPU_STANDIN, the switch of the test suite's GPU stand-ins (microbench/__init__.py):
only "1" turns them on, and only in a source checkout; every result made on them says so in
its output's first line, its meta.json and its last line (replay under the MPI launcher,
sweep, a settings grid of nccl replays); report and compare never set such a run beside a
real one. A result file must never claim hardware it did not touch.

Each run is a real process started here with the variable in its environment (this file is
not gpu-marked: it needs no stand-in in the pytest process).
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import gpu_standin
from tests.replay_helpers import last_json, tiny_model

REPO = Path(__file__).resolve().parent.parent
VAR = "INFERCOMM_GPU_STANDIN"
MARK = re.compile(r"STAND-IN RESULT: this (replay|sweep|replay grid) ran on the test suite's "
                  r"stand-ins for CUDA, CuPy and NCCL \(INFERCOMM_GPU_STANDIN=1\), on no GPU")


def _infercomm(*args: str, value: str | None, cwd: Path = REPO, timeout: int = 240,
               pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != VAR}
    env["OMP_NUM_THREADS"] = "1"
    if value is not None:
        env[VAR] = value
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    # the console script a user runs; else -P: no working folder on sys.path before ours
    script = Path(sys.executable).parent / "infercomm"
    command = [str(script)] if script.is_file() else [sys.executable, "-P", "-m", "microbench"]
    return subprocess.run([*command, *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout, check=False)


def _docs_example() -> tuple[str, str]:
    """docs/gpu.md's refused command and the one line it prints."""
    text = (REPO / "docs" / "gpu.md").read_text()
    match = re.search(r"```bash\n(INFERCOMM_GPU_STANDIN=no infercomm [^\n]+)\n```\n\n```\n"
                      r"([^\n]+)\n```", text)
    assert match, "docs/gpu.md shows the refused stand-in switch"
    return match.group(1), match.group(2)


def test_the_documented_refusal_of_a_value_other_than_1(tmp_path):
    """`INFERCOMM_GPU_STANDIN=no infercomm replay --backend nccl ...` on this machine without
    a GPU: refused in docs/gpu.md's one line, exit 2, nothing written; never device=cuda
    (it replayed on the stand-ins and wrote device=cuda transport=nccl before)."""
    command, expected = _docs_example()
    argv = [*command.split()[2:], "--out", str(tmp_path / "out")]
    proc = _infercomm(*argv, value="no")
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", expected + "\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["false", "auto", "yes", " 1"])
def test_any_value_but_1_0_or_nothing_is_refused_naming_the_variable(tmp_path, value):
    proc = _infercomm("sweep", "--op", "allreduce", "-b", "8", "-e", "8", "--backend", "nccl",
                      "--nproc", "2", "--out", str(tmp_path / "out"), value=value)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"infercomm: error: {VAR}={value!r}: only 1 ")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["0", ""])
def test_0_or_empty_is_off(tmp_path, value):
    """Off means the real libraries: here, no CuPy, so --backend nccl is refused for that."""
    if importlib.util.find_spec("cupy") is not None and not gpu_standin.enabled():
        pytest.skip("a real CuPy is installed here: --backend nccl would run")
    proc = _infercomm("replay", "--model", tiny_model(tmp_path), "--tp", "2", "--prompt", "4",
                      "--decode", "2", "--backend", "nccl", "--out", str(tmp_path / "out"),
                      value=value)
    assert proc.returncode == 2
    assert proc.stderr == "infercomm replay: error: the nccl backend needs CuPy: pip install " \
                          "'infercomm[cuda]'\n"


def test_1_is_refused_outside_a_source_checkout(tmp_path):
    """An installed infercomm (a wheel holds `microbench` and `patterns` only, pyproject.toml
    packages.find) has no tests/ beside it: INFERCOMM_GPU_STANDIN=1 is refused there, even
    run from inside a checkout whose `tests` sys.path would find."""
    site = tmp_path / "site-packages"
    for package in ("microbench", "patterns"):
        shutil.copytree(REPO / package, site / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    model = tiny_model(tmp_path)
    for cwd in (tmp_path, REPO):
        proc = _infercomm("replay", "--model", model, "--tp", "2", "--prompt", "4",
                          "--decode", "2", "--backend", "nccl", "--out", str(tmp_path / "out"),
                          value="1", cwd=cwd, pythonpath=str(site))
        assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
        assert proc.stderr == (
            f"infercomm: error: {VAR}=1 runs on the test suite's stand-ins for CUDA, CuPy and "
            "NCCL, which only a source checkout of infercomm has (tests/gpu_standin.py beside "
            f"microbench/, not in {site}); unset {VAR}\n")
    assert not (tmp_path / "out").exists()


def _check_marked(proc: subprocess.CompletedProcess, command: str) -> dict:
    """The run's first stdout line says stand-in, its last line and meta.json too."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    mark = MARK.match(lines[0])
    assert mark and mark.group(1) == command, lines[0]
    last = last_json(proc.stdout)
    assert last["gpu_standin"] is True
    return last


def test_a_replay_under_the_mpi_launcher_is_marked(tmp_path):
    proc = _infercomm("replay", "--model", tiny_model(tmp_path), "--tp", "2", "--prompt", "4",
                      "--decode", "2", "--backend", "mpi", "--device", "cuda", "--nproc", "2",
                      "-n", "1", "-w", "1", "--out", str(tmp_path / "out"), value="1")
    last = _check_marked(proc, "replay")
    assert (last["device"], last["transport"]) == ("cuda", "mpi-staging")
    meta = json.loads((Path(last["results_dir"]) / "meta.json").read_text())
    assert meta["gpu_standin"] is True and meta["launcher"] == "pmi"


def test_a_sweep_is_marked(tmp_path):
    proc = _infercomm("sweep", "--op", "allreduce", "-b", "8", "-e", "64", "--backend", "nccl",
                      "--nproc", "2", "-n", "2", "-w", "1", "--out", str(tmp_path / "out"),
                      value="1")
    last = _check_marked(proc, "sweep")
    meta = json.loads((Path(last["results_dir"]) / "meta.json").read_text())
    assert (meta["gpu_standin"], meta["device"], meta["transport"]) == (True, "cuda", "nccl")


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """A settings grid of one nccl replay on the stand-ins: (its last line, the replay)."""
    tmp = tmp_path_factory.mktemp("grid")
    proc = _infercomm("replay", "--model", tiny_model(tmp), "--tp", "2", "--prompt", "4",
                      "--decode", "2", "--backend", "nccl", "-n", "2", "-w", "1",
                      "--env", "NCCL_PROTO=Simple", "--out", str(tmp / "out"), value="1")
    last = _check_marked(proc, "replay grid")
    document = json.loads((Path(last["results_dir"]) / "grid.json").read_text())
    return document, Path(document["runs"][0]["results_dir"])


def test_a_grid_and_its_runs_are_marked(grid):
    document, replay = grid
    meta = json.loads((replay / "meta.json").read_text())
    assert document["gpu_standin"] is True
    assert (meta["gpu_standin"], meta["device"], meta["transport"]) == (True, "cuda", "nccl")


def _copy(run: Path, where: Path, **meta_changes) -> Path:
    """The run folder copied, its meta.json changed as given (None: the key removed)."""
    copy = where / f"{run.name}-copy"
    shutil.copytree(run, copy)
    meta = json.loads((copy / "meta.json").read_text())
    for key, value in meta_changes.items():
        if value is None:
            meta.pop(key)
        else:
            meta[key] = value
    (copy / "meta.json").write_text(json.dumps(meta))
    return copy


def test_compare_and_report_refuse_to_mix_standin_and_real_runs(grid, tmp_path, cli):
    """The same run with gpu_standin false is a real one to the readers: never beside it.
    A run written before meta.json had the key is known by its stand-in GPU's name."""
    _, replay = grid
    real = _copy(replay, tmp_path, gpu_standin=False)
    (tmp_path / "older").mkdir()
    older = _copy(replay, tmp_path / "older", gpu_standin=None)
    assert json.loads((older / "meta.json").read_text())["versions"]["gpu"].startswith(
        "Stand-in GPU")
    for runs in ((replay, real), (older, real)):
        status, out, err = cli("compare", *map(str, runs))
        assert (status, out) == (2, ""), err
        assert err == (f"infercomm compare: error: {runs[0]} ran on the test suite's GPU "
                       f"stand-ins (meta.json gpu_standin) and {real} on real devices; "
                       "stand-in runs go only with stand-in runs\n")
    status, out, err = cli("report", str(real), str(replay), "-o", str(tmp_path / "r.html"))
    assert (status, out) == (2, "") and "ran on the test suite's GPU stand-ins" in err
    assert not (tmp_path / "r.html").exists()
    # stand-in with stand-in: compared (2 timed inferences a side: 3, inconclusive, or a
    # verdict; never the refusal's 2)
    status, out, _ = cli("compare", str(replay), str(older))
    assert status in (0, 1, 3) and last_json(out)["runs"] == [str(replay), str(older)]


def test_a_meta_gpu_standin_that_is_no_boolean_is_refused(grid, tmp_path, cli):
    _, replay = grid
    odd = _copy(replay, tmp_path, gpu_standin="yes")
    status, _, err = cli("compare", str(replay), str(odd))
    assert status == 2 and err == (f"infercomm compare: error: {odd / 'meta.json'}: "
                                   "gpu_standin is 'yes', not true or false; the file is not "
                                   "one infercomm wrote\n")
