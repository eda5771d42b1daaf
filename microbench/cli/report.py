"""`infercomm report` (one self-contained HTML page) and `infercomm plot` (the same figures
as PNG files), both from result files only."""

import argparse
import json
import sys
from pathlib import Path

from microbench.argtypes import UsageError
from microbench.results.atomic import check_writable, missing_folders, remove_made, write_atomic
from microbench.results.runs import RunFolder, load_run, load_sweep

EXAMPLES = """\
examples:
  infercomm report results/REPLAY_A results/REPLAY_B results/SWEEP -o report.html
  infercomm report results/REPLAY --sweep results/SWEEP -o report.html  (predicted vs measured)
  infercomm plot results/SWEEP_NCCL results/SWEEP_MPI -o figures/
"""


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN", help="replay or sweep run folders; "
                        "the first of each kind is the baseline of the ratios")
    parser.add_argument("--sweep", default=None, metavar="SWEEP_RUN",
                        help="a sweep run whose fits predict the replays (predicted vs "
                             "measured)")
    parser.add_argument("--threshold", type=float, default=0.05,
                        help="regression threshold used by the ratios' verdicts (default 0.05)")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    report = subparsers.add_parser(
        "report", help="one self-contained HTML page of figures and tables from runs",
        description="Time per phase and op kind, message sizes, volume by layout, latency and "
                    "bus bandwidth vs size, run-vs-run ratios and predicted vs measured, in "
                    "one HTML file with its figures embedded (no network needed to view it).",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(report)
    report.add_argument("-o", "--output", default=None,
                        help="the HTML file to write (default report.html, never replaced "
                             "unless named with -o)")
    report.set_defaults(run=run_report)
    plot = subparsers.add_parser(
        "plot", help="the report's figures as PNG files",
        description="Write each figure of `infercomm report` as a PNG file into a folder.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(plot)
    plot.add_argument("-o", "--output", default="figures",
                      help="the folder to write PNG files into (default figures/)")
    plot.set_defaults(run=run_plot)


def _inputs(args: argparse.Namespace) -> tuple[list[RunFolder], RunFolder | None]:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("figures need matplotlib: pip install 'infercomm[plot]'") from None
    runs = [load_run(p) for p in args.runs]
    sweep = load_sweep("--sweep", args.sweep, collectives=True) if args.sweep else None
    from microbench.results.runs import refuse_mixed_standins
    refuse_mixed_standins(runs + ([sweep] if sweep is not None else []))
    return runs, sweep


DEFAULT_REPORT = "report.html"


def run_report(args: argparse.Namespace) -> int:
    from microbench.analysis.report import build
    from microbench.analysis.report_html import render_html

    if args.output is None:  # the default name is not overwritten behind the user's back
        if Path(DEFAULT_REPORT).exists():
            raise UsageError(f"./{DEFAULT_REPORT} exists; pass -o FILE for a new page (or "
                             f"-o {DEFAULT_REPORT} to replace it)")
        args.output = DEFAULT_REPORT
    out = Path(args.output)
    if out.is_dir():
        raise UsageError(f"-o {args.output} is a folder; name the HTML file to write")
    check_writable(out.parent, args.output)  # at once, not after the figures (5 s and more)
    runs, sweep = _inputs(args)
    entries, tables = build(runs, sweep, args.threshold)
    page = render_html(entries, tables)
    write_atomic(out, page, args.output)
    for note in tables["notes"]:
        sys.stderr.write(f"infercomm report: {note}\n")
    print(f"report: {out} ({len(page) // 1024} KiB, {len(entries)} figures: "
          f"{', '.join(e.name for e in entries)})")
    print(json.dumps({"report": str(out), "figures": [e.name for e in entries],
                      "bytes": len(page)}, separators=(",", ":")))
    return 0


def run_plot(args: argparse.Namespace) -> int:
    from microbench.analysis.report import build
    from microbench.analysis.report_html import png_bytes

    folder = Path(args.output)
    check_writable(folder, args.output)  # at once, not after the figures
    runs, sweep = _inputs(args)
    entries, tables = build(runs, sweep, args.threshold)
    if not entries:  # e.g. KV-transfer runs: their transfers are the report's tables
        kinds = ", ".join(sorted({r.kind for r in runs}))
        raise UsageError(f"no figure to draw from these runs ({kinds}); `infercomm report "
                         f"{' '.join(args.runs)} -o report.html` shows their tables")
    made = missing_folders(folder)
    files: list[Path] = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for e in entries:
            path = folder / f"{e.name}.png"
            write_atomic(path, png_bytes(e.figure), args.output)
            files.append(path)
    except OSError as err:
        remove_made(files, made)
        raise UsageError(f"-o {args.output}: cannot create the folder ({err.strerror})") from None
    except UsageError:  # no room for a figure: no half-made folder stays (a full disk)
        remove_made(files, made)
        raise
    for path, e in zip(files, entries, strict=True):
        print(f"{path}  {e.title}")
    for note in tables["notes"]:
        sys.stderr.write(f"infercomm plot: {note}\n")
    print(json.dumps({"files": [str(f) for f in files]}, separators=(",", ":")))
    return 0
