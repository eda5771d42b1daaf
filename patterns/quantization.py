"""A checkpoint's `quantization_config` as vLLM loads it: which weights are stored how wide,
scales included, and which modules are kept in the model's dtype.

Read at modal-projects/vllm @ c8109375 (`vllm/model_executor/layers/quantization/`):
- `fp8` (`fp8.py` `Fp8Config.from_config`): every decoder linear layer in fp8 (1 byte), one
  fp32 scale a tensor, or one a `weight_block_size` block (DeepSeek-V3, Qwen3-FP8: 128 x 128);
  `ignored_layers`, else `modules_to_not_convert`, stay in the dtype.
- `fbgemm_fp8` (`fbgemm_fp8.py` `FBGEMMFp8Config.from_config`): fp8 with one fp32 scale an
  output row; `modules_to_not_convert` as full module paths (Meta's Llama-3.1-405B-FP8 lists
  its first and last layers' MLP and every layer's attention: Meta's quantizer converts only
  the feed-forward of the other layers).
- `compressed-tensors` (`compressed_tensors/compressed_tensors.py`): `config_groups`, each with
  `targets` ("Linear", or module names / `re:` patterns) and `weights` (`num_bits`, `type`
  int or float, `strategy` tensor / channel / group / block / tensor_group, `group_size`,
  `block_structure`); `input_activations` null is weight-only (W8A16, W4A16); `ignore` kept
  in the dtype. NVFP4 is 4-bit floats with an fp8 scale every 16.
- `modelopt` (`modelopt.py` `ModelOptQuantConfigBase.from_config`): `quant_algo` FP8 (one
  fp32 scale a tensor) or NVFP4 (an fp8 scale every `group_size`, 16), at the top level or
  under `quantization`; `exclude_modules` / `ignore` are wildcards.
- `mxfp4` (gpt-oss, `mxfp4.py`): the experts alone, 4-bit values and an 8-bit scale every 32
  (4.25 bits); attention, router, embedding and LM head stay in the dtype.
- `awq` / `gptq` (`awq.py`, `gptq.py`): `bits`-bit integers with an fp16 scale and a packed
  `bits`-bit zero point every `group_size` inputs (GPTQ's `group_size` -1: one an output row);
  AWQ's `modules_to_not_convert` match as substrings.

The embedding and the LM head are never quantized here (vLLM's VocabParallelEmbedding and
ParallelLMHead take no quant method from these configs). A `quant_method` not above is
refused, naming it: read as bf16 it would double or quadruple the weights.
"""

import fnmatch
import re
from dataclasses import dataclass
from functools import cache

from patterns.errors import ConfigError, shown

KNOWN_METHODS = ("fp8", "fbgemm_fp8", "compressed-tensors", "modelopt", "modelopt_fp4",
                 "mxfp4", "awq", "awq_marlin", "gptq", "gptq_marlin")


@dataclass(frozen=True)
class Format:
    """How one weight is stored: `bits` a value plus `scale_bytes` every `per` values (0: no
    per-value scale). `block`: the (rows, columns) block a scale covers (block fp8), which
    each TP shard must hold whole; `group`: the inputs a scale covers (its shard must too)."""

    label: str
    bits: float
    scale_bytes: float = 0.0
    per: int = 0
    block: tuple[int, int] | None = None
    group: int = 0
    fp8_compute: bool = False  # activations in fp8 too: the GEMM runs at the fp8 rate

    def bytes_per_param(self, row: int) -> float:
        """Bytes a weight takes, its share of the scales included; `row`: the width of a
        row, for a scale an output row."""
        per = row if self.per == ROW else self.per
        return self.bits / 8 + (self.scale_bytes / per if per > 0 else 0.0)


# A row's scale: spread over the row's inputs, taken as the hidden size (the rows' widths
# differ by layer; the scale is 4 bytes over thousands of weights, a 0.1% term).
ROW = -1


@dataclass(frozen=True)
class QuantScheme:
    """`rules`: (targets, format), the first whose targets match a module wins; `ignore`:
    modules kept in the dtype; `experts_only`: only the MoE experts are quantized (mxfp4)."""

    method: str
    rules: tuple[tuple[tuple[str, ...], Format], ...]
    ignore: tuple[str, ...] = ()
    experts_only: bool = False
    substring_ignore: bool = False  # AWQ: an entry anywhere in the module's path
    # A method the tool does not model: the one line that refuses it wherever the weights'
    # bytes are asked for (plan's memory, --disagg's), never read as the dtype; the
    # communication of its model does not depend on it, so pattern and replay still run.
    refusal: str = ""

    def format_of(self, path: str, experts: bool = False) -> Format | None:
        return _format_of(self, path, experts)

    @property
    def fp8_compute(self) -> bool:
        return any(fmt.fp8_compute for _, fmt in self.rules)

    @property
    def label(self) -> str:
        labels = sorted({fmt.label for _, fmt in self.rules})
        return f"{self.method} ({', '.join(labels)})"


@cache
def _format_of(scheme: QuantScheme, path: str, experts: bool) -> Format | None:
    if scheme.experts_only and not experts:
        return None
    if any(_listed(path, entry, scheme.substring_ignore) for entry in scheme.ignore):
        return None
    for targets, fmt in scheme.rules:
        if any(t == "Linear" or _listed(path, t, False) for t in targets):
            return fmt
    return None


def _listed(path: str, entry: str, substring: bool) -> bool:
    """Whether a config's module entry names `path`: `re:` a regular expression from the
    start; a `*` wildcard over the path or one of its dotted prefixes; else the entry as
    whole dotted parts of the path (`lm_head`, `mlp.gate`, `model.layers.0.mlp.down_proj`),
    or anywhere in it for AWQ."""
    if entry.startswith("re:"):
        try:
            return re.match(entry[3:], path) is not None
        except re.error:
            return False
    if "*" in entry or "?" in entry:
        parts = path.split(".")
        return any(fnmatch.fnmatchcase(".".join(parts[:i]), entry)
                   for i in range(1, len(parts) + 1))
    if substring:
        return entry in path
    return f".{entry}." in f".{path}."


def _int(value: object, name: str, where: str, default: int | None = None) -> int:
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: quantization_config {name} is {shown(repr(value), 30)}; "
                          "it must be an integer")
    return value


def _names(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _fp8(raw: dict, where: str) -> QuantScheme:
    block = raw.get("weight_block_size")
    ignore = _names(raw.get("ignored_layers")) or _names(raw.get("modules_to_not_convert"))
    if block is not None:
        if (not isinstance(block, list) or len(block) != 2
                or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0
                           for b in block)):
            raise ConfigError(f"{where}: quantization_config weight_block_size is "
                              f"{shown(repr(block), 30)}; it must be two positive integers, "
                              "e.g. [128, 128]")
        fmt = Format("fp8 block", 8, 4, block[0] * block[1], block=(block[0], block[1]),
                     fp8_compute=True)
    else:
        fmt = Format("fp8 per-tensor", 8, fp8_compute=True)
    return QuantScheme("fp8", ((("Linear",), fmt),), ignore)


def _fbgemm(raw: dict, where: str) -> QuantScheme:
    fmt = Format("fp8 per-row", 8, 4, ROW, fp8_compute=True)
    return QuantScheme("fbgemm_fp8", ((("Linear",), fmt),),
                       _names(raw.get("modules_to_not_convert")))


def _ct_format(weights: dict, activations: object, where: str) -> Format:
    bits = _int(weights.get("num_bits"), "num_bits", where)
    kind = str(weights.get("type") or "int")
    strategy = str(weights.get("strategy") or "tensor")
    group = weights.get("group_size")
    fp8_act = (isinstance(activations, dict) and activations.get("type") == "float"
               and activations.get("num_bits") == 8)
    name = f"{'fp' if kind == 'float' else 'int'}{bits}"
    if kind == "float" and bits == 4:  # NVFP4: an fp8 scale every 16
        size = _int(group, "group_size", where, 16)
        return Format("nvfp4", 4, 1, size, group=size)
    if strategy == "block":
        block = weights.get("block_structure") or [128, 128]
        if not (isinstance(block, list) and len(block) == 2
                and all(isinstance(b, int) and b > 0 for b in block)):
            raise ConfigError(f"{where}: quantization_config block_structure is "
                              f"{shown(repr(block), 30)}; it must be two positive integers")
        return Format(f"{name} block", bits, 4, block[0] * block[1],
                      block=(block[0], block[1]), fp8_compute=fp8_act)
    if strategy in ("group", "tensor_group"):
        size = _int(group, "group_size", where)
        zero = 0.0 if weights.get("symmetric", True) else bits / 8
        return Format(f"{name} group {size}", bits, 2 + zero, size, group=size,
                      fp8_compute=fp8_act)
    if strategy == "channel":
        return Format(f"{name} per-channel", bits, 4, ROW, fp8_compute=fp8_act)
    return Format(f"{name} per-tensor", bits, fp8_compute=fp8_act)


def _compressed(raw: dict, where: str) -> QuantScheme:
    groups = raw.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ConfigError(f"{where}: quantization_config (compressed-tensors) has no "
                          "config_groups; it must describe at least one group of weights")
    rules = []
    for name, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            raise ConfigError(f"{where}: compressed-tensors group {shown(str(name), 30)} has "
                              "no weights; each group says how its weights are stored")
        targets = _names(group.get("targets")) or ("Linear",)
        rules.append((targets, _ct_format(weights, group.get("input_activations"), where)))
    # groups naming modules before the catch-all "Linear" (vLLM matches names first)
    rules.sort(key=lambda rule: "Linear" in rule[0])
    return QuantScheme("compressed-tensors", tuple(rules), _names(raw.get("ignore")))


def _modelopt(raw: dict, where: str) -> QuantScheme:
    body = raw.get("quantization") if isinstance(raw.get("quantization"), dict) else raw
    algo = str(body.get("quant_algo") or "").upper()
    ignore = _names(body.get("exclude_modules")) or _names(body.get("ignore"))
    group = _int(body.get("group_size"), "group_size", where, 16)
    formats = {"FP8": Format("fp8 per-tensor", 8, fp8_compute=True),
               "FP8_PER_CHANNEL_PER_TOKEN": Format("fp8 per-channel", 8, 4, ROW,
                                                   fp8_compute=True),
               "NVFP4": Format("nvfp4", 4, 1, group, group=group)}
    if algo == "MIXED_PRECISION":
        layers = body.get("quantized_layers")
        if not isinstance(layers, dict):
            raise ConfigError(f"{where}: modelopt MIXED_PRECISION without quantized_layers")
        rules = []
        for module, spec in layers.items():
            sub = str(spec.get("quant_algo", "")).upper() if isinstance(spec, dict) else ""
            if sub not in formats:
                raise ConfigError(f"{where}: modelopt quant_algo {shown(sub, 30)!r} of "
                                  f"{shown(str(module), 40)} is not modelled; one of "
                                  f"{', '.join(formats)}")
            rules.append(((str(module),), formats[sub]))
        return QuantScheme("modelopt", tuple(rules), ignore)
    if algo not in formats:
        raise ConfigError(f"{where}: modelopt quant_algo {shown(algo, 30)!r} is not modelled; "
                          f"one of {', '.join(formats)} or MIXED_PRECISION")
    return QuantScheme("modelopt", ((("Linear",), formats[algo]),), ignore)


def _mxfp4(raw: dict, where: str) -> QuantScheme:
    fmt = Format("mxfp4", 4, 1, 32, group=32)
    return QuantScheme("mxfp4", ((("Linear",), fmt),),
                       _names(raw.get("modules_to_not_convert")), experts_only=True)


def _awq_gptq(raw: dict, where: str, method: str) -> QuantScheme:
    bits = _int(raw.get("bits", raw.get("w_bit")), "bits", where)
    group = _int(raw.get("group_size", raw.get("q_group_size")), "group_size", where, 128)
    if bits not in (2, 3, 4, 8):
        raise ConfigError(f"{where}: {method} bits {bits}; vLLM loads 2, 3, 4 or 8")
    per = ROW if group == -1 else group
    fmt = Format(f"int{bits} group {group}", bits, 2 + bits / 8, per,
                 group=0 if group == -1 else group)
    awq = method.startswith("awq")
    return QuantScheme("awq" if awq else "gptq", ((("Linear",), fmt),),
                       _names(raw.get("modules_to_not_convert")), substring_ignore=awq)


def quantization_scheme(raw_config: dict[str, object], where: str) -> QuantScheme | None:
    """The scheme of a config.json's `quantization_config` (None: not quantized); a malformed
    config refused in one line; a method the tool does not model kept as a refusal
    (`QuantScheme.refusal`), raised where its weights are sized."""
    raw = raw_config.get("quantization_config")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: quantization_config is {type(raw).__name__}; it must be "
                          "an object with a quant_method")
    method = str(raw.get("quant_method") or "").lower()
    if not method:
        keys = ", ".join(f"{k} {shown(repr(v), 12)}" for k, v in list(raw.items())[:3])
        return QuantScheme("", (), refusal=(
            f"{where}: quantization_config has no quant_method ({keys}: another tool's format, "
            "an MLX checkpoint's?); vLLM loads none without one, and its weights are not "
            f"{raw_config.get('torch_dtype')}"))
    readers = {"fp8": _fp8, "fbgemm_fp8": _fbgemm, "compressed-tensors": _compressed,
               "modelopt": _modelopt, "modelopt_fp4": _modelopt, "mxfp4": _mxfp4}
    if method in readers:
        return readers[method](raw, where)
    if method in ("awq", "awq_marlin", "gptq", "gptq_marlin"):
        return _awq_gptq(raw, where, method)
    return QuantScheme(method, (), refusal=(
        f"{where}: quantization_config.quant_method {shown(method, 40)!r} is not modelled (its "
        f"weights are not {raw_config.get('torch_dtype')}, and no width is guessed); the known "
        f"ones are {', '.join(KNOWN_METHODS)}"))


# The presets carry their checkpoint's method alone (models.py `weight_format`): the scheme
# their config.json gives (tests/data/configs: deepseek-r1 block fp8 128 x 128, gpt-oss mxfp4).
PRESET_SCHEMES = {"fp8": _fp8({"weight_block_size": [128, 128]}, "preset"),
                  "mxfp4": _mxfp4({"modules_to_not_convert": [
                      "model.layers.*.self_attn", "model.layers.*.mlp.router",
                      "model.embed_tokens", "lm_head"]}, "preset")}
