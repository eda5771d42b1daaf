"""Samples whose median hides their shape: two modes, or a high coefficient of variation.

A median ratio of two bimodal sides depends on how many samples fell in each mode, so a
verdict on them says little; field evidence is an NCCL small-message regression on GB300
whose runs were bimodal with a CV of 26.5% and took 5 runs a setting on 10 nodes to settle.

- CV = population standard deviation / mean of one side's pooled samples; high above
  CV_HIGH (0.20).
- Two modes: Sarle's bimodality coefficient as the SAS/STAT User's Guide defines it (the
  CLUSTER procedure), from the sample skewness G1 and excess kurtosis G2 (both with their
  small-sample corrections):
  b = (G1^2 + 1) / (G2 + 3 (n-1)^2 / ((n-2)(n-3))); about 1/3 for a normal sample, 5/9 for
  a uniform one, near 1 for two spikes. Above 5/9 (BIMODAL_B), from at least MIN_FOR_MODES
  samples, and only when the largest gap between sorted samples leaves at least
  max(2, 10%) of them on its smaller side: one stray sample is an outlier, not a mode (b
  alone calls it one). Without the corrections b flagged half of all normal samples of 10.
"""

import math

import numpy as np

CV_HIGH = 0.20
BIMODAL_B = 5 / 9
MIN_FOR_MODES = 10


def coefficient_of_variation(x: np.ndarray) -> float:
    return float(np.std(x) / np.mean(x))


def bimodality_coefficient(x: np.ndarray) -> float | None:
    """Sarle's b of x (sample-corrected); None under MIN_FOR_MODES samples or with no spread."""
    n = x.size
    if n < MIN_FOR_MODES:
        return None
    d = x - np.mean(x)
    m2, m3, m4 = (float(np.mean(d ** k)) for k in (2, 3, 4))
    if m2 <= 0:
        return None
    g1 = m3 / m2 ** 1.5 * math.sqrt(n * (n - 1)) / (n - 2)
    g2 = (n - 1) / ((n - 2) * (n - 3)) * ((n + 1) * (m4 / m2 ** 2 - 3) + 6)
    return (g1 ** 2 + 1) / (g2 + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3)))


def smaller_side_of_gap(x: np.ndarray) -> int:
    """Samples on the smaller side of the largest gap between sorted samples."""
    ordered = np.sort(x)
    cut = int(np.argmax(np.diff(ordered))) + 1
    return min(cut, x.size - cut)


def two_modes(x: np.ndarray) -> float | None:
    """b when x has two modes by the rule above, else None."""
    b = bimodality_coefficient(x)
    if b is None or b <= BIMODAL_B:
        return None
    return b if smaller_side_of_gap(x) >= max(2, math.ceil(0.1 * x.size)) else None


def shape_flags(side: str, x: np.ndarray) -> list[str]:
    """Words to print beside a verdict, e.g. ["B bimodal (b=0.83)", "B CV 26%"]."""
    flags = []
    b = two_modes(x)
    if b is not None:
        flags.append(f"{side} bimodal (b={b:.2f})")
    cv = coefficient_of_variation(x)
    if cv > CV_HIGH:
        flags.append(f"{side} CV {cv:.0%}")
    return flags
