"""The unamplified matrix mechanism: one Gaussian mechanism over the whole run.

Without sampling randomness, releasing ``C x + z`` with ``z ~ N(0, sigma^2 I)`` is the Gaussian
mechanism with L2 sensitivity ``sens = sup ||C (x - x')||`` over the participation schema, i.e.
exactly ``mu = sens / sigma`` GDP. Its epsilon is the closed form of
:func:`dpmf.privacy.gaussian_epsilon` (tight; no discretization), identical in both directions.
For fixed-order sampling with k epochs the identity has ``sens = sqrt(k)``.

Cost is that of ``strategy.sensitivity``: O(1) for the identity, O(n) time and memory for Toeplitz
strategies and the binary tree under every-step or fixed-epoch participation (no matrix), and for
a dense ``m x n`` encoder (or other schemas) O(m n + n^2) memory for ``C`` and ``C^T C`` plus the
sensitivity program of :func:`dpmf.strategies.sensitivity_squared`.
"""

from __future__ import annotations

import time

from dpmf import validation as _v
from dpmf.accounting.guard import guarded
from dpmf.accounting.report import PrivacyReport
from dpmf.privacy.gdp import gaussian_epsilon, gdp_mu
from dpmf.privacy.tradeoff import PrivacyCurve
from dpmf.sampling.schemes import (
    BallsInBinsSampling,
    CyclicPoissonSampling,
    FixedOrderSampling,
    MinSepSampling,
    MultiAttributionMinSepSampling,
    PoissonSampling,
)
from dpmf.accounting.user_level import user_sensitivity_factor
from dpmf.strategies.participation import Participation
from dpmf.strategies.sensitivity import FixedEpochParticipation

NAME = "unamplified"


def participation_of(scheme) -> Participation | FixedEpochParticipation:
    """Worst-case participation pattern a scheme allows (no credit for its randomness)."""
    if isinstance(scheme, BallsInBinsSampling) and not scheme.reused_single_slot:
        # k slots per epoch and/or fresh slots: epochs * k steps, any two possibly adjacent
        return Participation(scheme.max_participations, 1)
    if isinstance(scheme, (FixedOrderSampling, BallsInBinsSampling)):  # exactly k times, b apart
        return FixedEpochParticipation(scheme.max_participations, scheme.min_sep)
    if isinstance(scheme, (CyclicPoissonSampling, MinSepSampling, MultiAttributionMinSepSampling)):
        # at most ceil(n/b), >= b apart (multi-attribution: a user; accounting.user_level)
        return Participation(scheme.max_participations, scheme.min_sep)
    if isinstance(scheme, PoissonSampling):
        return Participation(scheme.steps, 1)  # an example may be drawn every step
    raise TypeError(type(scheme).__name__)


def supports(strategy, scheme) -> str | None:
    if not hasattr(strategy, "sensitivity"):
        return "the strategy does not expose its sensitivity"
    if not isinstance(
        scheme,
        (FixedOrderSampling, PoissonSampling, BallsInBinsSampling, CyclicPoissonSampling, MinSepSampling,
         MultiAttributionMinSepSampling),
    ):
        return f"no participation pattern known for {type(scheme).__name__}"
    return None


@guarded(NAME, supports)
def account_unamplified(strategy, scheme, noise_multiplier: float, delta: float) -> PrivacyReport:
    """Report for the Gaussian mechanism with the strategy's sensitivity under ``scheme``."""
    start = time.perf_counter()
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    participation = participation_of(scheme)
    sens = user_sensitivity_factor(scheme) * float(strategy.sensitivity(participation))  # k_u for users
    eps = gaussian_epsilon(sigma, delta, sens)
    return PrivacyReport(
        epsilon=eps,
        delta=delta,
        noise_multiplier=sigma,
        method=NAME,
        certified=True,
        epsilon_by_direction={"remove": eps, "add": eps},
        strategy=strategy.describe(),
        scheme=scheme.describe(),
        diagnostics={
            "sensitivity": sens,
            "participation": participation.describe(),
            "mu_gdp": sens / sigma,
            "seconds": time.perf_counter() - start,
        },
        curve=PrivacyCurve.gaussian(
            sens / sigma,
            note=f"the Gaussian mechanism: sensitivity {sens:.6g} / noise multiplier {sigma:.6g}",
            exact=isinstance(scheme, FixedOrderSampling),  # (other samplers' randomness is not credited)
        ),
    )


@guarded(NAME, supports)
def calibrate_unamplified(strategy, scheme, target_epsilon: float, delta: float) -> float:
    """Exact smallest noise multiplier: ``sens / mu*(epsilon, delta)`` (verified by gdp_mu)."""
    sens = user_sensitivity_factor(scheme) * float(strategy.sensitivity(participation_of(scheme)))
    return sens / gdp_mu(target_epsilon, delta)
