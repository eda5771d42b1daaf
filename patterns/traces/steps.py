"""A trace is a flat call list: split it into steps (profiler step annotations, else the
period that repeats at its end) and fold repeats into runs, as `Pattern` holds them."""

from array import array
from collections.abc import Sequence

MAX_PERIOD_CANDIDATES = 8  # periods tried: each costs one backward scan of the call list


def find_period(ids: Sequence[int]) -> int | None:
    """The step length that repeats over the end of the call list, or None.

    A candidate p is a distance at which the last call recurs; its coverage is how far back
    from the end call i equals call i - p. The candidate covering the most calls, at least
    two whole periods, wins (the shorter on a tie). Cost: a few scans of the list.
    """
    n = len(ids)
    if n < 2:
        return None
    last = ids[-1]
    best, best_cover = None, 0
    tried = 0
    for p in range(1, n // 2 + 1):
        if ids[n - 1 - p] != last:
            continue
        tried += 1
        i = n - 1
        while i - p >= 0 and ids[i] == ids[i - p]:
            i -= 1
        cover = (n - 1 - i) + p  # calls from i+1-p to the end are p-periodic
        cover -= cover % p
        if cover >= 2 * p and cover > best_cover:
            best, best_cover = p, cover
        if tried >= MAX_PERIOD_CANDIDATES:
            break
    return best


def split_steps(ids: Sequence[int], starts: list[int] | None) -> list[tuple[int, int]]:
    """(begin, end) of each step. Annotated starts win; else the repeating period splits
    the periodic tail, and what precedes it is cut into periods too where it divides
    evenly (a prefill step issues the same kinds of calls at other sizes), else one step."""
    n = len(ids)
    if starts:
        bounds = sorted(set(s for s in starts if 0 <= s < n))
        if bounds and bounds[0] != 0:
            bounds.insert(0, 0)
        return [(b, e) for b, e in zip(bounds, [*bounds[1:], n], strict=True)]
    p = find_period(ids)
    if p is None:
        return [(0, n)] if n else []
    i = n - 1
    while i - p >= 0 and ids[i] == ids[i - p]:
        i -= 1
    tail_start = i + 1 - p
    tail_start += (n - tail_start) % p  # whole periods only
    head = tail_start
    steps = [(b, b + p) for b in range(tail_start, n, p)]
    if head == 0:
        return steps
    if head % p == 0:
        return [(b, b + p) for b in range(0, head, p)] + steps
    return [(0, head), *steps]


def fold(ids: Sequence[int], steps: list[tuple[int, int]]) -> list[tuple[tuple[int, ...], int]]:
    """Consecutive equal steps as (call ids of the step, repeat)."""
    runs: list[tuple[tuple[int, ...], int]] = []
    view = ids if isinstance(ids, array) else list(ids)
    for begin, end in steps:
        step = tuple(view[begin:end])
        if runs and runs[-1][0] == step:
            runs[-1] = (step, runs[-1][1] + 1)
        else:
            runs.append((step, 1))
    return runs
