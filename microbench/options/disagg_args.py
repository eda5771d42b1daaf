"""`--disagg`, `--connector`, `--kv-cache-dtype`, `--kv-block-size`: the options of a
disaggregated deployment, shared by `pattern`, `replay` and `plan`, and the deployment they
describe (read by the KV transfer's replay and pricing too). Replay's and sweep's transfer
options: `microbench/cli/kv_args.py`. Nothing heavy is imported here: `--help` stays fast."""

import argparse
import dataclasses

from microbench.argtypes import UsageError, commit_text, positive_int
from patterns import EngineOptions, Workload, resolve_model
from patterns.disagg import KV_CACHE_DTYPES, DisaggPattern, generate_disagg, parse_disagg

TRANSPORTS = ("nixl", "mooncake", "rma", "p2p", "torch")  # replay --kv-transport
MOONCAKE_PROTOCOLS = ("tcp", "rdma")  # --mooncake-protocol (backends/mooncake_transport.py)
DEFAULT_DESCRIPTORS = 64  # sweep --op kvtransfer: descriptors a transfer


def add_disagg_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--disagg", default=None, metavar="prefill=LAYOUT,decode=LAYOUT",
                       help="disaggregated prefill and decode, e.g. prefill=tp4,decode=tp8 "
                            "(dpN for replicas): both sides' calls and one request's KV "
                            "transfer between them")
    group.add_argument("--connector", default=None,
                       help="with --disagg: the engine's KV connector, nixl (vllm; sglang), "
                            "nixl-push (vllm's NixlPushConnector: the prefill ranks write) or "
                            "mooncake (sglang) (default: vllm nixl, sglang mooncake)")
    group.add_argument("--connector-version", default=None, metavar="COMMIT", type=commit_text,
                       help="with --disagg: the engine commit whose connector is modelled "
                            "(vllm: c8109375, K and V packed, the default; cda19ecf, K and V "
                            "two regions, before vLLM #44455; sglang: 8905cbd4)")
    group.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                       help="with --disagg: the KV cache's dtype, auto (the model's) or fp8 "
                            "(one byte an element)")
    group.add_argument("--kv-block-size", type=positive_int, default=None, metavar="TOKENS",
                       help="with --disagg: tokens a KV block (vllm --block-size, sglang "
                            "--page-size; default the engine's: vllm 16, for MLA the "
                            "attention backend's (h100/h200: 16, fp8 cache 64; b200: 32); "
                            "sglang 1, on the b200 64); vllm with --requests: the block "
                            "prefix caching finds whole (vLLM's CPU build: 128)")


def refuse_workload_with_disagg(args: argparse.Namespace) -> None:
    """--disagg prices one request's KV transfer (--prompt, --decode): a request workload or
    speculative decoding is not modelled with it, and is said so rather than read as a
    missing prompt length; nor is SGLang's overlap scheduler, which only acts over a
    workload (not silently ignored)."""
    given = [flag for flag in ("--requests", "--step-time-ms", "--speculative-config",
                               "--acceptance-length", "--acceptance-rate", "--mixed-chunk",
                               "--disable-overlap-schedule")
             if getattr(args, flag[2:].replace("-", "_"), None)]
    if given:
        raise UsageError(f"--disagg models one request's KV-cache transfer (--prompt, "
                         f"--decode); {', '.join(given)} {'is' if len(given) == 1 else 'are'} not "
                         f"modelled with it: drop "
                         f"{'it' if len(given) == 1 else 'them'}, or drop --disagg")
    missing = [f"--{n}" for n in ("prompt", "decode") if getattr(args, n, None) is None]
    if missing:
        raise UsageError(f"--disagg needs {' and '.join(missing)}: the request whose KV cache "
                         "moves")


def disagg_from_args(args: argparse.Namespace) -> DisaggPattern:
    """The disaggregated deployment the options describe; ConfigError on bad input."""
    refuse_workload_with_disagg(args)
    model = resolve_model(args.model)
    if getattr(args, "name", None):
        model = dataclasses.replace(model, name=args.name)
    workload = Workload(prompt=args.prompt, decode=args.decode, batch=args.batch,
                        dtype=args.dtype, dp_batches=getattr(args, "dp_batches", None))
    return generate_disagg(args.engine, model, parse_disagg(args.disagg), workload,
                           engine_options(args), args.connector, args.kv_cache_dtype,
                           args.kv_block_size,
                           connector_version=getattr(args, "connector_version", None))


def engine_options(args: argparse.Namespace) -> EngineOptions:
    return EngineOptions(eager=args.eager, max_batched_tokens=args.max_batched_tokens,
                         control_plane=args.control_plane, gpu=args.gpu,
                         nccl_only=args.nccl_only, model_runner=args.model_runner,
                         max_num_seqs=args.max_num_seqs, sp=args.sp,
                         return_log_probs=getattr(args, "return_log_probs", False),
                         async_scheduling=getattr(args, "async_scheduling", None),
                         disable_overlap_schedule=getattr(args, "disable_overlap_schedule",
                                                          False))


def refuse_disagg_options(args: argparse.Namespace) -> None:
    """A colocated pattern takes none of the disaggregated options."""
    if getattr(args, "disagg", None) is not None:
        raise UsageError("--disagg is taken by `infercomm pattern`, `replay` and `plan`; drop "
                         "it here")
    given = [flag for flag, value, default in (
        ("--connector", getattr(args, "connector", None), None),
        ("--connector-version", getattr(args, "connector_version", None), None),
        ("--kv-cache-dtype", getattr(args, "kv_cache_dtype", "auto"), "auto"),
        # a request workload's prefix caching reads it too (vllm/workload.py)
        ("--kv-block-size", None if getattr(args, "requests", None)
         else getattr(args, "kv_block_size", None), None),
        ("--kv-transport", getattr(args, "kv_transport", None), None),
        ("--nixl-progress-thread", getattr(args, "nixl_progress_thread", False), False),
        ("--mooncake-protocol", getattr(args, "mooncake_protocol", None), None),
        ("--mooncake-host", getattr(args, "mooncake_host", None), None),
        ("--with-collectives", getattr(args, "with_collectives", False), False))
        if value != default]
    if given:
        raise UsageError(f"{', '.join(given)} describe(s) the KV transfer of --disagg "
                         "prefill=LAYOUT,decode=LAYOUT; add --disagg or drop them")


def refuse_layout_options(args: argparse.Namespace) -> None:
    """--disagg names both sides' layouts: --tp/--pp/--dp/--ep would be a third."""
    given = [f"--{name.replace('_', '-')}" for name, default in
             (("tp", 1), ("pp", 1), ("dp", 1), ("ep", False), ("dp_batches", None))
             if getattr(args, name, default) != default]
    if given:
        raise UsageError(f"--disagg gives each side's layout (prefill=tp4,decode=tp8); drop "
                         f"{', '.join(given)}")


def choose_kv_transport(args: argparse.Namespace) -> None:
    """--kv-transport, defaulted from --backend and checked against it: the one rule that the
    KV transfer's replay and sweep share."""
    if args.kv_transport is None:
        args.kv_transport = "rma" if args.backend == "mpi" else "nixl"
    if args.kv_transport in ("rma", "p2p") and args.backend != "mpi":
        raise UsageError(f"--kv-transport {args.kv_transport} issues MPI calls; add --backend "
                         "mpi (or use --kv-transport nixl)")
    if args.kv_transport == "torch" and args.backend != "torch":
        raise UsageError("--kv-transport torch issues torch.distributed calls; use --backend "
                         "torch")
    given = [flag for flag in ("--mooncake-protocol", "--mooncake-host")
             if getattr(args, flag[2:].replace("-", "_"), None) is not None]
    if given and args.kv_transport != "mooncake":
        raise UsageError(f"{' and '.join(given)} act(s) with --kv-transport mooncake; add it "
                         f"or drop {'it' if len(given) == 1 else 'them'}")
