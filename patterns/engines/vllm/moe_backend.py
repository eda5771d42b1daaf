"""`--moe-backend`: the kernel of mxfp4 (gpt-oss, `mxfp4.py`) or block-fp8 (DeepSeek-V3,
`fp8_moe.py`) experts, refused where vLLM would refuse it or where it picks nothing."""

from patterns.engines.vllm.fp8_moe import fp8_moe_backend
from patterns.engines.vllm.mxfp4 import MXFP4_BACKENDS
from patterns.errors import ConfigError
from patterns.layout import Layout
from patterns.models import ModelConfig
from patterns.pattern import EngineOptions


def check_moe_backend(model: ModelConfig, layout: Layout, options: EngineOptions) -> None:
    """--moe-backend: the kernel of mxfp4 (gpt-oss) or block-fp8 (DeepSeek-V3) experts."""
    chosen = options.moe_backend
    if chosen is None:
        return
    if model.weight_format == "mxfp4":
        if chosen not in MXFP4_BACKENDS:
            raise ConfigError(f"moe-backend {chosen} does not run mxfp4 experts; use one of "
                              f"{', '.join(MXFP4_BACKENDS)}")
        return
    if model.weight_format == "fp8":
        fp8_moe_backend(options.gpu, layout.ep, chosen, options.a2a)  # refuses as vLLM does
        return
    raise ConfigError(f"moe-backend picks the kernel of mxfp4 (gpt-oss) or block-fp8 MoE "
                      f"checkpoints; {model.name} is neither: drop --moe-backend")
