"""Which DP rank each request of a workload goes to, as the engine's front end routes it.

- vLLM (`--dp-routing least-loaded`, its default): `DPLBAsyncMPClient.
  get_core_engine_for_request` (`v1/engine/core_client.py:1468-1519` @ c8109375, one API
  server: client_count 1, client_index 0) scores each engine max(its in-flight requests,
  the coordinator's waiting + running plus those routed since), scans the engines from
  `eng_start_index`, takes the first of least score, then moves `eng_start_index` on by
  one (ties go round-robin). In flight: routed and not yet seen finished
  (`process_engine_outputs`, `:1533-1539`). Here a request is seen finished once the
  output of its last step is out: the end of that step, one step later under async
  scheduling (its batch queue processes step n's output in step n + 1); each engine's
  scheduler runs alongside the routing (`RankScheduler`), so an engine's finished
  requests are those of its own schedule. Not modelled: the coordinator's snapshot
  (published every 100 ms; it can only raise a score by the requests an engine finished
  since it, `score = max(inflight, waiting + running)`), and the KV-cache penalty on
  waiting requests above 50% usage (`:1494-1501`; KV space is not modelled).
- SGLang (`round-robin`, its default): `DataParallelController.round_robin_scheduler`
  (`managers/data_parallel_controller.py:749-768` @ 8905cbd4), the `auto` load-balance
  method outside PD disaggregation (`server_args.py:3164-3179`): request i to DP rank
  i mod dp in arrival order. Its load-aware methods (total_requests, total_tokens) read the
  schedulers' load snapshots and are not modelled.
- `round-robin` under vLLM: request i to DP rank i mod dp, what least-loaded gives when
  every request arrives at once.
"""

import heapq
from collections.abc import Sequence
from typing import Protocol

from patterns.errors import ConfigError

ROUTINGS = ("least-loaded", "round-robin")
DEFAULT_ROUTING = {"vllm": "least-loaded", "sglang": "round-robin"}


class RankScheduler(Protocol):
    """A DP rank's scheduler that can be given requests while it runs (VllmScheduler)."""

    finished_at: dict[int, int]  # request -> clock step of its last token's step

    def add(self, r: int) -> None: ...

    def advance(self, horizon: int | None) -> None: ...


def routing_for(engine: str, routing: str | None) -> str:
    chosen = routing or DEFAULT_ROUTING[engine]
    if chosen not in ROUTINGS:
        raise ConfigError(f"dp-routing {chosen!r} is not a routing; use one of "
                          f"{', '.join(ROUTINGS)}")
    if engine == "sglang" and chosen != "round-robin":
        raise ConfigError("dp-routing least-loaded is vLLM's front end; SGLang's load-aware "
                          "methods (total_requests, total_tokens) read its schedulers' load "
                          "snapshots, which is not modelled: use round-robin, SGLang's default")
    return chosen


def round_robin(count: int, dp: int) -> list[int]:
    """DP rank of each request, in arrival order."""
    return [i % dp for i in range(count)]


def least_loaded(arrivals: Sequence[int], schedulers: Sequence[RankScheduler],
                 lag: int) -> list[int]:
    """vLLM's rule (module doc): the DP rank of each request, `arrivals` its clock steps in
    arrival order; each chosen scheduler is given the request, every scheduler run up to
    each arrival first. `lag`: steps after a request's last step before the front end sees
    it finished (1 under async scheduling)."""
    dp = len(schedulers)
    rank_of = [0] * len(arrivals)
    inflight = [0] * dp
    seen: list[list[tuple[int, int]]] = [[] for _ in range(dp)]  # heaps of (seen at, r)
    pending: list[list[int]] = [[] for _ in range(dp)]  # routed, last step not yet known
    start = 0  # eng_start_index
    i = 0
    while i < len(arrivals):
        now = arrivals[i]
        for d, scheduler in enumerate(schedulers):
            scheduler.advance(now)
            left = []
            for r in pending[d]:
                end = scheduler.finished_at.get(r)
                if end is None:
                    left.append(r)
                else:
                    heapq.heappush(seen[d], (end + 1 + lag, r))
            pending[d] = left
            while seen[d] and seen[d][0][0] <= now:
                heapq.heappop(seen[d])
                inflight[d] -= 1
        while i < len(arrivals) and arrivals[i] == now:  # every request of this step
            best, chosen = None, 0
            for k in range(dp):
                d = (start + k) % dp
                if best is None or inflight[d] < best:
                    best, chosen = inflight[d], d
            start = (start + 1) % dp
            inflight[chosen] += 1
            pending[chosen].append(i)
            schedulers[chosen].add(i)
            rank_of[i] = chosen
            i += 1
    return rank_of
