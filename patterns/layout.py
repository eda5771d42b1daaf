"""Parallel layout and workload; each validates itself and names every factor when it fails."""

from dataclasses import dataclass

from patterns.dtypes import canonical_dtype
from patterns.errors import ConfigError
from patterns.models import ModelConfig


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Layout:
    """Tensor parallel x pipeline parallel. Global rank = pp_rank * tp + tp_rank (vLLM's order)."""

    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for name, value in (("tp", self.tp), ("pp", self.pp)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}({value!r}) must be a positive integer")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    def check_model(self, model: ModelConfig) -> None:
        """Refuse layouts the engine refuses: vLLM asserts heads % tp == 0 and pp <= layers."""
        heads = model.num_attention_heads
        if heads % self.tp:
            allowed = ", ".join(map(str, _divisors(heads)))
            # MLA attention asserts the same (vLLM models/deepseek_v2.py:478).
            mla = " (MLA attention splits its heads over TP too)" if model.mla else ""
            raise ConfigError(f"tp({self.tp}) does not divide num_attention_heads({heads}) of "
                              f"{model.name}{mla}; use tp in {allowed}")
        layers = model.num_hidden_layers
        if self.pp > layers:
            raise ConfigError(f"pp({self.pp}) exceeds num_hidden_layers({layers}) of "
                              f"{model.name}; use pp <= {layers}")

    def check_world_size(self, world_size: int) -> None:
        if world_size != self.world_size:
            raise ConfigError(f"world size {world_size} does not match the layout: tp({self.tp})"
                              f" x pp({self.pp}) = {self.world_size} ranks are needed")

    def stage_of(self, rank: int) -> int:
        return rank // self.tp

    def tp_rank_of(self, rank: int) -> int:
        return rank % self.tp

    def rank_of(self, stage: int, tp_rank: int) -> int:
        return stage * self.tp + tp_rank


@dataclass(frozen=True)
class Workload:
    """One batch of B requests: Sp prompt tokens each, Sd output tokens each.

    Sd counts the token the prefill step samples, so an inference is 1 prefill step and
    Sd - 1 decode steps.
    """

    prompt: int
    decode: int
    batch: int = 1
    dtype: str | None = None  # None: the model's (`ModelConfig.default_dtype`)

    def __post_init__(self) -> None:
        for name, value in (("prompt", self.prompt), ("decode", self.decode),
                            ("batch", self.batch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} length {value!r} must be a positive integer"
                                  if name != "batch" else
                                  f"batch {value!r} must be a positive integer")
        if self.dtype is not None:
            object.__setattr__(self, "dtype", canonical_dtype(self.dtype))

    @property
    def decode_steps(self) -> int:
        return self.decode - 1
