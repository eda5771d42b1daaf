"""The one definition of the figures that several parts of infercomm compute.

decode_step_us, per timed inference: the slowest rank's decode time (end of the inference
minus end of prefill, rank-max) divided by the number of decode steps; a run's figure is the
median of that over its timed inferences. The replay's summary and last line, iterations.csv's
decode_step_mean_us, compare, report, predict and `microbench.results.load` all use it.

Why this and not the median of each inference's per-step figures:
- it is the time per output token a user of the engine sees, vLLM's TPOT (vllm/benchmarks/
  serve.py, calculate_metrics: tpot = (latency - ttft) / (output_len - 1), median over
  requests; vllm-project/vllm@def9ce85): slow steps count in full, where a median of steps
  hides a stall every few steps however long it is;
- the rank-max is taken of each inference's whole decode, which is what the engine waits
  for; a rank-max of every step summed counts each rank's jitter once per step and so
  overstates the time (ranks wait for each other at every collective anyway);
- it exists at every --timing level (inference, step, op), so runs timed differently compare;
- its samples are one per inference, the unit compare bootstraps over.
The tail of single steps stays a figure of its own, decode_step_p99_us (--timing step or op).
"""

from typing import TypeVar

T = TypeVar("T")


def decode_step_us(decode_us: T, decode_steps: int) -> T:
    """Per inference: decode time (slowest rank) / decode steps. Works on a float, a numpy
    array or a pandas Series of decode times; needs decode_steps > 0."""
    if decode_steps <= 0:
        raise ValueError(f"decode_steps {decode_steps}: a pattern without decode steps has "
                         "no decode step time")
    return decode_us / decode_steps  # type: ignore[operator]
