"""`infercomm sweep --op kvtransfer`: the time of one KV transfer of K descriptors of S bytes
between two ranks, over a range of S, through NIXL, MPI one-sided or MPI send/recv.

What a connector posts is a list of descriptors, one per block (vLLM), per run of pages or
per token slice (SGLang); what it costs depends on their size and number. Each row of the
sweep is one transfer of `--kv-descriptors` K descriptors of `size_bytes` S each, laid one
every 2S in both buffers (so that no library merges them into one range), from rank 0 (the
prefill side) to rank 1 (the decode side), READ by rank 1 (`--kv-direction read`, vLLM's
pull) or WRITTEN by rank 0 (write, SGLang's push). The protocol is replay's: barrier, the
transfer, each rank's clock stopped when its part is complete, the slowest rank's time.
`plan --disagg` prices a connector's pair of K' descriptors of S' bytes as K'/K x t(S').
"""

import argparse
import json
import socket
import sys
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
from microbench.options.disagg_args import DEFAULT_DESCRIPTORS, choose_kv_transport
from patterns.disagg import Pair

OP = "kvtransfer"
DEFAULT_MIN, DEFAULT_MAX, DEFAULT_FACTOR = 256, 1 << 20, 4
MAX_BUFFER = 1 << 31  # 2 GiB a rank: K x S x 2 beyond this is refused


def sizes_of(args: argparse.Namespace) -> list[int]:
    from microbench.sweep.cases import geometric_sizes

    if args.sizes is not None:
        if not args.sizes:
            raise UsageError("--sizes is empty; write sizes like 4K,1M")
        return args.sizes
    return geometric_sizes(args.minbytes if args.minbytes is not None else DEFAULT_MIN,
                           args.maxbytes if args.maxbytes is not None else DEFAULT_MAX,
                           args.stepfactor or DEFAULT_FACTOR)


def check_args(args: argparse.Namespace) -> tuple[list[int], int]:
    if args.from_pattern or args.model is not None:
        raise UsageError("--op kvtransfer sweeps descriptor sizes; drop --from-pattern and the "
                         "pattern options (plan --disagg prices a model's transfer from it)")
    from microbench.options.pattern_args import refuse_pattern_options
    refuse_pattern_options(args, "drop them (plan --disagg --kv-sweep prices a model's "
                                 "transfer from this sweep)")  # not ignored
    if args.sizes is not None and any(v is not None for v in
                                       (args.minbytes, args.maxbytes, args.stepfactor)):
        raise UsageError("give sizes by -b/-e/-f or by --sizes, not both")
    sizes = sizes_of(args)
    count = args.kv_descriptors or DEFAULT_DESCRIPTORS
    if 2 * count * max(sizes) > MAX_BUFFER:
        raise UsageError(f"{count} descriptors of {max(sizes):,} bytes, one every two, need "
                         f"{2 * count * max(sizes):,} bytes a rank; keep it within "
                         f"{MAX_BUFFER:,} (lower -e or --kv-descriptors)")
    choose_kv_transport(args)
    check_transport_here(args)
    if args.device == "cuda":
        raise UsageError("--op kvtransfer moves host memory; drop --device cuda")
    return sizes, count


def run_kv_sweep(args: argparse.Namespace) -> int:
    from microbench.ranks import dist, launch
    from microbench.replay.run_args import check_out_dir, check_out_for_rank, strip_nproc

    sizes, count = check_args(args)
    env = dist.detect()
    if args.nproc is not None or env is None:
        if (args.nproc or 2) != 2:
            raise UsageError("--op kvtransfer runs one pair: --nproc 2")
        check_out_dir(args.out)
        return launch.spawn_local(2, args.backend, strip_nproc(args.argv))
    if env.world_size != 2:
        raise UsageError(f"--op kvtransfer runs one pair (2 ranks); the launcher started "
                         f"{env.world_size}")
    check_out_for_rank(args.out, env.rank)
    args.launcher = env.launcher
    status = _rank(sizes, count, env, args)
    if args.kv_transport in ENDS_PAST_DESTRUCTORS:
        from microbench.ranks.teardown import exit_past_library_destructors
        exit_past_library_destructors(status)
    return status


def case_role(rank: int, size: int, count: int, direction: str) -> Role:
    offsets = np.arange(count, dtype=np.uint64) * np.uint64(2 * size)
    lengths = np.full(count, size, dtype=np.uint64)
    pd = PairDescs(Pair(0, 0, 0, 0, 1), 0, 0, 1, offsets, offsets.copy(), lengths)
    return Role(rank, "prefill" if rank == 0 else "decode", 2 * size * count, [pd], direction)


def _rank(sizes: list[int], count: int, env: Any, args: argparse.Namespace) -> int:
    from microbench.backends import open_backend
    from microbench.ranks.failures import report_rank_failure
    from microbench.ranks.watchdog import Watchdog

    watchdog = Watchdog(args.timeout, env.rank, command="sweep").start()
    try:
        backend = open_backend(args.backend, env=env, device="cpu", timeout=args.timeout,
                               staging=False)
        transport = open_transport(args.kv_transport, backend.rank,
                                   getattr(backend, "comm", None), args.nixl_progress_thread,
                                   mooncake_options(args))
        whole = transport.allocate(2 * count * max(sizes))
        whole[:] = (np.arange(whole.size) % 251).astype(np.uint8) if backend.rank == 0 else 0
        results = []
        for size in sizes:
            watchdog.where = f"kvtransfer of {count} x {size} bytes"
            role = case_role(backend.rank, size, count, args.kv_direction)
            transport.clear()
            transport.prepare(role, whole, backend.allgather_object)
            times = []
            for i in range(args.warmup + args.iters):
                backend.barrier()
                start = time.perf_counter()
                transport.transfer()
                if i >= args.warmup:
                    times.append((time.perf_counter() - start) * 1e6)
                watchdog.steps += 1
            wrong = None
            if args.check:  # once more into zeroed ranges, then compared
                if backend.rank == 1:
                    whole[:] = 0
                backend.barrier()
                transport.transfer()
                backend.barrier()
                if backend.rank == 1:
                    ends = (role.pairs[0].dst + role.pairs[0].length).astype(np.int64)
                    got = np.concatenate([whole[int(a) - size:int(a)] for a in ends])
                    want = np.concatenate([(np.arange(int(a) - size, int(a)) % 251)
                                           .astype(np.uint8) for a in ends])
                    wrong = int(np.count_nonzero(got != want))
                else:
                    wrong = 0
            results.append((np.array(times), wrong))
        gathered = backend.allgather_object((socket.gethostname(), results))
        status = 1 if any(w for _, r in gathered for _, w in r) else 0
        if backend.rank == 0:
            status = _write(sizes, count, args, gathered, backend,
                            {**backend.versions(), **transport.versions()}) or status
        transport.close()
        backend.close()
        return status
    except UsageError:
        raise
    except Exception as err:
        return report_rank_failure("sweep", env.rank, err)
    finally:
        watchdog.stop()


def _write(sizes: list[int], count: int, args: argparse.Namespace, gathered: list[Any],
           backend: Any, versions: dict[str, Any]) -> int:
    from microbench.ranks import cpus
    from microbench.results.store import base_meta, csv_text, json_text, write_run_or_keep
    from microbench.sweep.cases import rank_max, stats
    from microbench.sweep.output import COLUMNS, SAMPLE_COLUMNS, sweep_table

    rows, samples = [], []
    hosts = [h for h, _ in gathered]
    for i, size in enumerate(sizes):
        times = rank_max([r[i][0] for _, r in gathered])
        median, p5, p95 = stats(times)
        wrongs = [r[i][1] for _, r in gathered]
        moved = size * count
        rows.append({"op": OP, "size_bytes": size, "count": count, "dtype": "uint8",
                     "group_size": 2, "time_us": round(median, 3), "time_p5_us": round(p5, 3),
                     "time_p95_us": round(p95, 3), "time_run_us": round(median, 3),
                     "algbw_gbps": round(moved / median / 1e3, 6),
                     "busbw_gbps": round(moved / median / 1e3, 6),
                     "wrong": None if None in wrongs else sum(wrongs)})
        samples += [{"op": OP, "size_bytes": size, "dtype": "uint8", "group_size": 2,
                     "iteration": it, "time_us": round(float(t), 3)}
                    for it, t in enumerate(times)]
    columns = list(COLUMNS)
    from microbench.sweep.output import node_ids
    nodes = node_ids(hosts, args.ranks_per_node)  # --ranks-per-node 1: two nodes
    if len(set(nodes)) > 1:
        columns.append("level")
        for row in rows:
            row["level"] = "inter"
    head = {"kind": "sweep", "backend": backend.name, "transport": args.kv_transport,
            "device": "cpu", "world_size": 2, "iterations": args.iters, "warmup": args.warmup}
    where = cpus.placement(hosts, "cpu")
    meta = {**base_meta(args.argv), **head, "hosts": hosts, **where,
            "launcher": args.launcher, "versions": versions, "check": args.check,
            "timeout_s": args.timeout, "source": "kvtransfer", "ops": [OP], "sizes": sizes,
            "dtypes": ["uint8"], "kv_descriptors": count, "kv_direction": args.kv_direction,
            "kv_transport": args.kv_transport, "nodes": len(set(nodes)),
            "ranks_per_node": args.ranks_per_node}
    wrongs = [r["wrong"] for r in rows]
    summary = {**head, "wrong": None if None in wrongs else sum(wrongs), "rows": rows}
    files = {"meta.json": json_text(meta), "sweep.csv": csv_text(rows, columns),
             "samples.csv": csv_text(samples, SAMPLE_COLUMNS),
             "summary.json": json_text(summary)}
    label = args.label or f"sweep-kvtransfer-{args.kv_transport}-{args.kv_direction}"
    folder, error = write_run_or_keep(args.out, label, files)
    from microbench.results.store import print_standin_line
    print_standin_line("sweep")
    print(f"# {OP}: {count} descriptors of size_bytes each, one transfer a row "
          f"({args.kv_transport}, {args.kv_direction}); count = descriptors")
    print(sweep_table(rows, head, hosts, False))
    print(f"results: {folder}")
    print(json.dumps({**{k: v for k, v in summary.items() if k != "rows"}, "cases": len(rows),
                      "results_dir": str(folder) if folder is not None else None},
                     separators=(",", ":")), flush=True)
    if error is not None:
        from microbench.results.store import WRITE_ERROR_EXIT_STATUS, write_error_message
        sys.stderr.write(write_error_message("sweep", args.out, error, folder))
        return WRITE_ERROR_EXIT_STATUS
    return 0
