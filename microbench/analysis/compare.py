"""Run against run: ratio of medians, its bootstrap confidence interval, and a verdict.

For each metric, with A the baseline's samples and B the other run's:
- ratio = median(B) / median(A) (above 1: B is slower);
- 95% interval: resample A and B (with replacement, each to its own size) 2000 times with a
  seeded generator, take median(B*) / median(A*) each time, keep the 2.5th and 97.5th
  percentiles (the percentile bootstrap);
- verdict, with t the threshold (default 0.05):
  "faster" when the whole interval is below 1, "slower" when it is above 1;
  "same" when it holds 1 and lies within [1/(1+t), 1+t]: any difference is within t;
  "inconclusive" when it holds 1 but reaches past 1+t or below 1/(1+t): the samples can
  neither show a difference nor rule out one larger than the threshold (a ratio of 29 with
  an interval [0.34, 44.7] is not "same"), or when a run has fewer than MIN_SAMPLES
  samples (a percentile bootstrap of a median from 1 to 4 samples is far too narrow: from
  one sample it is a single point);
- regression: "slower" and ratio > 1 + threshold, i.e. B is slower beyond doubt and by more
  than the threshold.
An inconclusive metric carries the iterations that would likely resolve it (see
iterations_needed). Samples are one per timed inference (replay) or per timed call (sweep),
each the slowest rank's, so iterations are the resampling unit.
"""

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from microbench.argtypes import UsageError
from microbench.results.runs import RunFolder, replay_samples, sweep_key_name, sweep_samples
from patterns import EngineOptions

RESAMPLES = 2000
SEED = 0
LEVEL = 0.95
MIN_SAMPLES = 5


@dataclass(frozen=True)
class Comparison:
    run: str  # the compared run's folder
    metric: str
    a_median_us: float
    b_median_us: float
    ratio: float
    ci_low: float
    ci_high: float
    verdict: str
    regression: bool
    predicted_us: float | None = None
    # For an inconclusive verdict: timed iterations per run that would likely decide it
    # (None when more iterations cannot, e.g. a ratio of exactly 1 at threshold 0).
    iterations_needed: int | None = None
    samples: int = 0  # the fewer of the two runs' samples

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v)
                for k, v in self.__dict__.items()}


def bootstrap_ratio(a: np.ndarray, b: np.ndarray, resamples: int = RESAMPLES,
                    seed: int = SEED) -> tuple[float, float, float]:
    """(median(b)/median(a), low, high) with the percentile bootstrap interval at LEVEL."""
    rng = np.random.default_rng(seed)
    a_star = np.median(a[rng.integers(0, a.size, (resamples, a.size))], axis=1)
    b_star = np.median(b[rng.integers(0, b.size, (resamples, b.size))], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = b_star / a_star
        ratio = float(np.median(b) / np.median(a))
    tail = (1 - LEVEL) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return ratio, float(low), float(high)


def verdict(low: float, high: float, threshold: float = 0.05) -> str:
    if high < 1:
        return "faster"
    if low > 1:
        return "slower"
    if high <= 1 + threshold and low >= 1 / (1 + threshold):
        return "same"
    return "inconclusive"


def iterations_needed(ratio: float, low: float, high: float, threshold: float,
                      samples: int) -> int | None:
    """Iterations per run after which the interval would likely be decisive.

    The interval's half-widths shrink about as 1/sqrt(n) (the standard error of a median
    does), so scaling both sides by k about the ratio needs n / k^2 samples. Worked in
    log(ratio), where the interval of a ratio is about symmetric. Decisive is the first of:
    the interval clear of 1 (faster or slower), or inside [1/(1+t), 1+t] (same); the largest
    k that reaches one of them gives the fewest iterations. Assumes the ratio and the
    spread stay what they are: an estimate to plan the rerun with, rounded up.
    """
    if not (0 < low <= ratio <= high < math.inf):  # a zero median among the resamples
        return None
    r, lo, hi = math.log(ratio), math.log(ratio / low), math.log(high / ratio)
    band = math.log(1 + threshold)
    scales = []
    if r > 0 and lo > 0:  # slower once low' > 1
        scales.append(r / lo)
    if r < 0 and hi > 0:  # faster once high' < 1
        scales.append(-r / hi)
    if abs(r) < band:  # same once the interval fits within the band
        scales.append(min((band - r) / hi if hi > 0 else math.inf,
                          (band + r) / lo if lo > 0 else math.inf))
    k = max(scales, default=0.0)
    if k <= 0:
        return MIN_SAMPLES if samples < MIN_SAMPLES else None
    # Strictly inside: aim a little past the boundary (k x 0.95).
    return max(samples + 1, MIN_SAMPLES, math.ceil(samples / (0.95 * k) ** 2))


def compare_samples(run: str, metric: str, a: np.ndarray, b: np.ndarray,
                    threshold: float) -> Comparison:
    for name, x in (("baseline", a), (run, b)):
        # tables.py refuses such files; this keeps a nan from ever reading "same".
        if x.size == 0 or not np.all(np.isfinite(x)) or np.median(x) <= 0:
            raise UsageError(f"{metric} of {name}: no positive finite samples to compare")
    ratio, low, high = bootstrap_ratio(a, b)
    samples = min(a.size, b.size)
    v = verdict(low, high, threshold)
    if samples < MIN_SAMPLES and v != "inconclusive":
        v = "inconclusive"
    needed = (iterations_needed(ratio, low, high, threshold, samples)
              if v == "inconclusive" else None)
    return Comparison(run, metric, float(np.median(a)), float(np.median(b)), ratio, low, high,
                      v, v == "slower" and ratio > 1 + threshold, iterations_needed=needed,
                      samples=samples)


def _first_difference(a: Any, b: Any, where: str) -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(dict.fromkeys([*a, *b])):
            found = _first_difference(a.get(key), b.get(key), f"{where}.{key}")
            if found:
                return found
        return None
    return None if a == b else f"{where} differs: {a} in A, {b} in B"


def mismatch(a: RunFolder, b: RunFolder) -> str | None:
    """Why two runs did not measure the same thing, or None when they did."""
    if a.kind != b.kind:
        return f"kind differs: {a.kind} in A, {b.kind} in B"
    if a.kind == "replay":
        for field in ("model", "layout", "workload", "engine"):
            found = _first_difference(_identity(field, a.meta["pattern"].get(field)),
                                      _identity(field, b.meta["pattern"].get(field)), field)
            if found:
                return found
        return None
    keys_a, keys_b = set(sweep_samples(a)), set(sweep_samples(b))
    for index, field in enumerate(("op", "size_bytes", "dtype", "group_size")):
        va, vb = sorted({k[index] for k in keys_a}), sorted({k[index] for k in keys_b})
        if va != vb:
            return f"{field} differs: {_few(va)} in A, {_few(vb)} in B"
    if keys_a != keys_b:
        only = sorted(keys_a ^ keys_b)[0]
        return f"(op, size) sets differ: {sweep_key_name(only)} is in one run only"
    return None


def _identity(field: str, section: Any) -> Any:
    # Runs made before an engine option existed recorded no value for it: they ran with its
    # default (e.g. gpu, nccl_only, added with the engines of issue 10).
    if field == "engine" and isinstance(section, dict):
        section = {**asdict(EngineOptions()), **section}
    # A model's `source` is where its config was read from, not what it is.
    if isinstance(section, dict):
        return {k: v for k, v in section.items() if k != "source"}
    return section


def _few(values: list[Any]) -> str:
    text = ",".join(map(str, values[:6]))
    return text + (f",... ({len(values)} values)" if len(values) > 6 else "")


def run_metrics(run: RunFolder) -> dict[str, np.ndarray]:
    if run.kind == "replay":
        return replay_samples(run)
    return {sweep_key_name(k): v for k, v in sweep_samples(run).items()}


def compare_runs(runs: list[RunFolder], threshold: float,
                 predicted: dict[str, float] | None = None) -> list[Comparison]:
    """Every run against the first; refuses (UsageError) runs that measured different things."""
    if len(runs) < 2:
        raise UsageError("compare needs at least two runs: the baseline first")
    if threshold < 0:
        raise UsageError(f"--threshold {threshold} must be zero or more (0.05 = 5%)")
    base = runs[0]
    for other in runs[1:]:
        why = mismatch(base, other)
        if why:
            raise UsageError(f"{other.path} did not measure what {base.path} did: {why}")
    base_metrics = run_metrics(base)
    out = []
    for other in runs[1:]:
        metrics = run_metrics(other)
        for name, a in base_metrics.items():
            if name not in metrics:  # per-op metrics exist only with --timing op in both
                continue
            c = compare_samples(str(other.path), name, a, metrics[name], threshold)
            if predicted and name in predicted:
                c = Comparison(**{**c.__dict__, "predicted_us": predicted[name]})
            out.append(c)
    return out
