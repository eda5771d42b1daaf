"""Side A (the baseline) against side B, several runs a side: ratio, interval, verdict.

Runs, not iterations, are the unit of a verdict. For each metric, with each side's runs:
- ratio = median(B) / median(A) of each side's pooled samples (above 1: B is slower);
- 95% interval from the hierarchical bootstrap (analysis/hierarchy.py): 2000 seeded
  resamples, each drawing runs with replacement and then each drawn run's iterations;
- one run a side: the between-run spread is unknown and the interval covers only the
  variation within a run. The interval is then widened by the drift allowance D (default
  0.40, --drift): [low / (1 + D), high x (1 + D)]. So one run against one is called slower
  (or faster) only beyond a 1.4x drift, and never "same";
- verdict, with t the threshold (default 0.05), read from that interval:
  "faster" when it lies below 1, "slower" when above 1; "same" when it holds 1 and lies
  within [1/(1+t), 1+t]; "inconclusive" when it holds 1 but reaches past either, or a run
  has fewer than MIN_SAMPLES samples (a bootstrap median of 1 to 4 samples is far too narrow)
  unless the interval lies wholly beyond x FAR (2): then decided, and flagged;
- "regression" replaces "slower" when the ratio also exceeds 1 + t: beyond doubt, beyond
  drift, and by more than the threshold. The CLI exits 1 on it.
An inconclusive metric says what would decide it: runs a side (runs_needed; MIN_RUNS when a
side has one run, since the drift must be measured first), or iterations a run
(iterations_needed) when the runs are too short. The verdict words are the same in the
table, the markdown, the JSON and the report (verdict_label).

Why 0.40: six replays of one configuration run back to back on a 2-core machine shared with
other jobs (tests/data/compare-drift) had run medians up to 1.31x apart (prefill 7587 us
to 9924 us), each run's own interval a few percent wide; a field NCCL regression had runs
with a CV of 26.5%. A doubled time still clears it (2 / 1.31 = 1.53 > 1.4).
"""

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from microbench.analysis.hierarchy import RESAMPLES, between_run_cv, hierarchical_ratio
from microbench.analysis.sameness import first_repeat, mismatch, run_metrics
from microbench.analysis.spread import shape_flags
from microbench.argtypes import UsageError
from microbench.results.runs import RunFolder

__all__ = ["RESAMPLES", "Comparison", "compare_groups", "compare_runs", "compare_samples",
           "iterations_needed", "mismatch", "verdict", "verdict_label"]

THRESHOLD = 0.05
DRIFT = 0.40
MIN_SAMPLES = 5
MIN_RUNS = 3
# With fewer than MIN_SAMPLES samples a run the interval is too narrow to trust near 1, but
# one wholly beyond x2 (after the drift allowance) is no artefact of few samples: decided,
# flagged. Twice the 1.31x drift of tests/data/compare-drift would still not reach it.
FAR = 2.0
VERDICTS = ("faster", "same", "slower", "regression", "inconclusive")


@dataclass(frozen=True)
class Comparison:
    run: str  # side B: its run folder, or its folders joined by ", "
    metric: str
    a_median_us: float
    b_median_us: float
    ratio: float
    ci_low: float  # the interval the verdict read (widened by the drift with one run a side)
    ci_high: float
    verdict: str  # one of VERDICTS
    regression: bool
    predicted_us: float | None = None
    iterations_needed: int | None = None  # an inconclusive metric: iterations a run
    runs_needed: int | None = None  # an inconclusive metric: runs a side
    samples: int = 0  # the fewest samples of any run
    runs_a: int = 1
    runs_b: int = 1
    drift_allowed: float | None = None  # D when a side had one run (between-run unknown)
    between_run_cv_a: float | None = None  # CV of the runs' medians; None from one run
    between_run_cv_b: float | None = None
    flags: list[str] = field(default_factory=list)  # bimodal / high CV, per side

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v)
                for k, v in self.__dict__.items()}


def verdict(low: float, high: float, threshold: float = THRESHOLD) -> str:
    if high < 1:
        return "faster"
    if low > 1:
        return "slower"
    if high <= 1 + threshold and low >= 1 / (1 + threshold):
        return "same"
    return "inconclusive"


def verdict_label(c: Comparison | dict[str, Any]) -> str:
    """The verdict as every output prints it: the word, and for an inconclusive metric what
    would decide it ("inconclusive: 3 runs a side", "inconclusive: -n 51")."""
    get = c.get if isinstance(c, dict) else c.__dict__.get
    word = str(get("verdict"))
    if word != "inconclusive":
        return word
    if get("iterations_needed"):
        return f"inconclusive: -n {get('iterations_needed')}"
    if get("runs_needed"):
        return f"inconclusive: {get('runs_needed')} runs a side"
    return "inconclusive"


def iterations_needed(ratio: float, low: float, high: float, threshold: float,
                      samples: int) -> int | None:
    """Samples (iterations of a run, or runs of a side) after which the interval would
    likely be decisive.

    The interval's half-widths shrink about as 1/sqrt(n) (the standard error of a median
    does), so scaling both sides by k about the ratio needs n / k^2 samples. Worked in
    log(ratio), where the interval of a ratio is about symmetric. Decisive is the first of:
    the interval clear of 1 (faster or slower), or inside [1/(1+t), 1+t] (same); the largest
    k that reaches one of them gives the fewest samples. Assumes the ratio and the spread
    stay what they are: an estimate to plan the rerun with, rounded up.
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


def compare_sides(label: str, metric: str, a_runs: list[np.ndarray],
                  b_runs: list[np.ndarray], threshold: float = THRESHOLD,
                  drift: float = DRIFT) -> Comparison:
    """One metric, the runs of A against the runs of B (each a 1-d array of samples)."""
    for name, runs in (("A", a_runs), ("B", b_runs)):
        for x in runs:
            # tables.py refuses such files; this keeps a nan from ever reading "same".
            if x.size == 0 or not np.all(np.isfinite(x)) or np.median(x) <= 0:
                raise UsageError(f"{metric} of side {name}: no positive finite samples to "
                                 "compare")
    ratio, low, high = hierarchical_ratio(a_runs, b_runs)
    runs = min(len(a_runs), len(b_runs))
    allowed = drift if runs == 1 else None
    if allowed is not None:
        low, high = low / (1 + allowed), high * (1 + allowed)
    samples = min(x.size for x in [*a_runs, *b_runs])
    word = verdict(low, high, threshold)
    decided_few = samples < MIN_SAMPLES and (low > FAR or high < 1 / FAR)
    if samples < MIN_SAMPLES and not decided_few:
        word = "inconclusive"
    iters = runs_more = None
    if word == "inconclusive":
        if samples < MIN_SAMPLES:
            iters = iterations_needed(ratio, low, high, threshold, samples)
        elif runs == 1:
            runs_more = MIN_RUNS
        else:
            runs_more = iterations_needed(ratio, low, high, threshold, runs)
    regression = word == "slower" and ratio > 1 + threshold
    flags = [*shape_flags("A", np.concatenate(a_runs)), *shape_flags("B", np.concatenate(b_runs))]
    if decided_few:
        flags.append(f"few samples ({samples} a run): decided as the interval lies beyond "
                     f"x{FAR:g}")
    return Comparison(label, metric, float(np.median(np.concatenate(a_runs))),
                      float(np.median(np.concatenate(b_runs))), ratio, low, high,
                      "regression" if regression else word, regression,
                      iterations_needed=iters, runs_needed=runs_more, samples=samples,
                      runs_a=len(a_runs), runs_b=len(b_runs), drift_allowed=allowed,
                      between_run_cv_a=between_run_cv(a_runs),
                      between_run_cv_b=between_run_cv(b_runs), flags=flags)


def compare_samples(run: str, metric: str, a: np.ndarray, b: np.ndarray,
                    threshold: float = THRESHOLD, drift: float = DRIFT) -> Comparison:
    """One run against one."""
    return compare_sides(run, metric, [a], [b], threshold, drift)


def _check(threshold: float, drift: float) -> None:
    if not (math.isfinite(threshold) and threshold >= 0):
        raise UsageError(f"--threshold {threshold} must be zero or more (0.05 = 5%)")
    if not (math.isfinite(drift) and drift >= 0):
        raise UsageError(f"--drift {drift} must be zero or more (0.40 = runs may drift 40%)")


def check_sides(a_runs: list[RunFolder], b_runs: list[RunFolder]) -> None:
    """Refuses (UsageError) a run given twice, one run on both sides, runs that measured
    different things."""
    if not a_runs or not b_runs:
        raise UsageError("compare needs runs on both sides: -A RUN... -B RUN...")
    every = [("A", r) for r in a_runs] + [("B", r) for r in b_runs]
    repeat = first_repeat([r for _, r in every])
    if repeat:
        (side_i, x), (side_j, y) = every[repeat[0]], every[repeat[1]]
        where = f"on side {side_i}" if side_i == side_j else "on both sides"
        raise UsageError(f"{x.path} and {y.path} are {repeat[2]}, {where}: a run against "
                         "itself always reads 1.000; compare other runs of one build "
                         "to see its drift, or runs of two builds")
    base = a_runs[0]
    for other in every[1:]:
        why = mismatch(base, other[1])
        if why:
            raise UsageError(f"{other[1].path} did not measure what {base.path} did: {why}")


def compare_groups(a_runs: list[RunFolder], b_runs: list[RunFolder],
                   threshold: float = THRESHOLD, drift: float = DRIFT,
                   predicted: dict[str, float] | None = None) -> list[Comparison]:
    """Every metric the runs share, side A against side B."""
    _check(threshold, drift)
    check_sides(a_runs, b_runs)
    a_metrics = [run_metrics(r) for r in a_runs]
    b_metrics = [run_metrics(r) for r in b_runs]
    label = ", ".join(str(r.path) for r in b_runs)
    out = []
    for name in a_metrics[0]:
        # per-op metrics exist only with --timing op in every run
        if not all(name in m for m in [*a_metrics, *b_metrics]):
            continue
        c = compare_sides(label, name, [m[name] for m in a_metrics],
                          [m[name] for m in b_metrics], threshold, drift)
        if predicted and name in predicted:
            c = Comparison(**{**c.__dict__, "predicted_us": predicted[name]})
        out.append(c)
    return out


def compare_runs(runs: list[RunFolder], threshold: float = THRESHOLD,
                 predicted: dict[str, float] | None = None,
                 drift: float = DRIFT) -> list[Comparison]:
    """Every run against the first, one run a side."""
    if len(runs) < 2:
        raise UsageError("compare needs at least two runs: the baseline first")
    _check(threshold, drift)
    for other in runs[1:]:
        check_sides([runs[0]], [other])
    return [c for other in runs[1:]
            for c in compare_groups([runs[0]], [other], threshold, drift, predicted)]
