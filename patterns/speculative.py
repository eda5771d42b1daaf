"""Speculative decoding, what vLLM V1 and SGLang share: the --speculative-config they take and a
drafter's forward pass (each engine's steps: `patterns/engines/vllm/speculative.py`,
`patterns/engines/sglang/speculative.py`).

`--speculative-config '{"method": "mtp"|"eagle"|"eagle3"|"ngram", "num_speculative_tokens": k}'`
(vLLM's own flag and keys) and the mean tokens a verify step yields (`--acceptance-length`,
vLLM's "mean acceptance length", 1 + accepted drafts / drafts) or the per-position
acceptance rates vLLM logs (`--acceptance-rate r1,r2,...`, r_i the share of steps whose
draft i was accepted, so the length is 1 + sum r_i).
"""

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from patterns.errors import ConfigError, shown
from patterns.models import ModelConfig
from patterns.ops import Op, OpKind, Transport
from patterns.shapes import padded_vocab
from patterns.stage import Stage

METHODS = ("mtp", "eagle", "eagle3", "ngram")
# Models with MTP layers vLLM drafts from (`num_nextn_predict_layers` in their config).
MTP_MODEL_TYPES = frozenset({"deepseek_v3", "deepseek_v32"})
EAGLE_MODEL_TYPES = frozenset({"llama"})


@dataclass(frozen=True)
class SpecConfig:
    method: str
    k: int  # num_speculative_tokens
    acceptance_length: float  # mean tokens a verify step yields, 1 .. k + 1
    draft_vocab: int | None = None  # eagle3 heads with their own vocabulary
    draft_layers: int = 1


MAX_CONFIG_CHARS = 4096  # vLLM's speculative configs are a few keys


def _not_a_value(name: str) -> float:
    raise ValueError(f"{name} is not a value it takes")


def _bounded_int(text: str) -> int:
    if len(text) > 12:
        raise ValueError(f"an integer of {len(text):,} digits")
    return int(text)


def parse_spec(text: str, acceptance_length: float | None,
               acceptance_rate: str | None) -> SpecConfig:
    want = '\'{"method": "eagle", "num_speculative_tokens": 3}\''
    if len(text) > MAX_CONFIG_CHARS:
        raise ConfigError(f"--speculative-config of {len(text):,} characters; vLLM's is a "
                          f"short JSON object such as {want}")
    try:
        obj = json.loads(text, parse_constant=_not_a_value, parse_int=_bounded_int)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--speculative-config is not JSON ({e.msg}); want {want}") from None
    except (RecursionError, ValueError) as e:  # nesting, NaN, a 5,000-digit integer
        why = "nested too deep" if isinstance(e, RecursionError) else str(e)
        raise ConfigError(f"--speculative-config: {why}; want {want}") from None
    if not isinstance(obj, dict):
        raise ConfigError("--speculative-config must be a JSON object")
    method, k = obj.get("method"), obj.get("num_speculative_tokens")
    unknown = set(obj) - {"method", "num_speculative_tokens", "draft_vocab_size", "model"}
    if unknown:
        raise ConfigError(f"--speculative-config: {', '.join(sorted(unknown))} not modelled; "
                          "keys are method, num_speculative_tokens, draft_vocab_size")
    if method not in METHODS:
        raise ConfigError(f"--speculative-config method {shown(repr(method), 40)} is not "
                          f"modelled; use one of {', '.join(METHODS)}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 16:
        raise ConfigError(f"num_speculative_tokens {shown(repr(k), 40)} must be an integer "
                          "from 1 to 16")
    vocab = obj.get("draft_vocab_size")
    if vocab is not None and (method != "eagle3" or isinstance(vocab, bool)
                              or not isinstance(vocab, int) or not 1 <= vocab <= 10_000_000):
        raise ConfigError("draft_vocab_size is an eagle3 head's own vocabulary: a positive "
                          "integer with method eagle3")
    if method == "eagle3" and vocab is None:
        vocab = _draft_vocab(obj.get("model"))
    return SpecConfig(method, k, _acceptance(k, acceptance_length, acceptance_rate), vocab)


MAX_DRAFT_CONFIG_BYTES = 1 << 20


def _draft_vocab(model: object) -> int:
    """An EAGLE-3 head's vocabulary, from its config: vLLM's `Eagle3LlamaForCausalLM`
    (`model_executor/models/llama_eagle3.py:276-302` @ c8109375) sizes its lm_head by the
    draft config's draft_vocab_size, else that config's vocab_size. Never the target's:
    without the head's config (a local path in "model") or draft_vocab_size, refused."""
    want = ('give "draft_vocab_size" (the head\'s config.json says it) or "model": the local '
            "path of the head's config.json")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"method eagle3: the draft head has its own vocabulary; {want}")
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"method eagle3: model {shown(repr(model), 60)} is not a local "
                          f"config.json here; {want}")
    if path.stat().st_size > MAX_DRAFT_CONFIG_BYTES:
        raise ConfigError(f"method eagle3: {path} is over 1 MiB, not a model config; {want}")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError):
        raise ConfigError(f"method eagle3: {path} is not a JSON config; {want}") from None
    vocab = (config.get("draft_vocab_size") or config.get("vocab_size")
             if isinstance(config, dict) else None)
    if isinstance(vocab, bool) or not isinstance(vocab, int) or not 1 <= vocab <= 10_000_000:
        raise ConfigError(f"method eagle3: {path} has no draft_vocab_size or vocab_size; {want}")
    return vocab


def _acceptance(k: int, length: float | None, rates: str | None) -> float:
    if (length is None) == (rates is None):
        raise ConfigError("speculative decoding needs one of --acceptance-length (mean tokens a "
                          "verify step yields) or --acceptance-rate r1,...,rk")
    if rates is not None:
        try:
            values = [float(r) for r in rates.split(",")]
        except ValueError:
            raise ConfigError(f"--acceptance-rate {rates!r}: comma-separated numbers") from None
        if len(values) != k or not all(0 <= v <= 1 for v in values) or any(
                b > a for a, b in pairwise(values)):
            raise ConfigError(f"--acceptance-rate {rates}: {k} rates in [0, 1], not increasing "
                              "(draft i is accepted only after draft i-1)")
        return 1 + sum(values)
    assert length is not None
    if not (math.isfinite(length) and 1 <= length <= k + 1):
        raise ConfigError(f"--acceptance-length {length} must be between 1 and "
                          f"num_speculative_tokens + 1 = {k + 1}")
    return length


def check_spec_model(spec: SpecConfig, model: ModelConfig, engine: str) -> None:
    if engine not in ("vllm", "sglang"):
        raise ConfigError(f"--speculative-config is modelled for engines vllm and sglang, not "
                          f"{engine}")
    if spec.method == "mtp" and model.model_type not in MTP_MODEL_TYPES:
        raise ConfigError(f"method mtp drafts from the model's own MTP layers; {model.name} "
                          f"({model.model_type}) has none modelled: use deepseek-v3, or eagle")
    if spec.method in ("eagle", "eagle3") and model.model_type not in EAGLE_MODEL_TYPES:
        raise ConfigError(f"method {spec.method}: EAGLE heads are modelled for Llama models, not "
                          f"{model.name} ({model.model_type}); use mtp or ngram")


AllReduce = Callable[[Stage, int, str], Op]


def draft_pass(st: Stage, spec: SpecConfig, tokens: int, rows: int, tag: str,
               allreduce: AllReduce, logits_transport: Transport = Transport.NCCL) -> list[Op]:
    """One forward pass of the draft model over `tokens`, its logits over `rows`: the
    embedding's all-reduce, per draft layer o_proj's and the MLP's (MoE for an MTP layer),
    and the lm_head's all-gather. `allreduce` is the engine's own."""
    ops = [allreduce(st, tokens, f"{tag}.embed_tokens")]
    mlp = "mlp.experts" if spec.method == "mtp" else "mlp.down_proj"
    for layer in range(spec.draft_layers):
        ops.append(allreduce(st, tokens, f"{tag}.layers.{layer}.self_attn.o_proj"))
        ops.append(allreduce(st, tokens, f"{tag}.layers.{layer}.{mlp}"))
    vocab = padded_vocab(spec.draft_vocab or st.model.vocab_size)
    shard = vocab // st.tp
    ops.append(st.tp_op(OpKind.ALLGATHER, (rows, shard), (rows, shard * st.tp),
                        f"{tag}.logits", logits_transport))
    return ops
