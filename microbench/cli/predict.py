"""`infercomm predict`: a pattern's communication time from a sweep, without running it."""

import argparse
import json
import sys
from typing import Any

import numpy as np

from microbench.analysis.fits import LARGE_RMS, Fit, Topology, topology_from, unstable_sizes
from microbench.analysis.predict import caveats, dtype_caveats, predict_pattern
from microbench.argtypes import UsageError, positive_int
from microbench.options.pattern_args import add_pattern_arguments, pattern_from_args
from microbench.results.runs import (
    RunFolder,
    load_run,
    load_sweep,
    replay_samples,
    run_pattern,
    sweep_table,
)
from microbench.views.pattern import title
from microbench.views.textfmt import format_bytes, format_us, render_table
from patterns import Pattern

EXAMPLES = """\
examples:
  infercomm predict --sweep results/SWEEP --model llama-3.1-70b --tp 8 --prompt 128 --decode 128
  infercomm predict --sweep results/SWEEP --against results/REPLAY   (the replay's pattern)

Each call's time is alpha + bytes x beta of its collective and group size, fitted to the
sweep (piecewise where the sweep bends; a point 5x off what the sizes beside it allow, 10x
at either end, is left out and named). A transfer between stages costs its stage a stream
iteration and arrives half a sendrecv iteration after it began; a recv waits for its data,
so a figure is the critical path through the stages, the slowest rank's as replay reports
it. Across nodes
(--ranks-per-node, consecutive ranks per node, TP innermost) a group that spans nodes uses
the --sweep-inter fits. A sweep of another backend or world than the replay is said loudly.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "predict", help="predict a pattern's communication time from a sweep",
        description="Fit time = alpha + bytes x beta per collective and group size to a sweep "
                    "run, then add up the predicted time of every call of a pattern.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", required=True, metavar="SWEEP_RUN",
                        help="the sweep run folder to fit")
    parser.add_argument("--sweep-inter", default=None, metavar="SWEEP_RUN",
                        help="a sweep across nodes: its fits price the groups and transfers "
                             "that span nodes")
    parser.add_argument("--ranks-per-node", type=positive_int, default=None, metavar="N",
                        help="ranks per node (consecutive ranks per node; default: all on one "
                             "node)")
    parser.add_argument("--against", default=None, metavar="REPLAY_RUN",
                        help="a replay run: show its measured times beside the prediction "
                             "(its pattern is used when no --model is given)")
    parser.add_argument("--allreduce-algo", default="library", metavar="ALGO",
                        choices=("library", "ring", "recursive-doubling", "rabenseifner",
                                 "hierarchical"),
                        help="price every all-reduce as this algorithm from the sweeps' "
                             "sendrecv fits (as plan --allreduce-algo); default library")
    add_pattern_arguments(parser, required=False)
    parser.set_defaults(run=run)


def measured_medians(path: str, rebuild: bool = True
                     ) -> tuple[RunFolder, Pattern | None, dict[str, float]]:
    """The replay's median of each metric, and its pattern unless the options give one."""
    replay = load_run(path)
    if replay.kind != "replay":
        raise UsageError(f"--against {path}: a {replay.kind} run; pass a replay run")
    return replay, run_pattern(replay) if rebuild else None, {
        k: float(np.median(v)) for k, v in replay_samples(replay).items()}


def all_fits(topology: Topology) -> list[tuple[str, Fit]]:
    return ([("intra", f) for f in topology.intra.values()]
            + [("inter", f) for f in (topology.inter or {}).values()])


def fits_table(topology: Topology) -> str:
    rows = []
    for level, fit in all_fits(topology):
        for i, p in enumerate(fit.pieces):
            upper = fit.pieces[i + 1].from_bytes if i + 1 < len(fit.pieces) else None
            span = f">= {format_bytes(p.from_bytes)}" + (
                f", < {format_bytes(upper)}" if upper else "")
            # A flat piece saw no cost per byte in its sizes: no bandwidth to state.
            gbps = f"{1e-3 / p.beta_us_per_byte:.3f}" if p.beta_us_per_byte > 0 else "-"
            flag = " LARGE" if fit.rms_rel_error > LARGE_RMS else ""
            dropped = ",".join(format_bytes(d) for d in fit.dropped) or "-"
            ranks = str(fit.group_size) + (f" (scaled from {fit.scaled_from})"
                                           if fit.scaled_from is not None else "")
            op = fit.op + (f" (as {fit.stand_in})" if fit.stand_in else "")
            rows.append([level, op, ranks, span, f"{p.alpha_us:.2f}", gbps,
                         f"{100 * fit.rms_rel_error:.1f}%{flag}", str(fit.points), dropped])
    return render_table(["level", "op", "ranks", "sizes", "alpha(us)", "1/beta(GB/s)",
                         "rms error", "points", "outliers left out"], rows,
                        right_align={"ranks", "alpha(us)", "1/beta(GB/s)", "rms error",
                                     "points"})


def run(args: argparse.Namespace) -> int:
    sweep = load_sweep("--sweep", args.sweep, collectives=True)
    inter = (load_sweep("--sweep-inter", args.sweep_inter, collectives=True)
             if args.sweep_inter else None)
    measured: dict[str, float] = {}
    pattern = None
    replay = None
    if args.against is not None:
        replay, pattern, measured = measured_medians(args.against,
                                                     rebuild=args.model is None)
    from microbench.results.runs import refuse_mixed_standins
    refuse_mixed_standins([sweep, *(r for r in (inter, replay) if r is not None)])
    if args.model is not None:
        missing = [f"--{n}" for n in ("prompt", "decode") if getattr(args, n) is None]
        if missing and not args.requests:  # a workload brings its own prompts and outputs
            raise UsageError(f"the pattern needs {', '.join(missing)}")
        pattern = pattern_from_args(args)
    if pattern is None:
        raise UsageError("give the pattern options (--model, --prompt, --decode, ...) or "
                         "--against REPLAY_RUN")
    if inter is not None and args.ranks_per_node is None:
        raise UsageError("--sweep-inter prices groups that span nodes; say where ranks sit "
                         "with --ranks-per-node N")
    topology = topology_from(sweep_table(sweep), sweep_table(inter) if inter else None,
                             args.ranks_per_node)
    from microbench.analysis.algo_costs import with_algorithm
    topology = with_algorithm(topology, args.allreduce_algo)
    if hasattr(pattern, "rank_steps"):  # --requests over DP ranks: analysis/dp_workload.py
        from microbench.analysis.dp_workload import dp_predicted
        predicted, notes = dp_predicted(pattern, topology)  # type: ignore[arg-type]
    else:
        predicted, notes = predict_pattern(pattern, topology)
    from microbench.analysis.workload import measured_workload, predict_workload, workload_lines
    workload = predict_workload(pattern, topology)  # --requests: per-request figures
    measured_w = measured_workload(replay.path) if replay is not None and workload else None
    warnings = caveats(sweep.meta, pattern, replay.meta if replay is not None else None)
    warnings += dtype_caveats(sweep_table(sweep), pattern)
    warnings += unstable_sizes(sweep_table(sweep))  # analysis/fits.py: UNSTABLE_FACTOR
    for w in warnings:
        sys.stderr.write(f"infercomm predict: warning: {w}\n")
    dropped = [f"{f.op} over {f.group_size} ranks: left out {format_bytes(d)} (more than "
               f"5x off what the sizes beside it allow)"
               for _, f in all_fits(topology) for d in f.dropped]
    header = ["metric", "predicted"] + (["measured", "measured/predicted"] if measured else [])
    rows = []
    for metric, value in predicted.items():
        row = [metric, format_us(value)]
        if measured:
            m = measured.get(metric)
            row += ["-" if m is None else format_us(m),
                    "-" if m is None or value <= 0 else f"{m / value:.3f}"]
        rows.append(row)
    print("\n".join([
        "predict: " + title(pattern),
        f"from sweep {sweep.path} ({sweep.describe()}); all-reduce: "
        f"{getattr(args, 'allreduce_algo', None) or 'library'}",
        *([f"inter-node fits from {inter.path} ({inter.describe()})"] if inter else []),
        "", fits_table(topology), "",
        render_table(header, rows, right_align=set(header) - {"metric"}),
        *(["", *workload_lines(workload, measured_w)] if workload else []),
        *[f"note: {n}" for n in [*dropped, *notes]],
        *[f"WARNING: {w}" for w in warnings]]))
    last: dict[str, Any] = {"sweep": str(sweep.path), "model": pattern.model.name,
                            "tp": pattern.layout.tp, "pp": pattern.layout.pp,
                            "dp": pattern.layout.dp, "ep": pattern.layout.ep,
                            "prompt": pattern.workload.prompt,
                            "decode": pattern.workload.decode,
                            "predicted": {k: round(v, 3) for k, v in predicted.items()},
                            "fits": [{**f.as_dict(), "level": level}
                                     for level, f in all_fits(topology)],
                            "levels_used": sorted(topology.used),
                            "allreduce_algo": getattr(args, "allreduce_algo", None) or "library",
                            "notes": [*dropped, *notes], "warnings": warnings}
    if workload is not None:
        last["workload"] = workload
        if measured_w is not None:
            last["measured_workload"] = {k: measured_w[k] for k in ("ttft_comm_us",
                                                                    "tpot_comm_us")}
    if inter is not None:
        last["sweep_inter"] = str(inter.path)
        last["ranks_per_node"] = args.ranks_per_node
    if measured:
        last["against"] = args.against
        last["measured"] = {k: round(v, 3) for k, v in measured.items()}
    print(json.dumps(last, separators=(",", ":")))
    return 0
