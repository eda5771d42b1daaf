"""`infercomm validate --trace`: a generated pattern next to what the engine really issued."""

import argparse
import json

from microbench.argtypes import rank_list
from microbench.cli.validate_checks import check_ranks, check_workload_fits
from microbench.options.pattern_args import add_pattern_arguments, pattern_from_args
from microbench.views.textfmt import render_table
from patterns import Layout, Pattern
from patterns.engines.vllm.pp_hints import pp_path_hint
from patterns.rank_order import LAYOUT_ORDER, MEGATRON_DEFAULT_ORDER, RANK_ORDERS
from patterns.traces import read_traces
from patterns.traces.validate import HIDDEN_HINT, Validation, validate


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "validate", help="compare a pattern with a trace the engine really issued",
        description="Read a trace (NCCL/RCCL COLL logs or Kineto JSON, one file per rank) and "
                    "set the pattern of the given options next to it, rank by rank and phase "
                    "by phase: equal, missing, extra and different rows, and the first call "
                    "where they part. Exit 0 when they match, 1 when they differ, 2 on bad "
                    "input. An eager engine with custom all-reduce off (NCCL only) is the "
                    "setting that can match exactly.")
    parser.add_argument("--trace", nargs="+", required=True, metavar="FILE", action="append",
                        help="NCCL/RCCL log or Kineto JSON files; at --dp N, give --trace once "
                             "a DP rank when each DP engine numbers its own ranks from 0 "
                             "(vLLM's dense DP engines, independent): DP rank 0's files first")
    parser.add_argument("--rank-order", choices=RANK_ORDERS, default=LAYOUT_ORDER,
                        help=f"how the job numbered its ranks, fastest-varying first: "
                             f"{LAYOUT_ORDER} (default: infercomm's layout, vLLM, SGLang) or "
                             f"{MEGATRON_DEFAULT_ORDER} (Megatron-Core's default order, "
                             "tp-cp-ep-dp-pp: PP outermost); they differ only where dp and pp "
                             "are both above 1")
    parser.add_argument("--ranks", type=rank_list, default=None, metavar="R[,R...]",
                        help="the layout's ranks the trace holds, compared alone (a profile "
                             "of rank 0 of eight: --ranks 0); without it the trace must hold "
                             "every rank")
    add_pattern_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    trace = None
    if getattr(args, "requests", None):  # a workload is weighed against the trace first
        layout = Layout(tp=args.tp, pp=args.pp, dp=args.dp)
        trace = read_traces(*_per_dp_rank(args.trace, layout))
        check_workload_fits(args, trace)
    pattern = pattern_from_args(args)  # bad options end here, before reading big files
    if trace is None:
        trace = read_traces(*_per_dp_rank(args.trace, pattern.layout))
    check_ranks(args, trace, pattern)
    result = validate(trace, pattern, args.rank_order)
    rows = [[str(r.rank), r.phase, r.op, f"{r.numel:,}", r.dtype,
             "?" if r.group_size is None else str(r.group_size), f"{r.trace_calls:,}",
             f"{r.pattern_calls:,}", r.status] for r in result.rows]
    print(render_table(["rank", "phase", "op", "numel", "dtype", "group", "trace", "pattern",
                        "status"], rows,
                       right_align={"rank", "numel", "group", "trace", "pattern"}))
    print()
    print("match: the trace issued exactly the pattern's calls" if result.match else
          f"first difference: {result.first_difference}")
    counts = sorted(set(result.steps.values()))
    if any(t for t, _ in counts):
        print("steps (a step ends at the logits gather): " + "; ".join(
            f"the trace {t} from the inference's start, the pattern {p}" for t, p in counts))
    hints = _hints(pattern, result)
    # a pipeline hand-over of the other kind shifts every later call: not hidden all-reduces
    notes = [*(n for n in result.notes if not (hints and n == HIDDEN_HINT)), *hints,
             *_rank_order_hint(pattern, result.first_difference, args.rank_order)]
    for note in notes:
        print(f"note: {note}")
    statuses = [r.status for r in result.rows]
    summary = {"match": result.match, "first_difference": result.first_difference,
               "engine": pattern.engine, "ranks": len(trace.ranks), "calls": trace.calls,
               "unparsed": trace.unparsed,
               **{s: statuses.count(s) for s in ("equal", "missing", "extra", "different")},
               "notes": notes}
    print(json.dumps(summary, separators=(",", ":")))
    return 0 if result.match else 1


def _per_dp_rank(groups: list[list[str]], layout: Layout) -> tuple[list[str], list[int]]:
    """The files of every --trace, and each one's rank offset: --trace given once a DP rank
    places the k-th one's ranks at DP rank k (an engine's rank r: k x tp x pp + r)."""
    if len(groups) == 1:
        return groups[0], [0] * len(groups[0])
    if len(groups) != layout.dp:
        from microbench.argtypes import UsageError
        raise UsageError(f"--trace is given {len(groups)} times for dp({layout.dp}): give it "
                         "once (every rank's files), or once a DP rank")
    files = [f for group in groups for f in group]
    offsets = [k * layout.tp * layout.pp for k, group in enumerate(groups) for _ in group]
    return files, offsets


def _hints(pattern: Pattern, result: Validation) -> list[str]:
    """What usually explains a first difference the options can fix."""
    first_difference = result.first_difference
    if first_difference is None:
        return []
    hints = []
    if pattern.engine == "vllm" and pattern.layout.pp > 1:
        options = pattern.options
        pp = pp_path_hint(result.rows, options.pp_whole_tensors, options.tensor_device)
        hints += [pp] if pp else []
    if (pattern.engine == "vllm" and pattern.model.weight_format == "mxfp4"
            and "experts" in first_difference and pattern.options.moe_backend is None):
        hints.append("the width of an mxfp4 MoE all-reduce depends on vLLM's MoE kernel and "
                     "version: try --moe-backend (on B200 a vLLM before May 2026 pads it: "
                     "flashinfer-trtllm-padded; docs/real-engine.md)")
    return hints


def _rank_order_hint(pattern: Pattern, first_difference: str | None, order: str) -> list[str]:
    """A Megatron job with dp and pp above 1 numbers its ranks PP-outermost by default."""
    layout = pattern.layout
    if first_difference is None or pattern.engine != "megatron" or layout.dp == 1 \
            or layout.pp == 1 or order != LAYOUT_ORDER:
        return []
    return [f"Megatron-Core numbers ranks {MEGATRON_DEFAULT_ORDER} by default (its order "
            f"tp-cp-ep-dp-pp: PP outermost), infercomm's layout {LAYOUT_ORDER}; with dp "
            f"{layout.dp} and pp {layout.pp} they differ: unless the job ran with "
            f"--use-tp-pp-dp-mapping, pass --rank-order {MEGATRON_DEFAULT_ORDER}"]
