#!/usr/bin/env python3
"""K runs of A and K runs of B, interleaved (A B A B ...), then `infercomm compare -A ... -B ...`.

Drift (other jobs, clocks, thermal state) moves every run of a stretch of time alike; taking
the two sides in turn spreads it over both, so the comparison sees it as run-to-run spread
instead of as a difference. A and B are command prefixes that run infercomm: two
installations, or one with two environments:

    python scripts/interleave.py -k 3 --out results/ab \\
        --a "env MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=recursive_doubling .venv/bin/infercomm" \\
        --b "env MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring .venv/bin/infercomm" \\
        -- replay --model llama-3.2-1b --tp 2 --prompt 32 --decode 16 -n 20 --backend mpi \\
        --nproc 2 --dtype fp32

    python scripts/interleave.py -k 3 --out results/ab --a .venv/bin/infercomm \\
        --b ".venv-ompi/bin/python -m microbench" -- replay ...     (two MPI wheels)

Each run gets `--out OUT/a` or `OUT/b` and `--label a-I` / `b-I` after the given arguments.
Exit status: compare's (0 no regression, 1 regression, 3 inconclusive or suspect), 2 for bad
input, the status of the first run that failed (1 when it printed no JSON line, 127 when its
prefix cannot be run), or 128+N when ended by signal N (130 for Ctrl-C), the run in progress
ended with it (microbench/ranks/children.py). Last stdout line: one JSON object with the
schedule and compare's summary, or with the runs kept ("complete": false).
"""

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's microbench
from microbench.argtypes import OneLineParser
from microbench.ranks.children import Stopped, run_child
from microbench.results.atomic import missing_folders, remove_made, unwritable
from patterns.errors import shown


class SideFailed(Exception):
    """A run that failed, printed no JSON line, or could not start; the status to exit with."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def parse(argv: list[str]) -> argparse.Namespace:
    if "--" not in argv:
        sys.stderr.write("interleave: error: give the infercomm command after --, e.g. "
                         "-- replay --model llama-3.2-1b --tp 2 ...\n")
        raise SystemExit(2)
    cut = argv.index("--")
    parser = OneLineParser(prog="interleave", description=__doc__.split("\n")[0])
    parser.add_argument("-k", "--runs", type=int, default=3,
                        help="runs a side (default 3: the fewest that measure the drift)")
    parser.add_argument("--a", required=True, help="command prefix of side A (the baseline)")
    parser.add_argument("--b", required=True, help="command prefix of side B")
    parser.add_argument("--out", required=True, help="folder for OUT/a and OUT/b")
    parser.add_argument("--compare", default=None,
                        help="command prefix that runs compare (default: side A's)")
    parser.add_argument("--compare-args", default="",
                        help="options for compare, e.g. \"--threshold 0.10 --format markdown\"")
    args = parser.parse_args(argv[:cut])
    args.command = argv[cut + 1:]
    if not 1 <= args.runs <= 100:
        parser.error(f"-k {args.runs}: take 1 to 100 runs a side (3 or more measure drift)")
    if not args.command:
        parser.error("nothing after --: give the infercomm command (replay or sweep ...)")
    # found now, not after every run (a prefix or --compare-args shlex cannot split was a
    # traceback once all runs were done; a grid's folders cannot be compared)
    for name in ("a", "b", "compare", "compare_args"):
        value = getattr(args, name)
        try:
            words = shlex.split(value) if value is not None else None
        except ValueError as err:
            parser.error(f"--{name.replace('_', '-')} {shown(value, 40)!r}: {err}; quote it as "
                         "a shell would")
        if name in ("a", "b") and not words:
            parser.error(f"--{name} is empty; give the command prefix that runs infercomm")
    if args.command[0] not in ("replay", "sweep"):
        parser.error(f"interleave runs replay or sweep, which write run folders to compare; "
                     f"not {shown(args.command[0], 40)!r}")
    # an --out no run can write to (read-only, full) is one line here, and nothing is made
    reason = unwritable(Path(args.out))
    if reason is not None:
        parser.error(f"--out {shown(args.out, 60)!r} cannot be created or written: {reason}; "
                     "pass a writable folder")
    args.made = missing_folders(Path(args.out))  # removed again if no run is kept
    try:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        parser.error(f"--out {shown(args.out, 60)!r} cannot be created ({err.strerror}); pass "
                     "a writable folder")
    taken = [a for a in args.command
             if a.split("=", 1)[0] in ("--out", "--label", "--env", "--env-runs")]
    if taken:
        parser.error(f"{shown(taken[0], 40)} after --: interleave gives each run --out and "
                     "--label itself, and a settings grid (--env) cannot be compared run by "
                     "run; put a setting in a side's prefix (env NAME=v infercomm)")
    return args


def one_run(prefix: str, command: list[str], out: Path, label: str) -> str:
    """Run one side; its run folder. A stop signal ends the run and raises Stopped."""
    argv = [*shlex.split(prefix), *command, "--out", str(out), "--label", label]
    sys.stderr.write(f"interleave: {label}: {shlex.join(argv)}\n")
    try:
        done = run_child(argv)
    except OSError as err:
        raise SideFailed(f"{label}: cannot run {argv[0]!r} ({err.strerror}); give a command "
                         "prefix that runs infercomm", 127) from None
    sys.stderr.write(done.stdout)  # the run's table, kept off our stdout
    if done.status != 0:
        raise SideFailed(f"{label} failed (exit {done.status})", done.status)
    last = last_json(done.stdout)
    if last is None or not isinstance(last.get("results_dir"), str):
        raise SideFailed(f"{label} ended without a JSON last line naming its run folder "
                         "(results_dir): give a command prefix that runs infercomm", 1)
    return last["results_dir"]


def last_json(stdout: str) -> dict | None:
    lines = stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    schedule: list[tuple[str, str]] = []
    sides: dict[str, list[str]] = {"a": [], "b": []}
    try:
        for i in range(1, args.runs + 1):
            for side in ("a", "b"):
                folder = one_run(getattr(args, side), args.command, out / side, f"{side}-{i}")
                sides[side].append(folder)
                schedule.append((f"{side}-{i}", folder))
        compare = [*shlex.split(args.compare or args.a), "compare", "-A", *sides["a"],
                   "-B", *sides["b"], *shlex.split(args.compare_args)]
        try:
            proc = run_child(compare)
        except OSError as err:
            raise SideFailed(f"cannot run {compare[0]!r} ({err.strerror})", 127) from None
    except (SideFailed, Stopped) as ended:
        what = (f"{ended.how}; ended the run in progress" if isinstance(ended, Stopped)
                else f"{ended}; stopping")
        kept = ", ".join(folder for _, folder in schedule) or "none"
        if not schedule and args.made:  # nothing kept: the --out this made goes (a rerun)
            remove_made([], [out / "a", out / "b", *args.made])
        sys.stderr.write(f"interleave: {what}; runs kept: {kept}\n")
        status = 128 + ended.signum if isinstance(ended, Stopped) else ended.status
        print(json.dumps({"schedule": [label for label, _ in schedule], "a": sides["a"],
                          "b": sides["b"], "complete": False, "status": status},
                         separators=(",", ":")))
        return status
    lines = proc.stdout.rstrip("\n").splitlines()
    summary = last_json(proc.stdout)
    print("\n".join(lines[:-1] if summary is not None else lines))
    print(json.dumps({"schedule": [label for label, _ in schedule], "a": sides["a"],
                      "b": sides["b"], "complete": True, "compare_status": proc.status,
                      "compare": summary}, separators=(",", ":")))
    return proc.status


if __name__ == "__main__":
    sys.exit(main())
