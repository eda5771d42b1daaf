"""Hybrid models: decoder layers whose mixer is a Mamba state-space block beside, or instead
of, attention, read from a Hugging Face config.json as vLLM builds their layers
(modal-projects/vllm @ c8109375, `vllm/model_executor/models/`):

- `nemotron_h` (`nemotron_h.py:531-536, 574-596`): one block a layer, by
  `hybrid_override_pattern` (M Mamba-2, * attention, - MLP, E MoE) or, as transformers 5
  writes it, `layers_block_type` (mamba / linear_attention, attention / full_attention, mlp,
  moe); the mixer is `layers.i.mixer`;
- `granitemoehybrid` (`granitemoehybrid.py:55-140, 318-325`): `layer_types` picks Mamba-2
  (`mamba`, `linear_attention`) or attention (`attention`, `full_attention`), then the
  experts (`num_local_experts` > 0) and the shared MLP (`shared_intermediate_size` > 0);
- `falcon_h1` (`falcon_h1.py:315-411`): every layer attention, then Mamba-2, then the MLP;
- `jamba` (`jamba.py:115-300`, periods as transformers' JambaConfig.layers_block_type and
  layers_num_experts): attention where i % attn_layer_period == attn_layer_offset, else
  Mamba-1 (`layers/mamba/mamba_mixer.py`); experts where i % expert_layer_period ==
  expert_layer_offset (num_experts > 1), else the MLP.
Defaults for absent fields are those of transformers' config classes (5.24:
GraniteMoeHybridConfig, FalconH1Config, JambaConfig).
"""

from dataclasses import dataclass
from math import ceil

from patterns.errors import ConfigError, shown

ATTENTION, MAMBA, MLP, MOE, SHARED_MLP = "attention", "mamba", "mlp", "moe", "shared_mlp"
Block = tuple[str, str]  # (kind: which calls, module: its name in the tags, under layers.i)
HYBRID_FAMILIES = ("nemotron_h", "granitemoehybrid", "falcon_h1", "jamba")


@dataclass(frozen=True)
class Mamba:
    """The mixer's sizes that set its calls and the TP degrees vLLM accepts."""

    version: int  # 2: MambaMixer2 (layers/mamba/mamba_mixer2.py); 1: MambaMixer (Jamba)
    heads: int = 0  # Mamba-2 heads, split over TP
    groups: int = 0  # Mamba-2 n_groups
    gated_norm: bool = True  # Mamba-2's Mixer2RMSNormGated normalises (use_rms_norm)
    inner: int = 0  # Mamba-1 intermediate size, split over TP
    ssm_params: int = 0  # Mamba-1 x_proj output width: dt_rank + 2 x d_state


@dataclass(frozen=True)
class HybridLayers:
    family: str
    layers: tuple[tuple[Block, ...], ...]  # each layer's blocks, in the order it runs them
    mamba: Mamba
    latent_moe: int = 0  # nemotron_h moe_latent_size: routed experts reduce in this width
    shared_experts: bool = False  # nemotron_h shared experts beside latent routed ones

    def moe_layers(self) -> tuple[int, ...]:
        return tuple(i for i, blocks in enumerate(self.layers)
                     if any(kind == MOE for kind, _ in blocks))


def _int(raw: dict[str, object], field: str, where: str, default: int | None = None,
         least: int = 1) -> int:
    value = raw.get(field, default)
    if value is None:
        value = default
    if value is None:
        raise ConfigError(f"{where}: lacks {field}; a {raw.get('model_type')} config.json "
                          f"gives it (an integer >= {least})")
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{where}: {field} is {shown(repr(value), 20)}; it must be an "
                          f"integer >= {least}")
    return value


def _names(raw: dict[str, object], field: str, where: str, known: dict[str, str],
           layers: int | None) -> list[str]:
    """A list of layer kinds, each one `known` maps, one a layer."""
    kinds = raw.get(field)
    if not isinstance(kinds, list) or not kinds:
        raise ConfigError(f"{where}: {field} is {shown(repr(kinds), 30)}; it must list one "
                          f"layer kind a layer ({', '.join(known)})")
    for i, kind in enumerate(kinds):
        if kind not in known:
            raise ConfigError(f"{where}: {field}[{i}] is {shown(repr(kind), 30)}; each entry "
                              f"must be one of {', '.join(known)}")
    if layers is not None and len(kinds) != layers:
        raise ConfigError(f"{where}: {field} has {len(kinds)} entries for num_hidden_layers"
                          f"({layers}); give one a layer")
    return [known[k] for k in kinds]


_NEMOTRON_NAMES = {"mamba": "M", "linear_attention": "M", "attention": "*",
                   "full_attention": "*", "mlp": "-", "moe": "E"}
_NEMOTRON_BLOCKS = {"M": (MAMBA, "mixer"), "*": (ATTENTION, "mixer.o_proj"),
                    "-": (MLP, "mixer.down_proj"), "E": (MOE, "mixer.experts")}


def _nemotron_h(raw: dict[str, object], where: str, layers: int | None) -> HybridLayers:
    pattern = raw.get("hybrid_override_pattern")
    if pattern is None:
        pattern = "".join(_names(raw, "layers_block_type", where, _NEMOTRON_NAMES, layers))
    if not isinstance(pattern, str) or not pattern or set(pattern) - set(_NEMOTRON_BLOCKS):
        raise ConfigError(f"{where}: hybrid_override_pattern is {shown(repr(pattern), 30)}; "
                          "it must be a string of M (Mamba-2), * (attention), - (MLP) and E "
                          "(MoE), one a layer")
    if layers is not None and len(pattern) != layers:  # configs/nemotron_h.py:219-221
        raise ConfigError(f"{where}: hybrid_override_pattern has {len(pattern)} layers, "
                          f"num_hidden_layers {layers}; vLLM needs them equal")
    groups = "n_groups" if "n_groups" in raw else "mamba_n_groups"  # transformers 5 names
    mamba = Mamba(2, heads=_int(raw, "mamba_num_heads", where), groups=_int(raw, groups, where))
    latent = raw.get("moe_latent_size")
    return HybridLayers("nemotron_h", tuple((_NEMOTRON_BLOCKS[c],) for c in pattern), mamba,
                        latent_moe=_int(raw, "moe_latent_size", where) if latent else 0,
                        shared_experts=bool(raw.get("n_shared_experts")))


def _granite(raw: dict[str, object], where: str, layers: int) -> HybridLayers:
    known = {"mamba": MAMBA, "linear_attention": MAMBA, "attention": ATTENTION,
             "full_attention": ATTENTION}
    field = "layer_types" if "layer_types" in raw else "layers_block_type"
    mixers = (_names(raw, field, where, known, layers) if field in raw
              else [MAMBA] * layers)  # GraniteMoeHybridConfig: every layer Mamba
    ffn: tuple[Block, ...] = ()
    if _int(raw, "num_local_experts", where, 8, least=0) > 0:
        ffn += ((MOE, "block_sparse_moe"),)
    if _int(raw, "shared_intermediate_size", where, 1024, least=0) > 0:
        ffn += ((SHARED_MLP, "shared_mlp.output_linear"),)
    mamba = Mamba(2, heads=_int(raw, "mamba_n_heads", where, 128),
                  groups=_int(raw, "mamba_n_groups", where, 1))
    return HybridLayers("granitemoehybrid", tuple(
        ((MAMBA, "mamba") if kind == MAMBA else (ATTENTION, "self_attn.o_proj"), *ffn)
        for kind in mixers), mamba)


def _falcon_h1(raw: dict[str, object], where: str, layers: int) -> HybridLayers:
    norm = raw.get("mamba_rms_norm", False)
    mamba = Mamba(2, heads=_int(raw, "mamba_n_heads", where, 128),
                  groups=_int(raw, "mamba_n_groups", where, 1), gated_norm=norm is True)
    blocks = ((ATTENTION, "self_attn.o_proj"), (MAMBA, "mamba.mamba"),
              (MLP, "feed_forward.down_proj"))
    return HybridLayers("falcon_h1", (blocks,) * layers, mamba)


def _jamba(raw: dict[str, object], where: str, layers: int, hidden: int) -> HybridLayers:
    attn_period = _int(raw, "attn_layer_period", where, 8)
    attn_offset = _int(raw, "attn_layer_offset", where, 4, least=0)
    expert_period = _int(raw, "expert_layer_period", where, 2)
    expert_offset = _int(raw, "expert_layer_offset", where, 1, least=0)
    experts = _int(raw, "num_experts", where, 16)
    rank = raw.get("mamba_dt_rank", "auto")
    dt_rank = ceil(hidden / 16) if rank in ("auto", None) else _int(raw, "mamba_dt_rank", where)
    mamba = Mamba(1, inner=_int(raw, "mamba_expand", where, 2) * hidden,
                  ssm_params=dt_rank + 2 * _int(raw, "mamba_d_state", where, 16))
    table = []
    for i in range(layers):
        mixer = (ATTENTION, "o_proj") if i % attn_period == attn_offset else (MAMBA, "mamba")
        moe = experts > 1 and i % expert_period == expert_offset
        table.append((mixer, (MOE, "feed_forward.experts") if moe
                      else (MLP, "feed_forward.down_proj")))
    return HybridLayers("jamba", tuple(table), mamba)


def hybrid_layer_count(raw: dict[str, object]) -> int | None:
    """A nemotron_h config.json of transformers 5 gives no num_hidden_layers: the layers
    are its layers_block_type entries (or hybrid_override_pattern's characters)."""
    if raw.get("model_type") != "nemotron_h" or "num_hidden_layers" in raw:
        return None
    kinds = raw.get("hybrid_override_pattern") or raw.get("layers_block_type")
    return len(kinds) if isinstance(kinds, (str, list)) and kinds else None


def read_hybrid(raw: dict[str, object], where: str, layers: int,
                hidden: int) -> HybridLayers | None:
    """The layers of a hybrid family's config, None for any other family."""
    family = str(raw.get("model_type") or "").lower()
    if family == "nemotron_h":
        return _nemotron_h(raw, where, layers)
    if family == "granitemoehybrid":
        return _granite(raw, where, layers)
    if family == "falcon_h1":
        return _falcon_h1(raw, where, layers)
    if family == "jamba":
        return _jamba(raw, where, layers, hidden)
    return None


def check_hybrid_tp(name: str, hybrid: HybridLayers, tp: int) -> None:
    """The TP degrees vLLM's Mamba mixers accept: Mamba-2 asserts tp | heads and tp | n_groups
    unless n_groups == 1 (`mamba_mixer2.py:288-295`); Mamba-1 splits its intermediate size
    over TP (`mamba_mixer.py:91-126`, ColumnParallelLinear)."""
    m = hybrid.mamba
    if m.version == 1 and m.inner % tp:
        fits = [t for t in range(1, m.inner + 1) if m.inner % t == 0 and t <= 64]
        raise ConfigError(f"tp({tp}) does not divide the Mamba intermediate size({m.inner}) of "
                          f"{name}; use tp in {', '.join(map(str, fits))}")
    if m.version == 2 and (m.heads % tp or (m.groups % tp and m.groups != 1)):
        fits = [t for t in range(1, m.heads + 1)
                if m.heads % t == 0 and (m.groups % t == 0 or m.groups == 1)]
        raise ConfigError(f"tp({tp}) does not split the Mamba-2 mixer of {name} "
                          f"({m.heads} heads, n_groups {m.groups}): vLLM needs tp | heads and "
                          f"tp | n_groups (or n_groups 1); use tp in {', '.join(map(str, fits))}")


def check_hybrid_use(name: str, hybrid: HybridLayers | None, engine: str | None,
                     what: str = "") -> None:
    """Hybrids are modelled for vLLM's own calls alone: other engines' layers, the KV
    transfer of disaggregation and the memory `plan` prices all take every layer as
    attention + MLP with a KV cache, which a Mamba layer is not (its state is fixed)."""
    if hybrid is None:
        return
    if what:
        raise ConfigError(f"{name} is a Mamba hybrid ({hybrid.family}); {what} is modelled "
                          "for attention + MLP layers (a KV cache in every layer) only; use "
                          "pattern, validate or replay with --engine vllm")
    if engine != "vllm":
        raise ConfigError(f"{name} is a Mamba hybrid ({hybrid.family}): its calls are modelled "
                          f"for vLLM, not {engine}; use --engine vllm")
