"""DP-SGD (identity encoder) under Poisson sampling: the PLD accountant.

Each step is the Poisson-subsampled Gaussian (sampling probability q, noise multiplier sigma,
clip norm 1); T steps compose. The PLD (connect-the-dots, pessimistic) is tight up to its
discretization: for q = 0.01, sigma = 1, T = 1000, delta = 1e-6 it gives epsilon = 2.12452,
the value dp_accounting and prv_accountant agree on (``notes/peer-libraries.md`` A.7, D).

Cost: the strategy is never materialized (the identity is implicit). One PLD of the single step
(grid points ~ loss range / discretization; built vectorized) and one FFT self-composition whose
length grows like ``T q^2 / (2 sigma^2) + 10 q sqrt(T) / sigma`` over the discretization: memory
``O(that length)``, independent of ``n = T`` otherwise (15 MiB at T = 10^6, q = 1e-4, sigma = 0.8;
``benchmarks/bench_dpsgd_scale.py``).
"""

from __future__ import annotations

import time

from dpmf import validation as _v
from dpmf.accounting.guard import guarded
from dpmf.accounting.report import PrivacyReport, pld_report
from dpmf.accounting.truncated import truncation_refusal
from dpmf.privacy.gaussian_plds import discretization_diagnostics, step_discretization, subsampled_gaussian
from dpmf.privacy.pld import DEFAULT_DISCRETIZATION
from dpmf.sampling.schemes import PoissonSampling
from dpmf.strategies.identity import Identity

NAME = "pld"


def supports(strategy, scheme) -> str | None:
    """``None`` when this method applies, else the reason it does not."""
    if not isinstance(strategy, Identity):
        return "the PLD DP-SGD accountant covers only the identity strategy (independent noise)"
    if not isinstance(scheme, PoissonSampling):
        return "the PLD DP-SGD accountant needs Poisson sampling"
    return truncation_refusal(scheme, "the PLD DP-SGD accountant")


def dpsgd_epsilon_by_direction(
    noise_multiplier: float,
    sampling_prob: float,
    steps: int,
    delta: float,
    *,
    discretization: float = DEFAULT_DISCRETIZATION,
) -> dict[str, float]:
    """Per-direction epsilon of ``steps`` Poisson-subsampled Gaussian steps (on the grid
    :func:`~dpmf.privacy.gaussian_plds.step_discretization` chooses: ``discretization`` where it
    fits, a coarser one at small noise)."""
    steps = _v.positive_int("steps", steps)
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    disc = step_discretization(discretization, [(sigma, sampling_prob, 1.0)])
    pld = subsampled_gaussian(sigma, sampling_prob, discretization=disc)
    return pld.self_compose(steps).epsilon_by_direction(delta)


@guarded(NAME, supports)
def account_dpsgd(
    strategy: Identity,
    scheme: PoissonSampling,
    noise_multiplier: float,
    delta: float,
    *,
    discretization: float = DEFAULT_DISCRETIZATION,
) -> PrivacyReport:
    """Report for DP-SGD with Poisson sampling (see module docstring). At a noise whose one-step
    grid would not fit at ``discretization``, a coarser grid is used
    (:func:`~dpmf.privacy.gaussian_plds.step_discretization`; ``diagnostics["discretization_note"]``
    says so)."""
    start = time.perf_counter()
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    steps = _v.positive_int("steps", scheme.steps)
    requested = _v.positive("discretization", discretization)
    discretization = step_discretization(requested, [(sigma, scheme.sampling_prob, 1.0)])
    pld = subsampled_gaussian(sigma, scheme.sampling_prob, discretization=discretization).self_compose(steps)
    return pld_report(
        pld, delta=delta, noise_multiplier=sigma, method=NAME, strategy=strategy, scheme=scheme,
        note=f"pessimistic PLD of {steps} Poisson-subsampled Gaussian steps (q = {scheme.sampling_prob:g})",
        diagnostics=discretization_diagnostics(requested, discretization), start=start,
    )
