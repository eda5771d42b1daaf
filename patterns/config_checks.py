"""One validation of a Hugging Face config.json: every field the patterns read, its type and
its range, before any of it becomes a ModelConfig.

A config that cannot describe a model (more experts chosen than exist, more KV heads than
heads, a negative size) is refused with the field, its value and what would be right; an
architecture whose layers are not attention + MLP (Mamba, RWKV) is refused, since its
communication follows none of the profiles' rules.
"""

import json
import stat
from pathlib import Path

from patterns.errors import ConfigError

# A config.json is a few KiB (DeepSeek-V3's is 1.7 KiB); anything near this is not one.
MAX_CONFIG_BYTES = 16 << 20

# Families whose layers are attention + MLP (or MoE) as the engine profiles model them.
# Unknown families are still read (the fields are Hugging Face's), with a note that the
# profiles' Llama rules were applied to them (`unknown_family_note`).
KNOWN_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2",
    "deepseek_v3", "gpt_oss", "gemma", "gemma2", "gemma3", "gemma3_text", "llama4",
    "llama4_text", "phi3", "phi", "granite", "granitemoe", "olmo", "olmo2", "olmoe",
    "internlm2", "cohere", "starcoder2", "exaone", "minicpm", "baichuan", "yi", "glm4",
    "glm4_moe", "ernie4_5", "ernie4_5_moe", "hunyuan_v1_dense", "seed_oss", "kimi_k2",
})

# Families without attention + MLP layers: their state-space or recurrent mixers move
# nothing the profiles know how to count.
NOT_TRANSFORMERS = frozenset({
    "mamba", "mamba2", "falcon_mamba", "rwkv", "rwkv5", "rwkv6", "rwkv7", "jamba", "zamba",
    "zamba2", "recurrent_gemma", "xlstm", "bamba", "nemotron_h", "granitemoehybrid",
    "lfm2", "plamo2",
})

# Integer fields and the least value each may take (absent or null: not checked here).
_POSITIVE = ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads",
             "num_key_value_heads", "intermediate_size", "moe_intermediate_size",
             "max_position_embeddings", "head_dim", "shared_expert_intermediate_size")
_NON_NEGATIVE = ("num_local_experts", "num_experts", "n_routed_experts",
                 "num_experts_per_tok", "experts_per_token", "n_shared_experts",
                 "first_k_dense_replace", "moe_layer_freq", "interleave_moe_layer_step",
                 "decoder_sparse_step", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                 "qk_rope_head_dim", "v_head_dim")
_STRINGS = ("model_type", "torch_dtype", "dtype", "_name_or_path")


def read_config_json(file: Path) -> dict[str, object]:
    """The JSON object of a config.json, or one line saying why there is none."""
    try:
        info = file.stat()
    except OSError as err:
        raise ConfigError(f"model config {str(file)!r} cannot be read ({err.strerror}); pass "
                          "a preset or the path of a Hugging Face config.json") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"model config {str(file)!r} is {_kind(info.st_mode)}, not a file; "
                          "pass the path of a Hugging Face config.json or its folder")
    if info.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"model config {str(file)!r} is {info.st_size:,} bytes; a Hugging "
                          f"Face config.json is a few KiB (at most {MAX_CONFIG_BYTES:,} bytes "
                          "are read)")
    try:
        raw = json.loads(file.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{file}: not valid JSON ({err}); a Hugging Face config.json "
                          "is one JSON object") from None
    except RecursionError:
        raise ConfigError(f"{file}: JSON nested too deeply to be a config.json; a Hugging "
                          "Face config.json is one flat JSON object") from None
    except OSError as err:
        raise ConfigError(f"{file}: cannot be read ({err.strerror})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: holds a JSON {type(raw).__name__}; a Hugging Face "
                          "config.json is one JSON object")
    return raw


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder without a config.json"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_fields(raw: dict[str, object], where: str) -> None:
    """Types and ranges of every field the patterns read; the first wrong one is named."""
    for field in _POSITIVE:
        _check_int(raw, field, where, least=1)
    for field in _NON_NEGATIVE:
        _check_int(raw, field, where, least=0)
    for field in _STRINGS:
        value = raw.get(field)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{where}: {field} is {_show(value)}; it must be a string")
    tie = raw.get("tie_word_embeddings")
    if tie is not None and not isinstance(tie, bool):
        raise ConfigError(f"{where}: tie_word_embeddings is {_show(tie)}; it must be true or "
                          "false")
    dense = raw.get("mlp_only_layers")
    if dense is not None and not (isinstance(dense, list) and all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in dense)):
        raise ConfigError(f"{where}: mlp_only_layers is {_show(dense)}; it must be a list of "
                          "layer indices (non-negative integers)")
    quant = raw.get("quantization_config")
    if quant is not None and not isinstance(quant, dict):
        raise ConfigError(f"{where}: quantization_config is {_show(quant)}; it must be a JSON "
                          "object")
    family = raw.get("model_type")
    if isinstance(family, str) and family.lower() in NOT_TRANSFORMERS:
        raise ConfigError(f"{where}: model_type {family!r} has no attention + MLP layers; the "
                          "engine profiles model transformer decoders (llama, qwen3, mixtral, "
                          "deepseek_v3, gpt_oss, ...)")


def check_shape(raw: dict[str, object], where: str, heads: int, experts: int,
                top_k: int) -> None:
    """Relations between fields that no real model breaks."""
    kv = raw.get("num_key_value_heads")
    if isinstance(kv, int) and not isinstance(kv, bool):
        if kv > heads:
            raise ConfigError(f"{where}: num_key_value_heads({kv}) exceeds "
                              f"num_attention_heads({heads}); a KV head serves one or more "
                              "query heads, so use at most as many")
        if heads % kv:
            raise ConfigError(f"{where}: num_key_value_heads({kv}) does not divide "
                              f"num_attention_heads({heads}); grouped-query attention needs "
                              "heads to be a multiple of KV heads")
    if top_k > experts > 0:
        raise ConfigError(f"{where}: {top_k} experts a token (num_experts_per_tok) of "
                          f"{experts}; choose at most as many as there are")
    if experts > 1 and top_k == 0:
        raise ConfigError(f"{where}: {experts} experts but no num_experts_per_tok; a MoE "
                          "config says how many experts each token uses")


def unknown_family_note(model_type: str) -> str | None:
    """A pattern note for a family the profiles were not written for (None if known)."""
    if model_type.lower() in KNOWN_MODEL_TYPES:
        return None
    return (f"model_type {model_type!r} is not one the engine profiles were written for; "
            "its calls follow the Llama rules (attention and MLP all-reduces per layer)")


def _check_int(raw: dict[str, object], field: str, where: str, least: int) -> None:
    value = raw.get(field)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: {field} is {_show(value)}; it must be an integer "
                          f">= {least}")
    if value < least:
        wanted = "a positive integer" if least == 1 else f">= {least}"
        raise ConfigError(f"{where}: {field} is {value}; it must be {wanted}")


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."

