"""A whole inference for every stage, run-length encoded so its size does not grow with Sd."""

from collections.abc import Iterator
from dataclasses import dataclass

from patterns.layout import Layout, Workload
from patterns.models import ModelConfig
from patterns.ops import Phase, Step


@dataclass(frozen=True)
class EngineOptions:
    """Switches that change what an engine issues (defaults: vLLM's on a GPU)."""

    eager: bool = False  # True: no CUDA graphs, so decode batches are not padded
    max_batched_tokens: int | None = None  # chunked prefill's token budget per step
    control_plane: bool = False  # the per-step broadcasts of model inputs (V0's C1)


@dataclass(frozen=True)
class Run:
    """`repeat` consecutive steps that issue the same calls."""

    phase: Phase
    step: Step
    repeat: int


@dataclass(frozen=True)
class Pattern:
    engine: str
    model: ModelConfig
    layout: Layout
    workload: Workload
    options: EngineOptions
    stages: tuple[tuple[Run, ...], ...]  # stages[s] is the run list of every rank in stage s

    def steps(self, stage: int) -> Iterator[tuple[Phase, Step]]:
        """The steps of one inference in order, expanded lazily."""
        for run in self.stages[stage]:
            for _ in range(run.repeat):
                yield run.phase, run.step

    def calls_per_inference(self, stage: int) -> int:
        return sum(len(run.step.ops) * run.repeat for run in self.stages[stage])

    def first_step(self, stage: int, phase: Phase) -> Step | None:
        return next((run.step for run in self.stages[stage] if run.phase == phase), None)
