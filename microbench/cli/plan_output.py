"""`plan`'s output and its guards: `--list-gpus`, the bounds on --gpus and --gpus-per-node,
the document in the chosen format, and stdout that cannot take it (a full disk, /dev/full)
said in one line, not a traceback."""

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

from microbench.argtypes import UsageError


class ListGpus(argparse.Action):
    """`plan --list-gpus`: the GPU table (analysis/hardware.py) and its JSON line, then exit,
    whatever else the command line holds (as --help does)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        from microbench.analysis.hardware import GPU_SPECS, gpu_table
        line = json.dumps({"gpus": [{"gpu": s.name, "memory_mib": round(s.memory_mib, 1),
                                     "bf16_tflops": s.bf16_flops / 1e12,
                                     "fp8_tflops": s.fp8_flops / 1e12 if s.has_fp8 else None,
                                     "hbm_tb_per_s": s.hbm_bytes_per_s / 1e12}
                                    for s in GPU_SPECS.values()]}, separators=(",", ":"))
        try:
            write_stdout(gpu_table() + "\n" + line)
        except UsageError as err:
            sys.stderr.write(f"infercomm plan: error: {err}\n")
            parser.exit(2)
        parser.exit(0)


def refuse_layout_counts(gpus: int, per_node: int, max_gpus: int, max_per_node: int) -> None:
    """Refused before any work: more ranks than plan prices, a node larger than any made,
    and fewer ranks than one node (a node's ranks are the deployment's: --gpus-per-node 8
    of --gpus 1 would place ranks that do not exist)."""
    if gpus > max_gpus:
        raise UsageError(f"--gpus {gpus:,} is beyond any deployment of one model; plan "
                         f"prices at most {max_gpus:,} ranks")
    if per_node > max_per_node:
        raise UsageError(f"--gpus-per-node {per_node:,} is beyond any node (the largest NVLink "
                         f"domain holds 576 GPUs); give at most {max_per_node:,}")
    if gpus < per_node:
        raise UsageError(f"--gpus {gpus:,} is less than one node of --gpus-per-node "
                         f"{per_node:,}; give --gpus-per-node {gpus:,} (the ranks on the one "
                         f"node) or --gpus {per_node:,}")


def write_stdout(text: str) -> None:
    """The output and its newline, flushed here: a stdout that cannot take it (ENOSPC on a
    full disk or /dev/full, EIO) is one line, exit 2; what it could not take is dropped (its
    descriptor pointed at /dev/null), so the interpreter's own flush at exit has nothing to
    fail on. A closed pipe (`| head`) is the caller's BrokenPipeError, as for every command."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        _drop_stdout()
        raise
    except OSError as err:
        _drop_stdout()
        raise UsageError(f"cannot write the plan to stdout: {os.strerror(err.errno or 0)}; "
                         "free some space or send it elsewhere") from None


def _drop_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def plan_output(args: argparse.Namespace, doc: dict[str, Any], priced: list[Any],
                refused: list[str], notes: list[str], scope: str, disagg_text: str) -> str:
    """The document in --format's form: the JSON document, CSV (notes on stderr), or the
    table and, last, one short JSON line."""
    from microbench.views.plan import csv_rows, plan_text
    if args.format == "json":
        return json.dumps(doc, separators=(",", ":"))
    if args.format == "csv":
        for n in notes:
            sys.stderr.write(f"infercomm plan: note: {n}\n")
        return csv_rows(priced)
    best = next((p for p in priced if p.best), None)
    short: dict[str, Any] = {"model": args.model, "gpus": args.gpus,
                             "allreduce_algo": doc["allreduce_algo"], "layouts": len(priced),
                             "fit": sum(p.fits_memory for p in priced),
                             "refused": len(refused)}
    if doc.get("not_loadable"):
        short["not_loadable"] = len(doc["not_loadable"])
    short["best"] = None if best is None else {
        "tp": best.shape.tp, "pp": best.shape.pp, "dp": best.shape.dp, "ep": best.shape.ep,
        f"{args.objective}_floor_us": round(best.totals()[args.objective], 3),
        "kv_tokens": best.kv_capacity_tokens}
    line = json.dumps(short, separators=(",", ":"))
    return plan_text(doc, priced, scope) + disagg_text + "\n" + line


class Progress:
    """A line on stderr every `every` seconds while plan prices (none for a plan done
    sooner): the layouts done of all and the time so far. A thread writes it, so a layout
    that takes long to price (a large --requests) is heard from too."""

    def __init__(self, what: str, every: float = 2.0) -> None:
        self.what, self.every = what, every
        self.done, self.total = 0, 0
        self.start = time.monotonic()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __call__(self, done: int, total: int) -> None:
        self.done, self.total = done, total

    def _run(self) -> None:
        while not self.stopped.wait(self.every):
            try:
                sys.stderr.write(f"infercomm plan: {self.what}: {self.done} of "
                                 f"{self.total or '?'} layouts priced, "
                                 f"{time.monotonic() - self.start:.0f} s so far\n")
                sys.stderr.flush()
            except (OSError, ValueError):  # stderr gone: the plan goes on, silently
                return

    def __enter__(self) -> "Progress":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()


def interrupted() -> None:
    """Ctrl-C: the one line and status 130 at once. A plan's heap (a large workload's
    steps, gigabytes) took the interpreter's exit seconds to free, object by object;
    nothing is left to write, so the process ends without it."""
    try:
        sys.stderr.write("infercomm plan: interrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(130)


# What one request on one lane arrangement costs to schedule and price, measured: 100,000
# requests over 1,024 GPUs (405B, 8 arrangements of tp and dp x pp) took 32 s of CPU
# (benchmarks/plan_workload.py --count 100000): 40 us each.
REQUEST_LANE_S = 40e-6
MAX_PLAN_CPU_S = 300.0


def declared_requests(source: str) -> int:
    """How many requests --requests holds, read before they are: a poisson spec's count, a
    file's lines (a header or blank line counted too: an estimate)."""
    if source.startswith("poisson:"):
        for part in source.removeprefix("poisson:").split(","):
            key, _, value = part.partition("=")
            if key.strip() == "count" and value.strip().isdigit() and len(value) < 9:
                return int(value)
        return 0
    try:
        with open(source, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except OSError:
        return 0  # the reader says what is wrong with it


def refuse_costly_workload(requests: int, arrangements: int) -> None:
    """A workload whose pricing would run past MAX_PLAN_CPU_S: refused before any work,
    saying what it would cost (each request is scheduled once per distinct tp and dp x pp
    of the layouts)."""
    estimate = requests * arrangements * REQUEST_LANE_S
    if estimate > MAX_PLAN_CPU_S:
        fewer = int(MAX_PLAN_CPU_S / (arrangements * REQUEST_LANE_S))
        raise UsageError(f"--requests of {requests:,} over {arrangements} arrangements of tp "
                         f"and dp x pp would take about {estimate:,.0f} s of CPU to price (40 us "
                         f"a request and arrangement); plan prices up to {MAX_PLAN_CPU_S:.0f} s: "
                         f"give at most {fewer:,} requests, or fewer --gpus")
