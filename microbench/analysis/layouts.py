"""Every layout of N ranks for a model, each priced by `predict` from the user's own sweeps.

Only communication is priced: a layout's prefill_us and decode_step_us are the floor under
TTFT and TPOT that its calls put there, whatever the kernels do. The prediction is the one of
microbench/analysis/predict.py (the critical path through the stages) in the engine's order:
a decode step begins once the previous step's token is sampled, so a pipeline's decode step
costs the chain through every stage, as it does for one batch in vLLM (a replay, which has
no such dependency, runs the steps of its stages overlapped; `predict` models that). With the
ranks placed as launchers place them: consecutive ranks per node, TP innermost (global rank =
pp_rank x tp + tp_rank), so a TP group wider than a node, or a PP hop between stages on two
nodes, takes the inter-node fits.

The candidate shapes come from `shapes` alone: tp x pp x dp = N with dp = 1 and no expert
parallelism until patterns model them; adding them is that one function and `layout_of`.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from microbench.analysis.predict import Topology, predict_pattern
from patterns import ConfigError, Layout, ModelConfig, Pattern, volume_bytes
from patterns.volume import as_number

# Data-parallel replica counts tried; (1,) until patterns carry data parallelism.
DP_SIZES: tuple[int, ...] = (1,)


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
    best: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"tp": self.shape.tp, "pp": self.shape.pp, "dp": self.shape.dp,
                "ep": self.shape.ep, "prefill_us": round(self.prefill_us, 3),
                "decode_step_us": round(self.decode_step_us, 3),
                "e2e_us": round(self.e2e_us, 3), "volume_bytes": self.volume_bytes,
                "meets_budget": self.meets_budget, "crosses_nodes": self.crosses_nodes,
                "best": self.best}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def shapes(gpus: int) -> list[Shape]:
    """Every tp x pp x dp = gpus (the one place new parallelism dimensions enter)."""
    out = []
    for dp in (d for d in DP_SIZES if gpus % d == 0):
        for tp in _divisors(gpus // dp):
            out.append(Shape(tp=tp, pp=gpus // dp // tp, dp=dp))
    return out


def layout_of(shape: Shape) -> Layout:
    return Layout(tp=shape.tp, pp=shape.pp)


def valid_layouts(model: ModelConfig, gpus: int) -> tuple[list[Shape], list[str]]:
    """The shapes the engine accepts for this model, and why the others were left out."""
    kept, refused = [], []
    for shape in shapes(gpus):
        try:
            layout_of(shape).check_model(model)
        except ConfigError as err:
            refused.append(f"tp={shape.tp} pp={shape.pp}: {err}")
            continue
        kept.append(shape)
    return kept, refused


def price(pattern: Pattern, shape: Shape, topology: Topology, budget: Budget) -> Priced:
    topology.reset()
    predicted, notes = predict_pattern(pattern, topology, token_order=True)
    prefill, step = predicted["prefill_us"], predicted.get("decode_step_us", 0.0)
    return Priced(shape, prefill, step, predicted["e2e_us"],
                  as_number(volume_bytes(pattern)["total"]), budget.met(prefill, step),
                  "inter" in topology.used, tuple(notes))


def plan(model: ModelConfig, gpus: int, make_pattern: Callable[[Layout], Pattern],
         topology: Topology, budget: Budget) -> tuple[list[Priced], list[str]]:
    """Every valid layout priced, best first: those meeting the budget before the others,
    then by end to end, then by volume. The first is marked best."""
    kept, refused = valid_layouts(model, gpus)
    if not kept:
        raise ConfigError(f"no layout of {gpus} ranks suits {model.name}: tp must divide "
                          f"num_attention_heads({model.num_attention_heads}) and pp = "
                          f"{gpus}/tp must be at most num_hidden_layers"
                          f"({model.num_hidden_layers})")
    priced = [price(make_pattern(layout_of(s)), s, topology, budget) for s in kept]
    priced.sort(key=lambda p: (not p.meets_budget, p.e2e_us, p.volume_bytes, p.shape.pp))
    best = priced[0]
    priced[0] = Priced(**{**best.__dict__, "best": True})
    return priced, refused
