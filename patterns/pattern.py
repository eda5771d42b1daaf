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
    # How MoE layers exchange tokens under --dp N --ep (patterns/moe.py A2A_MODES):
    # vLLM's default all-gather + reduce-scatter, or DeepEP-style all-to-all.
    a2a: str = "allgather_reducescatter"


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
    # Per DP rank, when DP ranks issue different calls (uneven --dp-batches): dp_stages[d][s].
    # Empty: every DP rank issues `stages`. When set, dp_stages[0] == stages.
    dp_stages: tuple[tuple[tuple[Run, ...], ...], ...] = ()

    def runs(self, stage: int, dp_rank: int = 0) -> tuple[Run, ...]:
        """The run list of the ranks of one stage of one DP rank."""
        return self.dp_stages[dp_rank][stage] if self.dp_stages else self.stages[stage]

    def runs_of_rank(self, rank: int) -> tuple[Run, ...]:
        return self.runs(self.layout.stage_of(rank), self.layout.dp_rank_of(rank))

    def replicas(self) -> tuple[tuple[tuple[Run, ...], ...], ...]:
        """The stages of every DP rank (the same object repeated when they are equal)."""
        return self.dp_stages or (self.stages,) * self.layout.dp

    def steps(self, stage: int) -> Iterator[tuple[Phase, Step]]:
        """The steps of one inference in order, expanded lazily."""
        for run in self.stages[stage]:
            for _ in range(run.repeat):
                yield run.phase, run.step

    def calls_per_inference(self, stage: int) -> int:
        return sum(len(run.step.ops) * run.repeat for run in self.stages[stage])

    def first_step(self, stage: int, phase: Phase) -> Step | None:
        return next((run.step for run in self.stages[stage] if run.phase == phase), None)
