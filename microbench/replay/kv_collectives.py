"""`replay --disagg ... --with-collectives`: each side's collectives beside the KV transfer.

The job's ranks are the prefill side's TP ranks, then the decode side's (replay/kv_transfer.py).
Each side's pattern is bound to its ranks through `SideBackend`, which shows the side's own
rank numbers to the replay's plan builder and shifts them into the job's when it makes a
group. Every rank of the job creates both sides' groups, prefill side first, in one order, as
torch.distributed requires of every new_group; then binds only its own side's calls.

One iteration, each part between barriers so that each is timed alone: the prefill ranks
issue their prefill step's collectives (the calls under the request's TTFT on the prefill
side), then every rank its part of the KV transfer, then the decode ranks their first decode
step. The request's communication under TTFT is the prefill collectives plus the transfer.
"""

import time
from typing import Any

from microbench.replay.plan import Plan, build_plan, make_groups
from patterns import Phase
from patterns.disagg import DisaggPattern


class SideBackend:
    """The job's backend as one side sees it: ranks 0..world-1 of that side."""

    def __init__(self, base: Any, offset: int, world: int, prefix: str) -> None:
        self._base, self._offset, self._prefix = base, offset, prefix
        self.world_size = world

    @property
    def rank(self) -> int:  # outside 0..world-1 on the other side's ranks: in no group
        return int(self._base.rank) - self._offset

    def new_group(self, name: str, ranks: list[int]) -> Any:
        return self._base.new_group(f"{self._prefix}{name}", [r + self._offset for r in ranks])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def side_plan(d: DisaggPattern, backend: Any) -> tuple[str, Plan]:
    """This rank's side and its bound calls; every rank creates both sides' groups."""
    prefill_world = d.disagg.prefill.world_size
    sides = [("prefill", d.prefill, SideBackend(backend, 0, prefill_world, "prefill-")),
             ("decode", d.decode, SideBackend(backend, prefill_world,
                                              d.disagg.decode.world_size, "decode-"))]
    made = [(name, pattern, view, make_groups(pattern, view)) for name, pattern, view in sides]
    name, pattern, view, groups = made[0] if backend.rank < prefill_world else made[1]
    return name, build_plan(pattern, view, groups)


def side_calls(side: str, plan: Plan) -> list[Any]:
    """The calls a side times: the prefill side's prefill step(s), the decode side's first
    decode step."""
    if side == "prefill":
        return [call for run in plan.runs if run.phase == Phase.PREFILL
                for _ in range(run.repeat) for call in run.calls]
    first = next((run for run in plan.runs if run.phase == Phase.DECODE), None)
    return list(first.calls) if first is not None else []


def timed_iterations(side: str, calls: list[Any], transport: Any, backend: Any, warmup: int,
                     iters: int, watchdog: Any) -> tuple[list[float], list[float], list[float]]:
    """Per timed iteration (us): this rank's prefill collectives (0 on a decode rank), its
    part of the transfer, and its first decode step (0 on a prefill rank)."""
    prefill, transfer, decode = [], [], []
    for i in range(warmup + iters):
        watchdog.where = f"{'warm-up' if i < warmup else 'timed'} iteration {i + 1}"
        parts = []
        for part in ("prefill", "transfer", "decode"):
            backend.barrier()
            start = time.perf_counter()
            if part == "transfer":
                transport.transfer()
            elif part == side:
                for call in calls:
                    call()
                backend.synchronize()
            parts.append((time.perf_counter() - start) * 1e6 if part in (side, "transfer")
                         else 0.0)
        if i >= warmup:
            prefill.append(parts[0])
            transfer.append(parts[1])
            decode.append(parts[2])
        watchdog.steps += 1
    return prefill, transfer, decode
