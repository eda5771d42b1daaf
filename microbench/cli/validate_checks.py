"""What `validate` weighs before comparing: which of the layout's ranks the trace holds, and
whether a request workload can fit the trace at all.

- A trace of fewer ranks than the layout compared those ranks and exited 0 ("match") with a
  note: a profile of rank 0 of eight is a fine thing to check (docs/real-engine.md), but a
  match of one rank must be asked for, `--ranks 0`, not read into an exit status meant for
  the whole deployment; a `--ranks` beyond the layout, or other than the trace's, is refused.
- `--requests` of 10^6 requests against a trace of 5 steps scheduled every request before
  the comparison showed the mismatch (no answer in 7 minutes). Every request is in at least
  one step, a step takes at most the step's token budget of requests (each of them takes a
  token), and a step of a layout with TP or PP issues at least one call a rank: a workload
  that needs more steps than the trace has calls on any rank cannot be the trace's, and is
  refused from its count alone, before it is read.
"""

import argparse
import re
from pathlib import Path

from microbench.argtypes import UsageError
from patterns import Pattern
from patterns.traces.calls import Trace


def check_ranks(args: argparse.Namespace, trace: Trace, pattern: Pattern) -> None:
    world = pattern.layout.world_size
    outside = [r for r in trace.ranks if not 0 <= r.rank < world]
    if outside:  # another layout's trace: no --ranks makes it this one's
        raise UsageError(f"trace rank {outside[0].rank} ({outside[0].name}) is outside the "
                         f"layout's {world} ranks; pass the --tp/--pp/--dp the engine ran with")
    held = sorted(r.rank for r in trace.ranks)
    text = ",".join(map(str, held))
    if args.ranks is None:
        if held != list(range(world)):
            raise UsageError(f"the trace holds rank {text} of the layout's {world} ranks; pass "
                             f"every rank's trace, or --ranks {text} to compare "
                             f"{'that rank' if len(held) == 1 else 'those ranks'} alone")
        return
    asked = sorted(set(args.ranks))
    beyond = [r for r in asked if r >= world]
    if beyond:
        raise UsageError(f"--ranks {beyond[0]} is beyond the layout's {world} ranks (0 to "
                         f"{world - 1}); pass the --tp/--pp/--dp the engine ran with")
    if asked != held:
        raise UsageError(f"--ranks {','.join(map(str, asked))}, but the trace holds rank "
                         f"{text}; name the ranks whose traces are given")


def check_workload_fits(args: argparse.Namespace, trace: Trace) -> None:
    """Refuse a --requests workload too large for the trace (module note); its count only."""
    if not getattr(args, "requests", None) or args.tp * args.pp == 1 or not trace.ranks:
        return
    count = _request_count(args.requests)
    if count is None:
        return
    budget = _per_step(args)
    steps = -(-count // budget)
    calls = max(len(r.ids) for r in trace.ranks)
    if steps > calls:
        raise UsageError(f"--requests holds {count:,} requests: at least {steps:,} steps of "
                         f"at most {budget:,} requests, each with a call on every rank, and the "
                         f"trace holds at most {calls:,} calls a rank; it is not this "
                         "workload's trace (pass the workload the engine served)")


def _per_step(args: argparse.Namespace) -> int:
    """The most requests one step can hold: its token budget (each takes a token), and under
    vLLM its max_num_seqs."""
    gpu = args.gpu or "h100"
    if args.engine == "sglang":
        from patterns.engines.sglang.profile import chunked_prefill_size
        return args.max_batched_tokens or chunked_prefill_size(gpu)
    from patterns.engines.vllm.rules import v1_defaults
    seqs, tokens = v1_defaults(gpu)
    return min(args.max_batched_tokens or tokens, args.max_num_seqs or seqs)


def _request_count(source: str) -> int | None:
    """The requests of `--requests` by a count of its lines (or the poisson spec's count),
    without reading them; None where that cannot be told (the reader then says why)."""
    if source.startswith("poisson:"):
        found = re.search(r"(?:^poisson:|,)\s*count\s*=\s*([0-9]{1,18})\s*(?:,|$)", source)
        return int(found.group(1)) if found else None
    path = Path(source)
    try:
        with path.open("rb") as f:
            lines = sum(1 for line in f if line.strip())
    except OSError:
        return None
    return lines - 1 if path.suffix.lower() == ".csv" else lines  # a CSV's header
