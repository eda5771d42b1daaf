"""vLLM's memory on one GPU as its profiler measures it, and the KV cache a deployment gets.

vLLM V1 sizes the KV cache (modal-projects/vllm @ c8109375, `v1/worker/gpu_worker.py`
`determine_available_memory`, 460-560; `utils/mem_utils.py` `memory_profiling`, 234-326):
    available = total x gpu_memory_utilization - non_kv - cuda_graph_estimate
    non_kv    = weights + (torch's peak - torch's allocated after the profile run)
                + every byte the process took from the driver beyond torch's (non-torch)
Each term here, per rank of a pipeline stage:

- weights: patterns/weights.py (the checkpoint as stored, scales included).
- profile activations: `profile_run` (gpu_model_runner.py 6405-6478) runs one forward of
  max_num_batched_tokens T (`_dummy_run(self.max_num_tokens, is_profile=True)`); its peak
  is the residual stream and normed input (2 x h a token), plus the larger of attention's
  (q, k, v and output of the rank's heads) and the MLP's: a dense MLP's gate-up and
  activation (3 x I / tp), a MoE layer's workspaces (top-k x (gate-up 2N + activation N +
  down h) a token, N the rank's share of an expert: fused_moe's intermediate caches), in
  the serving dtype.
- sampler: on the last stage, `_dummy_sampler_run` (6214-6300) computes the logits of
  min(T, max_num_seqs) requests (`_dummy_run`: num_reqs = min(num_tokens, max_num_reqs))
  over the whole vocabulary in the dtype, then `Sampler.forward` casts them to fp32
  (sampler.py 96), and the native top-k/top-p path's softmax and exponential noise are two
  more fp32 copies (topk_topp_sampler.py `forward_native`, `random_sample`): S x V x
  (dtype + 12) bytes. The forward's activations are freed by then (only the last hidden
  states [T, h] live): the profile's peak is the larger of the two.
- CUDA graphs: `profile_cudagraph_memory` (6617-6780) captures the two largest sizes of
  each mode and estimates first capture + (graphs - 1) x the second's (at least 1 MiB a
  graph). The first capture holds the forward's activations at the largest size
  (min(2 x max_num_seqs, 512, T), patterns/engines/vllm/rules.py); FULL and PIECEWISE modes
  share the pool (the max of their first captures, the sum of their per-graph terms). None
  with --eager.
- communication buffers (non-torch): NCCL's, per communicator of more than one rank,
  16 channels x 2 ring peers x (4 MiB Simple + 4.5 MiB LL128 + 0.25 MiB LL) (NCCL's
  NCCL_BUFFSIZE / NCCL_LL128_BUFFSIZE defaults), two a TP group (torch's process group and
  vLLM's PyNccl communicator), one a PP group, two each for DP attention's DP and EP groups (a
  dense model's DP replicas are separate engines); vLLM's custom all-reduce
  (custom_all_reduce.py 74, 207-217: 8 MiB + its 16 MiB gather / reduce-scatter buffer) on
  a TP group of 2-8.
- MoE workspace (persistent, `moe_workspace_bytes`).
- non-torch reserve: what the named terms do not cover (cuBLAS / attention workspaces,
  Triton's scratch, allocator fragmentation, the CUDA context's growth), one figure a GPU,
  the only one fitted: against three public logs on H100s at vLLM's defaults (Meta's
  Llama-3.1-405B-FP8 at TP8 starts with its 131,072 context, vllm#6689, weights 57.75 GiB,
  vllm#6746; Qwen3-235B-A22B-FP8 at TP4 holds 178,880 tokens, vllm#21348; gpt-oss-120b on
  one H100 has -2.14 GiB for its KV cache, vllm#23278) every reserve from 3.5 to 4.4 GiB
  gives all three (405B fits, Qwen3 within 15%, gpt-oss refused); each log alone asks
  4.4-4.7 GiB (older vLLMs' sort-based sampler among what it holds): 4 GiB.

The KV cache: what `available` holds, per token the rank's K and V (or MLA's latent) of
every full-attention layer and, for a sliding-window layer, of its window only (vLLM's
hybrid allocator: a request of L tokens needs its full layers' L and its sliding layers'
min(L, window)). vLLM refuses to start when one request of max_model_len does not fit
(`kv_cache_utils.py` `check_enough_kv_cache_memory`); its "GPU KV cache size: N tokens" is
int(max_concurrency x max_model_len), max_concurrency = available / one request's bytes
(`_report_kv_cache_config`). A layout fits when weights + overhead + one max_model_len
request + the batch's (or the workload's peak) KV fit in the utilisation.
"""

from dataclasses import dataclass
from typing import Any

from patterns.dtypes import DTYPE_BYTES
from patterns.engines.vllm.rules import V1_MAX_CAPTURE, v1_capture_sizes
from patterns.layout import Layout
from patterns.models import ModelConfig
from patterns.shapes import stage_layer_counts
from patterns.weights import _head_dim, kv_bytes_per_token_layer, stage_bytes

MIB = 1 << 20
NCCL_COMMUNICATOR_BYTES = int(16 * 2 * (4 + 4.5 + 0.25) * MIB)
CUSTOM_ALLREDUCE_BYTES = 24 * MIB
GRAPH_FLOOR_BYTES = MIB
# Held against three public logs (module doc; docs/predict-plan.md lists them).
NON_TORCH_RESERVE_BYTES = 4 * (1 << 30)


@dataclass(frozen=True)
class Overhead:
    """vLLM's non-KV memory on one rank beside its weights, term by term."""

    activations: int
    sampler: int
    profile_peak: int
    cuda_graphs: int
    communication: int
    non_torch: int
    moe_workspace: int = 0

    @property
    def total(self) -> int:
        return (self.profile_peak + self.moe_workspace + self.cuda_graphs + self.communication
                + self.non_torch)

    def as_dict(self) -> dict[str, int]:
        return {"profile_activation_bytes": self.activations, "sampler_bytes": self.sampler,
                "profile_peak_bytes": self.profile_peak,
                "moe_workspace_bytes": self.moe_workspace,
                "cuda_graph_bytes": self.cuda_graphs,
                "communication_bytes": self.communication,
                "non_torch_reserve_bytes": self.non_torch, "total_bytes": self.total}


@dataclass(frozen=True)
class Settings:
    """The engine settings memory depends on (vLLM's names)."""

    dtype: str
    kv_dtype: str  # the cache's element: the dtype, or uint8 for --kv-cache-dtype fp8
    max_model_len: int
    max_batched_tokens: int
    max_num_seqs: int
    eager: bool = False
    gpus_per_node: int = 8
    vllm: bool = True  # vLLM V1's profiler; else the activation reserve alone


def forward_activation_bytes(model: ModelConfig, layout: Layout, dtype: str,
                             tokens: int) -> int:
    """The transient peak of one forward over `tokens` on a rank (module doc: profile
    activations): the residual stream and normed input, and the larger of attention's
    q, k, v and output and a dense MLP's gate-up and activation (a MoE layer's intermediates
    live in the persistent workspace, `moe_workspace_bytes`)."""
    b, h, tp = DTYPE_BYTES[dtype], model.hidden_size, layout.tp
    heads = max(model.num_attention_heads // tp, 1)
    kv_heads = max(model.num_key_value_heads // tp, 1)
    attention = (2 * heads + 2 * kv_heads) * _head_dim(model)
    dense = len(model.moe_layers or ()) < model.num_hidden_layers
    mlp = 3 * model.intermediate_size // tp if dense else 0
    return tokens * (2 * h + max(attention, mlp)) * b


def moe_workspace_bytes(model: ModelConfig, layout: Layout, dtype: str, tokens: int) -> int:
    """The MoE kernels' workspace, kept between forwards (`v1/worker/workspace.py`
    WorkspaceManager, grown to the profile run's size): `modular_kernel.py` 1150-1175 takes
    max(workspace13, output) and workspace2 at once, TritonExperts' shapes
    (`experts/triton_moe.py` 197-212) (M, top-k, max(N / 2, K)) and (M, top-k, max(N, K)),
    N the gate-up width of the rank's share of an expert (2 x moe_intermediate / tp, whole
    under EP), K the hidden size, M the profile's tokens."""
    if not model.is_moe:
        return 0
    inter = model.moe_intermediate_size or model.intermediate_size
    share = inter if layout.ep else inter // layout.tp
    k, top = model.hidden_size, model.num_experts_per_tok
    return tokens * top * (max(share, k) + max(2 * share, k)) * DTYPE_BYTES[dtype]


def activation_reserve_bytes(model: ModelConfig, tp: int, dtype: str, tokens: int) -> int:
    """The activation reserve of engines other than vLLM V1 (one forward over the step's
    token budget): tokens x (2 x hidden + 3 x intermediate / tp) x dtype bytes, a MoE
    layer's intermediate top-k x the expert's."""
    inter = model.intermediate_size
    if model.is_moe:
        inter = max(inter, model.num_experts_per_tok * (model.moe_intermediate_size or inter))
    return tokens * (2 * model.hidden_size + 3 * inter // tp) * DTYPE_BYTES[dtype]


def _communication(layout: Layout, per_node: int) -> int:
    """NCCL's buffers of the rank's communicators and the custom all-reduce's (module doc).
    A dense model's DP replicas are separate engines, with no group between them; DP
    attention's ranks (EP) share a DP and an EP group."""
    groups = [(layout.tp, 2), (layout.pp, 1)]
    if layout.ep and layout.dp > 1:
        groups += [(layout.dp, 2), (layout.dp * layout.tp, 2)]
    total = sum(count * NCCL_COMMUNICATOR_BYTES for size, count in groups if size > 1)
    if 2 <= layout.tp <= min(8, per_node):
        total += CUSTOM_ALLREDUCE_BYTES
    return total


def overhead(model: ModelConfig, layout: Layout, settings: Settings, last_stage: bool,
             ) -> Overhead:
    """vLLM's non-KV memory beside the weights on a rank (module doc); for another engine
    the activation reserve alone (`activation_reserve_bytes`)."""
    b, t = DTYPE_BYTES[settings.dtype], settings.max_batched_tokens
    if not settings.vllm:
        reserve = activation_reserve_bytes(model, layout.tp, settings.dtype, t)
        return Overhead(reserve, 0, reserve, 0, 0, 0)
    activations = forward_activation_bytes(model, layout, settings.dtype, t)
    sampler = 0
    if last_stage:
        seqs = min(t, settings.max_num_seqs)
        sampler = seqs * model.vocab_size * (b + 12)
    peak = max(activations, sampler + t * model.hidden_size * b)
    graphs = 0
    if not settings.eager:
        sizes = v1_capture_sizes(settings.max_num_seqs, t)
        largest = min(2 * settings.max_num_seqs, V1_MAX_CAPTURE, t)
        first = forward_activation_bytes(model, layout, settings.dtype, largest)
        graphs = first + 2 * (len(sizes) - 1) * GRAPH_FLOOR_BYTES  # FULL and PIECEWISE
    return Overhead(activations, sampler, peak, graphs,
                    _communication(layout, settings.gpus_per_node), NON_TORCH_RESERVE_BYTES,
                    moe_workspace_bytes(model, layout, settings.dtype, t))


@dataclass(frozen=True)
class StageMemory:
    weights: int
    overhead: Overhead
    kv_token: int  # one token's cache on the rank (every cached layer)
    request_kv: int  # one request of max_model_len
    batch_kv: int


def request_kv_bytes(model: ModelConfig, tp: int, kv_dtype: str, layers: range,
                     tokens: int) -> int:
    """One request of `tokens` on a rank holding `layers`: a sliding layer keeps its window."""
    per = kv_bytes_per_token_layer(model, tp, kv_dtype)
    window = model.sliding_window
    sliding = set(model.sliding_layers)
    return sum(per * (min(tokens, window) if layer in sliding and window else tokens)
               for layer in layers)


def stage_memory(model: ModelConfig, layout: Layout, settings: Settings,
                 batch_tokens: int) -> list[StageMemory]:
    """Each pipeline stage's rank: weights, overhead, one max_model_len request's KV and the
    batch's (`batch_tokens` a DP rank, every layer cached whole)."""
    out, first = [], 0
    weights = stage_bytes(model, layout, settings.dtype)
    counts = stage_layer_counts(model.num_hidden_layers, layout.pp)
    per_layer = kv_bytes_per_token_layer(model, layout.tp, settings.kv_dtype)
    for stage, count in enumerate(counts):
        layers = range(first, first + count)
        first += count
        out.append(StageMemory(
            round(weights[stage]), overhead(model, layout, settings, stage == layout.pp - 1),
            per_layer * count,
            request_kv_bytes(model, layout.tp, settings.kv_dtype, layers,
                             settings.max_model_len),
            per_layer * count * batch_tokens))
    return out


@dataclass(frozen=True)
class DeploymentMemory:
    """The fullest rank's figures and the KV cache the deployment gets."""

    weights: int
    overhead: Overhead
    request_kv: int
    batch_kv: int
    available_kv: int
    kv_capacity_tokens: int
    max_concurrency: float
    fits: bool
    reason: str

    @property
    def total(self) -> int:
        return self.weights + self.overhead.total + self.request_kv + self.batch_kv


def deployment_memory(model: ModelConfig, layout: Layout, settings: Settings,
                      batch_tokens: int, limit: int) -> DeploymentMemory:
    """The stage with the least room decides; capacity is the smallest stage's (vLLM takes
    the fewest blocks over its workers)."""
    stages = stage_memory(model, layout, settings, batch_tokens)
    concurrency = min(max(limit - s.weights - s.overhead.total, 0) / s.request_kv
                      for s in stages)
    worst = min(stages, key=lambda s: limit - s.weights - s.overhead.total - s.request_kv
                - s.batch_kv)
    available = limit - worst.weights - worst.overhead.total
    reason = _reason(worst, available, settings)
    return DeploymentMemory(worst.weights, worst.overhead, worst.request_kv, worst.batch_kv,
                            available, int(concurrency * settings.max_model_len),
                            round(concurrency, 2), not reason, reason)


def _reason(stage: StageMemory, available: int, settings: Settings) -> str:
    gib = 1 << 30
    if available <= 0:
        return (f"weights {stage.weights / gib:.2f} GiB and vLLM's overhead "
                f"{stage.overhead.total / gib:.2f} GiB leave {available / gib:.2f} GiB for "
                "the KV cache")
    if available < stage.request_kv:
        return (f"the KV cache's {available / gib:.2f} GiB cannot hold one request of "
                f"max_model_len {settings.max_model_len:,} ({stage.request_kv / gib:.2f} GiB): "
                "vLLM refuses to start; lower --max-model-len")
    if available < stage.request_kv + stage.batch_kv:
        return (f"the KV cache's {available / gib:.2f} GiB cannot hold one max_model_len "
                f"request and the batch ({(stage.request_kv + stage.batch_kv) / gib:.2f} GiB)")
    return ""


def memory_document(m: DeploymentMemory) -> dict[str, Any]:
    """The JSON of a layout's memory (plan's `memory` key)."""
    return {"overhead": m.overhead.as_dict(), "max_model_len_kv_bytes": m.request_kv,
            "available_kv_bytes": m.available_kv, "kv_capacity_tokens": m.kv_capacity_tokens,
            "max_concurrency": m.max_concurrency, "reason": m.reason}
