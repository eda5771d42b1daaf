"""Which transport SGLang sends a TP all-reduce and the logits all-gather through, under its
defaults (engine spec 10.4; the GPU architectures: `patterns/transports.py`).

- SGLang main of 2026-07-20 (modal-projects/sglang @ 8905cbd4, `python/sglang/srt/`):
  `CustomAllReduceV2` (on by default, `environ.py:747` SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2)
  takes sizes that are a multiple of 16 B up to its 16 MiB workspace (`environ.py:750`,
  `custom_all_reduce_v2.py:284-297`; every sm90/sm100 two-shot threshold of
  `configs/custom_all_reduce_v2.py:115-163` is >= 16 MiB), NCCL above; on A100 the first
  custom all-reduce's 8 MiB (`custom_all_reduce.py:42`) is taken. FlashInfer all-reduce +
  RMSNorm fusion is switched on for the architectures of `arg_groups/overrides.py:1514-1557`
  on sm90/sm100 at TP > 1 and runs for batches up to `FUSE_ALLREDUCE_MAX_BATCH_SIZE` = 2048
  tokens (`layers/communicator.py:161-175`). The logits all-gather goes through a Triton
  multimem kernel for bf16 and at most 128 rows (`triton_symm_mem_ag.py:421-510`) where
  NVLink multicast exists (sm90+).
"""

from patterns.ops import Transport
from patterns.transports import GPU_ARCH, MiB

SGLANG_CUSTOM_AR_MAX = 16 * MiB
SGLANG_CUSTOM_AR_MAX_SM80 = 8 * MiB
# The HF model_type of the architectures in _FLASHINFER_ALLREDUCE_FUSION_ARCHS.
SGLANG_FUSION_MODEL_TYPES = frozenset({"deepseek_v3", "deepseek_v32", "gpt_oss", "glm4_moe",
                                       "qwen3_moe", "qwen3_next", "nemotron_h"})
SGLANG_MULTIMEM_MAX_ROWS = 128


def sglang_allreduce(nbytes: int, tokens: int, tp: int, gpu: str, model_type: str,
                     nccl_only: bool, fusable: bool = True) -> Transport:
    """The transport of one SGLang TP all-reduce (engine spec 10.4). `fusable`: the call is
    one the fusion can take (not the embedding's nor the last layer's MLP one:
    `patterns.engines.sglang.fusable`)."""
    if nccl_only or tp == 1:
        return Transport.NCCL
    if (fusable and model_type in SGLANG_FUSION_MODEL_TYPES
            and GPU_ARCH[gpu] in ("sm90", "sm100") and tokens <= SGLANG_FUSION_MAX_TOKENS):
        return Transport.FUSED_ALLREDUCE_RMSNORM
    cap = SGLANG_CUSTOM_AR_MAX_SM80 if GPU_ARCH[gpu] == "sm80" else SGLANG_CUSTOM_AR_MAX
    if 2 <= tp <= 8 and nbytes % 16 == 0 and nbytes <= cap:
        return Transport.CUSTOM_ALLREDUCE
    return Transport.NCCL


# layers/communicator.py: the fused all-reduce + RMSNorm runs for batches up to this size.
SGLANG_FUSION_MAX_TOKENS = 2048


def sglang_logits_allgather(rows: int, dtype: str, gpu: str, nccl_only: bool) -> Transport:
    if nccl_only or dtype != "bf16" or GPU_ARCH[gpu] == "sm80" or rows > SGLANG_MULTIMEM_MAX_ROWS:
        return Transport.NCCL
    return Transport.MULTIMEM
