"""`infercomm plan`: every layout of N GPUs for a model, priced by its communication alone."""

import argparse
import gc
import json
import math
import sys
from typing import Any

from microbench.analysis.hardware import GPU_SPECS, memory_limit
from microbench.argtypes import UsageError, positive_int
from microbench.options.pattern_args import add_pattern_arguments, pattern_from_args

SCOPE = ("floors, not a prediction of the engine: communication (prefill, decode step, end to "
         "end) is what the sweeps say the layout's calls put under TTFT and TPOT; compute is "
         "the roofline of --gpu's peak FLOP/s and HBM bandwidth; ranked by their sum; decode "
         "steps wait for the previous step's token, as in the engine")

EXAMPLES = """\
examples:
  infercomm plan --model llama-3.1-70b --gpus 16 --gpus-per-node 4 --prompt 2048 \\
      --decode 256 --batch 1 --sweep results/SWEEP --sweep-inter results/SWEEP_2NODES
  infercomm plan ... --budget-tpot-ms 5 --format json

Every dp x tp x pp of N ranks the model accepts (heads % tp == 0, pp <= layers; for a MoE
model dp > 1 with --ep, dp x tp dividing the experts; for a dense one dp > 1 is independent
replicas, priced as one replica) and the engine models (--engine refuses the rest; they are
listed as left out) is predicted as `infercomm predict` does (the critical path through the
stages, the slowest DP rank), in the engine's order: a decode step starts once the previous
step's token is sampled (one batch). Ranks sit as launchers place them: consecutive ranks
per node, TP innermost, then PP, then DP, so a TP, DP or EP group wider than a node, or a PP
hop between nodes, takes the --sweep-inter fits. Beside each layout's communication, its
compute floor: a roofline from --gpu's peak dense FLOP/s and HBM bandwidth (analysis/
compute.py). Sorted best first: layouts that fit in memory, that meet the budgets, then by
the --objective's floor (communication + compute), then by volume; the top 5 say why each
lost. Memory is checked against --gpu's (h100 80 GiB, h200 141, b200 192, a100 80;
--gpu-memory overrides) at --gpu-memory-utilization 0.9, as vLLM: the fullest rank's
weights, KV cache and activation reserve (analysis/hardware.py); those that do not fit are
listed apart with their figures, never best.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan", help="price every layout of N GPUs by its predicted communication",
        description="Predict the communication of every valid layout of N GPUs from your "
                    "own sweeps, without deploying anything, and mark the best.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_argument_group("plan")
    group.add_argument("--gpus", type=positive_int, required=True, metavar="N",
                       help="ranks the deployment has")
    group.add_argument("--gpus-per-node", type=positive_int, required=True, metavar="G",
                       help="ranks per node (consecutive ranks share a node)")
    group.add_argument("--sweep", required=True, metavar="SWEEP_RUN",
                       help="a sweep within one node: fits of the groups that stay on one")
    group.add_argument("--sweep-inter", default=None, metavar="SWEEP_RUN",
                       help="a sweep across nodes: fits of the groups and hops that span "
                            "nodes (needed when N > G, unless --sweep has inter rows)")
    group.add_argument("--budget-ttft-ms", type=float, default=None, metavar="MS",
                       help="TTFT budget: met when the prefill's floor (communication + "
                            "compute) is within it")
    group.add_argument("--budget-tpot-ms", type=float, default=None, metavar="MS",
                       help="TPOT budget: met when a decode step's floor (communication + "
                            "compute) is within it")
    group.add_argument("--gpu-memory", type=float, default=None, metavar="GIB",
                       help="GiB of memory a GPU has (default: --gpu's, h100 80, h200 141, "
                            "b200 192, a100 80): layouts whose weights, KV cache and "
                            "activations do not fit in --gpu-memory-utilization of it are "
                            "listed apart, never best")
    group.add_argument("--objective", choices=("ttft", "tpot", "e2e"), default="e2e",
                       help="the floor layouts are ranked by: TTFT (prefill), TPOT (decode "
                            "step) or end to end (default), communication + compute")
    group.add_argument("--gpu-memory-utilization", type=float, default=0.9, metavar="F",
                       help="the share of --gpu-memory the engine may use (vLLM's "
                            "--gpu-memory-utilization, default 0.9)")
    group.add_argument("--format", choices=("table", "json", "csv"), default="table",
                       help="table (default), json (one document) or csv")
    from microbench.analysis.kv_plan import add_plan_arguments
    add_plan_arguments(group)  # --kv-sweep, --kv-sweep-inter (with --disagg)
    group.add_argument("--allreduce-algo", default="library", metavar="ALGO",
                       choices=("library", "ring", "recursive-doubling", "rabenseifner",
                                "hierarchical"),
                       help="price every all-reduce as this algorithm, step by step from the "
                            "sweeps' sendrecv fits (analysis/algo_costs.py); default library: "
                            "the swept all-reduce")
    add_pattern_arguments(parser, layout=False)
    parser.set_defaults(run=run)


# The largest clusters of 2026 hold a few hundred thousand GPUs; pricing every layout of
# this many takes about a second (divisors by trial to sqrt(N), equal replicas priced once).
MAX_GPUS = 1 << 20


def _budget_us(flag: str, value: float | None) -> float | None:
    if value is None:
        return None
    if not 0 < value < math.inf:  # also nan, and 1e400 (read as inf)
        raise UsageError(f"{flag} {value} must be a positive number of milliseconds"
                         + (", a finite one" if value == math.inf else ""))
    return value * 1e3


# A GPU of a mebibyte of GiB is beyond any made; a larger figure overflows the byte count.
MAX_GPU_MEMORY_GIB = 1 << 20


def refuse_alone(args: argparse.Namespace) -> None:
    """Options that only act with another one, given without it: refused, not ignored."""
    pairs = [("--dp-routing", args.dp_routing is not None, "--requests",
              getattr(args, "requests", None)),
             ("--kv-sweep", args.kv_sweep is not None, "--disagg", args.disagg),
             ("--kv-sweep-inter", args.kv_sweep_inter is not None, "--disagg", args.disagg)]
    for flag, given, partner, present in pairs:
        if given and not present:
            raise UsageError(f"{flag} acts only with {partner}; add {partner} or drop {flag}")


def memory_gib(args: argparse.Namespace) -> float:
    return GPU_SPECS[args.gpu].memory_gib if args.gpu_memory is None else args.gpu_memory


def check_nodes(gpus: int, per_node: int) -> None:
    if gpus > per_node and gpus % per_node:
        raise UsageError(f"--gpus {gpus} is not a whole number of nodes of --gpus-per-node "
                         f"{per_node} (its last node would hold {gpus % per_node}); give a "
                         f"multiple of {per_node}, e.g. --gpus {gpus - gpus % per_node}")


def workload_lanes(args: argparse.Namespace, model: Any, engine_gpu: str) -> Any:
    """With --requests: a maker of each layout's lanes (analysis/workload_plan.py), the
    requests read once; None otherwise."""
    if not getattr(args, "requests", None) or args.speculative_config:
        return None
    from microbench.analysis.workload_plan import lanes_of
    from microbench.options.pattern_args import options_from_args
    from patterns.engines.workloads import workload_pattern
    from patterns.workload.requests import read_requests
    requests = list(read_requests(args.requests))
    options = options_from_args(argparse.Namespace(**{**vars(args), "gpu": engine_gpu}))
    step_time_s = None if args.step_time_ms is None else args.step_time_ms / 1e3
    if step_time_s is not None and step_time_s * 1e6 < 1:  # as workload_args refuses it
        raise UsageError(f"--step-time-ms {args.step_time_ms:.3g}: an engine step takes at "
                         "least a microsecond (0.001 ms); give the step time your engine "
                         "shows (20-40 ms is common for a 70B model at TP8)")

    made: dict[tuple[int, tuple[int, ...]], Any] = {}  # (tp, request indices) -> lane
    shared: dict[Any, Any] = {}  # steps priced once for every layout (workload_plan.Lanes)

    def make(layout: Any) -> Any:
        if model.is_moe and layout.dp > 1:  # DP ranks that step together: one DP pattern
            return workload_pattern(args.engine, model, layout, requests, args.dtype, options,
                                    step_time_s, None, args.requests, args.mixed_chunk,
                                    dp_routing=args.dp_routing)

        def lane(indices: list[int]) -> Any:
            key = (layout.tp, tuple(indices))
            if key not in made:
                made[key] = workload_pattern(args.engine, model, type(layout)(tp=layout.tp),
                                             [requests[i] for i in indices], args.dtype,
                                             options, step_time_s, None, args.requests,
                                             args.mixed_chunk, untagged=True)
            return made[key]
        return lanes_of(lane, model, layout, requests, args.dp_routing or "round-robin",
                        step_time_s, shared)
    return make


def document(args: argparse.Namespace, priced: list[Any], refused: list[str],
             notes: list[str]) -> dict[str, Any]:
    return {"model": args.model, "gpus": args.gpus, "gpus_per_node": args.gpus_per_node,
            "prompt": args.prompt, "decode": args.decode, "batch": args.batch,
            "engine": args.engine, "sweep": args.sweep, "sweep_inter": args.sweep_inter,
            "budget_ttft_ms": args.budget_ttft_ms, "budget_tpot_ms": args.budget_tpot_ms,
            "gpu": args.gpu, "gpu_memory_gib": memory_gib(args),
            "gpu_memory_utilization": args.gpu_memory_utilization,
            "memory_limit_bytes": memory_limit(args.gpu, args.gpu_memory,
                                               args.gpu_memory_utilization),
            "objective": args.objective, "scope": SCOPE,
            "layouts": [p.as_dict() for p in priced], "refused": refused, "notes": notes,
            "requests": getattr(args, "requests", None),
            "allreduce_algo": getattr(args, "allreduce_algo", None) or "library"}


def run(args: argparse.Namespace) -> int:
    from microbench.analysis.fits import topology_from, unstable_sizes
    from microbench.analysis.layouts import Budget, Hardware, plan
    from microbench.results.runs import load_sweep, sweep_table
    from patterns import resolve_model

    budget = Budget(_budget_us("--budget-ttft-ms", args.budget_ttft_ms),
                    _budget_us("--budget-tpot-ms", args.budget_tpot_ms))
    memory = args.gpu_memory
    if memory is not None and not 0 < memory <= MAX_GPU_MEMORY_GIB:
        raise UsageError(f"--gpu-memory {memory} must be a positive, finite number of GiB, "
                         f"at most {MAX_GPU_MEMORY_GIB:,} (80 for an H100)")
    share = args.gpu_memory_utilization
    if not 0 < share <= 1:
        raise UsageError(f"--gpu-memory-utilization {share} must be in (0, 1], as vLLM's "
                         "(default 0.9)")
    refuse_alone(args)
    if args.gpus > MAX_GPUS:
        raise UsageError(f"--gpus {args.gpus:,} is beyond any deployment of one model; plan "
                         f"prices at most {MAX_GPUS:,} ranks")
    check_nodes(args.gpus, args.gpus_per_node)
    model = resolve_model(args.model)
    sweep = load_sweep("--sweep", args.sweep)
    inter = load_sweep("--sweep-inter", args.sweep_inter) if args.sweep_inter else None
    topology = topology_from(sweep_table(sweep), sweep_table(inter) if inter else None,
                             args.gpus_per_node)
    if args.gpus > args.gpus_per_node and topology.inter is None:
        raise UsageError(f"{args.gpus} GPUs at {args.gpus_per_node} per node span nodes and "
                         "the sweep has no rows across nodes; pass --sweep-inter SWEEP_RUN")
    from microbench.analysis.algo_costs import with_algorithm
    topology = with_algorithm(topology, args.allreduce_algo)

    from microbench.analysis.hardware import step_token_budget
    from microbench.analysis.kv_plan import COLOCATED
    from patterns.engine_base import ENGINE_INFO
    # --gpu also names the hardware of the floors and the memory check; an engine profile
    # that does not read it (vllm-v0, trtllm, megatron) gets the default, as it would ignore it
    engine_gpu = args.gpu if "gpu" in ENGINE_INFO[args.engine].options else "h100"

    lanes = workload_lanes(args, model, engine_gpu)

    def make_pattern(layout: Any) -> Any:
        if lanes is not None:  # --requests over DP replicas and PP (analysis/workload_plan)
            return lanes(layout)
        return pattern_from_args(argparse.Namespace(**{**vars(args), **COLOCATED,
                                                       "gpu": engine_gpu},
                                                    tp=layout.tp, pp=layout.pp,
                                                    dp=layout.dp, ep=layout.ep,
                                                    dp_batches=None))

    limit = memory_limit(args.gpu, memory, share)
    hardware = Hardware(args.gpu, limit,
                        step_token_budget(args.gpu, args.max_batched_tokens), args.objective)
    # Pricing builds hundreds of thousands of long-lived objects (a workload's steps and
    # calls, shared between layouts) and no cycles worth collecting: the cyclic collector's
    # passes over them were a quarter of a 10,000-request plan (benchmarks/plan_workload.py).
    # Frozen after (gc.freeze, meant for such heaps), no pass walks them again, neither the
    # first one once collection is back on nor the one at exit (1.2 s of 6.7 s of CPU); the
    # price is that garbage cycles alive at that moment are never collected.
    gc.disable()
    try:
        priced, refused = plan(model, args.gpus, make_pattern, topology, budget, hardware)
    finally:
        gc.freeze()
        gc.enable()
    notes = sorted({n for p in priced for n in p.notes})
    notes += unstable_sizes(sweep_table(sweep))  # analysis/fits.py: UNSTABLE_FACTOR
    doc = document(args, priced, refused, notes)
    disagg_text = ""
    if args.disagg is not None:  # disaggregated candidates beside (analysis/kv_plan.py)
        from microbench.analysis.kv_plan import add_disagg_plan
        disagg_text = add_disagg_plan(doc, args, model, topology, budget, priced, limit,
                                      sweep_table(sweep), sweep_table(inter) if inter else None)
    from microbench.views.plan import csv_rows, plan_text
    if args.format == "json":
        print(json.dumps(doc, separators=(",", ":")))
    elif args.format == "csv":
        print(csv_rows(priced))
        for n in notes:
            sys.stderr.write(f"infercomm plan: note: {n}\n")
    else:
        print(plan_text(doc, priced, SCOPE) + disagg_text)
        # the last line for tools, short: the whole document is --format json
        best = next((p for p in priced if p.best), None)
        print(json.dumps({"model": args.model, "gpus": args.gpus,
                          "allreduce_algo": doc["allreduce_algo"], "layouts": len(priced),
                          "fit": sum(p.fits_memory for p in priced), "refused": len(refused),
                          "best": None if best is None else
                          {"tp": best.shape.tp, "pp": best.shape.pp, "dp": best.shape.dp,
                           "ep": best.shape.ep, f"{args.objective}_floor_us":
                           round(best.totals()[args.objective], 3)}},
                         separators=(",", ":")))
    return 0
