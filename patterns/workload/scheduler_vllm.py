"""vLLM V1's scheduler over a request workload: which tokens of which requests each step runs.

Follows `Scheduler.schedule()` of vllm-project/vllm @ 00024d31
(`vllm/v1/core/sched/scheduler.py`), which has no prefill or decode phase: each step
- first takes the RUNNING requests in order ("First, schedule the RUNNING requests"): each
  gets num_tokens_with_spec - num_computed_tokens tokens (the rest of its prompt, or 1 + k
  with k speculative tokens), cut to what is left of the token budget
  (`max_num_batched_tokens`); the loop ends when the budget is spent;
- then the WAITING requests in arrival order (FCFS) while budget is left and
  len(running) < max_num_seqs ("Next, schedule the WAITING requests"): each gets
  min(prompt tokens, budget left) with chunked prefill on (V1's default), and joins RUNNING.
So decodes go first: a request whose prompt is cut spends the whole budget and is last in
RUNNING; it is finished before any later request starts. A request that samples its last
token leaves RUNNING after the step (`update_from_output`), and its place is free at the
next step.

Not modelled (each refused or said): prefix caching (hash_ids of traces ignored: every prompt
token is computed), preemption for KV-cache space (the cache is taken to be large enough),
long_prefill_token_threshold (0 by default: no cap), async scheduling's placeholders (same
token counts a step), and the priority policy.

Cost: a step is simulated one by one only while the batch changes (a prompt chunk, an
arrival, a request finishing); a run of equal decode steps is one jump of
min(steps left of the running requests, steps to the next arrival). Generation is
O(requests x running) and does not grow with output lengths.
"""

from collections import deque
from collections.abc import Sequence

from patterns.errors import ConfigError
from patterns.workload.requests import Request
from patterns.workload.schedule import (
    Schedule,
    SegmentList,
    Span,
    StepShape,
    arrival_steps,
    decode_steps_of,
)


def schedule_vllm(requests: Sequence[Request], step_time_s: float | None, max_num_seqs: int,
                  max_batched_tokens: int, spec_tokens: int = 0,
                  accepted: float = 1.0) -> Schedule:
    """The steps vLLM V1 runs for `requests` (sorted by arrival).

    `spec_tokens` k and `accepted` (mean tokens a verify step yields, 1 <= a <= k + 1): each
    decode step of a request verifies 1 + k tokens, and a request needs
    ceil((output - 1) / a) of them.
    """
    per_decode = 1 + spec_tokens
    if max_num_seqs * per_decode > max_batched_tokens:
        raise ConfigError(f"max-num-seqs({max_num_seqs}) x {per_decode} decode tokens > "
                          f"max-batched-tokens({max_batched_tokens}): a running request could "
                          "be left out of a step (not modelled); raise --max-batched-tokens")
    arrivals = arrival_steps(requests, step_time_s)
    spans = [Span(a) for a in arrivals]
    # RUNNING entries: [request index, prompt tokens left, decode steps left]
    running: list[list[int]] = []
    waiting: deque[int] = deque()
    out = SegmentList()
    clock, nxt, n = 0, 0, len(requests)
    while nxt < n or waiting or running:
        while nxt < n and arrivals[nxt] <= clock:
            waiting.append(nxt)
            spans[nxt].waited_steps = -out.next  # completed when it first runs
            nxt += 1
        if not running and not waiting:
            clock = arrivals[nxt]
            continue
        budget = max_batched_tokens
        chunks: list[tuple[list[int], int]] = []
        decodes: list[list[int]] = []
        for entry in running:
            if budget <= 0:
                break
            if entry[1]:
                take = min(entry[1], budget)
                chunks.append((entry, take))
            else:
                take = per_decode
                decodes.append(entry)
            budget -= take
        while waiting and budget > 0 and len(running) < max_num_seqs:
            i = waiting.popleft()
            entry = [i, requests[i].prompt, decode_steps_of(requests[i].output, accepted)]
            spans[i].waited_steps += out.next
            running.append(entry)
            take = min(entry[1], budget)
            chunks.append((entry, take))
            budget -= take
        # Equal decode-only steps follow until a request ends or one arrives (it might join).
        repeat = 1
        if not chunks:
            repeat = min(entry[2] for entry in decodes)
            if nxt < n:
                repeat = min(repeat, arrivals[nxt] - clock)
        finished_prompts = sum(1 for entry, take in chunks if take == entry[1])
        shape = StepShape(sum(take for _, take in chunks), len(chunks), len(decodes),
                          per_decode, finished_prompts + len(decodes))
        start = out.add(shape, repeat)
        for entry, take in chunks:
            spans[entry[0]].add(spans[entry[0]].prefill, start, start + 1)
            entry[1] -= take
        for entry in decodes:
            spans[entry[0]].add(spans[entry[0]].decode, start, start + repeat)
            entry[2] -= repeat
        running = [e for e in running if e[1] or e[2]]
        clock += repeat
    return Schedule("vllm", tuple(out.segments), tuple(spans), step_time_s or 0.0, clock)
