"""SGLang's scheduler over a request workload.

Follows sgl-project/sglang @ d51c1c21, `python/sglang/srt/managers/scheduler.py`:
`get_next_batch_to_run` builds a prefill (extend) batch first ("Run prefill first if
possible") and runs the decode batch of every running request only when there is none;
`get_new_batch_prefill` returns none when nothing waits and no request is chunked, or when
running requests reach max_running_requests, else fills a `PrefillAdder`
(`managers/schedule_policy.py`) whose token budget is chunked_prefill_size less, with
`--enable-mixed-chunk`, one token per running request (`running_bs if self.is_mixed_chunk
else 0`): the chunked request's next chunk first (`add_chunked_req`), then waiting requests
in policy order, the last one cut to the budget left and kept as the new chunked request.
With mixed chunks the decode batch rides in the same forward pass (`mix_with_running`);
without (the default) the running requests wait while a prefill batch runs. Finished
prompts join the running batch after their step (`merge_batch`).

Schedule policy: fcfs (arrival order). SGLang's default `lpm` (longest prefix match) orders
the queue by cached prefix; with prefix caching not modelled every prefix is empty, and the
queue keeps arrival order. max_running_requests defaults to what KV memory allows; here it
is unbounded unless given (`--max-num-seqs`). Not modelled: retraction when the KV pool is
full, max_prefill_tokens (16384 by default, above the chunk size), page-size alignment of
a chunk (page size 1 by default).
"""

from collections import deque
from collections.abc import Sequence

from patterns.workload.requests import Request
from patterns.workload.schedule import (
    Schedule,
    SegmentList,
    Span,
    StepShape,
    arrival_steps,
    decode_steps_of,
)


def schedule_sglang(requests: Sequence[Request], step_time_s: float | None, chunk_size: int,
                    mixed: bool = False, max_running: int | None = None,
                    spec_tokens: int = 0, accepted: float = 1.0) -> Schedule:
    per_decode = 1 + spec_tokens
    cap = max_running if max_running is not None else len(requests)
    arrivals = arrival_steps(requests, step_time_s)
    spans = [Span(a) for a in arrivals]
    running: list[list[int]] = []  # decoding: [request index, 0, decode steps left]
    chunked: list[int] | None = None  # [request index, prompt left, decode steps left]
    waiting: deque[int] = deque()
    out = SegmentList()
    clock, nxt, n = 0, 0, len(requests)
    while nxt < n or waiting or running or chunked:
        while nxt < n and arrivals[nxt] <= clock:
            waiting.append(nxt)
            spans[nxt].waited_steps = -out.next
            nxt += 1
        if not (running or waiting or chunked):
            clock = arrivals[nxt]
            continue
        chunks: list[tuple[list[int], int]] = []
        if chunked is not None or (waiting and len(running) < cap):
            budget = chunk_size - (len(running) * per_decode if mixed else 0)
            if chunked is not None and budget > 0:
                take = min(chunked[1], budget)
                chunks.append((chunked, take))
                budget -= take
            while (waiting and budget > 0 and len(running) + len(chunks) < cap
                   and (not chunks or chunks[-1][1] == chunks[-1][0][1])):
                i = waiting.popleft()
                spans[i].waited_steps += out.next
                entry = [i, requests[i].prompt, decode_steps_of(requests[i].output, accepted)]
                take = min(entry[1], budget)
                chunks.append((entry, take))
                budget -= take
        decodes = running if (not chunks or mixed) else []
        repeat = 1
        if not chunks:
            repeat = min(e[2] for e in decodes)
            if nxt < n:
                repeat = min(repeat, arrivals[nxt] - clock)
        finished = [e for e, take in chunks if take == e[1]]
        shape = StepShape(sum(t for _, t in chunks), len(chunks), len(decodes), per_decode,
                          len(finished) + len(decodes))
        start = out.add(shape, repeat)
        for entry, take in chunks:
            spans[entry[0]].add(spans[entry[0]].prefill, start, start + 1)
            entry[1] -= take
        for entry in decodes:
            spans[entry[0]].add(spans[entry[0]].decode, start, start + repeat, contiguous=mixed)
            entry[2] -= repeat
        chunked = next((e for e, _ in chunks if e[1]), None)
        running = [e for e in running if e[2]] + [e for e in finished if e[2]]
        clock += repeat
    return Schedule("sglang", tuple(out.segments), tuple(spans), step_time_s or 0.0, clock,
                    decode_in_mixed=mixed)
