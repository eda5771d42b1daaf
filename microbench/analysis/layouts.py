"""Every layout of N ranks for a model, each priced by `predict` from the user's own sweeps.

Only communication is priced: a layout's prefill_us and decode_step_us are the floor under
TTFT and TPOT that its calls put there, whatever the kernels do. The prediction is the one of
microbench/analysis/predict.py (the critical path through the stages) in the engine's order:
a decode step begins once the previous step's token is sampled, so a pipeline's decode step
costs the chain through every stage, as it does for one batch in vLLM (a replay, which has
no such dependency, runs the steps of its stages overlapped; `predict` models that). With the
ranks placed as launchers place them: consecutive ranks per node, TP innermost, then PP, then
DP (global rank = (dp_rank x pp + pp_rank) x tp + tp_rank), so a TP, DP or EP group wider
than a node, or a PP hop between stages on two nodes, takes the inter-node fits.

The candidate shapes come from `shapes` alone: every dp x tp x pp = N. A MoE model gets its
tp x pp layouts without expert parallelism and every dp x tp x pp with it (--ep, the EP group
of dp x tp ranks; dp > 1 only with it, the layouts DP attention serves); `Layout.check_model`
refuses an EP group that does not divide the experts. A dense model's dp > 1 is dp
independent replicas: their figures are one replica's communication (the slowest), the
volume the whole deployment's, and each replica serves its own batch. The engine profile
refuses what it cannot model (a ConfigError), and plan lists it as refused with that message.
Memory is checked always: the fullest rank's weights and KV cache (patterns/weights.py) and
an activation reserve (analysis/hardware.py) against the GPU's memory as vLLM uses it; a
layout that does not fit is priced, kept apart and never best. Beside communication, each
layout has its compute floors (analysis/compute.py), and the ranking is by their sum.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from microbench.analysis.engine_memory import DeploymentMemory, Settings, deployment_memory
from microbench.analysis.fits import Topology
from microbench.analysis.predict import predict_pattern
from microbench.analysis.workload_plan import is_lanes, lanes_volume, price_lanes
from microbench.argtypes import UsageError
from patterns import ConfigError, Layout, ModelConfig, Pattern, volume_bytes
from patterns.volume import as_number


@dataclass(frozen=True)
class Shape:
    tp: int
    pp: int
    dp: int = 1
    ep: bool = False


@dataclass(frozen=True)
class Budget:
    """Communication budgets in microseconds; None: no budget on that figure."""

    ttft_us: float | None = None
    tpot_us: float | None = None

    def met(self, prefill_us: float, decode_step_us: float) -> bool:
        return ((self.ttft_us is None or prefill_us <= self.ttft_us)
                and (self.tpot_us is None or decode_step_us <= self.tpot_us))


OBJECTIVES = {"ttft": "prefill", "tpot": "decode step", "e2e": "end to end"}


@dataclass(frozen=True)
class Hardware:
    """What `plan` needs of the GPU beside the sweeps: its name (analysis/hardware.py), the
    bytes a rank may fill (None: not checked), the engine settings its memory depends on
    (analysis/engine_memory.py: the tokens of vLLM's profile run, max_num_seqs, max_model_len,
    the KV cache's dtype; vllm_overhead: vLLM V1's profiler, else an activation reserve)."""

    gpu: str = "h100"
    memory_limit: int | None = None
    step_tokens: int = 8192
    objective: str = "e2e"
    max_num_seqs: int = 1024
    max_model_len: int = 0  # 0: the model's own context
    kv_cache_dtype: str = "auto"
    eager: bool = False
    gpus_per_node: int = 8
    vllm_overhead: bool = False


@dataclass(frozen=True)
class Priced:
    shape: Shape
    prefill_us: float
    decode_step_us: float
    e2e_us: float
    volume_bytes: int | float
    meets_budget: bool
    crosses_nodes: bool
    notes: tuple[str, ...]
    # The fullest rank's weights, KV cache of the batch and the engine's overhead (the
    # profile run's peak in activation_bytes, every term in memory), one max_model_len
    # request's KV, and the KV cache the rest holds (analysis/engine_memory.py).
    weight_bytes: int = 0
    kv_cache_bytes: int = 0
    activation_bytes: int = 0
    fits_memory: bool = True
    overhead_bytes: int = 0
    request_kv_bytes: int = 0
    kv_capacity_tokens: int = 0
    max_concurrency: float = 0.0
    memory: Any = None
    # The roofline floors of the same figures (analysis/compute.py).
    compute_prefill_us: float = 0.0
    compute_decode_step_us: float = 0.0
    compute_e2e_us: float = 0.0
    best: bool = False

    @property
    def memory_bytes(self) -> int:
        return (self.weight_bytes + self.kv_cache_bytes + self.overhead_bytes
                + self.request_kv_bytes)

    def totals(self) -> dict[str, float]:
        """Communication and compute floors added, per objective."""
        return {"ttft": self.prefill_us + self.compute_prefill_us,
                "tpot": self.decode_step_us + self.compute_decode_step_us,
                "e2e": self.e2e_us + self.compute_e2e_us}

    def comm_shares(self) -> dict[str, float]:
        """How much of each floor is communication: what the sweeps say the calls take, over
        that plus the compute floor. Compute is a floor (kernels reach a fraction of the
        peaks), so the engine's share is at most this."""
        comm = {"ttft": self.prefill_us, "tpot": self.decode_step_us, "e2e": self.e2e_us}
        return {k: comm[k] / total if total > 0 else 0.0
                for k, total in self.totals().items()}

    def as_dict(self) -> dict[str, Any]:
        totals = self.totals()
        shares = self.comm_shares()
        return {"tp": self.shape.tp, "pp": self.shape.pp, "dp": self.shape.dp,
                "ep": self.shape.ep, "prefill_us": round(self.prefill_us, 3),
                "decode_step_us": round(self.decode_step_us, 3),
                "e2e_us": round(self.e2e_us, 3),
                "compute_prefill_us": round(self.compute_prefill_us, 3),
                "compute_decode_step_us": round(self.compute_decode_step_us, 3),
                "compute_e2e_us": round(self.compute_e2e_us, 3),
                "ttft_floor_us": round(totals["ttft"], 3),
                "tpot_floor_us": round(totals["tpot"], 3),
                "e2e_floor_us": round(totals["e2e"], 3),
                "ttft_comm_share": round(shares["ttft"], 4),
                "tpot_comm_share": round(shares["tpot"], 4),
                "e2e_comm_share": round(shares["e2e"], 4),
                "volume_bytes": self.volume_bytes,
                "meets_budget": self.meets_budget, "crosses_nodes": self.crosses_nodes,
                "weight_bytes_per_gpu": self.weight_bytes,
                "kv_cache_bytes_per_gpu": self.kv_cache_bytes,
                "activation_bytes_per_gpu": self.activation_bytes,
                "overhead_bytes_per_gpu": self.overhead_bytes,
                "max_model_len_kv_bytes_per_gpu": self.request_kv_bytes,
                "kv_capacity_tokens": self.kv_capacity_tokens,
                "max_concurrency": self.max_concurrency,
                "fits_memory": self.fits_memory, "best": self.best,
                "memory": self.memory}


def _divisors(n: int) -> list[int]:
    """Divisors in increasing order, by trial up to sqrt(n): a million GPUs take 1,000 tries."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def shapes(gpus: int, moe: bool = False) -> list[Shape]:
    """Every dp x tp x pp = gpus (the one place parallelism dimensions enter): for a dense
    model every dp (replicas); for a MoE model dp = 1 without expert parallelism, and every
    dp x tp > 1 with it."""
    out = []
    for dp in _divisors(gpus):
        for tp in _divisors(gpus // dp):
            pp = gpus // dp // tp
            if not moe or dp == 1:
                out.append(Shape(tp=tp, pp=pp, dp=dp))
            if moe and dp * tp > 1:
                out.append(Shape(tp=tp, pp=pp, dp=dp, ep=True))
    return out


def layout_of(shape: Shape) -> Layout:
    return Layout(tp=shape.tp, pp=shape.pp, dp=shape.dp, ep=shape.ep)


def label(shape: Shape) -> str:
    return f"tp={shape.tp} pp={shape.pp} dp={shape.dp}" + (" ep" if shape.ep else "")


def valid_layouts(model: ModelConfig, gpus: int) -> tuple[list[Shape], list[str]]:
    """The shapes the layout accepts for this model, and why the others were left out."""
    kept, refused = [], []
    for shape in shapes(gpus, model.is_moe):
        try:
            layout_of(shape).check_model(model)
        except ConfigError as err:
            refused.append(f"{label(shape)}: {err}")
            continue
        kept.append(shape)
    return kept, refused


def price(pattern: Pattern, shape: Shape, topology: Topology, budget: Budget,
          hardware: Hardware = Hardware()) -> Priced:
    """One layout's communication (predict, in the engine's order), memory and compute."""
    topology.reset()
    if is_lanes(pattern):  # --requests over DP replicas and PP
        return _price_lanes(pattern, shape, topology, budget, hardware)
    if hasattr(pattern, "rank_steps"):  # --requests over MoE DP ranks: dp_workload.py
        return _price_dp(pattern, shape, topology, budget, hardware)
    predicted, notes = predict_pattern(pattern, topology, token_order=True)
    if shape.dp > 1 and not shape.ep:
        notes = [*notes, "dp > 1 of a dense model is independent replicas: "
                 "the times are one replica's communication (the slowest), the bus volume the "
                 "deployment's, and each replica serves its own batch"]
    prefill, step = predicted["prefill_us"], predicted.get("decode_step_us", 0.0)
    from microbench.analysis.workload import plan_figures
    prefill, step, predicted, floors = plan_figures(pattern, topology, prefill, step,
                                                    predicted, hardware.gpu)
    from microbench.analysis.workload import kv_tokens
    model = pattern.model
    need = memory_of(model, pattern.layout, pattern.workload.dtype or model.default_dtype,
                     kv_tokens(pattern), hardware)
    priced = Priced(shape, prefill, step, predicted["e2e_us"],
                    as_number(volume_bytes(pattern)["total"]), False,
                    "inter" in topology.used, tuple(notes), *_memory_fields(need, hardware),
                    *floors)
    totals = priced.totals()
    return replace(priced, meets_budget=budget.met(totals["ttft"], totals["tpot"]))


def _price_lanes(lanes: Any, shape: Shape, topology: Topology, budget: Budget,
                 hardware: Hardware) -> Priced:
    comm, floors, kv = price_lanes(lanes, topology, hardware.gpu)
    model, layout = lanes.model, lanes.layout
    dtype = lanes.workload.dtype or model.default_dtype
    need = memory_of(model, layout, dtype, kv, hardware)
    notes = [*sorted(topology.notes),
             f"--requests: requests routed {lanes.routing} to the DP replicas, each "
             "replica's dealt to the pp batches it keeps in flight; prefill and decode step "
             "are p90s over every request, end to end the longest batch's steps"]
    priced = Priced(shape, *comm, lanes_volume(lanes), False, "inter" in topology.used,
                    tuple(notes), *_memory_fields(need, hardware), *floors)
    totals = priced.totals()
    return replace(priced, meets_budget=budget.met(totals["ttft"], totals["tpot"]))


def _price_dp(pattern: Any, shape: Shape, topology: Topology, budget: Budget,
              hardware: Hardware) -> Priced:
    """A MoE model's DP ranks over a workload: every global step its slowest rank's, an
    idle rank's dummy forwards priced (analysis/dp_workload.py)."""
    from microbench.analysis.dp_workload import dp_kv_tokens, price_dp_workload
    comm, floors = price_dp_workload(pattern, topology, hardware.gpu)
    model = pattern.model
    need = memory_of(model, pattern.layout, pattern.workload.dtype or model.default_dtype,
                     dp_kv_tokens(pattern), hardware)
    notes = [*sorted(topology.notes),
             f"--requests: requests routed {pattern.routing} to the DP ranks, which step "
             "together: each step is its slowest rank's, dummy forwards and idle batches "
             "included; prefill and decode step are p90s over every request"]
    priced = Priced(shape, *comm, as_number(volume_bytes(pattern)["total"]), False,
                    "inter" in topology.used, tuple(notes), *_memory_fields(need, hardware),
                    *floors)
    totals = priced.totals()
    return replace(priced, meets_budget=budget.met(totals["ttft"], totals["tpot"]))


def memory_of(model: ModelConfig, layout: Layout, dtype: str, batch_tokens: int,
              hardware: Hardware) -> DeploymentMemory:
    """The fullest rank's memory: weights, the engine's overhead, one max_model_len request
    and the batch's (or a workload's peak) KV cache (analysis/engine_memory.py)."""
    kv_dtype = "uint8" if hardware.kv_cache_dtype == "fp8" else dtype
    settings = Settings(dtype, kv_dtype, hardware.max_model_len or model_context(model),
                        hardware.step_tokens, hardware.max_num_seqs, hardware.eager,
                        hardware.gpus_per_node, hardware.vllm_overhead)
    limit = hardware.memory_limit if hardware.memory_limit is not None else 1 << 62
    return deployment_memory(model, layout, settings, batch_tokens, limit)


def model_context(model: ModelConfig) -> int:
    """The context vLLM derives for the model (`config/model.py` `_get_and_verify_max_len`:
    max_position_embeddings; a yarn checkpoint's original length x factor, which DeepSeek-V3's
    and gpt-oss's configs also give as max_position_embeddings); 2048 where the config has
    none, as vLLM assumes."""
    return model.max_position_embeddings or 2048


def _memory_fields(need: DeploymentMemory, hardware: Hardware) -> tuple[Any, ...]:
    from microbench.analysis.engine_memory import memory_document
    fits = hardware.memory_limit is None or need.fits
    return (need.weights, need.batch_kv, need.overhead.profile_peak, fits,
            need.overhead.total, need.request_kv, need.kv_capacity_tokens,
            need.max_concurrency, memory_document(need))


def plan(model: ModelConfig, gpus: int, make_pattern: Callable[[Layout], Pattern],
         topology: Topology, budget: Budget, hardware: Hardware = Hardware(),
         unloadable: list[str] | None = None,
         progress: Callable[[int, int], None] | None = None,
         ) -> tuple[list[Priced], list[str]]:
    """Every valid layout priced, best first: those that fit in memory, then those meeting
    the budget, then by the objective's floor (communication plus compute), then by volume.
    The first that fits is marked best; those that do not fit stay in the list, after the
    others, with `fits_memory` False (never best). Layouts the engine would not load
    (patterns/engines/vllm/loadable.py) go to `unloadable` with its reason, unpriced.
    `progress(done, total)` is told as each layout is done."""
    kept, refused = valid_layouts(model, gpus)
    from patterns.engines.vllm.loadable import load_refusal
    loads = []
    for shape in kept:
        reason = load_refusal(model, shape.tp, shape.ep)
        if reason is None:
            loads.append(shape)
        elif unloadable is not None:
            unloadable.append(f"{label(shape)}: {reason}")
    if kept and not loads:
        raise ConfigError(f"no layout of {gpus} ranks loads {model.name}: "
                          f"{load_refusal(model, kept[0].tp, kept[0].ep)}")
    kept = loads
    from microbench.analysis.compute import KV_CACHE_DTYPE
    kv_token = KV_CACHE_DTYPE.set("uint8" if hardware.kv_cache_dtype == "fp8" else None)
    try:
        priced, reasons = _price_all(kept, make_pattern, topology, budget, hardware, refused,
                                     progress)
    finally:
        KV_CACHE_DTYPE.reset(kv_token)
    if kept and len(reasons) == len(kept) and len(set(reasons)) == 1:
        # every layout refused for one reason, the options' own (--moe-backend for a dense
        # model, a flag the engine does not read): that reason, not the layout rules
        raise ConfigError(reasons[0])
    if not priced:
        raise ConfigError(f"no layout of {gpus} ranks suits {model.name}: tp must divide "
                          f"num_attention_heads({model.num_attention_heads}) and pp = "
                          f"{gpus}/(dp x tp) must be at most num_hidden_layers"
                          f"({model.num_hidden_layers})"
                          + (f", and with ep dp x tp must divide num_local_experts"
                             f"({model.num_local_experts})" if model.is_moe else "")
                          + (f"; the engine or the sweeps refused the others ({refused[-1]})"
                             if kept else ""))
    key = hardware.objective
    priced.sort(key=lambda p: (not p.fits_memory, not p.meets_budget, p.totals()[key],
                               p.volume_bytes, p.shape.pp, p.shape.dp, p.shape.ep))
    if priced[0].fits_memory:
        priced[0] = replace(priced[0], best=True)
    return priced, refused


def _price_all(kept: list[Shape], make_pattern: Callable[[Layout], Pattern],
               topology: Topology, budget: Budget, hardware: Hardware, refused: list[str],
               progress: Callable[[int, int], None] | None) -> tuple[list[Priced], list[str]]:
    """Each loadable layout priced, or refused (to `refused`) with the engine's or the
    sweeps' reason; also the engine's reasons alone."""
    priced: list[Priced] = []
    reasons: list[str] = []  # the engine's refusals, without the layout
    for done, shape in enumerate(kept):
        if progress is not None:
            progress(done, len(kept))
        try:  # the engine profile refuses what it cannot model
            pattern = make_pattern(layout_of(shape))
        except ConfigError as err:
            refused.append(f"{label(shape)}: {err}")
            reasons.append(str(err))
            continue
        try:  # a call the sweeps cannot price, with no stand-in, leaves this layout out
            priced.append(price(pattern, shape, topology, budget, hardware))
        except UsageError as err:
            refused.append(f"{label(shape)}: not priced: {err}")
    return priced, reasons
