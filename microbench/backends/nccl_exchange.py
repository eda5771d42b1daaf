"""How the nccl backend's ranks share each communicator's NCCL unique id (and the objects of
allgather_object): MPI_COMM_WORLD under an MPI launcher, else a torch TCPStore at
MASTER_ADDR:MASTER_PORT, served by rank 0 or, under torchrun, by torchrun's own agent."""

import importlib.util
import os
import pickle
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from microbench.argtypes import UsageError
from microbench.ranks.dist import DistEnv, rendezvous_address, resolve_master_addr


def agent_store_serves(env: DistEnv, environ: Any = None) -> bool:
    """Whether torchrun's agent already serves a TCPStore at this run's MASTER_PORT.

    torchrun's elastic agent hosts the rendezvous TCPStore on MASTER_PORT and tells its
    workers so with TORCHELASTIC_USE_AGENT_STORE=True (torch/distributed/elastic/agent/
    server/local_elastic_agent.py `_start_workers`); torch's own rendezvous then makes every
    rank a client of it (torch/distributed/rendezvous.py `_create_c10d_store`). A second
    server on that port fails to bind "address already in use" on torch 2.3-2.6 (pyproject
    allows >= 2.3); only later torch forgives that bind when the agent store is on and the
    port is MASTER_PORT (TCPStore.cpp, pytorch/pytorch#147465)."""
    e = os.environ if environ is None else environ
    return (env.launcher == "torchrun" and e.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            and e.get("MASTER_PORT", "") == str(env.master_port))


class _StoreExchange:
    """A torch TCPStore on MASTER_ADDR:MASTER_PORT served by rank 0 (no process group), or
    under torchrun the agent's store there, every rank a client, under a prefix of the run's
    attempt (a restarted worker group must not read the previous attempt's ids)."""

    name = "tcp-store"

    def __init__(self, env: DistEnv, timeout: float) -> None:
        try:
            from torch.distributed import PrefixStore, TCPStore
        except ImportError:
            raise UsageError("the nccl backend shares NCCL's unique id through torch's "
                             "TCPStore, or through MPI under mpiexec/srun --mpi: install "
                             "torch, or mpi4py and launch with MPI") from None
        self.rank, self.size, self._seq = env.rank, env.world_size, 0
        # mpirun/mpiexec across hosts without mpi4py: MASTER_ADDR's 127.0.0.1 fallback would
        # pair each host's ranks with themselves; rendezvous_address refuses it, naming
        # MASTER_ADDR (ranks/dist.py)
        addr = resolve_master_addr(rendezvous_address(env))
        client = agent_store_serves(env)
        store = TCPStore(addr, env.master_port, env.world_size, env.rank == 0 and not client,
                         timedelta(seconds=timeout))
        if client:
            attempt = (f"infercomm/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/"
                       f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}")
            store = PrefixStore(attempt, store)  # keys: attempt + "/" + key
        self.store = store

    def share(self, key: str, root: int, make: Callable[[], bytes] | None,
              member: bool) -> bytes | None:
        if self.rank == root and make is not None:
            data = make()
            self.store.set(key, data)
            return data
        return bytes(self.store.get(key)) if member else None

    def allgather(self, obj: Any) -> list[Any]:
        self._seq += 1
        prefix = f"infercomm/objects/{self._seq}/"
        self.store.set(prefix + str(self.rank), pickle.dumps(obj))
        return [pickle.loads(self.store.get(prefix + str(r))) for r in range(self.size)]

    def close(self) -> None:
        self.store = None


class _MpiExchange:
    """MPI_COMM_WORLD, when an MPI launcher started the ranks."""

    name = "mpi"

    def __init__(self, env: DistEnv) -> None:
        from mpi4py import MPI

        from microbench.ranks import shm
        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        shm.note_segments(self.rank)  # MPICH's /dev/shm segment: the launcher removes it
        if self.comm.Get_size() != env.world_size:
            raise UsageError(f"the launcher started {env.world_size} ranks but MPI sees a "
                             f"world of {self.comm.Get_size()}; launch with the MPI library's "
                             "mpiexec or srun --mpi=pmi2/pmix")

    def share(self, key: str, root: int, make: Callable[[], bytes] | None,
              member: bool) -> bytes | None:
        data = make() if self.rank == root and make is not None else None
        return self.comm.bcast(data, root=root)  # every rank calls new_group, so all join

    def allgather(self, obj: Any) -> list[Any]:
        return self.comm.allgather(obj)

    def close(self) -> None:
        pass


def open_exchange(env: DistEnv, timeout: float) -> "_StoreExchange | _MpiExchange":
    if env.launcher in ("openmpi", "pmi") and importlib.util.find_spec("mpi4py") is not None:
        return _MpiExchange(env)
    return _StoreExchange(env, timeout)
