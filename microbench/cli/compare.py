"""`infercomm compare RUN_A RUN_B [...]`: runs side by side, a verdict per metric, and an
exit status for CI (1 when any metric regresses past --threshold, 3 when a metric cannot be
decided from the samples)."""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from microbench.analysis.compare import MIN_SAMPLES, RESAMPLES, Comparison, compare_runs
from microbench.argtypes import UsageError
from microbench.results.runs import RunFolder, load_run
from microbench.views.textfmt import format_us, render_table

EXAMPLES = """\
examples:
  infercomm compare results/A results/B                     (A is the baseline)
  infercomm compare A B --threshold 0.10 --format markdown -o compare.md  (a CI comment)
  infercomm compare A B --sweep results/SWEEP               (predicted beside measured)

verdict: faster when the 95% interval of B/A lies below 1, slower when above 1, same when it
holds 1 and lies within [1/(1+threshold), 1+threshold], inconclusive when it holds 1 but
reaches past either (or a run has fewer than 5 samples); an inconclusive metric names the
iterations (-n) per run that would likely decide it. A regression is slower with
B/A > 1 + threshold.
exit status: 0 no regression and every metric decided; 1 a regression (whatever else);
2 bad input or runs that did not measure the same thing; 3 no regression found but some
metric inconclusive, so a CI gate does not pass on samples that cannot tell
(--inconclusive-ok makes that 0, still named on stderr).
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare", help="compare runs: ratios with confidence intervals and verdicts",
        description="Compare replay or sweep runs with the first (the baseline): per metric "
                    "the medians, B/A, its 95% bootstrap interval over the iteration samples, "
                    "and a verdict.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run folders; the first is "
                                                               "the baseline")
    parser.add_argument("--threshold", type=float, default=0.05,
                        help="relative slowdown that counts as a regression (default 0.05)")
    parser.add_argument("--format", choices=("table", "markdown"), default="table",
                        help="table for a terminal, markdown for a CI comment")
    parser.add_argument("--sweep", default=None, metavar="SWEEP_RUN",
                        help="a sweep run: show the pattern's predicted times beside replays")
    parser.add_argument("-o", "--output", default=None, metavar="FILE",
                        help="write the table (or the markdown) to FILE instead of stdout; "
                             "stdout still ends with the JSON line")
    parser.add_argument("--inconclusive-ok", action="store_true",
                        help="exit 0 rather than 3 when metrics are inconclusive (they are "
                             "still named on stderr)")
    parser.set_defaults(run=run)


def predicted_for(base: RunFolder, sweep_path: str | None) -> dict[str, float] | None:
    if sweep_path is None:
        return None
    from microbench.analysis.fits import fit_sweep
    from microbench.analysis.predict import predict_pattern
    from microbench.results.runs import run_pattern, sweep_table

    sweep = load_run(sweep_path)
    if sweep.kind != "sweep":
        raise UsageError(f"--sweep {sweep_path}: a {sweep.kind} run; pass a sweep run")
    pattern = run_pattern(base) if base.kind == "replay" else None
    if pattern is None:
        raise UsageError("--sweep predicts replays; the runs compared are sweeps")
    return predict_pattern(pattern, fit_sweep(sweep_table(sweep)))[0]


def _us(value: float | None) -> str:
    return "-" if value is None else format_us(value)


def table_rows(results: list[Comparison], runs: list[RunFolder],
               with_predicted: bool) -> tuple[list[str], list[list[str]]]:
    names = {str(r.path): chr(ord("A") + i) for i, r in enumerate(runs)}
    header = ["metric", "run", "A median", "median", "ratio", "95% CI", "verdict"]
    if with_predicted:
        header.insert(2, "predicted")
    rows = []
    for c in results:
        verdict = c.verdict + (" REGRESSION" if c.regression else "")
        if c.verdict == "inconclusive":
            verdict += f" (-n {c.iterations_needed})" if c.iterations_needed else " (-n ?)"
        row = [c.metric, names[c.run], _us(c.a_median_us), _us(c.b_median_us),
               f"{c.ratio:.3f}", f"[{c.ci_low:.3f}, {c.ci_high:.3f}]", verdict]
        if with_predicted:
            row.insert(2, _us(c.predicted_us))
        rows.append(row)
    return header, rows


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def run(args: argparse.Namespace) -> int:
    output = Path(args.output) if args.output is not None else None
    if output is not None and (args.output == "" or output.is_dir()):
        raise UsageError(f"-o {args.output!r}: name the file to write the "
                         f"{args.format} into")
    runs = [load_run(p) for p in args.runs]
    predicted = predicted_for(runs[0], args.sweep)
    results = compare_runs(runs, args.threshold, predicted)
    header, rows = table_rows(results, runs, predicted is not None)
    legend = [f"{chr(ord('A') + i)} = {r.path} ({r.kind}; {r.describe()})"
              + (" baseline" if i == 0 else "") for i, r in enumerate(runs)]
    note = (f"ratio = median(run) / median(A); 95% CI by bootstrap over iterations "
            f"({RESAMPLES} resamples, seed 0); regression = slower and ratio > "
            f"{1 + args.threshold:g}; inconclusive = the CI holds 1 and reaches past "
            f"[{1 / (1 + args.threshold):.3f}, {1 + args.threshold:g}] or fewer than "
            f"{MIN_SAMPLES} samples; (-n N) = iterations per run likely to decide it")
    if args.format == "markdown":
        text = "\n".join(["### infercomm compare", "", *[f"- {line}" for line in legend], "",
                          markdown(header, rows), "", f"_{note}_"])
    else:
        text = "\n".join([*legend, "", render_table(header, rows, right_align={
            "A median", "median", "ratio", "predicted"}), "", note])
    if output is None:
        print(text)
    else:
        write_text(output, text + "\n", args.output)
        print(f"compare: {args.format} of {len(results)} metrics written to {output}")
    regressions = [c for c in results if c.regression]
    inconclusive = [c for c in results if c.verdict == "inconclusive"]
    last: dict[str, Any] = {"baseline": str(runs[0].path), "runs": [str(r.path) for r in runs],
                            "kind": runs[0].kind, "threshold": args.threshold,
                            "regressions": [c.metric for c in regressions],
                            "inconclusive": [c.metric for c in inconclusive],
                            "metrics": [c.as_dict() for c in results]}
    if output is not None:
        last["output"] = str(output)
    print(json.dumps(last, separators=(",", ":")))
    if inconclusive:
        needed = [c.iterations_needed for c in inconclusive if c.iterations_needed]
        advice = (f"about -n {max(needed)} per run would likely decide "
                  f"{'it' if len(inconclusive) == 1 else 'them'}" if needed else
                  "more iterations cannot decide a ratio of 1 at threshold 0")
        named = ", ".join(f"{c.metric} x{c.ratio:.3f} in {c.run} (95% CI {c.ci_low:.3f}-"
                          f"{c.ci_high:.3f}, {c.samples} samples)" for c in inconclusive[:5])
        more = f" and {len(inconclusive) - 5} more" if len(inconclusive) > 5 else ""
        sys.stderr.write(f"infercomm compare: inconclusive at threshold {args.threshold:g}: "
                         f"{named}{more}; {advice}\n")
    if regressions:
        named = ", ".join(f"{c.metric} x{c.ratio:.3f} in {c.run} (95% CI {c.ci_low:.3f}-"
                          f"{c.ci_high:.3f})" for c in regressions)
        sys.stderr.write(f"infercomm compare: regression beyond {args.threshold:g}: {named}\n")
        return 1
    return 3 if inconclusive and not args.inconclusive_ok else 0


def write_text(path: Path, text: str, given: str) -> None:
    """The whole file or nothing (results/atomic.py)."""
    from microbench.results.atomic import write_atomic

    write_atomic(path, text, given)
