"""The `--allreduce-algo` option of sweep and replay (and replay's --ranks-per-node)."""

from __future__ import annotations

import argparse
from typing import Any

from microbench.algorithms.schedules import ALGORITHMS
from microbench.argtypes import positive_int


def add_algo_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("all-reduce algorithm")
    group.add_argument("--allreduce-algo", choices=ALGORITHMS, default="library",
                       help="library: the backend's own all-reduce (default); ring, "
                            "recursive-doubling, rabenseifner, hierarchical: built from the "
                            "backend's point-to-point calls (hierarchical: reduce-scatter "
                            "within a node, recursive doubling across, all-gather within)")
    if not any("--ranks-per-node" in a.option_strings for a in parser._actions):
        group.add_argument("--ranks-per-node", type=positive_int, default=None, metavar="N",
                           help="placement for --allreduce-algo hierarchical: ranks 0..N-1 "
                                "on the first node, ... (default: the hosts the ranks ran on)")


def wrap(backend: Any, args: argparse.Namespace) -> Any:
    from microbench.algorithms.registry import with_algorithm
    return with_algorithm(backend, getattr(args, "allreduce_algo", "library"),
                          getattr(args, "ranks_per_node", None))


def check_algo_options(args: argparse.Namespace, world: int | None = None) -> None:
    """Refusals before any rank starts: hierarchical over a world (`--nproc`, else the
    pattern's or the launcher's) that nodes of --ranks-per-node cannot split evenly (the
    ranks would each refuse it later)."""
    from microbench.argtypes import UsageError

    rpn = getattr(args, "ranks_per_node", None)
    world = getattr(args, "nproc", None) or world
    if getattr(args, "allreduce_algo", "library") != "hierarchical" or not rpn or not world:
        return
    if world > rpn and world % rpn:  # at most one node's worth: one node, nothing uneven
        raise UsageError(f"--allreduce-algo hierarchical needs the same number of ranks on "
                         f"every node; {world} ranks at --ranks-per-node {rpn} leave "
                         f"{world % rpn} on the last; use a divisor of {world}")
