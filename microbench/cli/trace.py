"""`infercomm trace`: what an engine really issued, read from its NCCL log or profiler trace."""

import argparse
import csv
import io
import json

from microbench.argtypes import UsageError, positive_int
from microbench.views.textfmt import format_bytes, render_table
from patterns.errors import printable
from patterns.traces import read_traces
from patterns.traces.summary import ROW_KEYS, steps_found, trace_document


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "trace", help="summarise the calls of an NCCL/RCCL log or a PyTorch profiler trace",
        description="Read NCCL/RCCL debug logs (NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL) or "
                    "Kineto JSON traces (one .json/.json.gz per rank) and summarise the calls "
                    "per rank and group: op, elements each rank contributes per call, dtype, "
                    "calls and bytes; the steps found; what was not understood.")
    parser.add_argument("files", nargs="+", metavar="FILE", help="log or Kineto JSON files")
    parser.add_argument("--format", choices=("table", "json", "csv"), default="table",
                        help="table for people; json (one document) or csv for tools")
    parser.add_argument("--dp", type=positive_int, default=1, metavar="N",
                        help="the files are N DP engines' as many files each, DP rank 0's "
                             "first, each engine numbering its ranks from 0 (vLLM's dense DP "
                             "engines): DP rank k's rank r is shown as k x files/N + r")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    per = len(args.files) // args.dp
    if per * args.dp != len(args.files):
        raise UsageError(f"--dp {args.dp} with {len(args.files)} files: give each DP rank's "
                         f"files, as many for every DP rank")
    trace = read_traces(args.files, [i // per * per for i in range(len(args.files))])
    doc = trace_document(trace)
    if args.format == "json":
        print(json.dumps(doc, separators=(",", ":")))
        return 0
    if args.format == "csv":
        out = io.StringIO()
        named = any("transport" in r for r in doc["rows"])  # type: ignore[union-attr]
        writer = csv.DictWriter(out, fieldnames=(*ROW_KEYS, "transport") if named else
                                ROW_KEYS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(doc["rows"])  # type: ignore[arg-type]
        print(out.getvalue(), end="")
        return 0
    names = {r.rank: r.name for r in trace.ranks}
    named = any("transport" in r for r in doc["rows"])  # type: ignore[union-attr]
    rows = [[str(r["rank"]), "?" if r["group_size"] is None else str(r["group_size"]),
             str(r["op"]), f"{r['numel']:,}", str(r["dtype"]), f"{r['calls']:,}",
             format_bytes(float(r["bytes"]))] + ([str(r.get("transport", ""))] if named else [])
            for r in doc["rows"]]  # type: ignore[union-attr]
    headers = ["rank", "group", "op", "numel", "dtype", "calls", "bytes"]
    lines = [f"{doc['ranks']} ranks, {doc['calls']:,} calls, {doc['unparsed']:,} lines or "
             "events not understood", "",
             render_table(headers + (["transport"] if named else []), rows,
                          right_align={"rank", "group", "numel", "calls", "bytes"}), ""]
    for found in steps_found(trace):
        lines.append(f"rank {found.rank} ({names[found.rank]}): {found.steps:,} steps "
                     f"({found.source}), {found.runs} runs after folding repeats")
    if trace.unknown:
        lines.append("not understood: " + ", ".join(f"{name} x{count:,}" for name, count
                                                    in trace.unknown.most_common(8)))
    if trace.ep_kernels:
        lines.append("expert-parallel kernels (DeepEP all-to-alls; no kernel event records "
                     "their sizes): " + ", ".join(f"{kind} x{count:,}" for kind, count
                                                  in sorted(trace.ep_kernels.items())))
    lines += trace.notes
    print(printable("\n".join(lines)))  # host names and event names are the trace's text
    # the last line for tools, short: the whole document is --format json
    total = sum(int(r["bytes"]) for r in doc["rows"])  # type: ignore[union-attr]
    print(json.dumps({"ranks": doc["ranks"], "calls": doc["calls"],
                      "unparsed": doc["unparsed"], "bytes": total,
                      "ep_kernels": sum(trace.ep_kernels.values()),
                      "notes": len(trace.notes)}, separators=(",", ":")))
    return 0
