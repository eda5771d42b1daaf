"""`infercomm pattern`: the calls an engine issues for a model, layout and workload."""

import argparse
import json

from microbench.options.pattern_args import add_pattern_arguments, pattern_from_args
from microbench.views.pattern import (
    calls_per_inference,
    pattern_csv,
    pattern_document,
    pattern_table,
    steps_text,
)
from patterns import volume_bytes
from patterns.dp_steps import wave_tail
from patterns.volume import as_number


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "pattern", help="print the calls an engine issues (no devices needed)",
        description="Generate the exact, ordered communication calls of one inference: per "
                    "phase and pipeline stage, each call with its group, shapes, dtype and "
                    "count, and the volume of the whole deployment.")
    add_pattern_arguments(parser)
    parser.add_argument("--format", choices=("table", "json", "csv"), default="table",
                        help="table for people; json (one line) or csv for tools")
    parser.add_argument("--steps", action="store_true",
                        help="the ordered calls of one prefill and one decode step per stage")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.disagg is not None:  # both sides and the KV transfer between them
        from microbench.cli.kv_args import print_disagg
        return print_disagg(args)
    pattern = pattern_from_args(args)
    from patterns.workload.steps import WorkloadPattern
    if isinstance(pattern, WorkloadPattern):  # --requests: steps and per-request figures
        from microbench.views.workload import print_workload
        from patterns.workload.dp_pattern import DPWorkloadPattern
        if isinstance(pattern, DPWorkloadPattern) and not args.steps:  # over DP ranks
            from microbench.views.dp_workload import print_dp_workload
            return print_dp_workload(pattern, args.format)
        return print_workload(pattern, args.format, args.steps)
    if args.format == "json":
        print(json.dumps(pattern_document(pattern, with_steps=args.steps),
                         separators=(",", ":")))
        return 0
    if args.format == "csv":
        print(pattern_csv(pattern), end="")
        return 0
    print(steps_text(pattern) if args.steps else pattern_table(pattern))
    summary = {"engine": pattern.engine, "model": pattern.model.name,
               "tp": pattern.layout.tp, "pp": pattern.layout.pp, "dp": pattern.layout.dp,
               "ep": pattern.layout.ep,
               "calls_per_inference": calls_per_inference(pattern),
               "volume_bytes": as_number(volume_bytes(pattern)["total"])}
    tail_steps, _ = wave_tail(pattern.stages[0])
    if tail_steps:
        summary["wave_tail_steps"] = tail_steps
    print(json.dumps(summary, separators=(",", ":")))
    return 0
