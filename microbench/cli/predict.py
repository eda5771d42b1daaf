"""`infercomm predict`: a pattern's communication time from a sweep, without running it."""

import argparse
import json
from typing import Any

import numpy as np

from microbench.analysis.predict import Fit, fit_sweep, predict_pattern
from microbench.argtypes import UsageError
from microbench.cli.pattern_args import add_pattern_arguments, pattern_from_args
from microbench.results.runs import load_run, replay_samples, run_pattern, sweep_table
from microbench.views.pattern import title
from microbench.views.textfmt import format_bytes, format_us, render_table
from patterns import Pattern

EXAMPLES = """\
examples:
  infercomm predict --sweep results/SWEEP --model llama-3.1-70b --tp 8 --prompt 128 --decode 128
  infercomm predict --sweep results/SWEEP --against results/REPLAY   (the replay's pattern)

Each call's time is alpha + bytes x beta of its collective and group size, fitted to the
sweep (piecewise where the sweep bends); send and recv are half a sendrecv iteration. A
figure is the stage with the largest one, as replay reports the slowest rank's.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "predict", help="predict a pattern's communication time from a sweep",
        description="Fit time = alpha + bytes x beta per collective and group size to a sweep "
                    "run, then add up the predicted time of every call of a pattern.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", required=True, metavar="SWEEP_RUN",
                        help="the sweep run folder to fit")
    parser.add_argument("--against", default=None, metavar="REPLAY_RUN",
                        help="a replay run: show its measured times beside the prediction "
                             "(its pattern is used when no --model is given)")
    add_pattern_arguments(parser, required=False)
    parser.set_defaults(run=run)


def measured_medians(path: str) -> tuple[Pattern | None, dict[str, float]]:
    replay = load_run(path)
    if replay.kind != "replay":
        raise UsageError(f"--against {path}: a {replay.kind} run; pass a replay run")
    return run_pattern(replay), {k: float(np.median(v))
                                 for k, v in replay_samples(replay).items()}


def fits_table(fits: dict[tuple[str, int], Fit]) -> str:
    rows = []
    for fit in fits.values():
        for i, p in enumerate(fit.pieces):
            upper = fit.pieces[i + 1].from_bytes if i + 1 < len(fit.pieces) else None
            span = f">= {format_bytes(p.from_bytes)}" + (
                f", < {format_bytes(upper)}" if upper else "")
            gbps = f"{1e-3 / p.beta_us_per_byte:.3f}" if p.beta_us_per_byte > 0 else "inf"
            rows.append([fit.op, str(fit.group_size), span, f"{p.alpha_us:.2f}", gbps,
                         f"{100 * fit.rms_rel_error:.1f}%", str(fit.points)])
    return render_table(["op", "ranks", "sizes", "alpha(us)", "1/beta(GB/s)", "rms error",
                         "points"], rows,
                        right_align={"ranks", "alpha(us)", "1/beta(GB/s)", "rms error",
                                     "points"})


def run(args: argparse.Namespace) -> int:
    sweep = load_run(args.sweep)
    if sweep.kind != "sweep":
        raise UsageError(f"--sweep {args.sweep}: a {sweep.kind} run; pass a sweep run")
    measured: dict[str, float] = {}
    pattern = None
    if args.against is not None:
        pattern, measured = measured_medians(args.against)
    if args.model is not None:
        missing = [f"--{n}" for n in ("prompt", "decode") if getattr(args, n) is None]
        if missing:
            raise UsageError(f"the pattern needs {', '.join(missing)}")
        pattern = pattern_from_args(args)
    if pattern is None:
        raise UsageError("give the pattern options (--model, --prompt, --decode, ...) or "
                         "--against REPLAY_RUN")
    fits = fit_sweep(sweep_table(sweep))
    predicted, notes = predict_pattern(pattern, fits)
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
        f"from sweep {sweep.path} ({sweep.describe()})", "", fits_table(fits), "",
        render_table(header, rows, right_align=set(header) - {"metric"}),
        *[f"note: {n}" for n in notes]]))
    last: dict[str, Any] = {"sweep": str(sweep.path), "model": pattern.model.name,
                            "tp": pattern.layout.tp, "pp": pattern.layout.pp,
                            "prompt": pattern.workload.prompt,
                            "decode": pattern.workload.decode,
                            "predicted": {k: round(v, 3) for k, v in predicted.items()},
                            "fits": [f.as_dict() for f in fits.values()], "notes": notes}
    if measured:
        last["against"] = args.against
        last["measured"] = {k: round(v, 3) for k, v in measured.items()}
    print(json.dumps(last, separators=(",", ":")))
    return 0
