"""`--nproc N`: start N local ranks without a launcher (torch), or through the MPI library's
own mpiexec (mpi), and make sure that when one rank fails every rank ends."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from microbench.argtypes import UsageError

# After the first rank fails, the others get this long to report their own error.
GRACE_SECONDS = 5.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_mpiexec() -> str:
    """The mpiexec of the MPI that mpi4py was built against: the wheel puts it beside python."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise UsageError("no mpiexec found beside python or on PATH; install the mpi extra "
                         "(pip install 'infercomm[mpi]') or launch the ranks yourself")
    return found


def _is_open_mpi(mpiexec: str) -> bool:
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                             timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    text = out.stdout + out.stderr
    return "Open MPI" in text or "OpenRTE" in text or "prte" in text.lower()


def _base_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default; mpiexec sets none
    # A leftover launcher environment would make the children think they are already ranks.
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PMI_RANK", "PMI_SIZE",
                "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID"):
        env.pop(var, None)
    return env


def mpi_command(nproc: int, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    mpiexec = find_mpiexec()
    env = _base_env()
    cmd = [mpiexec, "-n", str(nproc)]
    if _is_open_mpi(mpiexec):
        # Root is refused and more ranks than cores fail without these (cpu_stack_runbook 1).
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        env.setdefault("OMPI_MCA_pml", "ob1")
        env.setdefault("OMPI_MCA_btl", "self,sm")
        env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
        cmd.append("--oversubscribe")
    return [*cmd, sys.executable, "-m", "microbench", *argv], env


def spawn_local(nproc: int, backend: str, argv: list[str]) -> int:
    """Run `infercomm ARGV` as N local ranks; return the first failing rank's status, or 0."""
    if backend == "mpi":
        cmd, env = mpi_command(nproc, argv)
        return _wait_all([subprocess.Popen(cmd, env=env)], ["mpiexec"])
    else:
        env = _base_env()
        env.update(WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        procs = [subprocess.Popen([sys.executable, "-m", "microbench", *argv],
                                  env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
                 for r in range(nproc)]
    return _wait_all(procs, [f"rank {r}" for r in range(nproc)])


def _wait_all(procs: list[subprocess.Popen], names: list[str]) -> int:
    failed_at: float | None = None
    status = 0
    try:
        while True:
            for name, p in zip(names, procs, strict=True):
                code = p.poll()
                if code not in (None, 0) and failed_at is None:
                    failed_at, status = time.monotonic(), _exit_status(code)
                    others = "; ending the other ranks" if len(procs) > 1 else ""
                    sys.stderr.write(f"infercomm: error: {name} ended with "
                                     f"{_describe(code)}{others}\n")
            if all(p.poll() is not None for p in procs):
                break
            if failed_at is not None and time.monotonic() - failed_at > GRACE_SECONDS:
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return status


def _exit_status(code: int) -> int:
    return 128 - code if code < 0 else code  # a signal -N reads as 128+N, as in a shell


def _describe(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit status {code}"
