"""The timing protocol, written once: barrier, warm-up, timed inferences, raw marks kept.

One inference is the prefill step(s) then Sd-1 decode steps, every call back to back with no
barrier inside. Marks are taken per inference (start, end of prefill, end), per step, or per
call, depending on the level; nothing else runs between calls.
"""

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from microbench.backends import Backend
from microbench.ranks import faults
from microbench.ranks.watchdog import Watchdog
from microbench.replay import check
from microbench.replay.plan import Plan
from microbench.replay.timing import make_marks


@dataclass
class RankSamples:
    """What one rank measured: marks[i] are microseconds since inference i started."""

    rank: int
    stage: int
    host: str
    level: str
    marks: np.ndarray  # [iterations, marks per inference]
    prefill_mark: int  # index of the mark that ends the prefill
    step_marks: list[int]  # index of the mark that ends each step (step and op levels)
    wrong: int | None
    # --timing op: marks are kept per step (as --timing step); each call's time went to an
    # OpSampleFile, and per inference the summed time of each op kind ([iterations, kinds]).
    kind_times: np.ndarray | None = None
    kind_calls: dict[str, int] | None = None  # calls of each kind per inference
    # index of the mark that ends the inference's own steps where vLLM's DP wave tail
    # (Phase.WAVE_TAIL) follows them; None: the last mark ends them
    tail_mark: int | None = None


class Replayer:
    def __init__(self, plan: Plan, backend: Backend, level: str, watchdog: Watchdog,
                 graph: str = "none") -> None:
        self.plan, self.backend, self.level, self.watchdog = plan, backend, level, watchdog
        self.graph = graph
        if graph == "decode":  # decode runs' calls become one graph launch per step
            from microbench.replay.graphs import resolve_mode, use_graphs
            resolve_mode(graph, backend.name, backend.device, level)
            watchdog.where = "CUDA graph capture of the decode steps"
            use_graphs(plan, backend, progress=partial(_bump, watchdog))
        calls, steps = plan.calls_per_inference, plan.steps_per_inference
        tail = plan.tail_steps
        capacity = {"inference": 3 + bool(tail), "step": steps + 1, "op": calls + 1}[level]
        self.marks = make_marks(backend.device, capacity, getattr(backend, "stream", None))
        self.tail_mark = (2 if level == "inference" else steps - tail) if tail else None
        if level == "inference":
            self.prefill_mark, self.step_marks = 1, []
        elif level == "step":
            self.prefill_mark = plan.prefill_steps
            self.step_marks = list(range(1, steps + 1))
        else:  # call marks are taken, then reduced to step marks after each inference
            self.prefill_mark = plan.prefill_steps
            self.step_marks = list(range(1, steps + 1))
            self._step_ends = np.concatenate([[0], np.cumsum(plan.step_call_counts())])
            kinds = [op.op.kind.value for run in plan.runs for op in run.ops]
            self.kinds = sorted(set(kinds))
            per_step = [[self.kinds.index(op.op.kind.value) for op in run.ops]
                        for run in plan.runs]
            self._kind_of_call = np.array([k for run, ks in zip(plan.runs, per_step, strict=True)
                                           for _ in range(run.repeat) for k in ks],
                                          dtype=np.int16)
            self.kind_calls = {kind: int((self._kind_of_call == k).sum())
                               for k, kind in enumerate(self.kinds)}
            self.kind_times: list[np.ndarray] = []
            from microbench.replay.op_samples import OpSampleFile
            self.op_file = OpSampleFile()
        fault = faults.step_fault(backend.rank)
        if fault is not None:
            plan.add_to_every_step(_count_then(fault[0], fault[1]))

    def inference(self) -> np.ndarray:
        """Issue one inference; return its marks in microseconds from its start."""
        self.backend.barrier()
        marks, watchdog = self.marks, self.watchdog
        marks.reset()
        marks.mark()
        if self.level == "op":
            mark = marks.mark
            for run in self.plan.runs:
                calls = run.calls
                for _ in range(run.repeat):
                    for call in calls:
                        call()
                        mark()
                    watchdog.steps += 1
        elif self.level == "step":
            for run in self.plan.runs:
                calls = run.calls
                for _ in range(run.repeat):
                    for call in calls:
                        call()
                    marks.mark()
                    watchdog.steps += 1
        else:
            prefill_done = tail_done = False
            for run in self.plan.runs:
                if not prefill_done and run.phase != "prefill":
                    marks.mark()
                    prefill_done = True
                if not tail_done and run.phase == "wave_tail":  # the inference ends here
                    marks.mark()
                    tail_done = True
                calls = run.calls
                for _ in range(run.repeat):
                    for call in calls:
                        call()
                    watchdog.steps += 1
            if not prefill_done:
                marks.mark()
            marks.mark()
        self.backend.synchronize()
        return marks.elapsed_us()

    def run(self, warmup: int, iterations: int, progress: bool) -> np.ndarray:
        total = warmup + iterations
        samples = []
        start = last_report = time.monotonic()
        for i in range(total):
            self.watchdog.where = f"{'warm-up' if i < warmup else 'timed'} inference {i + 1}"
            marks = self.inference()
            if i >= warmup:
                if self.level == "op":  # outside the timed region: the next barrier waits
                    durations = np.diff(marks)
                    self.op_file.append(durations)
                    self.kind_times.append(np.bincount(self._kind_of_call, weights=durations,
                                                       minlength=len(self.kinds)))
                    marks = marks[self._step_ends]
                samples.append(marks)
            now = time.monotonic()
            if progress and now - start > 3 and now - last_report > 2 and i + 1 < total:
                sys.stderr.write(f"[infercomm] inference {i + 1}/{total} "
                                 f"({now - start:.1f} s)\n")
                last_report = now
        return np.vstack(samples)

    def check(self) -> int:
        """Issue one inference with known data; count the wrong elements on this rank."""
        self.watchdog.where = "--check inference"
        self.backend.barrier()
        rank = self.backend.rank
        corrupt = {op.op.tag: faults.corrupts_inputs(rank, op.op.tag)
                   for run in self.plan.runs for op in run.ops}
        wrong = 0
        for run in self.plan.runs:
            for _ in range(run.repeat):
                for op in run.ops:
                    wrong += check.verify(op, self.backend.write, self.backend.read,
                                          corrupt[op.op.tag])
                self.watchdog.steps += 1
        self.backend.synchronize()
        return wrong


def _bump(watchdog: Watchdog) -> None:
    watchdog.steps += 1  # a capture done: progress


def _count_then(step: int, action: Callable[[], None]) -> Callable[[], None]:
    """A call added to every step that runs `action` during the `step`-th one (test faults)."""
    count = 0

    def hook() -> None:
        nonlocal count
        count += 1
        if count == step:
            action()
    return hook
