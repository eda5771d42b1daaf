"""Element types of the tensors an engine communicates, and their sizes."""

from patterns.errors import ConfigError

# Canonical short names, as the CLI and result files spell them.
DTYPE_BYTES: dict[str, int] = {
    "bf16": 2,
    "fp16": 2,
    "fp32": 4,
    "int64": 8,
    "int32": 4,
    "uint8": 1,
}

# Spellings found in Hugging Face configs (torch_dtype) and on command lines.
_ALIASES: dict[str, str] = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
}

MODEL_DTYPES = ("bf16", "fp16", "fp32")


def canonical_dtype(name: str) -> str:
    """Return the short name of a model dtype (bf16, fp16, fp32) from any usual spelling."""
    key = name.strip().lower().removeprefix("torch.")
    key = _ALIASES.get(key, key)
    if key not in MODEL_DTYPES:
        raise ConfigError(
            f"dtype {name!r} is not a model dtype; use one of {', '.join(MODEL_DTYPES)}"
        )
    return key


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a canonical dtype name."""
    return DTYPE_BYTES[dtype]
