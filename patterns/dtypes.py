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
    # torch.bool, one byte an element: Megatron's MoE dispatcher all-gathers its routing map
    # as bool (patterns/engines/megatron/moe.py); NCCL carries it as uint8, as torch does.
    "bool": 1,
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
        # fp8/mxfp4 name weight formats, not what travels: vLLM's Fp8/Mxfp4 MoE methods
        # quantise weights (and at most the EP dispatch input), the residual stream that
        # all-reduces carry stays in the checkpoint's torch_dtype (bf16).
        why = (" (fp8/mxfp4 checkpoints quantise weights; their activations stay bf16: give "
               "the checkpoint's config, not --dtype)" if key in ("fp8", "mxfp4", "fp4",
                                                                     "int8", "int4") else "")
        raise ConfigError(
            f"dtype {name!r} is not a model dtype; use one of {', '.join(MODEL_DTYPES)}{why}"
        )
    return key


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a canonical dtype name."""
    return DTYPE_BYTES[dtype]
