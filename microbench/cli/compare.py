"""`infercomm compare A B [...]` and `infercomm compare -A RUN... -B RUN...`: a verdict per
metric decided with the variation between runs, what differs between the sides, and an exit
status for CI (analysis/compare.py has the rule)."""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from microbench.analysis.compare import (
    DRIFT,
    FAR,
    MIN_RUNS,
    MIN_SAMPLES,
    RESAMPLES,
    THRESHOLD,
    Comparison,
    compare_groups,
    compare_runs,
    verdict_label,
)
from microbench.analysis.differences import differences, suspects
from microbench.argtypes import UsageError
from microbench.results.runs import RunFolder, load_run
from microbench.views.textfmt import format_us, render_table

EXAMPLES = """\
examples:
  infercomm compare -A results/A1 results/A2 results/A3 -B results/B1 results/B2 results/B3
  infercomm compare results/A results/B                     (one run a side; A the baseline)
  infercomm compare -A A1 A2 A3 -B B1 B2 B3 --format markdown -o compare.md  (a CI comment)
  infercomm compare A B --sweep results/SWEEP               (predicted beside measured)

rule: ratio = median(B) / median(A); its 95% interval from a hierarchical bootstrap (runs,
then iterations within them). One run a side: the drift between runs is unknown, so the
interval is widened by --drift (default 0.40) before the verdict. faster / slower: the
interval below / above 1; same: it holds 1 within [1/(1+t), 1+t]; inconclusive: it holds 1
and reaches past that (it names the runs a side, or -n, likely to decide it); regression:
slower with B/A > 1 + t (t = --threshold, default 0.05).
exit status: 0 no regression, every metric decided; 1 a regression (whatever else);
2 bad input, runs that measured different things, or one run on both sides; 3 no regression
but a metric inconclusive or the comparison suspect (--inconclusive-ok makes that 0, still
said on stderr).
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare", help="compare runs: ratios with confidence intervals and verdicts",
        description="Compare replay or sweep runs: side A (the baseline) against side B, "
                    "one or several runs a side; per metric the medians, B/A, its 95% "
                    "interval over runs and iterations, a verdict, and what differs.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", metavar="RUN",
                        help="run folders, one run a side; the first is the baseline and "
                             "each other is compared with it")
    parser.add_argument("-A", dest="a_runs", nargs="+", metavar="RUN", default=None,
                        help="the baseline's runs (several: the drift between them counts)")
    parser.add_argument("-B", dest="b_runs", nargs="+", metavar="RUN", default=None,
                        help="the other side's runs")
    parser.add_argument("--threshold", type=float, default=THRESHOLD,
                        help=f"relative slowdown that counts as a regression (default "
                             f"{THRESHOLD})")
    parser.add_argument("--drift", type=float, default=DRIFT,
                        help=f"with one run a side, the run-to-run drift allowed for "
                             f"(default {DRIFT}: runs may differ by x1.4)")
    parser.add_argument("--format", choices=("table", "markdown"), default="table",
                        help="table for a terminal, markdown for a CI comment")
    parser.add_argument("--sweep", default=None, metavar="SWEEP_RUN",
                        help="a sweep run: show the pattern's predicted times beside replays")
    parser.add_argument("-o", "--output", default=None, metavar="FILE",
                        help="write the table (or the markdown) to FILE instead of stdout; "
                             "stdout still ends with the JSON line")
    parser.add_argument("--inconclusive-ok", action="store_true",
                        help="exit 0 rather than 3 when metrics are inconclusive or the "
                             "comparison suspect (still said on stderr)")
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


def _cv(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1%}"


def table_rows(results: list[Comparison], names: dict[str, str],
               with_predicted: bool) -> tuple[list[str], list[list[str]]]:
    header = ["metric", "run", "A median", "median", "ratio", "95% CI", "verdict",
              "drift A/B", "shape"]
    if with_predicted:
        header.insert(2, "predicted")
    rows = []
    for c in results:
        row = [c.metric, names[c.run], _us(c.a_median_us), _us(c.b_median_us),
               f"{c.ratio:.3f}", f"[{c.ci_low:.3f}, {c.ci_high:.3f}]", verdict_label(c),
               f"{_cv(c.between_run_cv_a)}/{_cv(c.between_run_cv_b)}",
               "; ".join(c.flags) or "-"]
        if with_predicted:
            row.insert(2, _us(c.predicted_us))
        rows.append(row)
    return header, rows


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _sides(args: argparse.Namespace) -> list[tuple[list[RunFolder], list[RunFolder]]]:
    """[(A runs, B runs)]: one pair for -A/-B, one per run after the first otherwise."""
    if args.a_runs is not None or args.b_runs is not None:
        if args.runs:
            raise UsageError(f"give runs either as RUN RUN... or as -A RUN... -B RUN..., not "
                             f"both ({' '.join(args.runs)} given besides -A/-B)")
        if not args.a_runs or not args.b_runs:
            raise UsageError("-A RUN... and -B RUN... go together: the baseline's runs and "
                             "the other side's")
        return [([load_run(p) for p in args.a_runs], [load_run(p) for p in args.b_runs])]
    if len(args.runs) < 2:
        raise UsageError("compare needs at least two runs: the baseline first (or -A RUN... "
                         "-B RUN...)")
    runs = [load_run(p) for p in args.runs]
    return [([runs[0]], [other]) for other in runs[1:]]


def _legend(pairs: list[tuple[list[RunFolder], list[RunFolder]]]) -> tuple[list[str],
                                                                              dict[str, str]]:
    a_runs = pairs[0][0]
    lines = [f"A = {', '.join(str(r.path) for r in a_runs)} ({a_runs[0].kind}; "
             f"{a_runs[0].describe()}; {len(a_runs)} run(s)) baseline"]
    names = {}
    for i, (_, b_runs) in enumerate(pairs):
        letter = chr(ord("B") + i)
        names[", ".join(str(r.path) for r in b_runs)] = letter
        lines.append(f"{letter} = {', '.join(str(r.path) for r in b_runs)} ({b_runs[0].kind}; "
                     f"{b_runs[0].describe()}; {len(b_runs)} run(s))")
    return lines, names


def run(args: argparse.Namespace) -> int:
    output = Path(args.output) if args.output is not None else None
    if output is not None and (args.output == "" or output.is_dir()):
        raise UsageError(f"-o {args.output!r}: name the file to write the "
                         f"{args.format} into")
    pairs = _sides(args)
    predicted = predicted_for(pairs[0][0][0], args.sweep)
    from microbench.results.runs import refuse_mixed_standins
    refuse_mixed_standins([r for a, b in pairs for r in (*a, *b)]
                          + ([load_run(args.sweep)] if args.sweep else []))
    if args.a_runs is not None:
        results = compare_groups(pairs[0][0], pairs[0][1], args.threshold, args.drift,
                                 predicted)
    else:
        results = compare_runs([pairs[0][0][0], *(b[0] for _, b in pairs)], args.threshold,
                               predicted, args.drift)
    legend, names = _legend(pairs)
    diffs = {names[", ".join(str(r.path) for r in b)]: differences(a, b) for a, b in pairs}
    warnings = [w for a, b in pairs for w in suspects(
        a, b, [c for c in results if c.run == ", ".join(str(r.path) for r in b)])]
    text = render(args, legend, results, names, diffs, warnings, predicted is not None)
    if output is None:
        print(text)
    else:
        write_text(output, text + "\n", args.output)
        print(f"compare: {args.format} of {len(results)} metrics written to {output}")
    regressions = [c for c in results if c.regression]
    inconclusive = [c for c in results if c.verdict == "inconclusive"]
    last: dict[str, Any] = {
        "baseline": str(pairs[0][0][0].path),  # as before runs a side: the first of A
        "runs": [str(r.path) for r in [*pairs[0][0], *(r for _, b in pairs for r in b)]],
        "sides": {"A": [str(r.path) for r in pairs[0][0]],
                  **{names[", ".join(str(r.path) for r in b)]: [str(r.path) for r in b]
                     for _, b in pairs}},
        "kind": pairs[0][0][0].kind, "threshold": args.threshold, "drift": args.drift,
        "regressions": [c.metric for c in regressions],
        "inconclusive": [c.metric for c in inconclusive],
        "differences": diffs, "warnings": warnings,
        "metrics": [{**c.as_dict(), "label": verdict_label(c)} for c in results]}
    if output is not None:
        last["output"] = str(output)
    print(json.dumps(last, separators=(",", ":")))
    return exit_status(args, results, regressions, inconclusive, warnings)


def exit_status(args: argparse.Namespace, results: list[Comparison],
                regressions: list[Comparison], inconclusive: list[Comparison],
                warnings: list[str]) -> int:
    for w in warnings:
        sys.stderr.write(f"infercomm compare: {w}\n")
    if inconclusive:
        one_run = any(c.drift_allowed is not None for c in inconclusive)
        named = ", ".join(f"{c.metric} x{c.ratio:.3f} ({verdict_label(c)})"
                          for c in inconclusive[:5])
        more = f" and {len(inconclusive) - 5} more" if len(inconclusive) > 5 else ""
        why = (f"; one run a side: the drift between runs is unknown (allowed: x"
               f"{1 + args.drift:g}); take {MIN_RUNS} or more runs a side, interleaved"
               if one_run else "")
        sys.stderr.write(f"infercomm compare: inconclusive at threshold {args.threshold:g}: "
                         f"{named}{more}{why}\n")
    if regressions:
        named = ", ".join(f"{c.metric} x{c.ratio:.3f} (95% CI {c.ci_low:.3f}-"
                          f"{c.ci_high:.3f})" for c in regressions)
        sys.stderr.write(f"infercomm compare: regression beyond {args.threshold:g}: {named}\n")
        return 1
    return 3 if (inconclusive or warnings) and not args.inconclusive_ok else 0


def render(args: argparse.Namespace, legend: list[str], results: list[Comparison],
           names: dict[str, str], diffs: dict[str, list[dict[str, str]]], warnings: list[str],
           with_predicted: bool) -> str:
    header, rows = table_rows(results, names, with_predicted)
    one_run = any(c.drift_allowed is not None for c in results)
    note = (f"ratio = median(B) / median(A); 95% CI by hierarchical bootstrap over runs, then "
            f"iterations ({RESAMPLES} resamples, seed 0)"
            + (f"; one run a side: between-run spread unknown, CI widened by x{1 + args.drift:g}"
               if one_run else "")
            + f"; regression = slower and ratio > {1 + args.threshold:g}; inconclusive = the "
            f"CI holds 1 and reaches past [{1 / (1 + args.threshold):.3f}, "
            f"{1 + args.threshold:g}] or a run has fewer than {MIN_SAMPLES} samples (unless the "
            f"CI lies beyond x{FAR:g}, flagged); drift = "
            f"CV of the runs' medians")
    diff_lines = []
    for letter, found in diffs.items():
        diff_lines.append(f"what differs, A -> {letter}:" + ("" if found
                                                             else " nothing recorded"))
        diff_lines += [f"  {d['what']}: {d['a']} -> {d['b']}" for d in found]
    if args.format == "markdown":
        parts = ["### infercomm compare", "", *[f"- {line}" for line in legend], "",
                 markdown(header, rows), ""]
        for letter, found in diffs.items():
            parts += [f"**What differs, A -> {letter}**" + (": nothing recorded" if not found
                                                           else ""), ""]
            if found:
                parts += [markdown(["what", "A", letter],
                                   [[d["what"], d["a"], d["b"]] for d in found]), ""]
        parts += [f"**{w}**" for w in warnings] + [f"_{note}_"]
        return "\n".join(parts)
    return "\n".join([*legend, "", render_table(header, rows, right_align={
        "A median", "median", "ratio", "predicted"}), "", *diff_lines, *warnings, "", note])


def write_text(path: Path, text: str, given: str) -> None:
    """The whole file or nothing (results/atomic.py)."""
    from microbench.results.atomic import write_atomic

    write_atomic(path, text, given)
