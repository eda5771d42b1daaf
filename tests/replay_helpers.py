"""Launch real multi-rank replays as a user would, and read what they wrote."""

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

TINY_CONFIG = {"hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 1000,
               "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 256,
               "torch_dtype": "bfloat16", "_name_or_path": "tiny"}

needs_mpi = pytest.mark.skipif(
    not (Path(sys.executable).parent / "mpiexec").exists(),
    reason="the mpich wheel's mpiexec is not installed beside python")


def tiny_model(folder: Path) -> str:
    path = folder / "config.json"
    path.write_text(json.dumps(TINY_CONFIG))
    return str(path)


def infercomm(*args: str, env: dict | None = None, timeout: float = 120,
              cwd: Path | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """Run `python -m microbench ARGS`; return the process and its wall time."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "microbench", *args], capture_output=True,
                          text=True, timeout=timeout, env=full_env, cwd=cwd, check=False)
    return proc, time.monotonic() - start


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))
