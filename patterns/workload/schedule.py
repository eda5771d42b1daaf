"""What an engine's scheduler makes of a request workload: run-length steps and, per request,
the steps of its prefill chunks and of its decodes. Engine-neutral types; the schedulers are
`engines/vllm/scheduler.py` and `engines/sglang/scheduler.py`.

Compute is not modelled, so time moves in steps of a fixed length the user sets
(`--step-time-ms`): a request arriving at t seconds joins the scheduler at clock step
ceil(t / step_time); requests arriving at 0 all join the first step. While nothing runs and
nothing waits, the clock jumps to the next arrival and no step is issued.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from patterns.errors import ConfigError
from patterns.ops import Phase
from patterns.workload.requests import Request


@dataclass(frozen=True)
class StepShape:
    """What one forward pass holds: the calls of a step follow from this alone."""

    prefill_tokens: int  # prompt tokens (chunks) of the step
    prefill_seqs: int  # requests with a prompt chunk in it
    decode_seqs: int  # requests decoding (verifying 1 + k tokens each with speculation)
    decode_tokens: int  # tokens of each decoding request: 1, or 1 + k
    samples: int  # requests that sample: prompts finished here, and the decodes
    # Of the prefill requests, 1-token prompts vLLM pads to 1 + k tokens (pad_spec_decode:
    # patterns/engines/vllm/scheduler.py); their tokens are in prefill_tokens.
    padded_prompts: int = 0

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_seqs * self.decode_tokens

    @property
    def phase(self) -> Phase:
        """A step with any prompt chunk is a prefill (mixed) step; else a decode step."""
        return Phase.PREFILL if self.prefill_seqs else Phase.DECODE


@dataclass(frozen=True)
class Segment:
    shape: StepShape
    repeat: int
    start: int  # index of its first step among the issued steps


@dataclass
class Span:
    """One request's steps among the issued ones: [start, end) of its prefill chunks and of
    its decode steps (each contiguous: a running request is scheduled every step)."""

    arrival_step: int  # clock step it arrived at
    prefill: list[int] = field(default_factory=lambda: [-1, -1])
    decode: list[int] = field(default_factory=lambda: [-1, -1])
    waited_steps: int = 0  # issued steps between its arrival and its first chunk

    def add(self, part: list[int], start: int, end: int, contiguous: bool = True) -> None:
        if part[0] < 0:
            part[0] = start
        elif contiguous and part[1] != start:  # a running request left out of a step
            raise AssertionError("a running request was skipped in a step")
        part[1] = end

    @property
    def prefill_steps(self) -> int:
        return self.prefill[1] - self.prefill[0]

    @property
    def decode_range(self) -> int:
        """Issued steps from its first decode step to its last (`Schedule.decode_in_mixed`
        says whether the prefill steps among them hold its decodes)."""
        return max(self.decode[1] - self.decode[0], 0)


@dataclass(frozen=True)
class Schedule:
    engine: str
    segments: tuple[Segment, ...]
    spans: tuple[Span, ...]  # in the order of the requests given
    step_time_s: float
    clock_steps: int  # steps of wall clock from the first arrival to the last step's end
    # A request decodes in the prefill (mixed) steps of its decode range too: vLLM, SGLang
    # with mixed chunks. False: SGLang's default, decodes wait while a prefill batch runs.
    decode_in_mixed: bool = True
    # (issued step, its clock step) of the first step and of each after an idle gap: the
    # clock of issued step i is c + i - s for the last (s, c) with s <= i (DP ranks step
    # together by clock: patterns/workload/dp_timeline.py). Empty: not recorded.
    resumes: tuple[tuple[int, int], ...] = ()

    @property
    def steps(self) -> int:
        return sum(s.repeat for s in self.segments)


class SegmentList:
    """Issued steps, consecutive equal shapes folded into one segment."""

    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self.next = 0

    def add(self, shape: StepShape, repeat: int) -> int:
        start = self.next
        last = self.segments[-1] if self.segments else None
        if last is not None and last.shape == shape:
            self.segments[-1] = Segment(shape, last.repeat + repeat, last.start)
        else:
            self.segments.append(Segment(shape, repeat, start))
        self.next += repeat
        return start


MAX_CLOCK_STEPS = 1e12  # a year of 30 us steps; more is a step time given in the wrong unit


def arrival_steps(requests: Sequence[Request], step_time_s: float | None) -> list[int]:
    """Clock step each request joins at: ceil(arrival / step time)."""
    if step_time_s is None:
        late = next((r for r in requests if r.arrival_s > 0), None)
        if late is not None:
            raise ConfigError(f"a request arrives at {late.arrival_s} s: arrival times become "
                              "steps through a step time; give --step-time-ms")
        return [0] * len(requests)
    if not (math.isfinite(step_time_s) and step_time_s > 0):
        raise ConfigError(f"step time {step_time_s * 1e3:g} ms must be a positive number")
    last = max(r.arrival_s for r in requests) / step_time_s
    if not last < MAX_CLOCK_STEPS:  # also inf, from a step time of 1e-320 ms
        raise ConfigError(f"step time {step_time_s * 1e3:g} ms puts the last request's "
                          f"arrival ({max(r.arrival_s for r in requests):g} s) beyond "
                          f"{MAX_CLOCK_STEPS:.0e} steps; give the step time your engine "
                          "shows (milliseconds)")
    # The small slack keeps an arrival of exactly k step times at step k despite rounding.
    return [max(0, math.ceil(r.arrival_s / step_time_s - 1e-9)) for r in requests]


def decode_steps_of(output: int, accepted: float) -> int:
    """Decode steps after the prompt's last chunk for `output` tokens, the first sampled by
    that chunk: output - 1, or with speculation ceil((output - 1) / mean tokens a step)."""
    return math.ceil((output - 1) / accepted - 1e-9) if output > 1 else 0
