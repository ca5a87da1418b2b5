"""Gaussian mechanisms whose sensitivity is binomial: two uses of mixture-of-Gaussians PLDs.

MMCC paper App. F.5 (``notes/mmcc.md`` §3.5 F.5):

* **Last-iterate DP-SGD for linear losses.** With linear losses the final model after ``n`` steps
  of Poisson-sampled noisy SGD reveals only the sum of the gradients and the noise: a Gaussian
  mechanism with noise ``sqrt(n) * sigma`` and sensitivity ``Binomial(n, p)``. The mixture PLD is
  tight for it. Paper example: n = 128, p = 1/128, sigma = 1 gives epsilon 0.806 at delta 1e-6
  when every step is released, and 0.291 in the add direction (0.420 over both directions) for
  the last iterate only.
* **Group privacy for DP-SGD.** A group of ``k`` examples sampled independently with probability
  ``p`` contributes ``Binomial(k, p)`` (times the clip norm) to each step; ``n`` such steps compose.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from dpmf import validation as _v
from dpmf.privacy.mixture import mixture_of_gaussians
from dpmf.privacy.pld import DEFAULT_DISCRETIZATION, PrivacyLossDistribution


def _binomial(count: int, prob: float) -> tuple[np.ndarray, np.ndarray]:
    k = np.arange(count + 1)
    return k.astype(np.float64), stats.binom.pmf(k, count, prob)


def last_iterate_linear(
    steps: int, sampling_prob: float, noise_multiplier: float, *, discretization: float = DEFAULT_DISCRETIZATION
) -> PrivacyLossDistribution:
    """PLD of releasing only the last iterate of DP-SGD on linear losses (see module docstring)."""
    steps = _v.positive_int("steps", steps)
    q = _v.probability("sampling_prob", sampling_prob)
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    sens, probs = _binomial(steps, q)
    return mixture_of_gaussians(sens, probs, np.sqrt(steps) * sigma, discretization=discretization)


def group_dpsgd(
    group_size: int,
    steps: int,
    sampling_prob: float,
    noise_multiplier: float,
    *,
    discretization: float = DEFAULT_DISCRETIZATION,
) -> PrivacyLossDistribution:
    """PLD of DP-SGD (Poisson sampling) for a group of ``group_size`` examples (see module docstring)."""
    k = _v.positive_int("group_size", group_size)
    steps = _v.positive_int("steps", steps)
    q = _v.probability("sampling_prob", sampling_prob)
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    sens, probs = _binomial(k, q)
    return mixture_of_gaussians(sens, probs, sigma, discretization=discretization).self_compose(steps)
