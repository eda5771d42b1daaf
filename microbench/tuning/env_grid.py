"""`--env NAME=v1,v2 [--env NAME2=...]` on sweep and replay: one run per combination.

Each combination is a separate `infercomm sweep|replay` process (its own launcher and ranks)
started with the variables in its environment, so they are set before any library loads and
reads them (NCCL_PROTO, NCCL_ALGO, MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM, OMPI_MCA_coll_tuned_*).
Each run is an ordinary run folder; its meta.json records the variables (environment, and
settings: the grid's names, see results/store.py). With --env-runs R the combinations run R
times, interleaved (a b a b ...), so that drift of the machine falls on every setting alike and
the comparison has runs a side. The grid's folder holds grid.json (every combination and its
runs) and best.csv (tuning/best.py); the last stdout line is one short JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import signal
import sys
from typing import Any

from microbench.argtypes import UsageError, positive_int
from microbench.ranks.children import (
    CHECK_ONLY_VAR,
    StopGuard,
    Stopped,
    check_only,
    check_only_value,
    die_with_parent,
    run_child,
)

SETTINGS_VAR = "INFERCOMM_SETTINGS"  # the names a grid set, recorded by results/store.py
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_COMBINATIONS = 64
MAX_RUNS = 10 * MAX_COMBINATIONS  # combinations x --env-runs: hours of runs already


def env_spec(text: str) -> tuple[str, list[str]]:
    name, sep, values = text.partition("=")
    if not sep or not _NAME.fullmatch(name):
        raise argparse.ArgumentTypeError(f"--env {text!r}: write NAME=v1,v2 (a variable name, "
                                         "then its values)")
    parts = [v.strip() for v in values.split(",")]
    if not parts or any(not v for v in parts):
        raise argparse.ArgumentTypeError(f"--env {text!r}: an empty value; write NAME=v1,v2")
    return name, list(dict.fromkeys(parts))


def add_env_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("settings grid")
    group.add_argument("--env", type=env_spec, action="append", default=None,
                       metavar="NAME=v1,v2",
                       help="run once per value (per combination when given several times), "
                            "each run a separate job with the variable set before the "
                            "libraries load; then the best setting per op and size (sweep) "
                            "or per phase (replay)")
    group.add_argument("--env-runs", type=positive_int, default=None, metavar="R",
                       help="runs of every combination, interleaved (default 1; 3 or more "
                            "let the verdicts read between-run drift)")


def combinations(specs: list[tuple[str, list[str]]], runs: int = 1) -> list[dict[str, str]]:
    names = [n for n, _ in specs]
    if len(set(names)) != len(names):
        raise UsageError("--env names a variable twice; give its values in one --env")
    count = math.prod(len(values) for _, values in specs)  # counted before any is built
    if count > MAX_COMBINATIONS:
        sizes = " x ".join(str(len(values)) for _, values in specs)
        raise UsageError(f"--env makes {count:,} combinations ({sizes} values), more than "
                         f"{MAX_COMBINATIONS}; give fewer values")
    if count * runs > MAX_RUNS:
        raise UsageError(f"--env makes {count:,} combinations x --env-runs {runs:,} = "
                         f"{count * runs:,} runs, more than {MAX_RUNS}; give fewer runs")
    return [dict(zip(names, values, strict=True))
            for values in itertools.product(*[v for _, v in specs])]


def setting_name(combo: dict[str, str], varying: set[str] | None = None) -> str:
    """NAME=value of the variables that differ between the combinations (all when none do)."""
    shown = [k for k in combo if varying is None or k in varying] or list(combo)
    return " ".join(f"{k}={combo[k]}" for k in shown)


def child_argv(argv: list[str]) -> list[str]:
    """argv without --env/--env-runs (and their values) and without --label."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--env", "--env-runs", "--label"):
            skip = True
        elif not arg.startswith(("--env=", "--env-runs=", "--label=")):
            out.append(arg)
    return out


def run_grid(command: str, args: argparse.Namespace) -> int:
    """Run every combination; write the grid folder; print the best-setting table.

    A run that fails stops the grid, and one that is stopped (Ctrl-C, kill) ends with it
    (ranks/children.py), as does a stop between runs or during the input check; either way
    the runs done so far are kept as a partial grid."""
    from microbench.ranks import dist
    if not args.env:
        raise UsageError("--env-runs repeats the combinations of --env NAME=v1,v2; add --env or "
                         "drop --env-runs")
    if dist.detect() is not None:
        raise UsageError("--env starts one job per setting itself; run it without a launcher "
                         "(add --nproc N for the ranks of each job)")
    check_only()  # a stray INFERCOMM_CHECK_ONLY would make every run measure nothing
    args.env_runs = args.env_runs or 1
    combos = combinations(args.env, args.env_runs)
    varying = {name for name, values in args.env if len(values) > 1}
    base = child_argv(args.argv)
    label = args.label or f"grid-{command}"
    total = len(combos) * args.env_runs
    runs: list[dict[str, Any]] = []
    ended: dict[str, Any] | None = None  # how a grid that did not finish ended
    status = 0
    with StopGuard() as guard:
        at, current = "the input check", None  # what a stop ends
        try:
            checked = _check_input(base, label, combos[0])
            if checked:
                return checked
            for n, (repeat, combo) in enumerate(itertools.product(range(args.env_runs),
                                                                  combos)):
                current = setting_name(combo)
                at = f"the run with {current} (run {n + 1} of {total})"
                slug = "-".join(f"{k}-{v}" for k, v in combo.items())
                cmd = [sys.executable, "-m", "microbench", *base, "--label",
                       f"{label}-{slug}"[:100]]
                env = {**os.environ, **combo, SETTINGS_VAR: ",".join(combo)}
                sys.stderr.write(f"[infercomm] grid {n + 1}/{total}: {setting_name(combo)}\n")
                done = run_child(cmd, env)
                at, current = f"the grid after run {n + 1} of {total}", None
                last = _last_json(done.stdout)
                folder = last.get("results_dir") if last else None
                wrong = bool(last.get("wrong")) if last else False
                if done.status != 0 and not (done.status == 1 and wrong and folder):
                    sys.stderr.write(done.stdout[-2000:])
                    status = done.status or 1
                    ended = {"setting": setting_name(combo), "exit_status": status,
                             "results_dir": folder}
                    sys.stderr.write(f"infercomm {command}: the run with {setting_name(combo)} "
                                     f"failed (exit {done.status}); the grid stops\n")
                    break
                runs.append({"setting": setting_name(combo, varying), "env": combo,
                             "repeat": repeat, "results_dir": folder,
                             "exit_status": done.status, "check_failed": wrong})
        except Stopped as stopped:
            guard.deafen()  # what was done is written whole
            status = 128 + stopped.signum
            ended = {"setting": current, "stopped_by": signal.Signals(stopped.signum).name}
            sys.stderr.write(f"infercomm {command}: {stopped.how}; ended {at}\n")
        guard.deafen()
        if not runs:
            sys.stderr.write(f"infercomm {command}: no run of the grid finished; nothing kept\n")
            return status
        from microbench.tuning.best import write_grid
        summary = write_grid(command, args, runs, label, total, ended)
        print(json.dumps(summary, separators=(",", ":")), flush=True)
    return status or (1 if any(r["exit_status"] for r in runs) else 0)


def _check_input(base: list[str], label: str, combo: dict[str, str]) -> int:
    """The first setting's job checks its input and ends before starting ranks: bad input
    is its one line (exit 2) before any run, not a failed first run of a grid."""
    import subprocess
    cmd = [sys.executable, "-m", "microbench", *base, "--label", label[:100]]
    env = {**os.environ, **combo, CHECK_ONLY_VAR: check_only_value()}
    try:
        # its own process group: a terminal's Ctrl-C stops the grid, which ends it
        done = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, errors="replace", timeout=120, process_group=0,
                              preexec_fn=die_with_parent(os.getpid()))
    except subprocess.TimeoutExpired:  # a check that slow is no reason to stop the grid
        return 0
    lines = done.stderr.strip().splitlines()
    if done.returncode != 0 and lines:  # its refusal, the last line (progress notes before)
        sys.stderr.write(lines[-1] + "\n")
    return done.returncode


def _last_json(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        return found if isinstance(found, dict) else None
    return None
