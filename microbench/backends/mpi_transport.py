"""What an MPI library carries traffic over, as far as it tells: recorded in meta.json.

- mpi_netmod: MPICH's network module. The `MPIR_CVAR_CH4_NETMOD` variable picks one of the
  modules the library was built with; unset, MPICH takes the first of its "MPICH Device:" line
  ("ch4:ucx ofi" in the pip wheel: ucx). Open MPI: the `OMPI_MCA_pml` variable, or None.
- mpi_shm: whether ranks on one node talk through shared memory. MPICH turns it off with
  `MPIR_CVAR_NOLOCAL=1` (every message through the netmod); otherwise "on".
- mpi_node_ranks: how many ranks MPI itself counts on rank 0's node
  (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)): the ranks it can reach through shared memory.
  Fewer than the ranks on that host means the library was told (by the launcher's process
  map) that they are on other nodes, and sends them through the network.

A comparison that says one node is slower than two reads these first (analysis/differences).
"""

import os
import re
from typing import Any

_TRUE = {"1", "yes", "true", "on"}


def node_ranks(comm: Any) -> int:
    """Ranks of `comm` that share rank's node as MPI sees it; collective over comm."""
    from mpi4py import MPI

    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return int(shared.Get_size())
    finally:
        shared.Free()


def transport_facts(library_version: str, ranks_on_node: int | None) -> dict[str, Any]:
    """mpi_netmod, mpi_shm, mpi_node_ranks from the library's version text and environment."""
    facts: dict[str, Any] = {"mpi_node_ranks": ranks_on_node}
    if "MPICH" in library_version:
        device = re.search(r"MPICH Device:\s*ch4:(\S+)(?:\s+(\S.*))?", library_version)
        built = ([device.group(1), *(device.group(2) or "").split()] if device else [])
        facts["mpi_netmod"] = os.environ.get("MPIR_CVAR_CH4_NETMOD") or (
            built[0] if built else None)
        nolocal = os.environ.get("MPIR_CVAR_NOLOCAL", "").strip().lower() in _TRUE
        facts["mpi_shm"] = "off (MPIR_CVAR_NOLOCAL)" if nolocal else "on"
    elif "Open MPI" in library_version:
        facts["mpi_netmod"] = os.environ.get("OMPI_MCA_pml")  # noqa: SIM112 (its name)
        facts["mpi_shm"] = None
    return facts
