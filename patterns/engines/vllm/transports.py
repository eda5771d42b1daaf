"""Which transport vLLM V1 sends a TP all-reduce through, under its defaults (engine spec
10.2; the GPU architectures: `patterns/transports.py`).

- vLLM `CudaCommunicator.all_reduce` takes the first of: NCCL symmetric memory (off by
  default), quick-reduce (ROCm), standalone FlashInfer all-reduce (off by default), AITER
  (ROCm), custom all-reduce, torch symmetric memory, PyNccl
  (`distributed/device_communicators/cuda_communicator.py`; vllm-project/vllm
  `all_reduce_utils.py` @ 00d618aa for the size tables). Before that, the compile pass
  `fuse_allreduce_rms` (on at -O2 when TP > 1 on sm90/sm100 with FlashInfer, which vLLM's
  CUDA requirements pin) turns every all-reduce that feeds an RMSNorm into FlashInfer's fused
  kernel up to `FI_ALLREDUCE_FUSION_MAX_SIZE_MB` (`compilation/passes/fusion/
  allreduce_rms_fusion.py` @ 0052812d).
"""

from patterns.ops import Transport
from patterns.transports import GPU_ARCH, MiB

# allreduce_rms_fusion.py: FI_ALLREDUCE_FUSION_MAX_SIZE_MB[90] / [100].
VLLM_FUSED_MAX = {"sm90": {2: 64 * MiB, 4: 2 * MiB, 8: MiB // 2},
                  "sm100": {2: 64 * MiB, 4: 32 * MiB, 8: 1 * MiB}}
# all_reduce_utils.py: CUSTOM_ALL_REDUCE_MAX_SIZES["9.0"] / ["10.0"].
VLLM_CUSTOM_AR_MAX = {"sm90": {2: 64 * MiB, 4: 32 * MiB, 6: MiB // 2, 8: MiB // 4},
                      "sm100": {2: 2 * MiB, 4: 2 * MiB, 6: 1 * MiB, 8: 1 * MiB}}
# custom_all_reduce.py:74: the default max_size, never exceeded (custom AR: size < max_size).
VLLM_CUSTOM_AR_DEFAULT = 8 * MiB
# all_reduce_utils.py: SYMM_MEM_ALL_REDUCE_MAX_SIZES["9.0"] / ["10.0"].
VLLM_SYMM_MEM_MAX = {"sm90": {2: 64 * MiB, 4: 32 * MiB, 6: 64 * MiB, 8: 64 * MiB},
                     "sm100": {2: 8 * MiB, 4: 32 * MiB, 6: 128 * MiB, 8: 128 * MiB}}
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)


def vllm_allreduce(nbytes: int, tp: int, gpu: str, dtype: str, feeds_rmsnorm: bool,
                   nccl_only: bool) -> Transport:
    """The transport of one vLLM V1 TP all-reduce of `nbytes` per rank.

    `feeds_rmsnorm`: the result goes straight into an RMSNorm (every model all-reduce except
    the last layer's on a stage that hands its output to the next stage) and torch.compile
    runs, so the fusion pass can take it. `nccl_only`: the seeds' setting, which in vLLM of
    2026 takes `--disable-custom-all-reduce`, -O0 *and* VLLM_ALLREDUCE_USE_SYMM_MEM=0: the
    first two alone leave bf16 all-reduces on torch symm-mem, which has its own switch
    (`cuda_communicator.py:56-60` @ c8109375). GPUs are taken as fully NVLinked with
    multicast (SXM boards).
    """
    if nccl_only or tp == 1:
        return Transport.NCCL
    arch = GPU_ARCH[gpu]
    fused = VLLM_FUSED_MAX.get(arch, {}).get(tp)
    if feeds_rmsnorm and fused is not None and nbytes <= fused:
        return Transport.FUSED_ALLREDUCE_RMSNORM
    # SymmMemCommunicator is up when the architecture and world size have a table entry
    # (symm_mem.py:66-79), whatever the model's dtype; it then caps custom AR
    # (custom_all_reduce.py:150-163) and takes only bf16 inputs (symm_mem.py:117-125).
    symm_max = VLLM_SYMM_MEM_MAX.get(arch, {}).get(tp)
    custom_max = VLLM_CUSTOM_AR_DEFAULT
    if symm_max is not None:
        custom_max = min(VLLM_CUSTOM_AR_MAX.get(arch, {}).get(tp, custom_max), custom_max)
    if tp in CUSTOM_AR_WORLD_SIZES and nbytes % 16 == 0 and nbytes < custom_max:
        return Transport.CUSTOM_ALLREDUCE
    if symm_max is not None and dtype == "bf16" and nbytes % 4 == 0 and nbytes <= symm_max:
        return Transport.SYMM_MEM
    return Transport.NCCL
