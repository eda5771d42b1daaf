"""Samples whose median hides their shape: two modes, or a high coefficient of variation.

A median ratio of two bimodal sides depends on how many samples fell in each mode, so a
verdict on them says little; field evidence is an NCCL small-message regression on GB300
whose runs were bimodal with a CV of 26.5% and took 5 runs a setting on 10 nodes to settle.

- CV = population standard deviation / mean of one side's pooled samples; high above
  CV_HIGH (0.20).
- Two modes: Sarle's bimodality coefficient b = (g1^2 + 1) / (m4 / m2^2), with g1 = m3 /
  m2^1.5 and mk the k-th central moment (the SAS/STAT manual's BC in its plain-moment form);
  b is 1/3 for a normal sample, 5/9 for a uniform one, 1 for two equal spikes. Above 5/9
  (BIMODAL_B), from at least MIN_FOR_MODES samples, the sample is called bimodal.
"""

import numpy as np

CV_HIGH = 0.20
BIMODAL_B = 5 / 9
MIN_FOR_MODES = 10


def coefficient_of_variation(x: np.ndarray) -> float:
    return float(np.std(x) / np.mean(x))


def bimodality_coefficient(x: np.ndarray) -> float | None:
    """Sarle's b of x; None under MIN_FOR_MODES samples or with no spread."""
    if x.size < MIN_FOR_MODES:
        return None
    d = x - np.mean(x)
    m2, m3, m4 = (float(np.mean(d ** k)) for k in (2, 3, 4))
    if m2 <= 0:
        return None
    return (m3 ** 2 / m2 ** 3 + 1) / (m4 / m2 ** 2)


def shape_flags(side: str, x: np.ndarray) -> list[str]:
    """Words to print beside a verdict, e.g. ["B bimodal (b=0.83)", "B CV 26%"]."""
    flags = []
    b = bimodality_coefficient(x)
    if b is not None and b > BIMODAL_B:
        flags.append(f"{side} bimodal (b={b:.2f})")
    cv = coefficient_of_variation(x)
    if cv > CV_HIGH:
        flags.append(f"{side} CV {cv:.0%}")
    return flags
