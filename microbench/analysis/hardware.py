"""What a GPU of `--gpu` holds and does: memory, peak dense FLOP/s, HBM bandwidth; and whether
a layout's fullest rank fits in it as vLLM would use it.

Figures per GPU of the SXM parts, from NVIDIA's datasheets (dense, without sparsity):
H100 SXM 80 GB, 989 TFLOP/s bf16, 1,979 fp8, 3.35 TB/s HBM3; H200 SXM 141 GB, the same
compute, 4.8 TB/s HBM3e; B200 (HGX) 192 GB, 2.25 PFLOP/s bf16, 4.5 fp8, 8 TB/s; A100 SXM 80 GB,
312 TFLOP/s bf16 and no fp8 (an fp8 checkpoint runs at the bf16 rate), 2.039 TB/s. Memory is
taken in GiB as `--gpu-memory` is (80 for an H100), `--gpu-memory` overrides it.

The memory check is vLLM's budget (`--gpu-memory-utilization`, 0.9 by default: the engine
takes that share of the GPU and fits weights, its profiled activation peak and the KV cache
in it, vllm/v1/worker/gpu_worker.py `determine_available_memory`): a layout fits when its
fullest rank's weights, the KV cache its requests need and an activation reserve fit in that
share. The activation reserve is the peak of one forward pass over the step's token budget
T (vLLM profiles a dummy batch of max_num_batched_tokens, 8192 by default, 2048 on an A100):
the residual and the normed hidden state (2 x hidden) and the MLP's gate-up output and its
activation (3 x the rank's intermediate size; for a MoE layer top-k x the expert's) per
token, in the serving dtype. CUDA graphs and the sampler's logits are not counted.
"""

from dataclasses import dataclass

from patterns.dtypes import DTYPE_BYTES
from patterns.models import ModelConfig

GIB = 1 << 30


@dataclass(frozen=True)
class GPUSpec:
    memory_gib: float
    bf16_flops: float  # peak dense FLOP/s
    fp8_flops: float
    hbm_bytes_per_s: float


GPU_SPECS = {
    "h100": GPUSpec(80, 989e12, 1979e12, 3.35e12),
    "h200": GPUSpec(141, 989e12, 1979e12, 4.8e12),
    "b200": GPUSpec(192, 2250e12, 4500e12, 8.0e12),
    "a100": GPUSpec(80, 312e12, 312e12, 2.039e12),
}


def step_token_budget(gpu: str, max_batched_tokens: int | None) -> int:
    """The tokens vLLM's memory profile runs: --max-batched-tokens, else V1's default for
    the GPU (patterns/engines/vllm/rules.py `v1_defaults`)."""
    from patterns.engines.vllm.rules import v1_defaults

    return max_batched_tokens or v1_defaults(gpu)[1]


def activation_bytes(model: ModelConfig, tp: int, dtype: str, tokens: int) -> int:
    """The activation reserve of one forward pass over `tokens` on a rank of a TP group of
    `tp` (module doc): tokens x (2 x hidden + 3 x intermediate / tp) x dtype bytes."""
    inter = model.intermediate_size
    if model.is_moe:
        inter = max(inter, model.num_experts_per_tok * (model.moe_intermediate_size or inter))
    per_token = 2 * model.hidden_size + 3 * inter // tp
    return tokens * per_token * DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class MemoryNeed:
    weights: int
    kv_cache: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations


def memory_limit(gpu: str, gpu_memory_gib: float | None, utilization: float) -> int:
    """Bytes a rank may fill: utilization x the GPU's memory (--gpu-memory, else --gpu's)."""
    gib = GPU_SPECS[gpu].memory_gib if gpu_memory_gib is None else gpu_memory_gib
    return int(gib * utilization * GIB)
