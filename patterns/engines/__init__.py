"""Engine profiles: one package per engine holding that engine's rules, each profile
registered by name with what it follows (the registry's types: `patterns.engine_base`).

Importing this package imports every profile, so each registers itself."""

from patterns.engine_base import (
    DEFAULT_ENGINE,
    DP_ENGINES,
    ENGINE_INFO,
    ENGINES,
    OPTION_FLAGS,
    EngineInfo,
    Profile,
    generate,
    register,
)
from patterns.engines.megatron import profile as megatron_profile
from patterns.engines.sglang import profile as sglang_profile
from patterns.engines.trtllm import profile as trtllm_profile
from patterns.engines.vllm import profile as vllm_profile
from patterns.engines.vllm_v0 import profile as vllm_v0_profile

PROFILES = (megatron_profile, sglang_profile, trtllm_profile, vllm_profile, vllm_v0_profile)

__all__ = ["DEFAULT_ENGINE", "DP_ENGINES", "ENGINES", "ENGINE_INFO", "OPTION_FLAGS", "PROFILES",
           "EngineInfo", "Profile", "generate", "register"]
