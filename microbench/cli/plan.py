"""`infercomm plan`: every layout of N GPUs for a model, priced by its communication alone."""

import argparse
import gc
import math
from typing import Any

from microbench.analysis.hardware import GPU_SPECS, memory_limit
from microbench.argtypes import UsageError, positive_int
from microbench.cli.plan_output import ListGpus, refuse_layout_counts, write_stdout
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
lost. Memory is checked against what --gpu's driver reports (`--list-gpus`; --gpu-memory
overrides) at --gpu-memory-utilization 0.9, as vLLM measures it (analysis/engine_memory.py):
the fullest rank's weights as the checkpoint stores them (quantization_config read), vLLM's
overhead (profile run, sampler, CUDA graphs, communication buffers, a non-torch reserve),
one --max-model-len request's KV cache and the batch's; each layout's kv_capacity_tokens and
max concurrency at max_model_len are shown. Those that do not fit are listed apart with
their figures, never best; those the engine would not load (block-quantized shards, KV
heads) apart with its reason.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan", help="price every layout of N GPUs by its predicted communication",
        description="Predict the communication of every valid layout of N GPUs from your "
                    "own sweeps, without deploying anything, and mark the best.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_argument_group("plan")
    group.add_argument("--list-gpus", action=ListGpus,
                       help="print every --gpu with the memory its driver reports, its peak "
                            "FLOP/s and HBM bandwidth, and exit")
    group.add_argument("--gpus", type=positive_int, required=True, metavar="N",
                       help="ranks the deployment has")
    group.add_argument("--gpus-per-node", type=positive_int, required=True, metavar="G",
                       help="ranks per node (consecutive ranks share a node; at most "
                            f"{MAX_GPUS_PER_NODE:,})")
    group.add_argument("--sweep", required=True, metavar="SWEEP_RUN",
                       help="a sweep within one node: fits of the groups that stay on one")
    group.add_argument("--max-model-len", type=positive_int, default=None, metavar="TOKENS",
                       help="vLLM's --max-model-len: one request of it must fit in the KV "
                            "cache beside the batch's (default: the model's own context)")
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
                       help="GiB of memory a GPU has (default: what --gpu's driver reports, "
                            "see --list-gpus): layouts whose weights, the engine's overhead "
                            "and KV cache do not fit in --gpu-memory-utilization of it are "
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
    # plan's --gpu names the hardware (analysis/hardware.py's table); the engine's rules run
    # as on the GPU of the same architecture it models (hardware.ENGINE_GPU)
    gpu = parser._option_string_actions["--gpu"]
    gpu.choices = list(GPU_SPECS)
    gpu.help = (f"the GPU: {', '.join(GPU_SPECS)} (default h100): its memory, peak FLOP/s "
                "and bandwidth (--list-gpus), and the transports its engine uses")
    parser._option_string_actions["--kv-cache-dtype"].help = (
        "the KV cache's dtype, auto (the model's) or fp8 (one byte an element): the KV "
        "cache's bytes, capacity and reads, and with --disagg the transfer")
    parser.set_defaults(run=run)


# The largest clusters of 2026 hold a few hundred thousand GPUs; pricing every layout of
# this many takes about a second (divisors by trial to sqrt(N), equal replicas priced once).
MAX_GPUS = 1 << 20
# The largest NVLink domain announced (NVL576) holds 576 GPUs: a node of more is a typo.
MAX_GPUS_PER_NODE = 1024


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


def check_memory_options(args: argparse.Namespace, model: Any) -> int:
    """--max-model-len within the model's context (vLLM refuses a longer one without
    VLLM_ALLOW_LONG_MAX_MODEL_LEN, config/model.py `_get_and_verify_max_len`) and above the
    batch's sequence; returns the max_model_len used."""
    from microbench.analysis.layouts import model_context
    from patterns.weights import scheme_of
    scheme_of(model)  # a quantization the tool does not model: refused here, in one line
    derived = model_context(model)
    length = args.max_model_len or derived
    if args.max_model_len and args.max_model_len > derived:
        raise UsageError(f"--max-model-len {args.max_model_len:,} is beyond {model.name}'s "
                         f"context ({derived:,}, max_position_embeddings); vLLM refuses it: "
                         f"give at most {derived:,}")
    sequence = (args.prompt or 0) + (args.decode or 0)
    if not getattr(args, "requests", None) and sequence > length:
        raise UsageError(f"--prompt + --decode = {sequence:,} tokens exceed --max-model-len "
                         f"{length:,}: vLLM refuses such a request; raise --max-model-len or "
                         "shorten them")
    return length


def memory_gib(args: argparse.Namespace) -> float:
    return GPU_SPECS[args.gpu].memory_gib if args.gpu_memory is None else args.gpu_memory


def check_nodes(gpus: int, per_node: int) -> None:
    refuse_layout_counts(gpus, per_node, MAX_GPUS, MAX_GPUS_PER_NODE)
    if gpus > per_node and gpus % per_node:
        raise UsageError(f"--gpus {gpus} is not a whole number of nodes of --gpus-per-node "
                         f"{per_node} (its last node would hold {gpus % per_node}); give a "
                         f"multiple of {per_node}, e.g. --gpus {gpus - gpus % per_node}")


def workload_lanes(args: argparse.Namespace, model: Any, engine_gpu: str) -> Any:
    """With --requests: a maker of each layout's lanes (analysis/workload_plan.py), the
    requests read once; None otherwise."""
    if not getattr(args, "requests", None) or args.speculative_config:
        return None
    from microbench.analysis.layouts import valid_layouts
    from microbench.analysis.workload_plan import lanes_of
    from microbench.cli.plan_output import declared_requests, refuse_costly_workload
    from microbench.options.pattern_args import options_from_args
    from patterns.engines.workloads import workload_pattern
    from patterns.workload.requests import read_requests
    shapes, _ = valid_layouts(model, args.gpus)
    arrangements = len({(s.tp, s.dp * s.pp) for s in shapes})
    refuse_costly_workload(declared_requests(args.requests), arrangements)  # before reading
    requests = list(read_requests(args.requests))
    refuse_costly_workload(len(requests), arrangements)
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
    check_nodes(args.gpus, args.gpus_per_node)
    model = resolve_model(args.model)
    # a KV-transfer sweep priced no layout but dp-only ones, and named one of them best
    sweep = load_sweep("--sweep", args.sweep, collectives=args.disagg is None)
    inter = (load_sweep("--sweep-inter", args.sweep_inter, collectives=True)
             if args.sweep_inter else None)
    topology = topology_from(sweep_table(sweep), sweep_table(inter) if inter else None,
                             args.gpus_per_node)
    if args.gpus > args.gpus_per_node and topology.inter is None:
        raise UsageError(f"{args.gpus} GPUs at {args.gpus_per_node} per node span nodes and "
                         "the sweep has no rows across nodes; pass --sweep-inter SWEEP_RUN")
    from microbench.analysis.algo_costs import with_algorithm
    topology = with_algorithm(topology, args.allreduce_algo)

    from microbench.analysis.hardware import engine_gpu as engine_gpu_of
    from microbench.analysis.hardware import step_token_budget
    from microbench.analysis.kv_plan import COLOCATED
    from patterns.engine_base import ENGINE_INFO
    from patterns.engines.vllm.rules import v1_defaults
    max_model_len = check_memory_options(args, model)
    # --gpu also names the hardware of the floors and the memory check; an engine profile
    # that does not read it (vllm-v0, trtllm, megatron) gets the default, as it would ignore
    # it; one that does, the GPU of the same architecture it models
    engine_gpu = (engine_gpu_of(args.gpu) if "gpu" in ENGINE_INFO[args.engine].options
                  else "h100")

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
    hardware = Hardware(args.gpu, limit, step_token_budget(args.gpu, args.max_batched_tokens),
                        args.objective, args.max_num_seqs or v1_defaults(engine_gpu)[0],
                        max_model_len, args.kv_cache_dtype, args.eager, args.gpus_per_node,
                        vllm_overhead=args.engine == "vllm")
    # Pricing builds hundreds of thousands of long-lived objects (a workload's steps and
    # calls, shared between layouts) and no cycles worth collecting: the cyclic collector's
    # passes over them were a quarter of a 10,000-request plan (benchmarks/plan_workload.py).
    # Frozen after (gc.freeze, meant for such heaps), no pass walks them again, neither the
    # first one once collection is back on nor the one at exit (1.2 s of 6.7 s of CPU); the
    # price is that garbage cycles alive at that moment are never collected.
    unloadable: list[str] = []
    from microbench.cli.plan_output import Progress, interrupted
    gc.disable()
    try:
        with Progress(f"{model.name} on {args.gpus:,} GPUs") as progress:
            priced, refused = plan(model, args.gpus, make_pattern, topology, budget,
                                   hardware, unloadable, progress)
    except KeyboardInterrupt:
        interrupted()
    finally:
        gc.freeze()
        gc.enable()
    notes = sorted({n for p in priced for n in p.notes})
    notes += unstable_sizes(sweep_table(sweep))  # analysis/fits.py: UNSTABLE_FACTOR
    notes += checkpoint_notes(model, args.gpu)
    if engine_gpu != args.gpu and "gpu" in ENGINE_INFO[args.engine].options:
        notes.append(f"--gpu {args.gpu}: memory, FLOP/s and bandwidth its own; the engine's "
                     f"calls and transports as on the {engine_gpu} (the architecture its "
                     "profile models; vLLM's ROCm transports are not modelled)"
                     if args.gpu.startswith("mi") else
                     f"--gpu {args.gpu}: memory, FLOP/s and bandwidth its own; the engine's "
                     f"calls and transports as on the {engine_gpu}, the same architecture")
    doc = document(args, priced, refused, notes)
    doc.update({"max_model_len": max_model_len, "kv_cache_dtype": args.kv_cache_dtype,
                "max_num_seqs": hardware.max_num_seqs,
                "max_batched_tokens": hardware.step_tokens, "not_loadable": unloadable,
                "checkpoint": checkpoint_label(model)})
    disagg_text = ""
    if args.disagg is not None:  # disaggregated candidates beside (analysis/kv_plan.py)
        from microbench.analysis.kv_plan import add_disagg_plan
        disagg_text = add_disagg_plan(doc, args, model, topology, budget, priced, limit,
                                      sweep_table(sweep), sweep_table(inter) if inter else None)
    from microbench.cli.plan_output import plan_output
    write_stdout(plan_output(args, doc, priced, refused, notes, SCOPE, disagg_text))
    return 0


def checkpoint_label(model: Any) -> str:
    from patterns.weights import scheme_of
    scheme = scheme_of(model)
    return "not quantized" if scheme is None else scheme.label


def checkpoint_notes(model: Any, gpu: str) -> list[str]:
    """What plan read of the checkpoint's quantization, and an fp8 one on a GPU without fp8
    units (vLLM runs it weight-only there: fp8 weights, bf16 arithmetic, through Marlin)."""
    from patterns.weights import scheme_of
    scheme = scheme_of(model)
    if scheme is None:
        return []
    notes = [f"checkpoint quantized: {scheme.label}; weights counted as stored, scales "
             "included, the modules it keeps in the dtype in the dtype"]
    if scheme.fp8_compute and not GPU_SPECS[gpu].has_fp8:
        notes.append(f"{gpu} has no fp8 units: vLLM loads the fp8 checkpoint weight-only "
                     "(Marlin), the weights 1 byte as stored, the arithmetic at bf16's rate")
    return notes
