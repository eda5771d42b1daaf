"""One validation of a Hugging Face config.json: every field the patterns read, its type and
its range, before any of it becomes a ModelConfig.

A config that cannot describe a model (more experts chosen than exist, more KV heads than
heads, a negative size, an integer of thousands of digits, a layer kind no model has) is
refused with the field, its value and what would be right; an architecture whose layers are
neither attention + MLP nor one of the Mamba hybrids `patterns/hybrid.py` reads (pure Mamba,
RWKV) is refused, since its communication follows none of the profiles' rules.
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
    "nemotron_h", "granitemoehybrid", "falcon_h1", "jamba",  # patterns/hybrid.py
})

# Families without attention + MLP layers: their state-space or recurrent mixers move
# nothing the profiles know how to count.
NOT_TRANSFORMERS = frozenset({
    "mamba", "mamba2", "falcon_mamba", "rwkv", "rwkv5", "rwkv6", "rwkv7", "zamba",
    "zamba2", "recurrent_gemma", "xlstm", "bamba", "lfm2", "plamo2",
})

# Families whose every model has experts: 0 of them cannot be one of these.
MOE_FAMILIES = frozenset({
    "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "olmoe",
    "granitemoe", "glm4_moe", "ernie4_5_moe", "kimi_k2", "llama4", "llama4_text",
})

# The layer kinds transformers accepts in `layer_types` (huggingface/transformers 5.24,
# configuration_utils.py ALLOWED_LAYER_TYPES) and its legacy names (_LEGACY_LAYER_TYPE_REMAP):
# any other entry is a typo that would be read as full attention.
LAYER_TYPES = (
    "full_attention", "sliding_attention", "chunked_attention", "window_attention",
    "indexed_attention", "compressed_sparse_attention", "heavily_compressed_attention",
    "minimax_m3_sparse", "conv", "moe", "hybrid", "hybrid_sliding",
    "reference_sliding_attention", "linear_attention", "sparse", "dense", "mamba", "attention",
    "mlp",  # nemotron_h's layers_block_type (transformers NemotronHConfig)
)

# Beyond int64 no config field means anything (sizes, ids and counts are far below).
MAX_INT_DIGITS = 18

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
        raw = json.loads(file.read_bytes(), parse_int=_bounded_int)
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
    _refuse_huge_ints(raw, str(file))
    return raw


class _HugeInt(int):
    """An integer literal of more than MAX_INT_DIGITS digits, kept as its digit count (int()
    of over 4,300 digits raises, and no field needs one): named by its field after parsing."""


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    return _HugeInt(digits) if digits > MAX_INT_DIGITS else int(text)


def _refuse_huge_ints(raw: dict[str, object], where: str) -> None:
    """The first integer of more than MAX_INT_DIGITS digits, named by its path."""
    stack: list[tuple[str, object]] = [("", raw)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _HugeInt):
            raise ConfigError(f"{where}: {path} is an integer of {int(value):,} digits; a "
                              "config.json's sizes, counts and ids fit in 64 bits (at most "
                              f"{MAX_INT_DIGITS} digits)")
        if isinstance(value, dict):
            stack += [(f"{path}.{k}" if path else str(k), v) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(f"{path}[{i}]", v) for i, v in enumerate(value)]


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
                          "deepseek_v3, gpt_oss, ...) and the Mamba hybrids nemotron_h, "
                          "granitemoehybrid, falcon_h1 and jamba")
    for field in ("layer_types", "layers_block_type"):
        _check_layer_kinds(raw.get(field), field, where)
    _check_zero_experts(raw, where)


def _check_layer_kinds(kinds: object, field: str, where: str) -> None:
    """Every entry of a layer-kind list one transformers knows (its type and length are
    checked where the list is read)."""
    if not isinstance(kinds, list):
        return
    for i, kind in enumerate(kinds):
        if isinstance(kind, str) and kind not in LAYER_TYPES:
            raise ConfigError(f"{where}: {field}[{i}] is {_show(kind)}, a layer kind no model "
                              f"has; each entry must be one of {', '.join(LAYER_TYPES)}")


def _check_zero_experts(raw: dict[str, object], where: str) -> None:
    """0 experts in a config that chooses some a token, or in a family that always has
    experts, was read as a dense model."""
    for field in ("num_local_experts", "num_experts", "n_routed_experts"):
        if raw.get(field) != 0 or isinstance(raw.get(field), bool):
            continue
        top_k = next((raw[f] for f in ("num_experts_per_tok", "experts_per_token")
                      if isinstance(raw.get(f), int) and raw[f] > 0), 0)
        family = str(raw.get("model_type") or "").lower()
        if top_k:
            raise ConfigError(f"{where}: {field} is 0 but num_experts_per_tok is {top_k}; a "
                              f"mixture-of-experts config has at least {top_k} experts (a "
                              "dense model gives no experts and no experts a token)")
        if family in MOE_FAMILIES:
            raise ConfigError(f"{where}: {field} is 0, but every {family} model has experts; "
                              "give its number of experts (more than 1)")


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

