"""SGLang's scheduler over a request workload.

Follows sgl-project/sglang @ 8905cbd4 (modal-projects/sglang), `python/sglang/srt/managers/
scheduler.py`: `get_next_batch_to_run` (2687-2822) builds a prefill (extend) batch first
("Run prefill first if possible") and runs the decode batch of every running request only
when there is none; `_get_new_batch_prefill_raw` (2850-3108) returns none when nothing waits
and no request is chunked, or when running_bs = len(running_batch.reqs) reaches
max_running_requests (`get_num_allocatable_reqs`, 2824-2827), else fills a `PrefillAdder`
(`managers/schedule_policy.py`) whose token budget is chunked_prefill_size less, with
`--enable-mixed-chunk`, one token per running request (`running_bs if self.is_mixed_chunk
else 0`): the chunked request's next chunk first (`add_chunked_req`), then waiting requests
in policy order, the last one cut to the budget left and kept as the new chunked request.
With mixed chunks the decode batch rides in the same forward pass (`mix_with_running`);
without (the default) the running requests wait while a prefill batch runs. Finished
prompts join the running batch at the next schedule (`merge_batch`, 2738-2764).

Finished requests leave the running batch late. `filter_batch` (`schedule_batch.py:
2857-2873`) drops the requests whose result marked them finished, and runs only where the
last extend batch is merged (2753-2764), on the mixed path (3092-3103) and in
`update_running_batch` (3140-3227), the decode path, which comes after the prefill was
tried. So a request that finished in a decode batch still counts in running_bs when the next
prefill is tried: a freed --max-running-requests slot is taken one step later.
The overlap scheduler, on by default (`event_loop_overlap`, 1554-1626; off with
`--disable-overlap-schedule`, `event_loop_normal`, 1520-1551), launches batch n + 1 before it
processes the result of batch n (`pop_and_process` after `run_batch`), so a request whose
last token comes in batch n is not yet known finished when batch n + 1 is built: it rides
that decode (or mixed) batch, its tokens thrown away, and holds its slot a further step; a
schedule that finds nothing to run processes the last result at once. Here: a request is
known finished once the step of its last token is processed (the step before under
`--disable-overlap-schedule`, two before with overlap, or at an empty schedule).

Schedule policy: fcfs, SGLang's default (`server_args.py:737-751` @ 8905cbd4), arrival
order. max_running_requests defaults to what KV memory allows, here unbounded unless given
(`--max-num-seqs`), and to 48 with speculative decoding (`arg_groups/speculative_hook.py`
507-511 `_handle_eagle_family`, 659-663 `_handle_ngram`: "Max running requests is reset to
48 for speculative decoding"). Not modelled:
retraction when the KV pool is full, max_prefill_tokens (16384 by default, above the chunk
size), page-size alignment of a chunk (page size 1 by default),
SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP (off by default).
"""

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from patterns.workload.requests import Request
from patterns.workload.schedule import (
    Schedule,
    SegmentList,
    Span,
    StepShape,
    arrival_steps,
    decode_steps_of,
)


@dataclass
class _Req:
    index: int
    prompt_left: int
    steps_left: int  # decode steps still to yield tokens
    done_at: int = -1  # issued step of its last token; -1 while it has more


def schedule_sglang(requests: Sequence[Request], step_time_s: float | None, chunk_size: int,
                    mixed: bool = False, max_running: int | None = None,
                    spec_tokens: int = 0, accepted: float = 1.0,
                    overlap: bool = True) -> Schedule:
    """`overlap`: SGLang's overlap scheduler (its default); False is
    `--disable-overlap-schedule`."""
    per_decode = 1 + spec_tokens
    cap = max_running if max_running is not None else len(requests)
    arrivals = arrival_steps(requests, step_time_s)
    spans = [Span(a) for a in arrivals]
    running: list[_Req] = []  # the running batch: decoding, or finished and not yet filtered
    last_extend: list[_Req] = []  # the requests of the last batch when it was an extend
    chunked: _Req | None = None
    waiting: deque[int] = deque()
    out = SegmentList()
    processed = -1  # the last issued step whose result the scheduler has read
    clock, nxt, n = 0, 0, len(requests)
    resumes: list[tuple[int, int]] = []  # (issued step, its clock) after each idle gap
    next_clock = -1

    def known(r: _Req) -> bool:
        return 0 <= r.done_at <= processed

    while nxt < n or waiting or running or chunked:
        while nxt < n and arrivals[nxt] <= clock:
            waiting.append(nxt)
            spans[nxt].waited_steps = -out.next
            nxt += 1
        if last_extend:  # merge_batch after filter_batch of the last extend batch
            gone = {id(r) for r in last_extend if known(r)}
            running = [r for r in running if id(r) not in gone]
            last_extend = []
        if not (running or waiting or chunked):
            clock = arrivals[nxt]
            continue
        chunks: list[tuple[_Req, int]] = []
        if chunked is not None or (waiting and len(running) < cap):
            budget = chunk_size - (len(running) * per_decode if mixed else 0)
            if chunked is not None and budget > 0:
                take = min(chunked.prompt_left, budget)
                chunks.append((chunked, take))
                budget -= take
            while (waiting and budget > 0 and len(running) + len(chunks) < cap
                   and (not chunks or chunks[-1][1] == chunks[-1][0].prompt_left)):
                i = waiting.popleft()
                spans[i].waited_steps += out.next
                entry = _Req(i, requests[i].prompt, decode_steps_of(requests[i].output,
                                                                     accepted))
                take = min(entry.prompt_left, budget)
                chunks.append((entry, take))
                budget -= take
        decodes: list[_Req] = []
        counted = len(running)  # running_bs of this step's prefill try
        if not chunks or mixed:  # update_running_batch / the mixed path filter first
            running = [r for r in running if not known(r)]
            decodes = running
        if not (chunks or decodes):  # nothing to run: the last result is read at once
            processed = out.next - 1
            continue
        repeat = 1
        # Equal decode steps follow while the running batch and the next prefill try stay
        # the same: none finished, none filtered here with requests waiting on the cap.
        if (not chunks and all(r.done_at < 0 for r in decodes)
                and not (waiting and counted != len(decodes))):
            repeat = min(r.steps_left for r in decodes)
            if nxt < n:
                repeat = min(repeat, arrivals[nxt] - clock)
        finished = [e for e, take in chunks if take == e.prompt_left]
        shape = StepShape(sum(t for _, t in chunks), len(chunks), len(decodes), per_decode,
                          len(finished) + len(decodes))
        start = out.add(shape, repeat)
        if clock != next_clock:
            resumes.append((start, clock))
        next_clock = clock + repeat
        for entry, take in chunks:
            spans[entry.index].add(spans[entry.index].prefill, start, start + 1)
            entry.prompt_left -= take
            if not entry.prompt_left and not entry.steps_left:
                entry.done_at = start
        for r in decodes:
            if r.done_at >= 0:
                continue  # rides the batch, finished: its tokens are thrown away
            spans[r.index].add(spans[r.index].decode, start, start + repeat, contiguous=mixed)
            r.steps_left -= repeat
            if not r.steps_left:
                r.done_at = start + repeat - 1
        chunked = next((e for e, _ in chunks if e.prompt_left), None)
        running += finished
        if chunks:
            last_extend = finished + (decodes if mixed else [])
        clock += repeat
        processed = out.next - 1 - (1 if overlap else 0)
    return Schedule("sglang", tuple(out.segments), tuple(spans), step_time_s or 0.0, clock,
                    decode_in_mixed=mixed, resumes=tuple(resumes))
