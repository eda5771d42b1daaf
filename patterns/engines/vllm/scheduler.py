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

Async scheduling (vLLM's default: `config/vllm.py:1095-1143` @ c8109375 turns it on unless
speculation is ngram, a pooling model or an executor without it; `platforms/cpu.py:142-144`
turns it off on CPUs; `--no-async-scheduling` turns it off). The engine core then keeps two
batches in flight (`config/vllm.py:539-549` max_concurrent_batches 2 at pp 1;
`v1/engine/core.py:625-741` step_with_batch_queue): `schedule()` of step n + 1 runs before
`update_from_output()` of step n, so a request that samples its last token in step n is still
in RUNNING at step n + 1. `Scheduler.schedule()` (`v1/core/sched/scheduler.py:485-502`)
skips it there when its placeholders show step n reaches max_tokens even with every draft
rejected (num_computed_tokens + 2 - num_output_placeholders >= prompt + max_tokens), but it
still counts in len(self.running) against max_num_seqs when WAITING requests are admitted
(`scheduler.py:687-691`): a freed slot is taken one step later than under the synchronous
scheduler. With k speculative tokens the check holds only when step n must yield a single
token; a request whose last verify must yield more (mean acceptance: output - 1 - (steps - 1)
x a > 1) is verified once more in step n + 1, with its drafter passes, and that step's
tokens are thrown away (`AsyncScheduler._update_after_schedule`, `async_scheduler.py:19-49`:
1 + k placeholders a verify). A step in which nothing is scheduled (every running request
skipped) issues no calls (`v1/worker/gpu/model_runner.py` returns at once on 0 tokens) and
takes no clock here; its update frees the slots and the next schedule admits.

pad_spec_decode (`scheduler.py:864-897, 1076-1079` @ c8109375): with speculative decoding,
a WAITING request whose prompt is one token, admitted while RUNNING decodes were scheduled
and no RUNNING prompt chunk, is given 1 + k tokens (k placeholder drafts) so the step stays
a uniform decode; it is left waiting rather than scheduled unpadded when the budget has no
1 + k tokens left. Its logits are then taken for 1 + k rows, as a verify's.

Automatic prefix caching (`patterns/workload/prefix.py`): a WAITING request whose prompt
shares a prefix with requests scheduled before it (in an earlier step, or earlier in this one)
starts with whole cached blocks of it and is scheduled only the rest.

Not modelled (each refused or said): shared prefixes a trace does not name (Mooncake's hash_ids
are ignored), preemption for KV-cache space (the cache is taken to be large enough),
long_prefill_token_threshold (0 by default: no cap), and the priority policy.

Cost: a step is simulated one by one only while the batch changes (a prompt chunk, an
arrival, a request finishing); a run of equal decode steps is one jump of
min(steps left of the running requests, steps to the next arrival). Each decoding request's
last step is known when its prompt ends, so a jump costs O(log running): generation is
O((requests + runs) log requests) and does not grow with output lengths.
"""

from collections import deque
from collections.abc import Sequence
from heapq import heappop, heappush

from patterns.errors import ConfigError
from patterns.workload.prefix import PrefixCache
from patterns.workload.requests import Request
from patterns.workload.schedule import (
    Schedule,
    SegmentList,
    Span,
    StepShape,
    arrival_steps,
    decode_steps_of,
)


def wasted_verify(output: int, accepted: float) -> bool:
    """Async scheduling: whether a request's last verify must yield more than one token, so
    that the scheduler, not yet knowing it finished, verifies it once more. Before its last
    of s = ceil((output - 1) / a) decode steps it holds 1 + (s - 1) a tokens (mean
    acceptance), so the last must yield output - 1 - (s - 1) a; without speculation (a = 1)
    that is always 1."""
    steps = decode_steps_of(output, accepted)
    return steps > 0 and output - 1 - (steps - 1) * accepted > 1 + 1e-9


def schedule_vllm(requests: Sequence[Request], step_time_s: float | None, max_num_seqs: int,
                  max_batched_tokens: int, spec_tokens: int = 0,
                  accepted: float = 1.0, async_scheduling: bool = False,
                  prefix: PrefixCache | None = None) -> Schedule:
    """The steps vLLM V1 runs for `requests` (sorted by arrival).

    `spec_tokens` k and `accepted` (mean tokens a verify step yields, 1 <= a <= k + 1): each
    decode step of a request verifies 1 + k tokens, and a request needs
    ceil((output - 1) / a) of them. `async_scheduling`: see the module's docstring; False
    is the synchronous scheduler (`--no-async-scheduling`). `prefix`: the prefix cache
    (None: prefix caching off, every prompt token computed).

    RUNNING is kept as what the schedule needs of it: the decoding requests (each scheduled
    every step: a heap of the issued step each leaves at) and at most one request whose
    prompt is cut, last in RUNNING order. A step whose decodes (1 + k tokens each) overrun
    the budget, where vLLM would leave a running request out, is refused when it comes, not
    up front: max_num_seqs x (1 + k) above the budget is a legal configuration (k = 8 at
    vLLM's defaults, 1024 x 9 > 8192) as long as that many never decode at once.
    """
    scheduler = VllmScheduler(requests, arrival_steps(requests, step_time_s), max_num_seqs,
                              max_batched_tokens, spec_tokens, accepted, async_scheduling,
                              prefix)
    for i in range(len(requests)):
        scheduler.add(i)
    scheduler.advance(None)
    return scheduler.schedule(step_time_s)


class VllmScheduler:
    """`schedule_vllm`'s scheduler, resumable: the requests it is given (`add`, in arrival
    order, indices into `requests`) are scheduled up to a clock step (`advance`), so that a
    front end can route each request knowing what every DP rank has finished by its arrival
    (patterns/workload/dp_routing.py). `finished_at[r]`: the clock step at whose end request
    r's last token is sampled (the end of its last step), once its prompt is done."""

    def __init__(self, requests: Sequence[Request], arrivals: Sequence[int], max_num_seqs: int,
                 max_batched_tokens: int, spec_tokens: int = 0, accepted: float = 1.0,
                 async_scheduling: bool = False, prefix: PrefixCache | None = None) -> None:
        self.requests, self.arrivals = requests, arrivals
        self.max_num_seqs, self.max_batched_tokens = max_num_seqs, max_batched_tokens
        self.spec_tokens, self.accepted = spec_tokens, accepted
        self.async_scheduling, self.prefix = async_scheduling, prefix
        self.own: list[int] = []  # the requests given, in arrival order
        self.spans: dict[int, Span] = {}
        self.finished_at: dict[int, int] = {}
        self.decoders: list[tuple[int, int]] = []  # heap of (issued step it is gone at, r)
        self.partial: tuple[int, int] | None = None  # (request, prompt tokens left)
        self.waiting: deque[int] = deque()
        # Async: finished requests still in RUNNING (skipped) at the issued step of the key.
        self.lingering: dict[int, int] = {}
        self.out = SegmentList()
        self.clock = self.nxt = 0
        self.resumes: list[tuple[int, int]] = []  # (issued step, its clock) after each gap
        self._next_clock = -1  # the clock the next issued step runs at without a gap

    def add(self, r: int) -> None:
        self.own.append(r)
        self.spans[r] = Span(self.arrivals[r])

    def schedule(self, step_time_s: float | None) -> Schedule:
        return Schedule("vllm", tuple(self.out.segments),
                        tuple(self.spans[r] for r in self.own), step_time_s or 0.0,
                        self.clock, resumes=tuple(self.resumes))

    def busy(self) -> bool:
        return bool(self.decoders or self.partial or self.waiting)

    def advance(self, horizon: int | None) -> None:
        """Issue every step that starts before clock step `horizon` (None: all of them):
        no request given later arrives before it."""
        requests, arrivals, own = self.requests, self.arrivals, self.own
        per_decode = 1 + self.spec_tokens
        spans, decoders, waiting, out = self.spans, self.decoders, self.waiting, self.out
        prefix, max_num_seqs = self.prefix, self.max_num_seqs
        while horizon is None or self.clock < horizon:
            i, clock, n = out.next, self.clock, len(own)
            while decoders and decoders[0][0] <= i:  # sampled its last token in step i - 1
                heappop(decoders)
            held = self.lingering.pop(i, 0)
            while self.nxt < n and arrivals[own[self.nxt]] <= clock:
                waiting.append(own[self.nxt])
                spans[own[self.nxt]].waited_steps = -i  # completed when it first runs
                self.nxt += 1
            if not (decoders or self.partial or waiting):
                if self.nxt < n:  # idle until the next arrival: no step issued
                    self.clock = arrivals[own[self.nxt]]
                    continue
                if horizon is not None:  # nothing before the horizon: wait there
                    self.clock = horizon
                break
            self._step(i, clock, held, per_decode, spans, decoders, waiting, out, prefix,
                       max_num_seqs, requests, arrivals, horizon)

    def _step(self, i: int, clock: int, held: int, per_decode: int, spans: dict[int, Span],
              decoders: list[tuple[int, int]], waiting: deque[int], out: SegmentList,
              prefix: PrefixCache | None, max_num_seqs: int, requests: Sequence[Request],
              arrivals: Sequence[int], horizon: int | None) -> None:
        """One schedule() at issued step i, clock step `clock` (the loop's body)."""
        partial, accepted, async_scheduling = self.partial, self.accepted, self.async_scheduling
        spec_tokens, max_batched_tokens = self.spec_tokens, self.max_batched_tokens
        lingering = self.lingering
        # RUNNING in order: the decodes (1 + k tokens each), then the cut prompt's next chunk.
        budget = max_batched_tokens - len(decoders) * per_decode
        if budget < (partial is not None):
            raise ConfigError(f"step {i}: {len(decoders)} requests decode {per_decode} tokens "
                              f"each{' and a prompt is cut' if partial else ''}, beyond "
                              f"max-batched-tokens({max_batched_tokens}): vLLM leaves a "
                              "running request out of the step, which is not modelled; raise "
                              "--max-batched-tokens or lower --max-num-seqs")
        chunks: list[tuple[int, int, int]] = []  # (request, tokens, prompt tokens left)
        if partial is not None:
            take = min(partial[1], budget)
            chunks.append((partial[0], take, partial[1] - take))
            budget -= take
            if prefix is not None:  # its blocks are cached as they are scheduled
                r = requests[partial[0]]
                prefix.computed(r.prefix_id, r.prefix_tokens, r.prompt - partial[1] + take)
        running = len(decoders) + (partial is not None) + held
        if not (decoders or partial) and waiting and running >= max_num_seqs:
            # Every slot is held by a finished request: this schedule is empty, its update
            # frees them, and the next schedule (the same issued step) admits.
            running -= held
        # pad_spec_decode: with running decodes and no running prompt chunk, a 1-token
        # prompt is scheduled as 1 + k tokens, keeping the batch a uniform decode.
        pad_spec = spec_tokens > 0 and bool(decoders) and partial is None
        padded = 0
        while waiting and budget > 0 and running < max_num_seqs:  # then WAITING, FCFS
            r = waiting[0]
            pads = pad_spec and requests[r].prompt == 1
            if pads and per_decode > budget:
                break  # "Prefer to not schedule than schedule un-padded here."
            waiting.popleft()
            spans[r].waited_steps += i
            running += 1
            # whole cached blocks of a prefix an earlier request computed are not computed
            req = requests[r]
            cached = prefix.hit(req.prefix_id, req.prefix_tokens, req.prompt) if prefix else 0
            take = per_decode if pads else min(req.prompt - cached, budget)
            chunks.append((r, take, 0 if pads else req.prompt - cached - take))
            if prefix is not None:
                prefix.computed(req.prefix_id, req.prefix_tokens, cached + take)
            padded += pads
            budget -= take
        # Equal decode-only steps follow until a request ends or one arrives (it might join).
        repeat = 1
        if not chunks and not (held and waiting):  # a held slot frees at the next step
            repeat = decoders[0][0] - i
            if self.nxt < len(self.own):
                repeat = min(repeat, arrivals[self.own[self.nxt]] - clock)
            if horizon is not None:  # a request routed later may arrive there
                repeat = min(repeat, horizon - clock)
        done = sum(1 for _, _, left in chunks if not left)
        shape = StepShape(sum(take for _, take, _ in chunks), len(chunks), len(decoders),
                          per_decode, done + len(decoders), padded)
        start = out.add(shape, repeat)
        if clock != self._next_clock:
            self.resumes.append((start, clock))
        self._next_clock = clock + repeat
        partial = None
        for r, _, left in chunks:
            spans[r].add(spans[r].prefill, start, start + 1)
            if left:
                partial = (r, left)
                continue
            steps = decode_steps_of(requests[r].output, accepted)
            self.finished_at[r] = clock + steps  # its last token's step (running: no gap)
            if steps:  # it decodes in every step from the next one on
                spans[r].decode = [start + 1, start + 1 + steps]
            if async_scheduling and wasted_verify(requests[r].output, accepted):
                steps += 1  # verified once more, its tokens thrown away
            elif async_scheduling:  # skipped, but in RUNNING, the step after its last
                lingering[start + 1 + steps] = lingering.get(start + 1 + steps, 0) + 1
            if steps:
                heappush(decoders, (start + 1 + steps, r))
        self.partial = partial
        self.clock = clock + repeat
