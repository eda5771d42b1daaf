"""What a GPU of `--gpu` holds and does: the memory its driver reports, peak dense FLOP/s and
HBM bandwidth (`infercomm plan --list-gpus` prints this table).

Memory is the total the driver reports, not the marketing figure: what `nvidia-smi` prints
(`Memory-Usage ... / N MiB`) or `rocm-smi` (`VRAM Total Memory (B)`), each quoted below from
a public log ("file N": the id of its stored copy in the project's search index). vLLM takes
`--gpu-memory-utilization` of CUDA's own total (`torch.cuda.mem_get_info`, a few hundred MiB
less: 79.19 GiB on an H100, whose nvidia-smi says 81,559 MiB = 79.65 GiB); the engine's
overhead (analysis/engine_memory.py) was held against logs on the nvidia-smi figure.

Compute and bandwidth are the vendors' datasheet figures per GPU, dense (no sparsity):
NVIDIA H100 / H800 SXM 989 TFLOP/s bf16, 1,979 fp8, 3.35 TB/s; H200 the same compute, 4.8
TB/s; H20 148 / 296, 4.0 TB/s; B200 (HGX) 2.25 / 4.5 PFLOP/s, 8 TB/s; GB200 (NVL72, per GPU:
the rack's 180 / 360 PFLOP/s dense over 72) 2.5 / 5.0, 8 TB/s; A100 SXM 312 bf16 and no fp8
units (vLLM runs fp8 checkpoints weight-only there, through Marlin: the bf16 rate), 2.039
TB/s (the 40 GB part 1.555 TB/s); AMD MI300X 1,307 bf16 / 2,615 fp8, 5.3 TB/s; MI325X the
same compute, 6.0 TB/s; MI355X 2,517 / 5,033, 8.0 TB/s.
"""

from dataclasses import dataclass

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_mib: float  # as the driver reports it
    bf16_flops: float  # peak dense FLOP/s
    fp8_flops: float  # the bf16 rate where the GPU has no fp8 units
    hbm_bytes_per_s: float
    source: str  # where the memory figure was read

    @property
    def memory_gib(self) -> float:
        return self.memory_mib / 1024

    @property
    def has_fp8(self) -> bool:
        return self.fp8_flops > self.bf16_flops


GPU_SPECS = {s.name: s for s in (
    GPUSpec("h100", 81559, 989e12, 1979e12, 3.35e12,
            "nvidia-smi 'NVIDIA H100 80GB HBM3 ... 0MiB / 81559MiB' (vllm-project/vllm#27508)"),
    GPUSpec("h200", 143771, 989e12, 1979e12, 4.8e12,
            "nvidia-smi 'NVIDIA H200 ... 0MiB / 143771MiB' (file 6737105653)"),
    GPUSpec("b200", 183359, 2250e12, 4500e12, 8.0e12,
            "nvidia-smi 'NVIDIA B200 ... 0MiB / 183359MiB' (file 9174932594)"),
    GPUSpec("gb200", 189471, 2500e12, 5000e12, 8.0e12,
            "nvidia-smi 'NVIDIA GB200 ... 0MiB / 189471MiB' (file 58750094259)"),
    GPUSpec("a100", 81920, 312e12, 312e12, 2.039e12,
            "nvidia-smi 'NVIDIA A100-SXM4-80GB ... 0MiB / 81920MiB' (file 51882073123)"),
    GPUSpec("a100-40gb", 40960, 312e12, 312e12, 1.555e12,
            "A100-SXM4-40GB: 40960 MiB, as a GPU test fixture gives it (file 67117255209)"),
    GPUSpec("h20", 97871, 148e12, 296e12, 4.0e12,
            "nvidia-smi 'NVIDIA H20 ... 4MiB / 97871MiB' (file 53244009727)"),
    GPUSpec("h800", 81559, 989e12, 1979e12, 3.35e12,
            "as the H100 SXM (its board, NVLink cut); H800 users report 81.6 GB (file "
            "58732342791)"),
    GPUSpec("mi300x", 205822885888 / MIB, 1307e12, 2615e12, 5.3e12,
            "rocm-smi 'VRAM Total Memory (B): 205822885888' (file 70352164058)"),
    GPUSpec("mi325x", 256 * 1024 * 205822885888 / (192 * GIB), 1307e12, 2615e12, 6.0e12,
            "AMD's 256 GB at the MI300X's reported share of its 192 (no rocm-smi found)"),
    GPUSpec("mi355x", 309220868096 / MIB, 2517e12, 5033e12, 8.0e12,
            "rocm-smi VRAM Total Memory (B) 309220868096 (file 65773950940)"),
)}


def memory_limit(gpu: str, gpu_memory_gib: float | None, utilization: float) -> int:
    """Bytes a rank may fill: utilization x the GPU's memory (--gpu-memory, else --gpu's)."""
    gib = GPU_SPECS[gpu].memory_gib if gpu_memory_gib is None else gpu_memory_gib
    return int(gib * utilization * GIB)


def step_token_budget(gpu: str, max_batched_tokens: int | None) -> int:
    """The tokens vLLM's memory profile runs: --max-batched-tokens, else V1's default for
    the GPU (patterns/engines/vllm/rules.py `v1_defaults`)."""
    from patterns.engines.vllm.rules import v1_defaults

    return max_batched_tokens or v1_defaults(engine_gpu(gpu))[1]


# The GPU whose engine rules (transports, defaults, kernels) a --gpu of plan's table runs:
# the same architecture among those the engine profiles model (patterns/pattern.py GPUS).
ENGINE_GPU = {"h100": "h100", "h200": "h200", "b200": "b200", "a100": "a100",
              "gb200": "b200", "a100-40gb": "a100", "h20": "h100", "h800": "h100",
              "mi300x": "h100", "mi325x": "h100", "mi355x": "h100"}


def engine_gpu(gpu: str) -> str:
    return ENGINE_GPU.get(gpu, gpu)


def gpu_table() -> str:
    """`plan --list-gpus`: every --gpu with its memory, peaks and where the memory was read."""
    from microbench.views.textfmt import render_table

    header = ["gpu", "memory (driver)", "GiB", "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM TB/s",
              "engine rules as", "memory from"]
    rows = [[s.name, f"{s.memory_mib:,.0f} MiB", f"{s.memory_gib:.2f}",
             f"{s.bf16_flops / 1e12:,.0f}",
             f"{s.fp8_flops / 1e12:,.0f}" if s.has_fp8 else "none (weight-only)",
             f"{s.hbm_bytes_per_s / 1e12:.3g}", engine_gpu(s.name), s.source]
            for s in GPU_SPECS.values()]
    return render_table(header, rows, right_align={"memory (driver)", "GiB", "bf16 TFLOP/s",
                                                    "fp8 TFLOP/s", "HBM TB/s"})
