"""Parallel layout and workload; each validates itself and names every factor when it fails."""

from dataclasses import dataclass

from patterns.dtypes import canonical_dtype
from patterns.errors import ConfigError
from patterns.hybrid import check_hybrid_tp
from patterns.models import ModelConfig


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Layout:
    """Data parallel x pipeline parallel x tensor parallel, and expert parallelism on or off.

    Global rank = (dp_rank * pp + pp_rank) * tp + tp_rank, vLLM's order (ExternalDP x DP x PP
    x TP); `patterns.groups` lists the tp, pp, dp and ep groups. `dp` is the number of
    data-parallel attention replicas; `ep` is vLLM's --enable-expert-parallel: the experts
    of a MoE layer are split over the EP group of dp x tp ranks instead of being sharded by TP.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: bool = False

    def __post_init__(self) -> None:
        for name, value in (("tp", self.tp), ("pp", self.pp), ("dp", self.dp)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}({value!r}) must be a positive integer")
        if not isinstance(self.ep, bool):
            raise ConfigError(f"ep({self.ep!r}) must be true or false")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def ep_size(self) -> int:
        """Ranks that share the experts of a layer: dp x tp with --ep, else none (1)."""
        return self.dp * self.tp if self.ep else 1

    def check_model(self, model: ModelConfig) -> None:
        """Refuse layouts the engine refuses: vLLM asserts heads % tp == 0 and pp <= layers."""
        heads = model.num_attention_heads
        if heads % self.tp:
            allowed = ", ".join(map(str, _divisors(heads)))
            # MLA attention asserts the same (vLLM models/deepseek_v2.py:478).
            mla = " (MLA attention splits its heads over TP too)" if model.mla else ""
            raise ConfigError(f"tp({self.tp}) does not divide num_attention_heads({heads}) of "
                              f"{model.name}{mla}; use tp in {allowed}")
        if self.ep:
            if not model.is_moe:
                raise ConfigError(f"ep needs a mixture-of-experts model; {model.name} is dense "
                                  "(num_local_experts 0): drop --ep")
            experts, size = model.num_local_experts, self.ep_size
            if experts % size:
                fits = [d for d in _divisors(experts) if d % self.tp == 0]
                raise ConfigError(
                    f"the EP group of dp({self.dp}) x tp({self.tp}) = {size} ranks does not "
                    f"divide the {experts} experts of {model.name}; use dp x tp in "
                    f"{', '.join(map(str, fits))}")
        if model.hybrid:  # the Mamba mixers' own TP rules
            check_hybrid_tp(model.name, model.hybrid, self.tp)
        layers = model.num_hidden_layers
        if self.pp > layers:
            raise ConfigError(f"pp({self.pp}) exceeds num_hidden_layers({layers}) of "
                              f"{model.name}; use pp <= {layers}")

    def check_world_size(self, world_size: int) -> None:
        if world_size != self.world_size:
            # dp named even at 1: with --ep and no --dp the message left out the option to add
            factors = f"dp({self.dp}) x tp({self.tp}) x pp({self.pp})"
            raise ConfigError(f"world size {world_size} does not match the layout: {factors} "
                              f"= {self.world_size} ranks are needed; give --dp, --tp and --pp "
                              f"whose product is {world_size}")

    def stage_of(self, rank: int) -> int:
        return rank // self.tp % self.pp

    def tp_rank_of(self, rank: int) -> int:
        return rank % self.tp

    def dp_rank_of(self, rank: int) -> int:
        return rank // (self.tp * self.pp)

    def rank_of(self, stage: int, tp_rank: int, dp_rank: int = 0) -> int:
        return (dp_rank * self.pp + stage) * self.tp + tp_rank

    def check_workload(self, workload: "Workload") -> None:
        """--dp-batches gives one batch per DP rank."""
        if workload.dp_batches is not None and len(workload.dp_batches) != self.dp:
            raise ConfigError(f"dp-batches gives {len(workload.dp_batches)} batches for "
                              f"dp({self.dp}); give one per DP rank, e.g. "
                              f"{','.join(['8'] * self.dp)}")


@dataclass(frozen=True)
class Workload:
    """One batch of B requests: Sp prompt tokens each, Sd output tokens each.

    Sd counts the token the prefill step samples, so an inference is 1 prefill step and
    Sd - 1 decode steps. `batch` is per DP rank; `dp_batches` gives each DP rank its own.
    """

    prompt: int
    decode: int
    batch: int = 1
    dtype: str | None = None  # None: the model's (`ModelConfig.default_dtype`)
    dp_batches: tuple[int, ...] | None = None  # per DP rank; None: `batch` on every one

    def __post_init__(self) -> None:
        for name, value in (("prompt", self.prompt), ("decode", self.decode),
                            ("batch", self.batch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} length {value!r} must be a positive integer"
                                  if name != "batch" else
                                  f"batch {value!r} must be a positive integer")
        if self.dtype is not None:
            object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        if self.dp_batches is not None:
            batches = tuple(self.dp_batches)
            if not batches or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                  for b in batches):
                raise ConfigError(f"dp-batches {list(batches)!r} must be positive integers, "
                                  "one per DP rank")
            object.__setattr__(self, "dp_batches", batches)

    def batch_of(self, dp_rank: int) -> int:
        return self.dp_batches[dp_rank] if self.dp_batches is not None else self.batch

    @property
    def decode_steps(self) -> int:
        return self.decode - 1
