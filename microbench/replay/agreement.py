"""Do the members of every communicator issue the same calls? Checked on a CPU, all ranks.

Every rank's plan is built from the pattern with a recording backend (no communication:
each call logs what NCCL would see on its communicator), the graphs are cut and "captured"
exactly as the replay does (`use_graphs`, whose capture here logs the warm-up as eager calls
and the captured calls as launched on every graph launch), and one inference is issued. Then,
per communicator, every member's sequence of (how issued, kind, count, dtype, root) must be
the same: NCCL requires collectives "in the same order, with the same count and datatype" on
every rank (docs/userguide/source/usage/collectives.rst @ 5067397c) and a captured call to
be captured on all of them (usage/cudagraph.rst). Point-to-point calls are checked per
(sender, receiver) pair: the sender's sends and the receiver's receives must match.
"""

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from microbench.backends import BoundCall, Group
from microbench.replay.graphs import use_graphs
from microbench.replay.plan import Plan, build_plan
from patterns import Pattern

Channel = tuple[Any, ...]  # (group name,) or (group name, sender rank, receiver rank)
Event = tuple[Any, ...]


class _Buffer:
    def __init__(self, numel: int, dtype: str) -> None:
        self.numel, self.dtype = numel, dtype


class RecordingBackend:
    """A Backend that issues nothing and logs every call on the channel it would use."""

    name = "record"
    transport = "record"
    device = "cuda"

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.log: dict[Channel, list[Event]] = defaultdict(list)
        self.members: dict[Channel, tuple[int, ...]] = {}
        self.mode = "eager"
        self._capturing: list[tuple[Channel, Event]] | None = None

    def new_group(self, name: str, ranks: list[int]) -> Group:
        index = ranks.index(self.rank) if self.rank in ranks else -1
        return Group(name, tuple(ranks), index, name)

    def empty(self, numel: int, dtype: str) -> _Buffer:
        return _Buffer(numel, dtype)

    def bind(self, kind: str, group: Group, send: Any, recv: Any,
             peer_or_root: int | None, counts: tuple[int, ...] | None = None) -> BoundCall:
        buffer = send if send is not None else recv
        if kind in ("send", "recv"):
            assert peer_or_root is not None
            me, other = group.ranks[group.index], group.ranks[peer_or_root]
            src, dst = (me, other) if kind == "send" else (other, me)
            channel: Channel = (group.name, src, dst)
            self.members[channel] = (src, dst)
            event: Event = ("p2p", buffer.numel, buffer.dtype)
        else:
            channel = (group.name,)
            self.members[channel] = group.ranks
            # Uneven all-gather/reduce-scatter: each rank sends its own part; the call
            # itself (one broadcast or reduce per rank, counts agreed) is what must match.
            size = sum(counts) if counts is not None else send.numel
            event = (kind, size, buffer.dtype, peer_or_root, counts)
        return lambda: self._record(channel, event)

    def _record(self, channel: Channel, event: Event) -> None:
        if self._capturing is not None:
            self._capturing.append((channel, event))
        else:
            self.log[channel].append((self.mode, *event))

    def capture(self, calls: list[BoundCall]) -> BoundCall:
        """What `_capture_torch`/`_capture_cupy` do on the wire: a warm-up, then a capture
        whose calls reach the communicators at every launch."""
        self.mode = "warm-up"
        for call in calls:
            call()
        self.mode, self._capturing = "eager", []
        for call in calls:
            call()
        captured, self._capturing = self._capturing, None

        def launch() -> None:
            for channel, event in captured:
                self.log[channel].append(("graph", *event))
        return launch

    def synchronize(self) -> None:
        pass


Alter = Callable[[int, Plan], None]


def rank_log(pattern: Pattern, rank: int, graphs: bool,
             alter: Alter | None = None) -> RecordingBackend:
    """One rank's calls of one inference (warm-ups and captures included), by channel."""
    backend = RecordingBackend(rank, pattern.layout.world_size)
    plan = build_plan(pattern, backend)
    if alter is not None:
        alter(rank, plan)
    if graphs:
        use_graphs(plan, backend, backend.capture)
    backend.mode = "eager"
    for run in plan.runs:
        for _ in range(run.repeat):
            for call in run.calls:
                call()
    return backend


def disagreements(pattern: Pattern, graphs: bool = True,
                  alter: Alter | None = None) -> list[str]:
    """Every communicator (or P2P pair) whose members' call sequences differ, in one line
    each: where they first differ and what each issued there. Empty when they agree."""
    logs = [rank_log(pattern, r, graphs, alter) for r in range(pattern.layout.world_size)]
    members: dict[Channel, tuple[int, ...]] = {}
    for backend in logs:
        members.update(backend.members)
    found = []
    for channel, ranks in sorted(members.items(), key=lambda kv: repr(kv[0])):
        seqs = {r: logs[r].log.get(channel, []) for r in ranks}
        first = seqs[ranks[0]]
        for r in ranks[1:]:
            if seqs[r] != first:
                at = next((i for i, (a, b) in enumerate(zip(first, seqs[r], strict=False))
                           if a != b), min(len(first), len(seqs[r])))
                found.append(f"{'/'.join(map(str, channel))}: ranks {ranks[0]} and {r} "
                             f"differ at call {at} ({len(first)} vs {len(seqs[r])} calls): "
                             f"{first[at] if at < len(first) else None} vs "
                             f"{seqs[r][at] if at < len(seqs[r]) else None}")
                break
    return found


def modes(backend: RecordingBackend) -> dict[str, set[str]]:
    """How each kind of call was issued on this rank: eager, warm-up, graph."""
    seen: dict[str, set[str]] = defaultdict(set)
    for events in backend.log.values():
        for mode, kind, *_ in events:
            seen[kind].add(mode)
    return seen
