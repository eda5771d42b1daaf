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
input, or the status of the first run that failed. Last stdout line: one JSON object with the
schedule and compare's summary.
"""

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path


def parse(argv: list[str]) -> argparse.Namespace:
    if "--" not in argv:
        sys.stderr.write("interleave: error: give the infercomm command after --, e.g. "
                         "-- replay --model llama-3.2-1b --tp 2 ...\n")
        raise SystemExit(2)
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="interleave", description=__doc__.split("\n")[0])
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
    return args


def one_run(prefix: str, command: list[str], out: Path, label: str) -> str:
    argv = [*shlex.split(prefix), *command, "--out", str(out), "--label", label]
    sys.stderr.write(f"interleave: {label}: {shlex.join(argv)}\n")
    proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
    sys.stderr.write(proc.stdout)  # the run's table, kept off our stdout
    if proc.returncode != 0:
        sys.stderr.write(f"interleave: {label} failed (exit {proc.returncode}); stopping\n")
        raise SystemExit(proc.returncode)
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    return str(last["results_dir"])


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    schedule: list[tuple[str, str]] = []
    sides: dict[str, list[str]] = {"a": [], "b": []}
    for i in range(1, args.runs + 1):
        for side in ("a", "b"):
            folder = one_run(getattr(args, side), args.command, out / side, f"{side}-{i}")
            sides[side].append(folder)
            schedule.append((f"{side}-{i}", folder))
    compare = [*shlex.split(args.compare or args.a), "compare", "-A", *sides["a"],
               "-B", *sides["b"], *shlex.split(args.compare_args)]
    proc = subprocess.run(compare, stdout=subprocess.PIPE, text=True, check=False)
    lines = proc.stdout.rstrip("\n").splitlines()
    print("\n".join(lines[:-1]))
    summary = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    print(json.dumps({"schedule": [label for label, _ in schedule], "a": sides["a"],
                      "b": sides["b"], "compare_status": proc.returncode,
                      "compare": summary}, separators=(",", ":")))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
