"""LossHistogram: pessimistic exact counts, merging, serialization, delta/epsilon with confidence.

Oracles: hand-binned losses, the raw-loss estimator (the histogram must never be below it and
at most h * P(L > eps - h) above), the Gaussian mechanism's closed-form delta(eps), and the
definition of the Chernoff-Hoeffding bound.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from dpmf.accounting.montecarlo.statistics import (
    LossHistogram,
    kl_bernoulli,
    kl_lower_confidence,
    kl_upper_confidence,
)
from dpmf.errors import InvalidParameterError, NumericalError
from dpmf.privacy.gdp import gaussian_epsilon


def gaussian_delta(eps: float, sigma: float) -> float:
    """Exact hockey-stick divergence of N(1, s^2) vs N(0, s^2) (Balle & Wang 2018)."""
    a = 1.0 / (2 * sigma)
    return norm.cdf(a - eps * sigma) - math.exp(eps) * norm.cdf(-a - eps * sigma)


def raw_delta(losses: np.ndarray, eps: float) -> float:
    return float(np.mean(-np.expm1(np.minimum(eps - losses, 0.0))))


def test_binning_by_hand():
    h = 1e-4
    losses = np.array([-np.inf, -1.0, 0.0, 0.5e-4, 1e-4, 1.5e-4, 63.99995, 64.5, np.inf])
    hist = LossHistogram.from_losses(losses, h, 64.0)
    assert hist.underflow == 3
    assert hist.counts[0] == 2  # (0, h] holds 0.5e-4 and 1e-4 exactly at the edge
    assert hist.counts[1] == 1
    assert hist.counts[-1] == 1  # 63.99995 rounds up to 64.0
    assert (hist.overflow, hist.infinite, hist.total) == (1, 1, 9)
    assert hist.counts.sum() == 4


def test_grid_value_never_below_the_loss():
    rng = np.random.default_rng(0)
    h = 1e-3
    x = rng.uniform(0, 5, 50_000)
    x[:1000] = np.arange(1, 1001) * h  # exact grid points (float rounding at the edges)
    hist = LossHistogram.from_losses(x, h, 8.0)
    # reconstruct the multiset of grid values and compare sorted with the sorted losses
    values = np.repeat(hist.grid, hist.counts)
    xs = np.sort(x)
    assert values.size == xs.size
    assert np.all(values >= xs)
    assert np.all(values - xs < h * (1 + 1e-9))


@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0, 2.5])
def test_estimate_is_pessimistic_and_close(eps):
    rng = np.random.default_rng(1)
    losses = rng.normal(0.5, 1.0, 200_000)
    losses[:10] = np.inf
    h = 1e-3
    hist = LossHistogram.from_losses(losses, h, 64.0)
    exact = raw_delta(losses, eps)
    est = hist.delta_estimate(eps)
    assert est >= exact
    assert est - exact <= h * np.mean(losses > eps - h) + 1e-15


def test_merge_equals_histogram_of_concatenation():
    rng = np.random.default_rng(2)
    a, b = rng.normal(1, 2, 1000), rng.normal(0, 1, 777)
    a[3] = np.inf
    b[5] = 100.0
    ha, hb = LossHistogram.from_losses(a), LossHistogram.from_losses(b)
    assert ha.merge(hb) == LossHistogram.from_losses(np.concatenate([a, b]))
    assert ha.merge(hb) == hb.merge(ha)
    with pytest.raises(InvalidParameterError):
        ha.merge(LossHistogram.from_losses(b, resolution=1e-3))


def test_sparse_roundtrip_and_corruption():
    rng = np.random.default_rng(3)
    hist = LossHistogram.from_losses(rng.normal(2, 1, 5000))
    data = hist.to_sparse()
    assert LossHistogram.from_sparse(data) == hist
    bad = dict(data, bins=data["bins"] + 10**9)
    with pytest.raises(InvalidParameterError):
        LossHistogram.from_sparse(bad)
    with pytest.raises(InvalidParameterError):
        LossHistogram.from_sparse({"resolution": 1e-4})


def test_bad_input():
    with pytest.raises(NumericalError):
        LossHistogram.from_losses(np.array([0.1, np.nan]))
    with pytest.raises(InvalidParameterError):
        LossHistogram.empty(resolution=-1.0)
    with pytest.raises(InvalidParameterError):
        LossHistogram.empty(resolution=1e-9, upper=1e3)  # 1e12 bins
    with pytest.raises(InvalidParameterError):
        LossHistogram.empty().delta_estimate(1.0)  # no samples
    hist = LossHistogram.from_losses(np.array([1.0]))
    with pytest.raises(InvalidParameterError):
        hist.delta_estimate(-0.5)
    with pytest.raises(InvalidParameterError):
        hist.delta_interval(1.0, 1.5)


def test_kl_bernoulli_closed_forms():
    assert kl_bernoulli(0.3, 0.3) == 0.0
    assert kl_bernoulli(0.0, 0.2) == pytest.approx(-math.log(0.8), rel=1e-15)
    assert kl_bernoulli(1.0, 0.2) == pytest.approx(-math.log(0.2), rel=1e-15)
    assert kl_bernoulli(0.1, 0.0) == math.inf
    a, b = 1e-9, 3e-9
    assert kl_bernoulli(a, b) == pytest.approx(a * math.log(a / b) + (1 - a) * math.log((1 - a) / (1 - b)), rel=1e-6)


@pytest.mark.parametrize("mean,s,alpha", [(0.01, 1000, 0.05), (0.3, 50, 0.01), (1e-6, 10**7, 1e-3)])
def test_kl_confidence_solves_its_definition(mean, s, alpha):
    u = kl_upper_confidence(mean, s, alpha)
    lo = kl_lower_confidence(mean, s, alpha)
    assert lo < mean < u
    assert s * kl_bernoulli(mean, u) == pytest.approx(math.log(1 / alpha), rel=1e-9)
    assert s * kl_bernoulli(mean, lo) == pytest.approx(math.log(1 / alpha), rel=1e-9)
    assert s * kl_bernoulli(mean, u) >= math.log(1 / alpha)  # rounded to the safe side


def test_kl_upper_confidence_coverage_on_worst_case_bernoulli():
    # Bernoulli summands are the extreme case of [0, 1] variables; the bound must cover at >= 1 - alpha
    rng = np.random.default_rng(4)
    mu, s, alpha, reps = 0.02, 500, 0.1, 4000
    means = rng.binomial(s, mu, reps) / s
    misses = sum(kl_upper_confidence(m, s, alpha) < mu for m in means)
    assert misses / reps <= alpha


@pytest.mark.parametrize("sigma", [0.7, 1.5])
def test_gaussian_delta_inside_interval(sigma):
    rng = np.random.default_rng(5)
    y = rng.normal(1.0, sigma, 400_000)
    hist = LossHistogram.from_losses((2 * y - 1) / (2 * sigma**2))
    for eps in (0.0, 0.5, 1.0, 2.0):
        lo, est, hi = hist.delta_interval(eps, 0.999)
        exact = gaussian_delta(eps, sigma)
        assert lo <= exact <= hi, (eps, lo, exact, hi)
        # informative: about the normal-approximation width of the same Chernoff exponent,
        # z = sqrt(2 ln(2 / alpha)), with the Bernoulli variance bound
        z = math.sqrt(2 * math.log(2 / 0.001))
        assert hi - lo < 1.1 * 2 * z * math.sqrt(exact * (1 - exact) / y.size)


def test_epsilon_bounds_bracket_the_gaussian_epsilon():
    sigma, delta = 1.0, 1e-2
    rng = np.random.default_rng(6)
    y = rng.normal(1.0, sigma, 1_000_000)
    hist = LossHistogram.from_losses((2 * y - 1) / (2 * sigma**2))
    exact = gaussian_epsilon(sigma, delta, 1.0)
    ub = hist.epsilon_upper_bound(delta, 0.001)
    est = hist.epsilon_estimate(delta)
    assert ub >= exact
    assert ub - exact < 0.05
    assert abs(est - exact) < 0.02
    assert hist.delta_upper_bound(ub, 0.001) <= delta
    assert hist.delta_upper_bound(ub - 1e-5, 0.001) > delta  # smallest such epsilon (to tolerance)


def test_epsilon_infinite_when_infinite_losses_exceed_delta():
    hist = LossHistogram.from_losses(np.array([np.inf] * 10 + [0.1] * 990))
    assert hist.epsilon_upper_bound(1e-3, 0.05) == math.inf
    assert hist.epsilon_upper_bound(0.5, 0.05) == 0.0
