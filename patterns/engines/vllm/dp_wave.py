"""vLLM's data-parallel lockstep of a MoE model: its DP ranks step together, a rank with
nothing to run runs a dummy forward, and a wave of steps ends only at a 32-step sync.

Code read: vLLM upstream main of 2026-08-03 = modal-projects/vllm @ c8109375, `vllm/`:
- `v1/engine/core.py:1307-1318`: a DP rank of a MoE model runs `DPEngineCoreProc`; "Non-MoE
  DP ranks are completely independent, so treat like DP=1" (`EngineCoreProc`, dp size 1): a
  dense model at dp > 1 is independent replicas, no call between them.
- `v1/engine/core.py:2102-2169` `DPEngineCoreProc.run_busy_loop`: each loop runs the
  engine's step, or, when it ran nothing (`executed` False) while the wave runs
  (`engines_running`), `execute_dummy_batch()`; then `_has_global_unfinished_reqs`
  (`:2171-2188`) counts the step (`step_counter`, reset at each wave's start) and only at
  every 32nd step all-reduces the ranks' state: `ParallelConfig.sync_dp_state`
  (`config/parallel.py:738-762`), a SUM all-reduce of a [2] int32 CPU tensor
  ([has_unfinished, pending_pause]) over the DP group made by `stateless_init_dp_group`
  (`config/parallel.py:614-650`, gloo: "the engine process might not have cuda device").
  The wave ends at the first sync at which no rank has an unfinished request: the steps
  after the last real one up to it are dummy forwards on every rank (the wave's tail).
- `v1/worker/gpu_worker.py:1165-1167` `execute_dummy_batch`: `_dummy_run(1,
  uniform_decode=True)` (`v1/worker/gpu_model_runner.py:5805-6212`): a one-token forward
  through `_determine_batch_execution_and_padding`, so with the per-step DP coordination
  all-reduce and DP padding, every MoE layer's dispatch and combine, no sampling (no
  logits call).
- When a rank learns that its requests are done: after the step that samples their last
  token under the synchronous scheduler (`EngineCore.step`, `core.py:584-614`, updates from
  that step's output), one step later under async scheduling, whose batch queue of 2
  (`step_with_batch_queue`, `core.py:625-739`) processes step n's output in loop n + 1. So
  the wave ends at the first multiple of 32 steps >= its last real step + that lag.

The sync is the engine core's (one process a DP rank, the worker's own at tp 1 and pp 1:
UniProcExecutor); the pattern gives it to every rank on its DP group, after the step's
calls. Not modelled: the two-phase pause protocol (`pending_pause`) and elastic EP.
"""

from collections.abc import Callable
from dataclasses import replace

from patterns.dp_steps import (
    DUMMY_STEP,
    RankStep,
    align_dp_runs,
    build_replicas,
    dp_padded_tokens,
    with_syncs,
)
from patterns.engines.vllm.moe import vllm_dp_coordination
from patterns.engines.vllm.rules import v1_capture_sizes, v1_defaults
from patterns.layout import Layout, Workload
from patterns.models import ModelConfig
from patterns.ops import Op, OpKind, Phase, Transport
from patterns.pattern import EngineOptions, Run
from patterns.shapes import prefill_chunks, stage_layer_counts
from patterns.stage import Stage, pad_to, stages

WAVE_SYNC_STEPS = 32  # core.py:2174, `self.step_counter % 32 != 0`
WAVE_SYNC_TAG = "engine_core.sync_dp_state"


def wave_sync(layout: Layout) -> Op:
    """`ParallelConfig.sync_dp_state`'s all-reduce of [has_unfinished, pending_pause]."""
    return Op(kind=OpKind.ALLREDUCE, group="dp", group_size=layout.dp, shape=(2,),
              out_shape=(2,), dtype="int32", tag=WAVE_SYNC_TAG, transport=Transport.GLOO)


def wave_lag(async_on: bool) -> int:
    """Steps after a rank's last real step before it knows its requests are done."""
    return 1 if async_on else 0


def wave_length(real_steps: int, async_on: bool) -> int:
    """Steps of a wave whose last real step is step `real_steps` (1-based): the first
    multiple of 32 at or after real_steps + the lag, when the sync finds no rank busy."""
    last = real_steps + wave_lag(async_on)
    return -(-last // WAVE_SYNC_STEPS) * WAVE_SYNC_STEPS


def _own_steps(workload: Workload, dp_rank: int, budget: int) -> list[tuple[RankStep, int]]:
    """One DP rank's own steps: its prefill chunks, then its decode steps."""
    batch = workload.batch_of(dp_rank)
    own = [(RankStep(Phase.PREFILL, chunk.tokens, chunk.seqs), 1)
           for chunk in prefill_chunks(batch, workload.prompt, budget)]
    if workload.decode_steps:
        own.append((RankStep(Phase.DECODE, batch, batch), workload.decode_steps))
    return own


def dp_replicas(model: ModelConfig, layout: Layout, workload: Workload,
                options: EngineOptions, runner: str, async_on: bool,
                step_calls: Callable[[Stage, int, RankStep], list[Op]]
                ) -> tuple[tuple[tuple[Run, ...], ...], ...]:
    """A MoE model at dp > 1 (one batch a DP rank): every DP rank's runs, the ranks stepping
    together (`patterns.dp_steps`): the per-step coordination all-reduce on the DP gloo
    group (NCCL under V1 with --no-async-scheduling: `vllm_dp_coordination`), DP padding,
    dummy steps on a rank that has finished, the calls `step_calls(stage, T, its own step)`
    of each forward (the profile's), then the wave's tail and its syncs (module doc)."""
    default_seqs, default_budget = v1_defaults(options.gpu)
    max_seqs = options.max_num_seqs or default_seqs
    budget = options.max_batched_tokens or default_budget
    sizes = [] if options.eager else v1_capture_sizes(max_seqs, budget)

    def graph(tokens: int) -> int | None:
        return pad_to(sizes, tokens) if sizes and tokens <= sizes[-1] else None

    per_rank = [_own_steps(workload, d, budget) for d in range(layout.dp)]
    sts = stages(model, layout, workload, options,
                 stage_layer_counts(model.num_hidden_layers, layout.pp))

    def tokens_of(steps: tuple[RankStep, ...]) -> tuple[int, ...]:
        return dp_padded_tokens([s.tokens for s in steps], graph)

    def ops_of(d: int, stage: int, steps: tuple[RankStep, ...],
               tokens: tuple[int, ...]) -> list[Op]:
        st = replace(sts[stage], dp_rank=d, dp_tokens=tokens)
        ops = vllm_dp_coordination(layout, runner, async_on) + step_calls(
            st, tokens[d], steps[d])
        # A dummy step samples nothing: no logits call.
        return [op for op in ops if not (op.tag == "logits" and steps[d].rows == 0)]

    aligned = align_dp_runs(per_rank)
    real = sum(repeat for _, repeat in aligned)
    # --no-wave-tail: the inference alone (its syncs kept), as under traffic
    length = wave_length(real, async_on) if options.wave_tail else real
    runs = with_syncs(aligned, WAVE_SYNC_STEPS, length, DUMMY_STEP)
    return build_replicas(runs, layout.pp, tokens_of, ops_of, wave_sync(layout))
