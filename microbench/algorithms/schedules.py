"""All-reduce algorithms as schedules of point-to-point steps, one list of steps per rank.

A schedule is pure data: which peer each step sends to and receives from, which element
range of the buffer goes out and which comes in, and whether what comes in is added to the
buffer (a reduce step) or copied over it (a gather step). The same schedules are executed
over every backend (microbench/algorithms/execute.py) and priced by the alpha-beta model
(microbench/analysis/algo_costs.py), so what is timed is what is priced.

- ring: reduce-scatter then all-gather around the ring, n-1 steps each, a chunk of
  about 1/n of the vector per step (Patarasuk & Yuan 2009; NCCL's ring).
- recursive doubling: log2(p) steps exchanging the whole vector with the rank at distance
  1, 2, 4, ... (Thakur, Rabenseifner & Gropp 2005, section 4.4). A group that is not a power
  of two first folds: of the first 2r ranks (r = p - p'), each even rank sends its vector to
  the odd rank after it and sits out; the odd ranks and the rest (p' of them) run the power
  of two; at the end each odd rank sends the result back to its even partner.
- rabenseifner: the same fold, then a reduce-scatter by recursive halving (the partner at
  distance p'/2, p'/4, ... receives the half it keeps) and an all-gather by recursive
  doubling (the reverse), 2 log2(p') steps moving 2 (p'-1)/p' of the vector in all.
- hierarchical (NVRAR, Singh et al. 2025): within each node a ring reduce-scatter over the
  node's L ranks; across nodes recursive doubling of each shard among the N ranks that hold
  it (the same local index on every node); within each node a ring all-gather.
"""

from __future__ import annotations

from dataclasses import dataclass

ALGORITHMS = ("library", "ring", "recursive-doubling", "rabenseifner", "hierarchical")

Span = tuple[int, int]  # (first element, element count)


@dataclass(frozen=True)
class Step:
    """One point-to-point step of one rank; peers are indices into the group, None = none.

    `local` is True when send and receive peers are on this rank's node (for pricing)."""

    send_to: int | None
    send: Span
    recv_from: int | None
    recv: Span
    reduce: bool  # add what arrives into `recv` (else copy it there)
    local: bool = True


def split(span: Span, parts: int) -> list[Span]:
    """`parts` contiguous spans covering `span`, the first count % parts one element longer."""
    start, count = span
    base, extra = divmod(count, parts)
    out, at = [], start
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append((at, size))
        at += size
    return out


def _join(spans: list[Span]) -> Span:
    return (spans[0][0], sum(c for _, c in spans))


def ring_reduce_scatter(members: list[int], me: int, chunks: list[Span],
                        local: bool = True) -> list[Step]:
    """n-1 steps; afterwards members[i] holds the full sum of chunks[(i + 1) % n]."""
    n, i = len(members), members.index(me)
    nxt, prv = members[(i + 1) % n], members[(i - 1) % n]
    return [Step(nxt, chunks[(i - s) % n], prv, chunks[(i - s - 1) % n], True, local)
            for s in range(n - 1)]


def ring_all_gather(members: list[int], me: int, chunks: list[Span],
                    local: bool = True) -> list[Step]:
    """n-1 steps, starting from members[i] holding chunks[(i + 1) % n]."""
    n, i = len(members), members.index(me)
    nxt, prv = members[(i + 1) % n], members[(i - 1) % n]
    return [Step(nxt, chunks[(i + 1 - s) % n], prv, chunks[(i - s) % n], False, local)
            for s in range(n - 1)]


def ring(n: int, me: int, numel: int) -> list[Step]:
    members, chunks = list(range(n)), split((0, numel), n)
    return ring_reduce_scatter(members, me, chunks) + ring_all_gather(members, me, chunks)


def _pof2(p: int) -> int:
    return 1 << (p.bit_length() - 1)


def _fold(members: list[int], me: int, span: Span, local: bool
          ) -> tuple[list[Step], list[Step], int | None]:
    """(steps before, steps after, this rank's index among the power of two or None)."""
    p = len(members)
    i = members.index(me)
    rem = p - _pof2(p)
    if i < 2 * rem:
        if i % 2 == 0:  # sends its vector on, sits out, gets the result back
            partner = members[i + 1]
            return ([Step(partner, span, None, (0, 0), False, local)],
                    [Step(None, (0, 0), partner, span, False, local)], None)
        partner = members[i - 1]
        return ([Step(None, (0, 0), partner, span, True, local)],
                [Step(partner, span, None, (0, 0), False, local)], i // 2)
    return [], [], i - rem


def _real(members: list[int], new: int) -> int:
    """The member behind index `new` of the power of two (the fold's inverse)."""
    rem = len(members) - _pof2(len(members))
    return members[2 * new + 1 if new < rem else new + rem]


def recursive_doubling_on(members: list[int], me: int, span: Span,
                          local: bool = True) -> list[Step]:
    before, after, new = _fold(members, me, span, local)
    steps = list(before)
    if new is not None:
        mask = 1
        while mask < _pof2(len(members)):
            peer = _real(members, new ^ mask)
            steps.append(Step(peer, span, peer, span, True, local))
            mask <<= 1
    return steps + after


def recursive_doubling(n: int, me: int, numel: int) -> list[Step]:
    return recursive_doubling_on(list(range(n)), me, (0, numel))


def rabenseifner(n: int, me: int, numel: int) -> list[Step]:
    members, span = list(range(n)), (0, numel)
    before, after, new = _fold(members, me, span, True)
    steps = list(before)
    if new is not None:
        pof2 = _pof2(n)
        chunks = split(span, pof2)
        lo, hi, mask = 0, pof2, pof2 // 2
        while mask:  # recursive halving: keep the half this index's bit names
            peer, mid = _real(members, new ^ mask), (lo + hi) // 2
            keep, give = ((mid, hi), (lo, mid)) if new & mask else ((lo, mid), (mid, hi))
            steps.append(Step(peer, _join(chunks[give[0]:give[1]]), peer,
                              _join(chunks[keep[0]:keep[1]]), True))
            lo, hi = keep
            mask //= 2
        mask = 1  # now holds chunk `new` summed; recursive doubling gathers the rest
        while mask < pof2:
            peer_new = new ^ mask
            mine, theirs = (new // mask) * mask, (peer_new // mask) * mask
            steps.append(Step(_real(members, peer_new), _join(chunks[mine:mine + mask]),
                              _real(members, peer_new), _join(chunks[theirs:theirs + mask]),
                              False))
            mask <<= 1
    return steps + after


def node_layout(nodes: list[int]) -> tuple[list[list[int]], int]:
    """Group indices per node (in order of first appearance) and ranks per node; raises
    ValueError unless every node has the same number of the group's ranks."""
    order = list(dict.fromkeys(nodes))
    per_node = [[i for i, n in enumerate(nodes) if n == node] for node in order]
    sizes = sorted({len(m) for m in per_node})
    if len(sizes) != 1:
        raise ValueError(f"hierarchical needs the same number of the group's ranks on every "
                         f"node; this group has {', '.join(str(len(m)) for m in per_node)}")
    return per_node, sizes[0]


def hierarchical(n: int, me: int, numel: int, nodes: list[int]) -> list[Step]:
    """`nodes[i]` is the node of group index i."""
    per_node, local = node_layout(nodes)
    mine = next(m for m in per_node if me in m)
    li = mine.index(me)
    chunks = split((0, numel), local)
    shard = chunks[(li + 1) % local]  # what the ring reduce-scatter leaves on this rank
    across = [m[li] for m in per_node]
    return (ring_reduce_scatter(mine, me, chunks)
            + (recursive_doubling_on(across, me, shard, local=False)
               if len(across) > 1 else [])
            + ring_all_gather(mine, me, chunks))


def schedule(algo: str, n: int, me: int, numel: int,
             nodes: list[int] | None = None) -> list[Step]:
    if n == 1:
        return []
    if algo == "ring":
        return ring(n, me, numel)
    if algo == "recursive-doubling":
        return recursive_doubling(n, me, numel)
    if algo == "rabenseifner":
        return rabenseifner(n, me, numel)
    if algo == "hierarchical":
        return hierarchical(n, me, numel, nodes if nodes is not None else [0] * n)
    raise ValueError(f"unknown all-reduce algorithm {algo!r}")
