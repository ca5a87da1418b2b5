"""PLDs of the Gaussian and the Poisson-subsampled Gaussian mechanisms.

Both delegate to ``dp_accounting.pld`` where it is exact and pessimistic (connect-the-dots
discretization, Doroshenko et al. 2022). Conventions (DESIGN.md): the mechanism adds
``N(0, sigma^2)`` to a query of L2 sensitivity ``sensitivity``; the subsampled version includes the
example with probability ``sampling_prob`` (Poisson sampling, zero-out adjacency). The remove
direction (P = with the example) is the worse one for subsampling; both are kept.
"""

from __future__ import annotations

from dpmf import validation as _v
from dpmf._lazy import LazyModule
from dpmf.privacy.pld import DEFAULT_DISCRETIZATION, PrivacyLossDistribution

_dpa_pld = LazyModule("dp_accounting.pld.privacy_loss_distribution")  # loaded on first use


def gaussian(
    noise_multiplier: float, sensitivity: float = 1.0, *, discretization: float = DEFAULT_DISCRETIZATION
) -> PrivacyLossDistribution:
    """PLD of ``f(D) + N(0, sigma^2)`` for a query of L2 sensitivity ``sensitivity``.

    For a single Gaussian the exact profile is also available in closed form:
    :func:`dpmf.privacy.gaussian_epsilon`.
    """
    return subsampled_gaussian(noise_multiplier, 1.0, sensitivity, discretization=discretization)


def subsampled_gaussian(
    noise_multiplier: float,
    sampling_prob: float,
    sensitivity: float = 1.0,
    *,
    discretization: float = DEFAULT_DISCRETIZATION,
) -> PrivacyLossDistribution:
    """PLD of one Poisson-subsampled Gaussian step (one DP-SGD step); ``sampling_prob = 1`` is
    the plain Gaussian mechanism.

    The dominating pair is ``N(0, sigma^2)`` vs ``(1-q) N(0, sigma^2) + q N(s, sigma^2)``; it is the
    mixture of Gaussians with sensitivities ``[0, s]`` and probabilities ``[1-q, q]``, built here
    with dp_accounting's closed-form inverse privacy loss.
    """
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    q = _v.probability("sampling_prob", sampling_prob)
    sens = _v.positive("sensitivity", sensitivity)
    disc = _v.positive("discretization", discretization)
    pld = _dpa_pld.from_gaussian_mechanism(
        standard_deviation=sigma,
        sensitivity=sens,
        pessimistic_estimate=True,
        value_discretization_interval=disc,
        sampling_prob=q,
    )
    return PrivacyLossDistribution.from_dp_accounting(pld)
