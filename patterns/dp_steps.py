"""Steps of several DP ranks that run together: each rank's own steps lined up into global
steps, the token counts DP padding gives them, and the run lists of every DP rank.

vLLM (`v1/worker/dp_utils.py`) and SGLang (`scheduler_dp_attn_mixin.py`) step all DP ranks
together once they share MoE layers: a rank with no work runs a dummy (vLLM, 1 token) or
idle (SGLang, 0 tokens) batch so that the per-step and per-layer collectives still match.
"""

from collections.abc import Callable, Sequence
from typing import NamedTuple

from patterns.ops import Op, Phase, Step
from patterns.pattern import Run


class RankStep(NamedTuple):
    """One DP rank's forward pass in a step: its phase, tokens (before DP padding), rows."""

    phase: Phase
    tokens: int
    rows: int


# What a DP rank with no work left runs while others still do: vLLM's execute_dummy_batch
# (`_dummy_run(1)`, gpu_model_runner.py), one token, in the DP collectives like any step;
# SGLang's idle batch has no token (`get_idle_batch`, scheduler_dp_attn_mixin.py).
DUMMY_STEP = RankStep(Phase.DECODE, 1, 0)
SGLANG_IDLE_STEP = RankStep(Phase.DECODE, 0, 0)


def align_dp_runs(per_rank: Sequence[Sequence[tuple[RankStep, int]]],
                  dummy: RankStep = DUMMY_STEP) -> list[tuple[tuple[RankStep, ...], int]]:
    """Line up the DP ranks' own run-length step lists into global steps.

    Step i of every rank runs together (each step all-reduces the DP coordination tensor
    and every MoE layer exchanges tokens between the ranks); a rank whose list is shorter
    (fewer prefill chunks, a smaller batch) runs dummy steps until the longest ends.
    Returns (steps of every DP rank, repeat) runs.
    """
    total = max(sum(repeat for _, repeat in runs) for runs in per_rank)
    queues = []
    for runs in per_rank:
        own = [(step, repeat) for step, repeat in runs if repeat > 0]
        left = total - sum(repeat for _, repeat in own)
        queues.append(own + ([(dummy, left)] if left else []))
    out: list[tuple[tuple[RankStep, ...], int]] = []
    heads = [0] * len(queues)
    used = [0] * len(queues)
    done = 0
    while done < total:
        take = min(q[h][1] - u for q, h, u in zip(queues, heads, used, strict=True))
        steps = tuple(q[h][0] for q, h in zip(queues, heads, strict=True))
        if out and out[-1][0] == steps:
            out[-1] = (steps, out[-1][1] + take)
        else:
            out.append((steps, take))
        done += take
        for r, q in enumerate(queues):
            used[r] += take
            if used[r] == q[heads[r]][1]:
                heads[r] += 1
                used[r] = 0
    return out


def dp_padded_tokens(tokens: Sequence[int],
                     graph_size: Callable[[int], int | None]) -> tuple[int, ...]:
    """The token count each DP rank runs with, as `v1/worker/dp_utils.py` decides it.

    `tokens` are the ranks' own counts; `graph_size(T)` is the CUDA-graph size a rank pads T
    to, None when it runs eager. Each rank sends its own padded count (row 1 of the
    coordination tensor); when every rank runs a graph (the synced mode, the minimum, is not
    NONE) all pad to the largest, else each keeps its own (`_post_process_dp_padding`).
    """
    return dp_padded(tokens, [graph_size(t) for t in tokens])


def dp_padded(tokens: Sequence[int], sizes: Sequence[int | None]) -> tuple[int, ...]:
    """`dp_padded_tokens` of the ranks' graph sizes found already."""
    if None in sizes:
        return tuple(t if s is None else s for t, s in zip(tokens, sizes, strict=True))
    return (max(s for s in sizes if s is not None),) * len(tokens)


class GlobalRun(NamedTuple):
    """`repeat` global steps in which every DP rank runs its step of `steps`; `sync`: each
    ends with the call `build_replicas` is given as the engine's periodic sync (vLLM's wave
    sync); `tail`: the ranks' steps are the wave's tail (Phase.WAVE_TAIL), not the
    inference's own."""

    steps: tuple[RankStep, ...]
    repeat: int
    sync: bool = False
    tail: bool = False


def with_syncs(global_runs: Sequence[tuple[tuple[RankStep, ...], int]], every: int,
               length: int, dummy: RankStep) -> list[GlobalRun]:
    """The aligned runs cut so that every `every`-th global step (1-based: every, 2 x every,
    ...) is a run of its own that syncs, and followed, up to `length` steps, by a tail of
    `dummy` steps on every rank (the wave's end)."""
    out: list[GlobalRun] = []
    at = 0
    tail = [((dummy,) * len(global_runs[0][0]), length - sum(r for _, r in global_runs), True)]
    for steps, repeat, *is_tail in [(s, r, False) for s, r in global_runs] + tail:
        left = repeat
        while left > 0:
            to_sync = every - at % every  # steps up to and including the next sync
            if left >= to_sync:
                if to_sync > 1:
                    out.append(GlobalRun(steps, to_sync - 1, False, is_tail[0]))
                out.append(GlobalRun(steps, 1, True, is_tail[0]))
                at, left = at + to_sync, left - to_sync
            else:
                out.append(GlobalRun(steps, left, False, is_tail[0]))
                at, left = at + left, 0
    return out


def build_replicas(global_runs: Sequence[tuple[tuple[RankStep, ...], int] | GlobalRun],
                   stages: int,
                   tokens_of: Callable[[tuple[RankStep, ...]], tuple[int, ...]],
                   ops_of: Callable[[int, int, tuple[RankStep, ...], tuple[int, ...]],
                                    list[Op]],
                   sync_op: Op | None = None
                   ) -> tuple[tuple[tuple[Run, ...], ...], ...]:
    """`Pattern.dp_stages`: per DP rank and stage, the merged run list.

    `tokens_of(steps)` gives every DP rank's T for one global step (after DP padding);
    `ops_of(dp_rank, stage, steps, tokens)` the calls of that rank's forward pass, `steps`
    being every DP rank's step of it; a GlobalRun's `sync` appends `sync_op`, its `tail`
    makes the steps Phase.WAVE_TAIL.
    """
    runs_in = [r if isinstance(r, GlobalRun) else GlobalRun(*r) for r in global_runs]
    dp = len(runs_in[0].steps) if runs_in else 0
    replicas = []
    for d in range(dp):
        per_stage = []
        for stage in range(stages):
            runs: list[Run] = []
            for steps, repeat, sync, tail in runs_in:
                tokens = tokens_of(steps)
                own = steps[d]
                ops = ops_of(d, stage, steps, tokens)
                if sync and sync_op is not None:
                    ops = [*ops, sync_op]
                step = Step(tuple(ops), tokens[d], own.rows)
                phase = Phase.WAVE_TAIL if tail else own.phase
                if runs and runs[-1].phase == phase and runs[-1].step == step:
                    runs[-1] = Run(phase, step, runs[-1].repeat + repeat)
                else:
                    runs.append(Run(phase, step, repeat))
            per_stage.append(tuple(runs))
        replicas.append(tuple(per_stage))
    return tuple(replicas)


def wave_tail(runs: Sequence[Run]) -> tuple[int, int]:
    """(steps, calls) of a run list's wave tail (Phase.WAVE_TAIL): what a DP rank issues
    after the inference's last real step until the wave ends."""
    tail = [run for run in runs if run.phase == Phase.WAVE_TAIL]
    return (sum(run.repeat for run in tail), sum(run.repeat * len(run.step.ops) for run in tail))
