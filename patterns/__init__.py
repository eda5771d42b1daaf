"""Communication patterns of LLM inference engines; standard library only.

    from patterns import resolve_model, Layout, Workload, generate
    pattern = generate("vllm-v0", resolve_model("llama-3.1-8b"), Layout(tp=2),
                       Workload(prompt=128, decode=128))
"""

from patterns.dtypes import canonical_dtype, dtype_bytes
from patterns.engines import ENGINE_INFO, ENGINES, EngineInfo, generate
from patterns.errors import ConfigError
from patterns.layout import Layout, Workload
from patterns.models import PRESETS, ModelConfig, from_hf_config, resolve_model
from patterns.ops import Op, OpKind, Phase, Step, Transport
from patterns.pattern import EngineOptions, Pattern, Run
from patterns.summary import PatternRow, pattern_rows
from patterns.volume import op_volume, volume_by_group, volume_bytes

__all__ = [
    "ENGINES",
    "ENGINE_INFO",
    "PRESETS",
    "ConfigError",
    "EngineInfo",
    "EngineOptions",
    "Layout",
    "ModelConfig",
    "Op",
    "OpKind",
    "Pattern",
    "PatternRow",
    "Phase",
    "Run",
    "Step",
    "Transport",
    "Workload",
    "canonical_dtype",
    "dtype_bytes",
    "from_hf_config",
    "generate",
    "op_volume",
    "pattern_rows",
    "resolve_model",
    "volume_by_group",
    "volume_bytes",
]
