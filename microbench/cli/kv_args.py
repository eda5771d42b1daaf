"""The KV transfer's own options, `replay --disagg`'s and `sweep --op kvtransfer`'s, and
`pattern --disagg`'s printout (the deployment's options: `microbench/options/disagg_args.py`).
Nothing heavy is imported here: `--help` stays fast."""

import argparse

from microbench.argtypes import UsageError, positive_int
from microbench.options.disagg_args import (
    DEFAULT_DESCRIPTORS,
    MOONCAKE_PROTOCOLS,
    TRANSPORTS,
    disagg_from_args,
    refuse_layout_options,
)


def print_disagg(args: argparse.Namespace) -> int:
    """`infercomm pattern --disagg ...`: table, JSON or CSV of both sides and the transfer."""
    import json

    from microbench.views.kv_transfer import disagg_csv, disagg_document, disagg_table

    refuse_layout_options(args)
    if args.steps:
        raise UsageError("--steps shows one layout's steps; drop it with --disagg")
    d = disagg_from_args(args)
    if args.format == "json":
        print(json.dumps(disagg_document(d), separators=(",", ":")))
        return 0
    if args.format == "csv":
        print(disagg_csv(d), end="")
        return 0
    print(disagg_table(d))
    t = d.transfer
    print(json.dumps({"engine": args.engine, "connector": t.connector.name,
                      "connector_version": t.connector.version,
                      "model": d.decode.model.name, "disagg": d.disagg.text(),
                      "kv_transfer_bytes": t.total_bytes, "direction": t.direction,
                      "pairs": sum(1 for p in t.pairs if not p.dummy)}, separators=(",", ":")))
    return 0


def add_kv_replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kv-transport", choices=TRANSPORTS, default=None,
                        help="with --disagg: what moves the KV blocks: nixl (NIXL's UCX "
                             "backend), mooncake (Mooncake's transfer engine, SGLang's "
                             "batches), rma (MPI one-sided Get/Put), p2p (MPI send/recv) or "
                             "torch (torch.distributed send/recv of packed descriptors); rma "
                             "and p2p need --backend mpi, torch --backend torch (default: rma "
                             "with --backend mpi, else nixl)")
    parser.add_argument("--nixl-progress-thread", action="store_true",
                        help="with --kv-transport nixl: keep NIXL's progress thread (4 "
                             "threads, as vLLM); default: the ranks progress UCX by polling")
    parser.add_argument("--mooncake-protocol", choices=MOONCAKE_PROTOCOLS, default=None,
                        help="with --kv-transport mooncake: the transfer engine's protocol, "
                             "tcp (default) or rdma (the host's RDMA devices)")
    parser.add_argument("--mooncake-host", default=None, metavar="ADDR",
                        help="with --kv-transport mooncake: the address each rank's engine "
                             "listens at and is reached at (default: 127.0.0.1 when every "
                             "rank runs on one host, else the address of each host's name)")
    parser.add_argument("--with-collectives", action="store_true",
                        help="with --disagg: each side's collectives too, each timed alone: "
                             "the prefill side's prefill step, the transfer, the decode side's "
                             "first decode step; the request's communication under TTFT and "
                             "the transfer's share of it")


def add_kv_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("kvtransfer (--op kvtransfer)")
    group.add_argument("--kv-descriptors", type=positive_int, default=None, metavar="K",
                       help=f"descriptors in one transfer (default {DEFAULT_DESCRIPTORS})")
    group.add_argument("--kv-direction", choices=("read", "write"), default="read",
                       help="read: rank 1 pulls (vLLM's NIXL READ, default); write: rank 0 "
                            "pushes (SGLang's WRITE)")
