"""Ranks against the CPUs they share: a CPU replay with more ranks on a host than CPUs
measures the scheduler as well as the library.

Measured on a 2-CPU VM: PP4 over MPI (4 ranks) took 3.3 ms for a prefill predicted at 0.3 ms
from the same machine's sweep (MPICH's ranks spin while they wait, so a rank whose data is
ready waits for a CPU); gloo's ranks sleep, yet PP4's decode step ran 2.6x its prediction once
the stages' steps overlapped. On a GPU the device does the work and this does not apply.
"""

import os
from typing import Any


def placement(hosts: list[str], device: str) -> dict[str, Any]:
    """The CPUs of rank 0's host, its ranks, and whether a CPU run oversubscribed them."""
    # The host's CPUs, not this rank's affinity: a launcher that binds each rank to one core
    # (Open MPI does for 2 ranks) would make every run look oversubscribed.
    cpus = os.cpu_count() or 1
    ranks = hosts.count(hosts[0]) if hosts else 1
    return {"host_cpus": cpus, "ranks_on_host": ranks,
            "oversubscribed": device == "cpu" and ranks > cpus}


def warning(command: str, where: dict[str, Any]) -> str | None:
    """One line when the run was oversubscribed, printed on stdout above the run's table: a
    batch job that merges stderr into its output file (sbatch) could otherwise put it after
    the JSON line that ends stdout."""
    if not where.get("oversubscribed"):
        return None
    return (f"infercomm {command}: warning: {where['ranks_on_host']} ranks on "
            f"{where['host_cpus']} CPUs: a rank whose data is ready can wait for a CPU, so the "
            "times include the scheduler's; use at most as many ranks as CPUs for figures "
            "of the library alone")
