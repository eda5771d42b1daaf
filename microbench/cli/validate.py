"""`infercomm validate --trace`: a generated pattern next to what the engine really issued."""

import argparse
import json

from microbench.options.pattern_args import add_pattern_arguments, pattern_from_args
from microbench.views.textfmt import render_table
from patterns import Pattern
from patterns.engines.vllm.pp_hints import pp_path_hint
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
    parser.add_argument("--trace", nargs="+", required=True, metavar="FILE",
                        help="NCCL/RCCL log or Kineto JSON files")
    add_pattern_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    pattern = pattern_from_args(args)  # bad options end here, before reading big files
    trace = read_traces(args.trace)
    result = validate(trace, pattern)
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
    notes = [n for n in result.notes if not (hints and n == HIDDEN_HINT)] + hints
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
