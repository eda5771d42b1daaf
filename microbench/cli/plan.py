"""`infercomm plan`: every layout of N GPUs for a model, priced by its communication alone."""

import argparse
import csv
import io
import json
import sys
from typing import Any

from microbench.argtypes import UsageError, positive_int
from microbench.cli.pattern_args import add_pattern_arguments, pattern_from_args
from microbench.views.textfmt import format_bytes, format_us, render_table

SCOPE = ("communication only: each figure is the floor its calls put under TTFT (prefill) and "
         "TPOT (decode step), which no kernel can remove; compute is not predicted; decode "
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
hop between nodes, takes the --sweep-inter fits. Sorted best first: layouts that meet the
budgets, then by end to end time, then by volume. Each shows the memory its fullest rank
needs, weights and the batch's KV cache (patterns/weights.py; activations and CUDA graphs
not counted); --gpu-memory GIB leaves out those that do not fit in 0.9 of it
(--gpu-memory-utilization, as vLLM).
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
                       help="communication budget of the prefill (TTFT share)")
    group.add_argument("--budget-tpot-ms", type=float, default=None, metavar="MS",
                       help="communication budget of a decode step (TPOT share)")
    group.add_argument("--gpu-memory", type=float, default=None, metavar="GIB",
                       help="GiB of memory a GPU has (80 for an H100, 141 for an H200): "
                            "layouts whose weights and KV cache of the batch do not fit in "
                            "--gpu-memory-utilization of it are left out")
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
    if not value > 0:
        raise UsageError(f"{flag} {value} must be a positive number of milliseconds")
    return value * 1e3


def document(args: argparse.Namespace, priced: list[Any], refused: list[str],
             notes: list[str]) -> dict[str, Any]:
    return {"model": args.model, "gpus": args.gpus, "gpus_per_node": args.gpus_per_node,
            "prompt": args.prompt, "decode": args.decode, "batch": args.batch,
            "engine": args.engine, "sweep": args.sweep, "sweep_inter": args.sweep_inter,
            "budget_ttft_ms": args.budget_ttft_ms, "budget_tpot_ms": args.budget_tpot_ms,
            "gpu_memory_gib": args.gpu_memory,
            "gpu_memory_utilization": args.gpu_memory_utilization, "scope": SCOPE,
            "layouts": [p.as_dict() for p in priced], "refused": refused, "notes": notes,
            "requests": getattr(args, "requests", None)}


def table(doc: dict[str, Any], priced: list[Any]) -> str:
    budgeted = doc["budget_ttft_ms"] is not None or doc["budget_tpot_ms"] is not None
    header = ["", "tp", "pp", "dp", "ep", "prefill", "decode step", "end to end", "volume",
              "memory/GPU", "nodes"] + (["budget"] if budgeted else [])
    rows = []
    for p in priced:
        row = ["best" if p.best else "", str(p.shape.tp), str(p.shape.pp), str(p.shape.dp),
               "yes" if p.shape.ep else "no", format_us(p.prefill_us),
               format_us(p.decode_step_us), format_us(p.e2e_us),
               format_bytes(float(p.volume_bytes)),
               format_bytes(float(p.weight_bytes + p.kv_cache_bytes)),
               "spans" if p.crosses_nodes else "one"]
        if budgeted:
            row.append("meets" if p.meets_budget else "over")
        rows.append(row)
    budgets = [f"{name} {doc[key]} ms" for name, key in
               (("TTFT", "budget_ttft_ms"), ("TPOT", "budget_tpot_ms")) if doc[key] is not None]
    what = (f"prompt {doc['prompt']}, decode {doc['decode']}, batch {doc['batch']}"
            if not doc.get("requests") else f"requests {doc['requests']} (prefill, decode "
            "step: p90 over requests of the communication under TTFT and per TPOT step)")
    lines = [f"plan: {doc['model']} on {doc['gpus']} GPUs ({doc['gpus_per_node']} per node), "
             f"{what}, engine {doc['engine']}" + (f"; budget {', '.join(budgets)}" if budgets
                                                  else ""),
             f"from sweep {doc['sweep']}" + (f", inter-node sweep {doc['sweep_inter']}"
                                              if doc["sweep_inter"] else ""),
             SCOPE, "",
             render_table(header, rows, right_align=set(header) - {"", "ep", "nodes",
                                                                     "budget"})]
    if budgeted and not priced[0].meets_budget:
        lines.append("no layout meets the budget; best is the fastest end to end")
    lines += [f"left out: {r}" for r in doc["refused"]]
    lines += [f"note: {n}" for n in doc["notes"]]
    return "\n".join(lines)


def csv_rows(priced: list[Any]) -> str:
    out = io.StringIO()
    rows = [p.as_dict() for p in priced]
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().rstrip("\n")


def run(args: argparse.Namespace) -> int:
    from microbench.analysis.fits import topology_from, unstable_sizes
    from microbench.analysis.layouts import Budget, plan
    from microbench.cli.predict import load_sweep
    from microbench.results.runs import sweep_table
    from patterns import resolve_model

    budget = Budget(_budget_us("--budget-ttft-ms", args.budget_ttft_ms),
                    _budget_us("--budget-tpot-ms", args.budget_tpot_ms))
    memory = args.gpu_memory
    if memory is not None and not 0 < memory < float("inf"):
        raise UsageError(f"--gpu-memory {memory} must be a positive, finite number of GiB "
                         "(80 for an H100)")
    share = args.gpu_memory_utilization
    if not 0 < share <= 1:
        raise UsageError(f"--gpu-memory-utilization {share} must be in (0, 1], as vLLM's "
                         "(default 0.9)")
    if args.gpus > MAX_GPUS:
        raise UsageError(f"--gpus {args.gpus:,} is beyond any deployment of one model; plan "
                         f"prices at most {MAX_GPUS:,} ranks")
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

    from microbench.analysis.kv_plan import COLOCATED

    def make_pattern(layout: Any) -> Any:
        return pattern_from_args(argparse.Namespace(**{**vars(args), **COLOCATED},
                                                    tp=layout.tp, pp=layout.pp,
                                                    dp=layout.dp, ep=layout.ep,
                                                    dp_batches=None))

    priced, refused = plan(model, args.gpus, make_pattern, topology, budget,
                           None if memory is None else int(memory * share * (1 << 30)))
    notes = sorted({n for p in priced for n in p.notes})
    notes += unstable_sizes(sweep_table(sweep))  # analysis/fits.py: UNSTABLE_FACTOR
    if memory is None:
        notes.append("memory is not checked: a layout whose weights and KV cache do not fit "
                     "a GPU is listed too (--gpu-memory GIB leaves those out; memory/GPU "
                     "column)")
    doc = document(args, priced, refused, notes)
    disagg_text = ""
    if args.disagg is not None:  # disaggregated candidates beside (microbench/kvtransfer)
        from microbench.analysis.kv_plan import add_disagg_plan
        disagg_text = add_disagg_plan(doc, args, model, topology, budget, priced,
                        None if memory is None else int(memory * share * (1 << 30)),
                        sweep_table(sweep), sweep_table(inter) if inter else None)
    if args.format == "json":
        print(json.dumps(doc, separators=(",", ":")))
    elif args.format == "csv":
        print(csv_rows(priced))
        for n in notes:
            sys.stderr.write(f"infercomm plan: note: {n}\n")
    else:
        print(table(doc, priced) + disagg_text)
        # the last line for tools, short: the whole document is --format json
        best = next((p for p in priced if p.best), None)
        print(json.dumps({"model": args.model, "gpus": args.gpus, "layouts": len(priced),
                          "refused": len(refused),
                          "best": None if best is None else
                          {"tp": best.shape.tp, "pp": best.shape.pp, "dp": best.shape.dp,
                           "ep": best.shape.ep, "e2e_us": round(best.e2e_us, 3)}},
                         separators=(",", ":")))
    return 0
