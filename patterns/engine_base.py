"""What every engine profile registers with: its EngineInfo, the registry it joins, and
`generate`, which checks a request and runs the registered profile.

The profiles themselves live in `patterns.engines.<engine>`; `patterns.engines` imports them
(so they register) and no profile imports `patterns.engines`."""

from collections.abc import Callable
from dataclasses import dataclass, fields, replace

from patterns.errors import ConfigError
from patterns.hybrid import check_hybrid_use
from patterns.layout import Layout, Workload
from patterns.models import ModelConfig
from patterns.pattern import EngineOptions, Pattern

Profile = Callable[[ModelConfig, Layout, Workload, EngineOptions], Pattern]

# The command-line flag of each EngineOptions field, as `infercomm pattern` spells it.
OPTION_FLAGS: dict[str, str] = {
    "eager": "--eager",
    "max_batched_tokens": "--max-batched-tokens",
    "control_plane": "--control-plane",
    "gpu": "--gpu",
    "nccl_only": "--nccl-only",
    "model_runner": "--model-runner",
    "sp": "--sp",
    "return_log_probs": "--return-log-probs",
    "max_num_seqs": "--max-num-seqs",
    "moe_backend": "--moe-backend",
    "a2a": "--a2a",
    "async_scheduling": "--async-scheduling / --no-async-scheduling",
    "disable_overlap_schedule": "--disable-overlap-schedule",
    "pp_whole_tensors": "--pp-whole-tensors",
    "prefix_caching": "--prefix-caching / --no-prefix-caching",
    "kv_block_size": "--kv-block-size",
    "tensor_device": "--tensor-device",
    "wave_tail": "--no-wave-tail",
}


@dataclass(frozen=True)
class EngineInfo:
    """What a profile follows: `infercomm engines` prints this, nothing hand-kept."""

    name: str  # the --engine value
    engine: str  # the engine as its users name it
    version: str  # the release(s) the profile follows
    source: str  # repository @ commit (and files) the rules were read from
    options: tuple[str, ...]  # EngineOptions fields the profile reads
    not_modelled: tuple[str, ...]  # what the engine does that the profile leaves out


# The engine `--engine` means when not given: vLLM V1, what users run (vLLM removed V0).
DEFAULT_ENGINE = "vllm"

ENGINES: dict[str, Profile] = {}
ENGINE_INFO: dict[str, EngineInfo] = {}


def register(info: EngineInfo) -> Callable[[Profile], Profile]:
    def add(profile: Profile) -> Profile:
        ENGINES[info.name] = profile
        ENGINE_INFO[info.name] = info
        return profile
    return add


def _check_options(info: EngineInfo, options: EngineOptions) -> None:
    """A non-default option the profile does not read would be silently ignored: refuse it."""
    defaults = EngineOptions()
    for field in fields(EngineOptions):
        if field.name in info.options:
            continue
        if getattr(options, field.name) != getattr(defaults, field.name):
            flag = OPTION_FLAGS[field.name]
            readers = [n for n, i in sorted(ENGINE_INFO.items()) if field.name in i.options]
            raise ConfigError(f"{flag} does not apply to engine {info.name}; it applies to "
                              f"{', '.join(readers) or 'no engine'}")


# Profiles that model MoE token exchange between DP ranks and per-DP-rank batches
# (patterns/moe.py); every other one models dp > 1 only as replicas of a dense model.
DP_ENGINES = frozenset({"vllm", "sglang"})
# Profiles that model a MoE model's experts under --dp and --ep with one batch shape on every
# DP rank (no --dp-batches): Megatron's static engine (patterns/engines/megatron/moe.py).
EP_ENGINES = DP_ENGINES | {"megatron"}


def _check_data_parallel(engine: str, model: ModelConfig, layout: Layout,
                         workload: Workload) -> None:
    """Never a silent TP-only answer to an expert-parallel question."""
    if engine in DP_ENGINES or (engine in EP_ENGINES and workload.dp_batches is None):
        return
    if layout.ep or (layout.dp > 1 and model.is_moe) or workload.dp_batches is not None:
        if engine in EP_ENGINES:  # it models --ep; what it lacks is uneven DP batches
            what = "--dp-batches"
        else:
            what = ("--ep" if layout.ep else "--dp-batches" if workload.dp_batches is not None
                    else f"dp({layout.dp}) with the MoE model {model.name}")
        raise ConfigError(f"engine {engine} does not model {what}; use --engine "
                          f"{' or '.join(sorted(DP_ENGINES))}")


def generate(engine: str, model: ModelConfig, layout: Layout, workload: Workload,
             options: EngineOptions | None = None) -> Pattern:
    """The pattern `engine` issues for this model, layout and workload."""
    profile = ENGINES.get(engine)
    if profile is None:
        raise ConfigError(f"unknown engine {engine!r}; use one of {', '.join(sorted(ENGINES))}")
    layout.check_model(model)
    check_hybrid_use(model.name, model.hybrid, engine)
    layout.check_workload(workload)
    _check_data_parallel(engine, model, layout, workload)
    if options is not None and options.a2a != "allgather_reducescatter" and not (
            layout.ep and layout.dp > 1 and model.is_moe):
        raise ConfigError(f"a2a {options.a2a} exchanges a MoE model's tokens between DP ranks: "
                          f"it needs --dp N (N > 1) and --ep (here dp({layout.dp}), ep "
                          f"{layout.ep}, {model.name})")
    model.check_sequence(workload.prompt, workload.decode)
    if workload.dtype is None:
        workload = replace(workload, dtype=model.default_dtype)
    options = options or EngineOptions()
    _check_options(ENGINE_INFO[engine], options)
    return profile(model, layout, workload, options)

