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
from dpmf._lazy import LazyModule

stats = LazyModule("scipy.stats")  # imported on first use

from dpmf import validation as _v
from dpmf.privacy.mixture import mixture_of_gaussians
from dpmf.privacy.pld import DEFAULT_DISCRETIZATION, PrivacyLossDistribution


def _binomial(count: int, prob: float) -> tuple[np.ndarray, np.ndarray]:
    k = np.arange(count + 1)
    return k.astype(np.float64), stats.binom.pmf(k, count, prob)


def last_iterate_linear(
    steps: int, sampling_prob: float, noise_multiplier: float, *, discretization: float = DEFAULT_DISCRETIZATION
) -> PrivacyLossDistribution:
    """PLD of releasing only the last iterate of DP-SGD on linear losses (MMCC App. F.5).

    The last iterate reveals ``sum_t x_t + N(0, n sigma^2)`` with ``x_t ~ Bernoulli(q)``: the mixture
    of Gaussians ``sum_k Binom(k; n, q) N(k, n sigma^2)`` against ``N(0, n sigma^2)``.

    >>> pld = last_iterate_linear(128, 1 / 128, 1.0)   # the paper's example
    >>> round(pld.epsilon(1e-6), 3), round(pld.epsilon_by_direction(1e-6)["add"], 3)
    (0.42, 0.291)
    """
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
    """PLD of DP-SGD (Poisson sampling) for a group of ``group_size`` examples (MMCC App. F.5).

    Each step is ``sum_k Binom(k; g, q) N(k, sigma^2)`` against ``N(0, sigma^2)`` (the group of
    ``g`` examples, each sampled independently, clip norm 1); ``steps`` of them compose.

    >>> round(group_dpsgd(2, 100, 0.01, 1.0).epsilon(1e-6), 3)
    1.971
    """
    k = _v.positive_int("group_size", group_size)
    steps = _v.positive_int("steps", steps)
    q = _v.probability("sampling_prob", sampling_prob)
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    sens, probs = _binomial(k, q)
    return mixture_of_gaussians(sens, probs, sigma, discretization=discretization).self_compose(steps)
