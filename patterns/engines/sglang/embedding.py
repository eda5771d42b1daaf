"""SGLang's input embedding under DP attention: which group its vocab-parallel all-reduce
runs on, model by model.

Code read: modal-projects/sglang @ 8905cbd4, `python/sglang/srt/`:
- `layers/vocab_parallel_embedding.py:246-252`: a `VocabParallelEmbedding` built with
  `use_attn_tp_group=True` shards the vocabulary over the attention-TP group (attn_tp_size
  ranks); `:562-574` `forward`: when its tp_size > 1 (and the attention-TP input is not
  scattered, `--enable-attn-tp-input-scattered`, off by default) it all-reduces the
  [T, h] output over that group (`attn_tp_all_reduce`), else over the whole TP group.
  `enable_tp=False` replicates the table: no all-reduce.
- `distributed/parallel_state.py:2253-2283`: at attn_tp < tp the attention-TP group is its
  own, with no custom all-reduce, symmetric memory or PyNccl (`use_custom_allreduce=False`
  ...): torch.distributed's all-reduce on its NCCL device group.
- The models, each building `embed_tokens` (`word_embeddings`, `wte`) so:
  use_attn_tp_group=is_dp_attention_enabled() (the attention-TP all-reduce): the table
  below, `ATTN_TP`; `enable_tp=not is_dp_attention_enabled()` (replicated under DP
  attention): `REPLICATED`; plain `VocabParallelEmbedding(vocab, hidden)` (the whole TP
  group, every DP rank's tokens summed as if one batch, which DP attention does not run):
  `WHOLE_TP`, refused under DP attention. A model type not listed takes the attention-TP
  group, what SGLang's newer models do.
"""

from patterns.errors import ConfigError
from patterns.layout import Layout
from patterns.models import ModelConfig
from patterns.moe import tp_op
from patterns.ops import Op, OpKind

# model_type -> where SGLang builds its embedding on the attention-TP group under DP attention
ATTN_TP = {
    "qwen2_moe": "models/qwen2_moe.py:837-843",
    "qwen3_moe": "models/qwen2_moe.py:837-843 (Qwen3MoeModel(Qwen2MoeModel), qwen3_moe.py:906)",
    "deepseek_v2": "models/deepseek_v2.py:2380-2384 (get_embedding_tp_kwargs, "
                   "vocab_parallel_embedding.py:166-185)",
    "deepseek_v3": "models/deepseek_v2.py:2380-2384 (get_embedding_tp_kwargs)",
    "kimi_k2": "models/deepseek_v2.py:2380-2384 (get_embedding_tp_kwargs)",
    "gpt_oss": "models/gpt_oss.py:640-644",
    "llama4": "models/llama4.py:505-511",
    "llama4_text": "models/llama4.py:505-511",
    "glm4_moe": "models/glm4_moe.py:1039-1043",
    "bailing_moe": "models/bailing_moe.py:708-713",
    "minimax_m2": "models/minimax_m2.py:1102-1105",
    "longcat_flash": "models/longcat_flash.py:578-581",
    "qwen3_next": "models/qwen3_next.py:897-901",
    "qwen2": "models/qwen2.py:286-291",
    "qwen3": "models/qwen2.py:286-291 (Qwen3Model(Qwen2Model))",
}
REPLICATED = {
    "deepseek_v4": "models/deepseek_v4.py:2052-2055",
    "bailing_moe_linear": "models/bailing_moe_linear.py:951-954",
    "exaone_moe": "models/exaone_moe.py:543-546",
    "sarvam_moe": "models/sarvam_moe.py:1145-1150",
    "step3p5": "models/step3p5.py:671-675",
}
WHOLE_TP = {
    "mixtral": "models/mixtral.py:276-280",
    "granitemoe": "models/granitemoe.py:251",
    "olmoe": "models/olmoe.py:275",
    "phimoe": "models/phimoe.py:411",
    "dbrx": "models/dbrx.py:365",
}


def check_dp_attention_embedding(model: ModelConfig) -> None:
    """Refuse DP attention for a model whose embedding all-reduces over the whole TP group."""
    where = WHOLE_TP.get(model.model_type)
    if where is not None:
        raise ConfigError(f"sglang builds the embedding of {model.model_type} over the whole TP "
                          f"group ({where} @ 8905cbd4), which DP attention (--dp N --ep) does "
                          "not run: each DP rank embeds its own tokens; use --engine vllm, or "
                          "--dp without --ep (independent replicas)")


def embedding_ops(model: ModelConfig, layout: Layout, tokens: int, dtype: str) -> list[Op]:
    """The embedding's all-reduce of [T, h] over the attention-TP group (the layout's tp
    group here) in a step of T tokens on this rank under DP attention; none at attn_tp 1 or
    for a replicated table."""
    if layout.tp == 1 or model.model_type in REPLICATED:
        return []
    h = model.hidden_size
    return [tp_op(OpKind.ALLREDUCE, layout.tp, (tokens, h), (tokens, h), dtype,
                  "embed_tokens")]
