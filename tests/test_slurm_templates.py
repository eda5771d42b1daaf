"""The sbatch templates refuse a layout that does not spread over the job's nodes, before
srun: 6 ranks on 4 nodes were cut to 4 (one a node), a world the layout never had.

The templates run here under bash alone, outside Slurm, with no srun on PATH: a refusal
ends them (exit 2, one line) before srun is looked up; a template that goes on to srun
ends with bash's 127 (command not found)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SLURM = Path(__file__).resolve().parent.parent / "slurm"
BASH = shutil.which("bash") or "/bin/bash"


def run_template(name: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([BASH, str(SLURM / name)], capture_output=True, text=True,
                          timeout=30, check=False, cwd=SLURM.parent,
                          env={"PATH": "/nonexistent", "HOME": os.environ.get("HOME", "/"),
                               "LOGS": "/nonexistent/logs", **env})


@pytest.mark.parametrize(("env", "words"), [
    # 3 x 2 = 6 ranks on 4 nodes: 6 % 4 = 2 left over
    ({"TP": "3", "PP": "2", "NODES": "4"},
     "replay.sbatch: TP*PP = 6 ranks do not spread evenly over 4 nodes; submit with -N "
     "dividing 6, or set TASKS_PER_NODE"),
    # 2 nodes x 3 = 6 ranks for a layout of 2 x 2 = 4
    ({"TP": "2", "PP": "2", "NODES": "2", "TASKS_PER_NODE": "3"},
     "replay.sbatch: 2 nodes x TASKS_PER_NODE=3 make 6 ranks, not TP*PP = 4"),
])
def test_replay_template_refuses_ranks_that_do_not_divide(env, words):
    proc = run_template("replay.sbatch", **env)
    assert (proc.returncode, proc.stderr) == (2, words + "\n")


def test_replay_template_goes_on_to_srun_when_they_divide():
    # 4 x 2 = 8 ranks on 4 nodes, 2 a node: no refusal, so srun is looked for (127)
    proc = run_template("replay.sbatch", TP="4", PP="2", NODES="4")
    assert proc.returncode == 127 and "srun: command not found" in proc.stderr, proc.stderr


def test_interconnect_template_refuses_an_odd_world():
    # 3 x 1 = 3 ranks cannot be half on each of two nodes (3 / 2 was cut to 1)
    proc = run_template("interconnect.sbatch", TP="3", PP="1")
    assert (proc.returncode, proc.stderr) == (
        2, "interconnect.sbatch: TP*PP = 3 ranks cannot be split in half over two nodes; use "
           "an even TP*PP\n")
