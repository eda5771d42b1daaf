"""A whole inference for every stage, run-length encoded so its size does not grow with Sd."""

from collections.abc import Iterator
from dataclasses import dataclass

from patterns.errors import ConfigError
from patterns.layout import Layout, Workload
from patterns.models import ModelConfig
from patterns.ops import Phase, Step

GPUS = ("h100", "h200", "b200", "a100")
# Where an engine's tensors live: what vLLM's pickled PP metadata names (torch's device type).
TENSOR_DEVICES = ("cuda", "cpu")
MODEL_RUNNERS = ("v1", "v2")
# vLLM's --moe-backend names: the mxfp4 backends (patterns/engines/vllm/mxfp4.py), then those
# that run block-fp8 experts only (patterns/engines/vllm/fp8_moe.py; its triton and
# flashinfer-cutlass are mxfp4 names too).
MOE_BACKENDS = ("triton", "marlin", "flashinfer-cutlass", "flashinfer-trtllm",
                "flashinfer-trtllm-padded", "deep-gemm")


@dataclass(frozen=True)
class EngineOptions:
    """Switches that change what an engine issues (defaults: the engine's own on an H100).

    Each profile lists the options it reads (`EngineInfo.options`); `generate` refuses a
    non-default value of an option the chosen profile does not read.
    """

    eager: bool = False  # True: no CUDA graphs, so batches are not padded to capture sizes
    max_batched_tokens: int | None = None  # chunked prefill's token budget (None: engine's)
    control_plane: bool = False  # per-step control broadcasts (V0's C1, SGLang's gloo one)
    gpu: str = "h100"  # sets which transport carries each call (engine spec 10.2)
    nccl_only: bool = False  # custom all-reduce and fusions off: every device call on NCCL
    model_runner: str | None = None  # vLLM V1's model runner v1 or v2; None: vLLM's default
    sp: bool = False  # Megatron sequence parallelism
    # Megatron: the request asks for log-probs (SamplingParams.return_log_probs): the
    # prefill's logits cover every prompt position, not only the last.
    return_log_probs: bool = False
    max_num_seqs: int | None = None  # None: the engine's default
    # How MoE layers exchange tokens under --dp N (patterns/moe.py A2A_MODES): vLLM's
    # default all-gather + reduce-scatter, or DeepEP-style all-to-all (needs --ep).
    a2a: str = "allgather_reducescatter"
    # vLLM's MoE experts' kernel (MOE_BACKENDS); None: vLLM's choice for `gpu`.
    moe_backend: str | None = None
    # vLLM's --async-scheduling / --no-async-scheduling; None: vLLM's default (on, off with
    # ngram speculation: patterns/engines/vllm/scheduler.py).
    async_scheduling: bool | None = None
    # SGLang's --disable-overlap-schedule (the overlap scheduler is on by default).
    disable_overlap_schedule: bool = False
    # vLLM's CPU build: a PP stage's tensors go whole, not as TP slices all-gathered after.
    pp_whole_tensors: bool = False
    # vLLM's --enable-prefix-caching / --no-enable-prefix-caching over a request workload
    # whose requests share prefixes (patterns/workload/prefix.py); None: vLLM's default, on.
    prefix_caching: bool | None = None
    # vLLM's --block-size (tokens a KV block) for prefix caching; None: vLLM's for the model.
    kv_block_size: int | None = None
    # The device type of vLLM's tensors, which its PP metadata pickles: "cpu" in its CPU build.
    tensor_device: str = "cuda"
    # vLLM's MoE DP ranks: the wave's tail after the last real step, dummy forwards to the
    # 32-step sync (patterns/engines/vllm/dp_wave.py); False leaves it out (--no-wave-tail:
    # the inference alone, as under traffic that keeps the wave running).
    wave_tail: bool = True

    def __post_init__(self) -> None:
        if self.gpu not in GPUS:
            raise ConfigError(f"gpu {self.gpu!r} is not modelled; use one of {', '.join(GPUS)}")
        if self.tensor_device not in TENSOR_DEVICES:
            raise ConfigError(f"tensor-device {self.tensor_device!r} is not modelled; use one "
                              f"of {', '.join(TENSOR_DEVICES)}")
        if self.model_runner is not None and self.model_runner not in MODEL_RUNNERS:
            raise ConfigError(f"model-runner {self.model_runner!r} does not exist; use one of "
                              f"{', '.join(MODEL_RUNNERS)}")
        if self.moe_backend is not None and self.moe_backend not in MOE_BACKENDS:
            raise ConfigError(f"moe-backend {self.moe_backend!r} is not a MoE backend; use one "
                              f"of {', '.join(MOE_BACKENDS)}")
        for name in ("max_batched_tokens", "max_num_seqs", "kv_block_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ConfigError(f"{name.replace('_', '-')}({value!r}) must be a positive "
                                  "integer")


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
