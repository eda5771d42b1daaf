"""A disaggregated deployment: the prefill side's calls, the decode side's, and the KV
transfer between them, for one model and workload."""

from dataclasses import dataclass, replace

from patterns.disagg.kvcache import kv_element_bytes
from patterns.disagg.layouts import DisaggLayout, connector_of
from patterns.disagg.transfer import KVTransfer, plan_transfer
from patterns.dtypes import DTYPE_BYTES
from patterns.engines import generate
from patterns.engines.sglang.profile import chunked_prefill_size
from patterns.engines.vllm.nixl_connector import sliding_blocks_read
from patterns.errors import ConfigError
from patterns.hybrid import check_hybrid_use
from patterns.layout import Workload
from patterns.models import ModelConfig
from patterns.pattern import EngineOptions, Pattern
from patterns.weights import gpu_memory_bytes

# Memory of one GPU of each kind the profiles model, in GiB as the driver reports it
# rounded down to the product figure (H100 SXM 80 GB, H200 141 GB, B200 180 GB, A100 80 GB).
GPU_MEMORY_GIB = {"h100": 80, "h200": 141, "b200": 180, "a100": 80}
# vLLM's --gpu-memory-utilization default (SGLang's mem_fraction_static is close to it).
GPU_MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True)
class DisaggPattern:
    disagg: DisaggLayout
    prefill: Pattern  # the prefill side: its prefill step (a workload of decode 1)
    decode: Pattern  # the decode side: its decode steps are what it runs of this pattern
    transfer: KVTransfer
    kv_cache_dtype: str
    decode_memory: tuple[int, int]  # (weights, KV cache of the batch) of a decode rank


def decode_memory(model: ModelConfig, disagg: DisaggLayout, workload: Workload, dtype: str,
                  kv_cache_dtype: str, engine: str = "vllm", block: int = 16
                  ) -> tuple[int, int]:
    """(weights, KV cache) of the fullest decode rank when it holds the batch's whole
    sequences (prompt + output tokens of each request), from patterns/weights.py. vLLM's
    hybrid manager keeps of a sliding-window layer only the blocks inside the window
    (`sliding_blocks_read`, patterns/engines/vllm/nixl_connector.py), so those layers count
    that much, not more."""
    sequence = workload.prompt + workload.decode
    weights, cache = gpu_memory_bytes(model, disagg.decode, dtype, workload.batch * sequence)
    sliding = len(model.sliding_layers) if model.sliding_window else 0
    if engine == "vllm" and sliding:
        kept = min(sequence, sliding_blocks_read(sequence, model.sliding_window, block) * block)
        layers = model.num_hidden_layers
        cache = cache * (layers - sliding) // layers + cache * sliding * kept // (
            layers * sequence)
    element = kv_element_bytes(model, dtype, kv_cache_dtype)
    return weights, cache * element // DTYPE_BYTES[dtype]


def check_decode_fits(model: ModelConfig, disagg: DisaggLayout, memory: tuple[int, int],
                      gpu: str) -> None:
    limit = int(GPU_MEMORY_GIB[gpu] * GPU_MEMORY_UTILIZATION * (1 << 30))
    weights, cache = memory
    if weights + cache <= limit:
        return
    gib = 1 << 30
    raise ConfigError(f"the decode side tp({disagg.decode.tp}) does not hold the batch: "
                      f"weights {weights / gib:.1f} GiB and KV cache {cache / gib:.1f} GiB a "
                      f"rank need more than {limit / gib:.1f} GiB ({GPU_MEMORY_UTILIZATION} of "
                      f"the {gpu}'s {GPU_MEMORY_GIB[gpu]} GiB); use a larger decode tp, a "
                      "smaller batch or prompt, --kv-cache-dtype fp8, or --gpu with more memory")


def generate_disagg(engine: str, model: ModelConfig, disagg: DisaggLayout, workload: Workload,
                    options: EngineOptions, connector: str | None = None,
                    kv_cache_dtype: str = "auto", block_tokens: int | None = None,
                    check_memory: bool = True, connector_version: str | None = None
                    ) -> DisaggPattern:
    """Both sides' patterns and one request's KV transfer; ConfigError on bad input
    (check_memory: a decode side that cannot hold the batch on options.gpu)."""
    chosen = connector_of(engine, connector, connector_version)
    check_hybrid_use(model.name, model.hybrid, engine, "--disagg (its KV transfer)")
    if workload.dp_batches is not None:
        raise ConfigError("--dp-batches does not apply to --disagg; give --batch (per replica)")
    # The whole sequence first: the prefill side's pattern is made with decode 1, and its
    # refusal would name that, not the decode length given.
    model.check_sequence(workload.prompt, workload.decode)
    dtype = workload.dtype or model.default_dtype
    prefill = generate(engine, model, disagg.prefill, replace(workload, decode=1), options)
    decode = generate(engine, model, disagg.decode, workload, options)
    chunk = (options.max_batched_tokens or chunked_prefill_size(options.gpu)
             if engine == "sglang" else None)
    transfer = plan_transfer(model, disagg, chosen, workload.prompt, dtype, kv_cache_dtype,
                             block_tokens, options.gpu, chunk)
    memory = decode_memory(model, disagg, workload, dtype, kv_cache_dtype, engine,
                           transfer.prefill.block_tokens)
    if check_memory:
        check_decode_fits(model, disagg, memory, options.gpu)
    return DisaggPattern(disagg, prefill, decode, transfer, kv_cache_dtype, memory)
