"""Engine profiles: one function per engine, registered by name."""

from collections.abc import Callable
from dataclasses import replace

from patterns.errors import ConfigError
from patterns.layout import Layout, Workload
from patterns.models import ModelConfig
from patterns.pattern import EngineOptions, Pattern

Profile = Callable[[ModelConfig, Layout, Workload, EngineOptions], Pattern]

ENGINES: dict[str, Profile] = {}


def register(name: str) -> Callable[[Profile], Profile]:
    def add(profile: Profile) -> Profile:
        ENGINES[name] = profile
        return profile
    return add


def generate(engine: str, model: ModelConfig, layout: Layout, workload: Workload,
             options: EngineOptions | None = None) -> Pattern:
    """The pattern `engine` issues for this model, layout and workload."""
    profile = ENGINES.get(engine)
    if profile is None:
        raise ConfigError(f"unknown engine {engine!r}; use one of {', '.join(sorted(ENGINES))}")
    layout.check_model(model)
    model.check_sequence(workload.prompt, workload.decode)
    if workload.dtype is None:
        workload = replace(workload, dtype=model.default_dtype)
    options = options or EngineOptions()
    if options.max_batched_tokens is not None and options.max_batched_tokens < 1:
        raise ConfigError(f"max-batched-tokens({options.max_batched_tokens}) must be a "
                          "positive integer")
    return profile(model, layout, workload, options)


# Profiles register themselves on import.
from patterns.engines import vllm_v0  # noqa: E402, F401
