"""`infercomm replay --disagg ...`: the prefill ranks and the decode ranks in one job, one
request's KV transfer issued through NIXL, MPI one-sided or MPI send/recv, timed and checked.

Job ranks: the prefill side's TP ranks first, then the decode side's (replica 0 of each).
Each rank holds its side's cache of the request; the prefill ranks' bytes are known values.
One iteration: barrier, then each rank issues its part of the transfer (transports.py) and
stops its clock once its part is complete; the request's figure is the slowest rank's.
`--check` zeroes the decode buffers, moves the blocks once more and counts the decode bytes
that differ from what the descriptors say they should hold (0 expected).
"""

import argparse
import socket
import time
from typing import Any

import numpy as np

from microbench.argtypes import UsageError
from microbench.backends.kv_transports import (
    ENDS_PAST_DESTRUCTORS,
    PairDescs,
    Role,
    check_transport_here,
    mooncake_options,
    open_transport,
)
from microbench.options.disagg_args import choose_kv_transport
from patterns.disagg import DisaggPattern

# A descriptor list beyond this is no request of a real prompt (Llama-3.1-70B's 128K tokens
# at SGLang's one-token slices are 40M): refused before any rank starts.
MAX_DESCRIPTORS = 1 << 22


def pair_descs(d: DisaggPattern) -> list[PairDescs]:
    t, offset = d.transfer, d.disagg.decode_offset
    out = []
    for i, pair in enumerate(t.pairs):
        rows = np.array(list(t.descriptors(pair)), dtype=np.uint64).reshape(-1, 3)
        out.append(PairDescs(pair, i, pair.prefill, offset + pair.decode,
                             rows[:, 0].copy(), rows[:, 1].copy(), rows[:, 2].copy(),
                             t.batches(pair)))
    return out


def role_of(d: DisaggPattern, rank: int, pairs: list[PairDescs]) -> Role:
    t = d.transfer
    if rank < d.disagg.decode_offset:
        mine = [p for p in pairs if p.prefill_rank == rank]
        return Role(rank, "prefill", t.prefill.rank_bytes, mine, t.direction)
    mine = [p for p in pairs if p.decode_rank == rank]
    return Role(rank, "decode", t.decode.rank_bytes, mine, t.direction)


def prefill_bytes(tp_rank: int, nbytes: int) -> np.ndarray:
    """The known contents of a prefill rank's cache: byte o is (131 o + 17 r + 1) mod 251,
    different at every offset within 251 and on every rank."""
    cycle = ((np.arange(251, dtype=np.int64) * 131 + 17 * tp_rank + 1) % 251).astype(np.uint8)
    return np.resize(cycle, nbytes)


def check_sizes(d: DisaggPattern, ranks_here: int, available: int | None) -> None:
    """Refuse, before any rank starts, descriptor lists and buffers beyond the machine."""
    t = d.transfer
    most = max((t.descriptor_count(p) for p in t.pairs), default=0)
    if most > MAX_DESCRIPTORS:
        raise UsageError(f"a rank pair would post {most:,} descriptors, beyond the "
                         f"{MAX_DESCRIPTORS:,} a replay takes; use a shorter --prompt or a "
                         "larger --kv-block-size")
    need = max(t.prefill.rank_bytes, t.decode.rank_bytes) * 2 * ranks_here  # + check copy
    if available is not None and need > available:
        raise UsageError(f"the KV buffers of {ranks_here} rank(s) need about {need:,} bytes "
                         f"and this host has {available:,} available; use a shorter --prompt "
                         "or fewer layers")


def expected_decode(role: Role, nbytes: int) -> np.ndarray:
    expected = np.zeros(nbytes, dtype=np.uint8)
    for pd in role.pairs:
        if not pd.length.size:
            continue
        source = prefill_bytes(pd.pair.prefill, int((pd.src + pd.length).max()))
        for src, dst, n in zip(pd.src.tolist(), pd.dst.tolist(), pd.length.tolist(),
                               strict=True):
            expected[dst:dst + n] = source[src:src + n]
    return expected


def timed_transfers(transport: Any, backend: Any, warmup: int, iters: int,
                    watchdog: Any) -> list[float]:
    """The timing protocol: per iteration a barrier, then this rank's part of the transfer
    between two clock reads; microseconds of the timed iterations."""
    from microbench.ranks import faults

    fault = faults.step_fault(backend.rank)  # INFERCOMM_FAULT kill/hang: a transfer a step
    samples = []
    for i in range(warmup + iters):
        watchdog.where = f"{'warm-up' if i < warmup else 'timed'} transfer {i + 1}"
        backend.barrier()
        if fault is not None and fault[0] == i + 1:
            fault[1]()
        start = time.perf_counter()
        transport.transfer()
        elapsed = (time.perf_counter() - start) * 1e6
        if i >= warmup:
            samples.append(elapsed)
        watchdog.steps += 1
    return samples


def _corrupt_if_asked(role: Role, buffer: np.ndarray) -> None:
    """INFERCOMM_FAULT=corrupt:RANK:kv (ranks/faults.py): the prefill rank RANK changes the
    first byte it sends before the --check transfer (the test that --check sees it)."""
    from microbench.ranks import faults

    sent = [pd for pd in role.pairs if pd.length.size]
    if role.side == "prefill" and sent and faults.corrupts_inputs(role.rank, "kvtransfer"):
        first = int(sent[0].src[0])
        buffer[first] = (int(buffer[first]) + 1) % 256


def run_rank_transfer(d: DisaggPattern, env: Any, args: argparse.Namespace) -> int:
    from microbench.backends import open_backend
    from microbench.ranks.failures import report_rank_failure
    from microbench.ranks.watchdog import Watchdog

    watchdog = Watchdog(args.timeout, env.rank).start()
    try:
        backend = open_backend(args.backend, env=env, device="cpu", timeout=args.timeout,
                               staging=False)
        watchdog.where = "KV transfer set-up"
        role = role_of(d, backend.rank, pair_descs(d))
        transport = open_transport(args.kv_transport, backend.rank,
                                   getattr(backend, "comm", None), args.nixl_progress_thread,
                                   mooncake_options(args))
        buffer = transport.allocate(role.nbytes)
        # Prefill job ranks are the prefill TP ranks (replica 0): the rank is the TP rank.
        buffer[:] = prefill_bytes(role.rank, role.nbytes) if role.side == "prefill" else 0
        transport.prepare(role, buffer, backend.allgather_object)
        sides: tuple[list[float], list[float], int] | None = None
        if getattr(args, "with_collectives", False):  # each side's collectives beside it
            from microbench.replay.kv_collectives import side_calls, side_plan, timed_iterations
            watchdog.where = "binding each side's collectives"
            side, plan = side_plan(d, backend)
            calls = side_calls(side, plan)
            prefill, samples, decode = timed_iterations(
                side, calls, transport, backend, args.warmup, args.iters, watchdog)
            sides = (prefill, decode, len(calls))
        else:
            samples = timed_transfers(transport, backend, args.warmup, args.iters, watchdog)
        wrong = None
        if args.check:
            watchdog.where = "--check transfer"
            if role.side == "decode":
                buffer[:] = 0
            _corrupt_if_asked(role, buffer)
            backend.barrier()
            transport.transfer()
            backend.barrier()  # a WRITE is complete at its target once its initiator is
            wrong = (int(np.count_nonzero(buffer != expected_decode(role, role.nbytes)))
                     if role.side == "decode" else 0)
            if wrong:  # the launcher says "--check found wrong data", not a rank's crash
                from microbench.ranks import notes
                notes.note_wrong(env.rank, wrong)
        watchdog.where = "collecting results"
        gathered = backend.allgather_object(
            (backend.rank, role.side, socket.gethostname(), samples, wrong, sides))
        status = 1 if any(g[4] for g in gathered) else 0
        if backend.rank == 0:
            from microbench.replay.kv_output import write_transfer
            versions = {**backend.versions(), **transport.versions()}
            status = write_transfer(d, args, gathered, versions, backend) or status
        transport.close()
        backend.close()
        return status
    except UsageError:
        raise
    except Exception as err:  # a peer's failure surfaces here as a library error
        return report_rank_failure("replay", env.rank, err)
    finally:
        watchdog.stop()


def run_disagg(args: argparse.Namespace) -> int:
    """Bad input refused here, before any process or file; then the ranks, started here
    (--nproc, or no launcher) or by mpiexec/srun/torchrun."""
    from microbench.options.disagg_args import (
        disagg_from_args,
        refuse_layout_options,
        refuse_workload_with_disagg,
    )
    from microbench.ranks import dist, launch
    from microbench.replay.run_args import check_out_dir, check_out_for_rank, strip_nproc

    if args.trace:
        raise UsageError("--trace replays a trace's own calls; drop --disagg or --trace")
    if args.model is None:
        raise UsageError("--disagg needs --model")
    refuse_workload_with_disagg(args)
    refuse_layout_options(args)
    if args.device == "cuda" or args.graph is not None or args.mpi_staging:
        raise UsageError("the KV transfer replay moves host memory (NIXL DRAM, MPI host "
                         "buffers); drop --device cuda, --graph and --mpi-staging")
    choose_kv_transport(args)
    if args.backend == "nccl":
        raise UsageError("the KV transfer replay runs its control calls over --backend mpi "
                         "or torch (gloo)")
    d = disagg_from_args(args)
    if d.disagg.prefill.dp > 1 or d.disagg.decode.dp > 1:
        raise UsageError("the replay moves one request between one replica of each side; "
                         "give tp only (drop dpN from --disagg)")
    check_transport_here(args)
    from microbench.replay.footprint import available_host_bytes, ranks_on_this_host

    world = d.disagg.world_size
    env = dist.detect()
    if args.nproc is not None or env is None:
        nproc = args.nproc or world
        if nproc != world:
            raise UsageError(f"--disagg {d.disagg.text()} runs {world} ranks (prefill "
                             f"{d.disagg.prefill.world_size} + decode "
                             f"{d.disagg.decode.world_size}); use --nproc {world}")
        check_sizes(d, nproc, available_host_bytes())
        check_out_dir(args.out)
        return launch.spawn_local(nproc, args.backend, strip_nproc(args.argv))
    if env.world_size != world:
        raise UsageError(f"the launcher started {env.world_size} ranks; --disagg "
                         f"{d.disagg.text()} needs {world} (prefill first, then decode)")
    check_out_for_rank(args.out, env.rank)
    check_sizes(d, ranks_on_this_host(), available_host_bytes())
    args.launcher = env.launcher
    status = run_rank_transfer(d, env, args)
    if args.kv_transport in ENDS_PAST_DESTRUCTORS:
        from microbench.ranks.teardown import exit_past_library_destructors
        exit_past_library_destructors(status)
    return status
