"""The hierarchical bootstrap: runs first, then iterations within them.

A run's iterations share what changed between runs (other jobs on the node, clock and cache
state, where the scheduler put the ranks), so iterations of one run are not independent
samples of the build: resampling them alone gives an interval that covers the variation
within one run and misses the drift between runs (two runs 2 s apart once read x1.068
[1.010, 1.146] "slower"). Here each resample draws, for each side, k runs with replacement
from its k runs, then each drawn run's iterations with replacement (to that run's own count),
pools them and takes their median; the ratio is median(B*) / median(A*). With one run a side
the first level draws that run every time and the interval is the within-run one: the
between-run spread is unknown, which compare.py then allows for with a stated drift.

The scheme is the two-level resampling of Saravanan et al., "Application of the hierarchical
bootstrap to multi-level data in neuroscience" (Neurons, Behavior, Data analysis and Theory,
2020): resample the top level (here runs), then within each drawn unit.
"""

import numpy as np

RESAMPLES = 2000
SEED = 0
LEVEL = 0.95
CHUNK_VALUES = 4_000_000


def pooled_median(runs: list[np.ndarray]) -> float:
    return float(np.median(np.concatenate(runs)))


def _resampled_medians(runs: list[np.ndarray], rng: np.random.Generator,
                       resamples: int) -> np.ndarray:
    k = len(runs)
    sizes = np.array([r.size for r in runs])
    width = int(sizes.max())
    padded = np.full((k, width), np.nan)
    for i, r in enumerate(runs):
        padded[i, :r.size] = r
    # Resamples in chunks of at most CHUNK_VALUES drawn values: 3 runs of 10,000 iterations
    # would otherwise draw 60 million at once.
    chunk = max(1, CHUNK_VALUES // (k * width))
    out = np.empty(resamples)
    for start in range(0, resamples, chunk):
        n = min(chunk, resamples - start)
        picks = rng.integers(0, k, (n, k))  # level 1: runs
        lengths = sizes[picks]  # (n, k)
        # level 2: iterations of each drawn run, as many as it has; padding beyond stays NaN
        index = (rng.random((n, k, width)) * lengths[..., None]).astype(np.int64)
        drawn = padded[picks[..., None], index]
        drawn[np.arange(width)[None, None, :] >= lengths[..., None]] = np.nan
        out[start:start + n] = np.nanmedian(drawn.reshape(n, k * width), axis=1)
    return out


def hierarchical_ratio(a_runs: list[np.ndarray], b_runs: list[np.ndarray],
                       resamples: int = RESAMPLES,
                       seed: int = SEED) -> tuple[float, float, float]:
    """(median(B) / median(A) of the pooled samples, low, high): the percentile interval at
    LEVEL of the ratio under the two-level resampling."""
    rng = np.random.default_rng(seed)
    a_star = _resampled_medians(a_runs, rng, resamples)
    b_star = _resampled_medians(b_runs, rng, resamples)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = b_star / a_star
        ratio = pooled_median(b_runs) / pooled_median(a_runs)
    tail = (1 - LEVEL) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(ratio), float(low), float(high)


def between_run_cv(runs: list[np.ndarray]) -> float | None:
    """Coefficient of variation of the runs' medians (None from one run: unknown)."""
    if len(runs) < 2:
        return None
    medians = np.array([np.median(r) for r in runs])
    return float(np.std(medians, ddof=1) / np.mean(medians))
