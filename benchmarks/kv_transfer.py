"""What the KV-transfer replay adds: `replay --disagg`'s transfer loop against a bare loop of
the same NIXL and MPI one-sided calls, on the same descriptors, in one run.

    python benchmarks/kv_transfer.py        (starts itself under mpiexec -n 2)

One request of Llama-3.1-8B, prompt 512, vLLM's NixlConnector from prefill TP1 (rank 0) to
decode TP1 (rank 1), in the two-region geometry of vLLM before #44455 (connector version
cda19ecf, kept so the figures of docs/disaggregated.md stay comparable): 32 layers x 2 (K,
V) x 32 blocks = 2,048 descriptors of 16 tokens x 8 heads x 128 x 2 bytes = 32 KiB, 64 MiB
READ by rank 1. Per transport, rounds alternate
between the replay's own loop (microbench/replay/kv_transfer.py `timed_transfers` over its
transport class) and a bare loop written here against the library (mpi4py's Win.Get with
the same hindexed datatypes; NIXL's make_prepped_xfer / transfer / check_xfer_state and the
target's get_new_notifs), each round a barrier then the transfer between two clock reads.
The ratio of medians, replay / bare, is printed per transport (goal <= 1.05).
"""

import json
import os
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

ROUNDS, WARMUP = 30, 5
GOAL = 1.05
PATTERN = dict(model="llama-3.1-8b", disagg="prefill=tp1,decode=tp1", prompt=512, decode=2)


def disagg():
    from microbench.options.disagg_args import disagg_from_args
    args = Namespace(**PATTERN, name=None, batch=1, dtype=None, eager=False,
                     max_batched_tokens=None, control_plane=False, gpu="h100",
                     nccl_only=False, model_runner=None, max_num_seqs=None, sp=False,
                     engine="vllm", connector="nixl", kv_cache_dtype="auto",
                     kv_block_size=None, connector_version="cda19ecf")
    return disagg_from_args(args)


class Replay:
    """The replay's path: its roles, descriptor arrays, transport class and timed loop."""

    def __init__(self, name, d, backend, watchdog):
        from microbench.backends.kv_transports import open_transport
        from microbench.replay.kv_transfer import pair_descs, prefill_bytes, role_of
        self.backend, self.watchdog = backend, watchdog
        role = role_of(d, backend.rank, pair_descs(d))
        self.transport = open_transport(name, backend.rank, backend.comm)
        buffer = self.transport.allocate(role.nbytes)
        buffer[:] = prefill_bytes(0, role.nbytes) if role.side == "prefill" else 0
        self.transport.prepare(role, buffer, backend.allgather_object)

    def round(self) -> float:
        from microbench.replay.kv_transfer import timed_transfers
        return timed_transfers(self.transport, self.backend, 0, 1, self.watchdog)[0]

    def close(self) -> None:
        self.transport.close()


def descriptors(d):
    import numpy as np
    t = d.transfer
    rows = np.array(list(t.descriptors(t.pairs[0])), dtype=np.uint64)
    return rows[:, 0], rows[:, 1], rows[:, 2], t.prefill.rank_bytes


def fill(buf, rank: int) -> None:
    """The replay's contents (untouched pages would all read as the one zero page)."""
    from microbench.replay.kv_transfer import prefill_bytes
    buf[:] = prefill_bytes(0, buf.size) if rank == 0 else 0


class BareRma:
    def __init__(self, d, comm):
        import numpy as np
        from mpi4py import MPI
        src, dst, length, nbytes = descriptors(d)
        self.comm, self.rank = comm, comm.Get_rank()
        self.win = MPI.Win.Allocate(nbytes, disp_unit=1, comm=comm)
        buf = np.frombuffer(self.win.tomemory(), dtype=np.uint8)
        fill(buf, self.rank)
        lens = length.tolist()
        self.local = MPI.BYTE.Create_hindexed(lens, dst.tolist()).Commit()
        self.remote = MPI.BYTE.Create_hindexed(lens, src.tolist()).Commit()
        self.origin = [buf, 1, self.local]

    def round(self) -> float:
        self.comm.Barrier()
        start = time.perf_counter()
        if self.rank == 1:
            self.win.Lock_all()
            self.win.Get(self.origin, 0, [0, 1, self.remote])
            self.win.Unlock_all()
        return (time.perf_counter() - start) * 1e6

    def close(self) -> None:
        self.local.Free()
        self.remote.Free()
        self.win.Free()


class BareNixl:
    def __init__(self, d, comm):
        import numpy as np

        from microbench.backends.kv_transports import import_nixl
        api = import_nixl()
        src, dst, length, nbytes = descriptors(d)
        self.comm, self.rank = comm, comm.Get_rank()
        self.agent = api.nixl_agent(f"bare-{self.rank}", api.nixl_agent_config(
            enable_prog_thread=False, backends=["UCX"]))
        self.buf = np.zeros(nbytes, dtype=np.uint8)
        fill(self.buf, self.rank)
        base = self.buf.ctypes.data
        self.registered = self.agent.register_memory([(base, nbytes, 0, "")], "DRAM")
        peers = comm.allgather((self.agent.get_agent_metadata(), base))
        if self.rank == 1:
            name = self.agent.add_remote_agent(peers[0][0])
            zeros = np.zeros_like(length)
            local = np.column_stack((base + dst, length, zeros)).astype(np.uint64)
            remote = np.column_stack((peers[0][1] + src, length, zeros)).astype(np.uint64)
            self.lh = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT",
                                                 self.agent.get_xfer_descs(local, "DRAM"))
            self.rh = self.agent.prep_xfer_dlist(name, self.agent.get_xfer_descs(remote,
                                                                                 "DRAM"))
            self.ids = np.arange(len(length))

    def round(self) -> float:
        agent = self.agent
        self.comm.Barrier()
        start = time.perf_counter()
        if self.rank == 1:
            h = agent.make_prepped_xfer("READ", self.lh, self.ids, self.rh, self.ids, b"kv:0")
            agent.transfer(h)
            while agent.check_xfer_state(h) == "PROC":
                pass
            agent.release_xfer_handle(h)
        else:
            got = 0
            while not got:
                got = sum(len(v) for v in agent.get_new_notifs().values())
        return (time.perf_counter() - start) * 1e6

    def close(self) -> None:
        """Handles and registrations given back, as the replay's transport does (UCX warns
        at exit about every one left)."""
        if self.rank == 1:
            self.agent.release_dlist_handle(self.lh)
            self.agent.release_dlist_handle(self.rh)
        self.agent.deregister_memory(self.registered)


def main() -> None:
    import numpy as np
    from mpi4py import MPI

    from microbench.backends import open_backend
    from microbench.ranks import dist
    from microbench.ranks.watchdog import Watchdog

    env = dist.detect()
    backend = open_backend("mpi", env=env, device="cpu", timeout=600)
    watchdog = Watchdog(600, env.rank, command="benchmark").start()
    d = disagg()
    try:
        from microbench.backends.kv_transports import import_nixl
        import_nixl()
        transports = {"rma": BareRma, "nixl": BareNixl}
    except Exception:  # no NIXL here: MPI alone
        transports = {"rma": BareRma}
    results = {}
    for name, bare_class in transports.items():
        bare = bare_class(d, MPI.COMM_WORLD)
        replay = Replay(name, d, backend, watchdog)
        times = {"replay": [], "bare": []}
        for i in range(WARMUP + ROUNDS):
            for way, issue in ((("bare", bare.round), ("replay", replay.round)) if i % 2 else
                               (("replay", replay.round), ("bare", bare.round))):
                took = issue()
                slowest = MPI.COMM_WORLD.allreduce(took, op=MPI.MAX)
                if i >= WARMUP:
                    times[way].append(slowest)
        MPI.COMM_WORLD.Barrier()  # both ranks done with both ways before either closes
        bare.close()
        replay.close()
        med = {way: float(np.median(v)) for way, v in times.items()}
        results[name] = {"replay_us": round(med["replay"], 1), "bare_us": round(med["bare"], 1),
                         "ratio": round(med["replay"] / med["bare"], 3)}
    watchdog.stop()
    if backend.rank == 0:
        t = d.transfer
        print(f"KV transfer of one request: {PATTERN['model']} {PATTERN['disagg']}, prompt "
              f"{PATTERN['prompt']}, vLLM nixl: {t.total_bytes:,} bytes in "
              f"{t.descriptor_count(t.pairs[0]):,} descriptors; {ROUNDS} rounds a way, "
              f"alternating; median of the slowest rank")
        for name, r in results.items():
            verdict = "meets" if r["ratio"] <= GOAL else "misses"
            print(f"  {name:>5}: replay {r['replay_us']:10.1f} us  bare {r['bare_us']:10.1f} us"
                  f"  ratio {r['ratio']:.3f} ({verdict} goal <= {GOAL})")
        print(json.dumps(results, separators=(",", ":")))


if __name__ == "__main__":
    if "PMI_RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ:
        mpiexec = Path(sys.executable).parent / "mpiexec"
        sys.exit(subprocess.call([str(mpiexec), "-n", "2", sys.executable, *sys.argv],
                                 env={**os.environ, "OMP_NUM_THREADS": "1"}))
    main()
