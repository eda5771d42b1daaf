"""The local two-node Slurm cluster of `slurm/local-cluster.sh` as a pytest fixture.

Not a test file: conftest imports it. A test marked `slurm` takes the fixture and runs Slurm
commands with the environment it yields:

    @pytest.mark.slurm
    def test_hostname(slurm_cluster):
        subprocess.run(["srun", "-N", "2", "hostname"], env=slurm_cluster, timeout=30, check=True)

The first session on a fresh machine installs Slurm through apt (root only, ~15 s); without
root, apt or a working cluster the tests are skipped, with the script's message as the reason.
"""

import atexit
import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "slurm" / "local-cluster.sh"
UP_TIMEOUT_S = 600   # includes `apt-get install slurm-wlm` on first use (~15 s on a fast mirror)
DOWN_TIMEOUT_S = 60  # the script itself gives up after ~20 s
POLL_S = 0.2

# Variables that would point srun/MPI at another allocation (pytest run inside a real Slurm
# job) or another PMI server; the local cluster must not inherit them.
_FOREIGN = re.compile(r"^(SLURM_|SLURMD_|SBATCH_|SRUN_|SALLOC_|PMI_|PMIX_|OMPI_|HYDRA_)")


def _cluster(verb: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), verb], capture_output=True, text=True,
                          timeout=timeout, check=False)


def _down() -> None:
    """Stop the cluster; safe to call twice (the script's `down` is idempotent)."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        _cluster("down", DOWN_TIMEOUT_S)


def _why_not(proc: subprocess.CompletedProcess) -> str:
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[dict[str, str]]:
    """Start the local cluster once per session; yield the environment to run Slurm commands.

    The environment is os.environ without foreign Slurm/PMI variables, plus SLURM_CONF and
    OMP_NUM_THREADS=1 (2 cores shared by up to 4 ranks). The cluster is always stopped at the
    end, also when the session dies without running fixture teardown (atexit).
    """
    if shutil.which("slurmctld") is None:
        # Installing system packages is asked for, never implied: `make test-slurm` and .ci/run
        # set INFERCOMM_INSTALL_SLURM=1; a plain `make test` skips these tests instead.
        if os.environ.get("INFERCOMM_INSTALL_SLURM") != "1":
            pytest.skip("Slurm is not installed; `make test-slurm` installs it (root, apt)")
        if shutil.which("apt-get") is None:
            pytest.skip("Slurm is not installed and there is no apt-get to install it")
        if os.geteuid() != 0:
            pytest.skip("Slurm is not installed and installing it needs root")
    # A cluster someone else started (another pytest, a developer) is used but left running;
    # one this session starts is always stopped, even when a test fails.
    started_here = _cluster("status", 10).returncode != 0
    if started_here:
        atexit.register(_down)
    try:
        try:
            up = _cluster("up", UP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.skip(f"slurm/local-cluster.sh up took over {UP_TIMEOUT_S} s")
        if up.returncode != 0:
            pytest.skip(f"local Slurm cluster did not start: {_why_not(up)}")
        conf = _cluster("env", 10).stdout.strip().removeprefix("export SLURM_CONF=")
        env = {k: v for k, v in os.environ.items() if not _FOREIGN.match(k)}
        env |= {"SLURM_CONF": conf, "OMP_NUM_THREADS": "1"}
        yield env
    finally:
        if started_here:
            _down()


def wait_for_job(job_id: str, env: dict[str, str], timeout: float) -> tuple[str, str]:
    """Wait until batch job `job_id` has left the queue; return its (ExitCode, JobState).

    Polls `squeue` every 0.2 s: `sbatch --wait` polls with backoff and returned 42 s late for an
    11 s job. ExitCode is "status:signal" ("0:0" for success); JobState e.g. "COMPLETED",
    "FAILED". Read within MinJobAge (300 s here) of the end. On timeout the job is cancelled
    and TimeoutError raised.
    """
    deadline = time.monotonic() + timeout
    while True:
        # -t: squeue -j also lists finished jobs (state CD) until MinJobAge; only wait on live ones.
        queued = subprocess.run(["squeue", "-h", "-j", job_id, "-t", "PD,CF,R,CG,S,RQ"],
                                env=env, capture_output=True, text=True, timeout=10,
                                check=False)
        if queued.returncode == 0 and not queued.stdout.strip():
            break
        if "Invalid job id" in queued.stderr:  # already purged; scontrol below says so
            break
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], env=env, capture_output=True, timeout=10,
                           check=False)
            raise TimeoutError(f"Slurm job {job_id} still queued after {timeout} s")
        time.sleep(POLL_S)
    shown = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True,
                           text=True, timeout=10, check=True).stdout
    exit_code = re.search(r"\bExitCode=(\S+)", shown)
    state = re.search(r"\bJobState=(\S+)", shown)
    if exit_code is None or state is None:
        raise RuntimeError(f"no ExitCode/JobState in `scontrol show job {job_id}`:\n{shown}")
    return exit_code.group(1), state.group(1)
