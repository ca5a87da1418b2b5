"""Algorithm 5 machinery: failure probability (exact binomial worst case), O9 sample sizes, EVR logic."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from dpmf.accounting.montecarlo.certify import (
    base_delta_for,
    estimate_verify_release,
    minimum_samples,
    overall_delta,
    verifier_acceptance_bound,
    verify,
)
from dpmf.accounting.montecarlo.statistics import LossHistogram, kl_bernoulli
from dpmf.errors import InvalidParameterError


@pytest.mark.parametrize("s,dp,d", [(2000, 0.01, 0.02), (500, 0.05, 0.08), (75_013, 5e-4, 7e-4)])
def test_acceptance_bound_covers_the_exact_bernoulli_worst_case(s, dp, d):
    # Bernoulli(d) summands: P(mean <= dp) is a binomial CDF; the bound must dominate it
    exact = binom.cdf(math.floor(s * dp), s, d)
    q = verifier_acceptance_bound(s, dp, d)
    assert exact <= q
    assert q < 1
    assert exact > q * 1e-3  # and is not vacuous (Chernoff is tight to a polynomial factor)


def test_acceptance_bound_is_one_below_the_threshold():
    assert verifier_acceptance_bound(1000, 1e-3, 5e-4) == 1.0


@pytest.mark.parametrize("target,expected", [(1e-3, 75_013), (2e-6, 59_299_627)])
def test_o9_minimum_samples(target, expected):
    assert minimum_samples(target) == expected


def test_o9_production_delta():
    s = minimum_samples(1.301e-8)
    assert round(s / 1e8) == 118  # notes O9: about 1.18e10
    assert overall_delta(s, 1.301e-8 / 2).overall <= 1.301e-8
    assert overall_delta(s - 1, 1.301e-8 / 2).overall > 1.301e-8


def test_base_delta_for_production_run():
    # notes Sec. 3: 7.5e9 samples per verification certify 1.301e-8 with delta' ~ 5.14e-9
    dp = base_delta_for(7_500_000_000, 1.301e-8)
    assert dp == pytest.approx(5.14e-9, rel=1e-3)
    assert overall_delta(7_500_000_000, dp).overall <= 1.301e-8


def test_overall_delta_is_the_minimum_over_a_dense_grid():
    s, dp = 75_013, 5e-4
    res = overall_delta(s, dp)
    grid = np.exp(np.linspace(math.log(dp) + 1e-9, math.log(0.1), 20_000))
    vals = [d + verifier_acceptance_bound(s, dp, d) * (1 - d) for d in grid]
    assert res.overall <= min(vals) * (1 + 1e-9)
    assert res.overall == pytest.approx(res.delta + res.failure_probability * (1 - res.delta), rel=1e-9)
    assert dp < res.delta < res.overall


def test_verify_needs_both_directions_and_compares_binned_estimates():
    rem = LossHistogram.from_losses(np.array([5.0] * 3 + [0.0] * 997))  # delta(1) ~ 0.003 * (1 - e^-4)
    add = LossHistogram.from_losses(np.zeros(1000))
    assert verify({"remove": rem, "add": add}, 1.0, 3e-3)
    assert not verify({"remove": rem, "add": add}, 1.0, 2e-3)
    with pytest.raises(InvalidParameterError):
        verify({"remove": rem}, 1.0, 3e-3)


@pytest.mark.parametrize(
    "passes,released,calls",
    [
        ([False, True, False, True, True], 3, 3),  # top-down: 4 ok, 3 ok, 2 fails -> stop
        ([True, True, True], 0, 3),
        ([True, True, False], 3, 1),  # largest candidate fails -> fallback
        ([False, True, True], 1, 3),
    ],
)
def test_estimate_verify_release_suffix_rule(passes, released, calls):
    seen = []

    def verifier(i, sigma):
        seen.append(i)
        return passes[i]

    cands = [0.5 + 0.1 * i for i in range(len(passes))]
    out = estimate_verify_release(cands, verifier)
    assert out.index == released
    assert out.fallback == (released == len(passes))
    assert len(seen) == calls and seen == sorted(seen, reverse=True)
    # the definition i* = min{i : v_j = 1 for all j >= i} on the full verdict vector
    full = passes + [True]
    assert released == min(i for i in range(len(full)) if all(full[i:]))


def test_estimate_verify_release_bad_candidates():
    with pytest.raises(InvalidParameterError):
        estimate_verify_release([0.6, 0.5], lambda i, s: True)
    with pytest.raises(InvalidParameterError):
        estimate_verify_release([-1.0], lambda i, s: True)


def test_bad_input():
    with pytest.raises(InvalidParameterError):
        minimum_samples(1e-3, base_delta=2e-3)
    with pytest.raises(InvalidParameterError):
        minimum_samples(0.0)
    with pytest.raises(InvalidParameterError):
        base_delta_for(10, 1e-6)  # far too few samples
    with pytest.raises(InvalidParameterError):
        overall_delta(0, 1e-3)


def test_o9_verifier_acceptance_rate_of_a_non_private_candidate_is_below_q():
    # Gaussian mechanism whose true delta(1) is exactly delta = 0.016 (the worst case the bound
    # allows); threshold delta' = 0.01. The binned verifier may accept with probability <= q.
    # (Gaussian summands have far less variance than the Bernoulli worst case, so the observed
    # rate is typically 0; the exact worst case is tested with the binomial CDF above.)
    from scipy.optimize import brentq
    from scipy.stats import norm

    def gdelta(sigma, eps=1.0):
        a = 1 / (2 * sigma)
        return norm.cdf(a - eps * sigma) - math.exp(eps) * norm.cdf(-a - eps * sigma)

    s, reps, dp, d = 2000, 1500, 0.01, 0.016
    rng = np.random.default_rng(12)

    def acceptance_rate(true_delta: float) -> float:
        sigma = brentq(lambda x: gdelta(x) - true_delta, 0.3, 20)
        accepted = 0
        for _ in range(reps):
            y = rng.normal(1.0, sigma, s)
            hist = LossHistogram.from_losses((2 * y - 1) / (2 * sigma**2), resolution=1e-2, upper=16.0)
            accepted += hist.delta_estimate(1.0) <= dp
        return accepted / reps

    q = verifier_acceptance_bound(s, dp, d)
    assert 0.01 < q < 0.2
    assert acceptance_rate(d) <= q
    # and it is not a verifier that always says no: a candidate with true delta 0.005 < delta'
    # is rejected with probability <= exp(-s KL(delta' || 0.005)) ~ 0.02
    assert acceptance_rate(0.005) >= 1 - math.exp(-s * kl_bernoulli(dp, 0.005))


@pytest.mark.slow  # importing jax takes ~5 s
def test_sample_sizes_match_jax_privacy():
    dc = pytest.importorskip("jax_privacy.experimental.monte_carlo.delta_calculation")
    for target in (1e-3, 1e-4, 2e-6):
        assert minimum_samples(target) == dc.minimum_samples_to_calibrate(target / 2, target)
    for s, dp in ((75_013, 5e-4), (10**6, 3e-5)):
        # any internal delta gives a valid bound; ours must be at least as tight (to 1e-6)
        assert overall_delta(s, dp).overall <= dc.get_overall_delta(s, dp) * (1 + 1e-6)
    assert base_delta_for(7_500_000_000, 1.301e-8) == pytest.approx(dc.get_base_delta(7_500_000_000, 1.301e-8), rel=1e-3)
