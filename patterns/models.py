"""Model configurations: the few fields that set message sizes, with Hugging Face names.

Presets cite the config.json their numbers come from (engine spec, section 8). Any other
decoder model is read from its own `config.json` with `from_hf_config`.
"""

from dataclasses import dataclass, replace
from pathlib import Path

from patterns.config_checks import check_fields, check_shape, read_config_json
from patterns.dtypes import canonical_dtype
from patterns.errors import ConfigError, printable, shown
from patterns.families import embedding_traits
from patterns.hybrid import Block, HybridLayers, hybrid_layer_count, read_hybrid
from patterns.quantization import QuantScheme, quantization_scheme


@dataclass(frozen=True)
class ModelConfig:
    """What an engine's communication depends on. Field names follow Hugging Face."""

    name: str
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    torch_dtype: str  # canonical short name: bf16, fp16 or fp32
    tie_word_embeddings: bool = False
    num_local_experts: int = 0  # 0 for a dense model
    num_experts_per_tok: int = 0
    source: str = ""
    model_type: str = "llama"  # HF model_type: sets the module names of the tags
    # Indices of the MoE layers; None: every layer of a model with experts, none otherwise.
    moe_layers: tuple[int, ...] | None = None
    mla: bool = False  # multi-head latent attention (DeepSeek: kv_lora_rank in the config)
    max_position_embeddings: int = 0  # longest sequence the model takes; 0 when not known
    # Weight shapes beyond what communication needs (patterns/weights.py); 0: derived
    # (head_dim = hidden / heads, moe_intermediate_size = intermediate_size).
    head_dim: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # DeepSeek: n_shared_experts x moe size
    # MLA (DeepSeek): q_lora_rank 0 means q is projected directly.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    weight_format: str = ""  # quantization_config.quant_method: "fp8", "mxfp4" or ""
    # Sliding-window attention: the window in tokens and the layers that use it (HF
    # `sliding_window` and `layer_types`); 0 / () where every layer attends to everything.
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] = ()
    # Mamba hybrids (patterns/hybrid.py): each layer's blocks; None for attention + MLP layers.
    hybrid: HybridLayers | None = None
    # What decides whether the embedding all-reduce fuses with the first norm
    # (patterns/families.py): embedded outside the compiled graph (multimodal), scaled before
    # the norm, or a family none of whose all-reduces meets an RMSNorm.
    multimodal: bool = False
    embedding_scaled: bool = False
    norm_fusion: bool = True
    # quantization_config as vLLM loads it (patterns/quantization.py); None: not quantized,
    # or a preset (its weight_format stands for its config's scheme)
    quantization: QuantScheme | None = None

    def __post_init__(self) -> None:
        if self.moe_layers is None:
            layers = tuple(range(self.num_hidden_layers)) if self.num_local_experts > 1 else ()
            object.__setattr__(self, "moe_layers", layers)

    @property
    def is_moe(self) -> bool:
        return self.num_local_experts > 1 and bool(self.moe_layers)

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_local_experts > 1 and layer in (self.moe_layers or ())

    def layer_blocks(self, layer: int) -> tuple[Block, ...]:
        """A hybrid layer's blocks in call order; () for an attention + MLP layer."""
        return self.hybrid.layers[layer] if self.hybrid else ()

    @property
    def embedding_fusable(self) -> bool:
        """Whether the embedding all-reduce goes straight into the first RMSNorm of the
        compiled graph (vLLM's fusion can take it only then)."""
        return self.norm_fusion and not (self.multimodal or self.embedding_scaled)

    def check_sequence(self, prompt: int, decode: int) -> None:
        """Refuse sequences longer than the model's positions (vLLM's max_model_len)."""
        limit = self.max_position_embeddings
        if limit and prompt + decode > limit:
            raise ConfigError(f"prompt({prompt}) + decode({decode}) = {prompt + decode} tokens "
                              f"exceed max_position_embeddings({limit}) of {self.name}; use "
                              f"prompt + decode <= {limit}")

    @property
    def default_dtype(self) -> str:
        """The dtype vLLM's `dtype=auto` picks: the config's, with fp32 served as bf16."""
        return "bf16" if self.torch_dtype == "fp32" else self.torch_dtype


def _llama(name: str, h: int, layers: int, vocab: int, heads: int, kv: int, inter: int,
           dtype: str, source: str, tie: bool = False) -> ModelConfig:
    return ModelConfig(name=name, hidden_size=h, num_hidden_layers=layers, vocab_size=vocab,
                       num_attention_heads=heads, num_key_value_heads=kv,
                       intermediate_size=inter, torch_dtype=dtype, tie_word_embeddings=tie,
                       source=source)


_HF = "https://huggingface.co/"


def mlp_module(model: ModelConfig, layer: int) -> str:
    """The module whose output a layer's second all-reduce sums, as the engine names it.

    Dense layers (of a dense or a MoE model) reduce `down_proj`; MoE layers reduce the
    experts' summed output (shared experts included) once.
    """
    prefix = "feed_forward" if model.model_type.startswith("llama4") else "mlp"
    if not model.is_moe_layer(layer):
        return f"{prefix}.down_proj"
    if model.model_type == "llama" or model.model_type == "mixtral":
        return "block_sparse_moe"  # Mixtral's module name (models/mixtral.py)
    return f"{prefix}.experts"

# Numbers from engine_comm_spec.md section 8; each source is a public copy of the official
# config.json (its `_name_or_path` names the official repository).
PRESETS: dict[str, ModelConfig] = {m.name: m for m in (
    _llama("llama-3.2-1b", 2048, 16, 128256, 32, 8, 8192, "bf16",
           _HF + "Emm9625/Llama-3.2-1B-chatml (copy of meta-llama/Llama-3.2-1B)", tie=True),
    _llama("llama-3.2-3b", 3072, 28, 128256, 24, 8, 8192, "bf16",
           _HF + "mlx-community/Llama-3.2-3B-bf16", tie=True),
    _llama("llama-3.1-8b", 4096, 32, 128256, 32, 8, 14336, "bf16",
           _HF + "NbAiLab/nb-llama-3.1-8B (_name_or_path meta-llama/Llama-3.1-8B)"),
    _llama("llama-2-7b", 4096, 32, 32000, 32, 32, 11008, "fp16",
           _HF + "philschmid/Llama-2-7b-hf"),
    _llama("llama-2-13b", 5120, 40, 32000, 40, 40, 13824, "fp16",
           _HF + "LoftQ/Llama-2-13b-hf-4bit-64rank (from meta-llama/Llama-2-13b-hf)"),
    _llama("llama-3.1-70b", 8192, 80, 128256, 64, 8, 28672, "bf16",
           _HF + "mlabonne/Llama-3.1-70B-Instruct-lorablated"),
    # num_key_value_heads is 8 in the official snapshot; early copies said 16.
    _llama("llama-3.1-405b", 16384, 126, 128256, 128, 8, 53248, "bf16",
           _HF + "uiuc-convai/CoALM-405B (from meta-llama/Llama-3.1-405B-Instruct)"),
    ModelConfig(name="mixtral-8x7b", hidden_size=4096, num_hidden_layers=32, vocab_size=32000,
                num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                torch_dtype="bf16", num_local_experts=8, num_experts_per_tok=2,
                model_type="mixtral",
                source=_HF + "mistralai/Mixtral-8x7B-Instruct-v0.1 @eba92302"),
    _llama("qwen2.5-7b", 3584, 28, 152064, 28, 4, 18944, "bf16",
           _HF + "AmberYifan/Qwen2.5-7B-gen-dpo-10k (from Qwen/Qwen2.5-7B)"),
    # tests/data/configs/README.md lists the copies these four were read from.
    ModelConfig(name="qwen3-8b", hidden_size=4096, num_hidden_layers=36, vocab_size=151936,
                num_attention_heads=32, num_key_value_heads=8, intermediate_size=12288,
                torch_dtype="bf16", model_type="qwen3",
                source=_HF + "Qwen/Qwen3-8B config.json (copy: tests/data/configs/qwen3-8b)"),
    ModelConfig(name="qwen3-30b-a3b", hidden_size=2048, num_hidden_layers=48,
                vocab_size=151936, num_attention_heads=32, num_key_value_heads=4,
                intermediate_size=6144, torch_dtype="bf16", num_local_experts=128,
                num_experts_per_tok=8, model_type="qwen3_moe", head_dim=128,
                moe_intermediate_size=768,
                source=_HF + "Qwen/Qwen3-30B-A3B config.json (copy: tests/data/configs/"
                       "qwen3-30b-a3b)"),
    ModelConfig(name="deepseek-v3", hidden_size=7168, num_hidden_layers=61, vocab_size=129280,
                num_attention_heads=128, num_key_value_heads=128, intermediate_size=18432,
                torch_dtype="bf16", num_local_experts=256, num_experts_per_tok=8,
                model_type="deepseek_v3", moe_layers=tuple(range(3, 61)), mla=True,
                moe_intermediate_size=2048, shared_expert_intermediate_size=2048,
                q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                qk_rope_head_dim=64, v_head_dim=128, weight_format="fp8",
                source=_HF + "deepseek-ai/DeepSeek-V3 config.json (= DeepSeek-R1's, copy: "
                       "tests/data/configs/deepseek-r1; first_k_dense_replace 3, MLA)"),
    ModelConfig(name="gpt-oss-120b", hidden_size=2880, num_hidden_layers=36, vocab_size=201088,
                num_attention_heads=64, num_key_value_heads=8, intermediate_size=2880,
                torch_dtype="fp32", num_local_experts=128, num_experts_per_tok=4,
                model_type="gpt_oss", head_dim=64, weight_format="mxfp4",
                sliding_window=128, sliding_layers=tuple(range(0, 36, 2)),
                source=_HF + "openai/gpt-oss-120b config.json (as tests/data/configs/"
                       "gpt-oss-20b with 36 layers, 128 experts; no torch_dtype: bf16; "
                       "layer_types alternate sliding_attention (window 128) and "
                       "full_attention from layer 0)"),
)}

# max_position_embeddings of each preset, from the config.json its `source` names.
_POSITIONS = {"llama-3.2-1b": 131072, "llama-3.2-3b": 131072, "llama-3.1-8b": 131072,
              "llama-2-7b": 4096, "llama-2-13b": 4096, "llama-3.1-70b": 131072,
              "llama-3.1-405b": 131072, "mixtral-8x7b": 32768, "qwen2.5-7b": 131072,
              "qwen3-8b": 40960, "qwen3-30b-a3b": 40960, "deepseek-v3": 163840,
              "gpt-oss-120b": 131072}
PRESETS = {name: replace(model, max_position_embeddings=_POSITIONS.get(name, 0))
           for name, model in PRESETS.items()}

# Far beyond any decoder model (Llama-3.1-405B has 126 layers): a larger count is a typo or
# garbage, and each layer adds calls to every step of the pattern.
MAX_LAYERS = 10_000

_REQUIRED = ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads")
# Expert-count field names differ between model families.
_EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")
_TOP_K_FIELDS = ("num_experts_per_tok", "experts_per_token")

# Fields a family's config.json may leave out, with the defaults of its transformers config
# class, which is what transformers (and so vLLM) reads then: a Gemma 3 text_config may hold
# only what differs from Gemma3TextConfig (huggingface/transformers @ 008f5c8c,
# models/gemma3/configuration_gemma3.py, Gemma3TextConfig.__init__).
_FAMILY_DEFAULTS: dict[str, dict[str, object]] = {
    "gemma3_text": {"vocab_size": 262208, "num_attention_heads": 8,
                    "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 4096,
                    "tie_word_embeddings": True},
}


def _moe_layers(raw: dict[str, object], layers: int, experts: int) -> tuple[int, ...]:
    """Which layers are MoE, by each family's rule in vLLM's model file."""
    if experts <= 1:
        return ()
    if "first_k_dense_replace" in raw:  # models/deepseek_v2.py: DeepseekV2DecoderLayer
        first = int(raw.get("first_k_dense_replace") or 0)
        freq = int(raw.get("moe_layer_freq") or 1)
        return tuple(i for i in range(layers) if i >= first and i % freq == 0)
    if "interleave_moe_layer_step" in raw:  # models/llama4.py: Llama4DecoderLayer
        step = int(raw.get("interleave_moe_layer_step") or 0)
        return tuple(i for i in range(layers) if step > 0 and (i + 1) % step == 0)
    if "decoder_sparse_step" in raw:  # models/qwen3_moe.py (and qwen2_moe.py)
        step = int(raw.get("decoder_sparse_step") or 1)
        dense = set(raw.get("mlp_only_layers") or ())  # type: ignore[call-overload]
        return tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)
    return tuple(range(layers))  # Mixtral, gpt-oss: every layer


def _positive_int(raw: dict[str, object], field: str, where: str) -> int:
    value = raw[field]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{where}: {field} is {value!r}; it must be a positive integer")
    return value


def _weight_shapes(raw: dict[str, object]) -> dict[str, object]:
    """The config's weight-shape fields that ModelConfig keeps (absent or null: 0)."""
    def size(field: str) -> int:
        value = raw.get(field)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
    moe = size("moe_intermediate_size")
    shared = size("shared_expert_intermediate_size") or size("n_shared_experts") * moe
    quant = raw.get("quantization_config")
    method = str(quant.get("quant_method", "")) if isinstance(quant, dict) else ""
    return {"head_dim": size("head_dim"), "moe_intermediate_size": moe,
            "shared_expert_intermediate_size": shared, "q_lora_rank": size("q_lora_rank"),
            "kv_lora_rank": size("kv_lora_rank"), "qk_nope_head_dim": size("qk_nope_head_dim"),
            "qk_rope_head_dim": size("qk_rope_head_dim"), "v_head_dim": size("v_head_dim"),
            "weight_format": method if method in ("fp8", "mxfp4") else ""}


def _sliding(raw: dict[str, object], layers: int, where: str) -> dict[str, object]:
    """`sliding_window` and the layers `layer_types` marks "sliding_attention" (both needed:
    a window without layer types is left out, as Qwen2's unused one). A `layer_types` that is
    not one name a layer, sliding layers without a positive window, or a Gemma 3
    `sliding_window_pattern` that is not a positive integer are refused (they were read as
    full attention, silently).

    A Gemma 3 config without `layer_types` gets them as transformers makes them from its
    `sliding_window_pattern` (6 by default): layer i slides unless (i + 1) is a multiple of
    the pattern (huggingface/transformers, src/transformers/models/gemma3/
    modular_gemma3.py, `Gemma3TextConfig.__init__`: "BC -> the pattern used to be a simple
    int"), which vLLM reads per layer (models/gemma3.py:153-155 @ c8109375)."""
    window, types = raw.get("sliding_window"), raw.get("layer_types")
    pattern = raw.get("sliding_window_pattern")
    if types is None and raw.get("model_type") == "gemma3_text":
        every = 6 if pattern is None else pattern
        if not isinstance(every, int) or isinstance(every, bool) or every <= 0:
            raise ConfigError(f"{where}: sliding_window_pattern is {shown(repr(pattern), 20)}; "
                              "it must be a positive integer (every Nth layer attends to all)")
        types = ["sliding_attention" if (i + 1) % every else "full_attention"
                 for i in range(layers)]
    if types is None:
        return {}
    if (not isinstance(types, list) or len(types) != layers
            or not all(isinstance(kind, str) for kind in types)):
        said = f"{len(types)} entries" if isinstance(types, list) else type(types).__name__
        raise ConfigError(f"{where}: layer_types is {said}; it must list one attention kind a "
                          f"layer ({layers}), e.g. sliding_attention or full_attention")
    if "sliding_attention" in types and (not isinstance(window, int) or isinstance(window, bool)
                                         or window <= 0):
        raise ConfigError(f"{where}: layer_types marks sliding_attention layers, but "
                          f"sliding_window is {shown(repr(window), 20)}; it must be a positive "
                          "number of tokens")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return {}
    sliding = tuple(i for i, kind in enumerate(types) if kind == "sliding_attention")
    return {"sliding_window": window, "sliding_layers": sliding} if sliding else {}


def model_name(raw: dict, file: Path, hidden: int, layers: int) -> str:
    """A name from the model itself, never from the folder holding the file (a Hugging Face
    cache folder is a commit hash): `_name_or_path`'s last part, else model_type with its size,
    else the file's stem."""
    # escaped: the name is printed in every header, and a file's text never drives the terminal
    given = printable(str(raw.get("_name_or_path") or "").rstrip("/"))
    if given:  # a hub id (org/model) as it is; a local path by its last part
        return given.rsplit("/", 1)[-1] if given[0] in "/.~" else given
    if raw.get("model_type"):
        return f"{printable(str(raw['model_type']))}-h{hidden}-L{layers}"
    return printable(file.stem)


def from_hf_config(path: str | Path) -> ModelConfig:
    """Read a Hugging Face `config.json` (or a folder holding one)."""
    file = Path(path)
    if file.is_dir():
        if not (file / "config.json").exists():
            raise ConfigError(f"folder {str(file)!r} holds no config.json; pass a preset or a "
                              "Hugging Face model folder or config.json")
        file = file / "config.json"
    if not file.exists():
        presets = ", ".join(PRESETS)
        raise ConfigError(f"model config {str(file)!r} does not exist; pass a preset "
                          f"({presets}) or the path of a Hugging Face config.json")
    raw = top = read_config_json(file)
    # Multimodal configs (Gemma 3, Llama 4) keep the language model's fields under
    # text_config; its model_type (gemma3_text, llama4_text) is the one that matters.
    if "hidden_size" not in raw and isinstance(raw.get("text_config"), dict):
        raw = {**raw, **raw["text_config"]}
    raw = {**_FAMILY_DEFAULTS.get(str(raw.get("model_type")), {}), **raw}
    check_fields(raw, str(file))
    if (count := hybrid_layer_count(raw)) is not None:
        raw = {**raw, "num_hidden_layers": count}
    missing = [f for f in _REQUIRED if f not in raw]
    if missing:
        raise ConfigError(f"{file}: lacks {', '.join(missing)}; a decoder model's config.json "
                          f"has all of {', '.join(_REQUIRED)}")
    where = str(file)
    values = {f: _positive_int(raw, f, where) for f in _REQUIRED}
    if values["num_hidden_layers"] > MAX_LAYERS:
        raise ConfigError(f"{where}: num_hidden_layers is {values['num_hidden_layers']}; no "
                          f"decoder model has more than a few hundred (Llama-3.1-405B has "
                          f"126): use at most {MAX_LAYERS}")
    positions = raw.get("max_position_embeddings")
    kv = raw.get("num_key_value_heads") or values["num_attention_heads"]
    experts = int(next((raw[f] for f in _EXPERT_FIELDS if raw.get(f)), 0))
    top_k = int(next((raw[f] for f in _TOP_K_FIELDS if raw.get(f)), 0))
    check_shape(raw, where, values["num_attention_heads"], experts, top_k)
    try:
        # No dtype at all (gpt-oss) is float32 to transformers, which vLLM serves as bf16.
        dtype = canonical_dtype(str(raw.get("torch_dtype") or raw.get("dtype") or "float32"))
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    name = model_name(raw, file, values["hidden_size"], values["num_hidden_layers"])
    hybrid = read_hybrid(raw, where, values["num_hidden_layers"], values["hidden_size"])
    family = str(raw.get("model_type") or "llama")
    return ModelConfig(
        name=name,
        num_key_value_heads=int(kv),
        intermediate_size=int(raw.get("intermediate_size") or 4 * values["hidden_size"]),
        torch_dtype=dtype,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        num_local_experts=experts,
        num_experts_per_tok=top_k,
        source=str(file.resolve()),
        model_type=family,
        moe_layers=(hybrid.moe_layers() if hybrid and experts > 1
                    else _moe_layers(raw, values["num_hidden_layers"], experts)),
        mla=bool(raw.get("kv_lora_rank")),
        **_weight_shapes(raw),
        quantization=quantization_scheme(raw, where),
        **({} if hybrid else _sliding(raw, values["num_hidden_layers"], where)),
        hybrid=hybrid, **embedding_traits(top, family),
        max_position_embeddings=(positions if isinstance(positions, int)
                                 and not isinstance(positions, bool) and positions > 0 else 0),
        **values,
    )


def resolve_model(name_or_path: str) -> ModelConfig:
    """A preset by name (case-insensitive), else a path to a config.json or its folder."""
    preset = PRESETS.get(name_or_path.strip().lower())
    if preset is not None:
        return preset
    looks_like_path = any(c in name_or_path for c in "/\\") or name_or_path.endswith(".json")
    if looks_like_path or Path(name_or_path).exists():
        return from_hf_config(name_or_path)
    raise ConfigError(f"unknown model {name_or_path!r}; use a preset ({', '.join(PRESETS)}) "
                      "or the path of a Hugging Face config.json")
