"""The band's own moving average (``allocation/surrogates/moving_average.py``), a member of ``allocation_pld``'s
family for banded C under random allocation.

Oracles: (a) exact numerical integration (b = 3) of the surrogate's own pair: the program's deltas are
never below it and within a few percent; (b) the fit checked from its definition (the covariance
rebuilt as a linear map of the innovations; the split into a rank-one PSD part and a non-negative
rest); (c) a Monte Carlo estimate of the exact pair, which the member never undercuts and which it is
close to; (d) negative controls: smaller loadings, or the corners left uncovered, are caught.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_allocation_correlated import _exact_deltas, _exact_deltas_low, _mc_epsilon_interval

import dpmf
from dpmf.accounting.allocation.surrogates import moving_average as ma
from dpmf.accounting.allocation.dominating_pair import mixture_means
from dpmf.accounting.allocation.surrogates.markov_programs import _interp_call, _interp_put, markov_epsilon
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import Identity, ToeplitzStrategy, bsr

_U = 2.0**-53


def _gram(strategy, epochs):
    means = mixture_means(strategy, epochs, strategy.n)
    g = np.maximum(means @ means.T, 0.0) * (1 + 2 * (means.shape[1] + 2) * _U)
    return means, np.maximum(g, g.T)


def test_bsr_over_four_epochs_is_its_own_moving_average_with_the_corners_cut():
    means, g = _gram(bsr(64, 4), 4)  # 4 reused epochs of 16 slots
    sur = ma.fit_moving_average(g)
    assert sur is not None and sur.order == 3 and sur.cut is not None
    A = sur.loadings
    b, w = A.shape[0], 3
    # the interior is the band's coefficients times sqrt(epochs): bsr's c = (1, 1/2, 3/8, 5/16)
    c = np.array([1.0, 0.5, 0.375, 0.3125])
    assert np.allclose(A[w:b - w], 2 * c, rtol=1e-8) and np.all(A >= 0)
    # the covariance rebuilt from the definition Y'_s = sum_j A[s, j] xi_{s+j}
    lin = np.zeros((b, b + w))
    for s in range(b):
        lin[s, s:s + w + 1] = A[s]
    cov = lin @ lin.T
    u, v = (np.array(x) for x in sur.cut)
    p = np.zeros(b)
    p[:w], p[b - w:] = v, -u
    rest = cov - g - np.outer(p, p)
    assert rest.min() >= -1e-12 * g.max()  # Lemma P: Cov' - G = p p^T (PSD) + a non-negative rest
    assert np.all(cov[b - w:, :w] == 0) and g[b - w:, :w].max() > 1.0  # the corners are the cut's
    # negative control: the same loadings without the cut leave the corners uncovered
    bare = ma.MovingAverageSurrogate(tuple(tuple(np.tile(2 * c * (1 + 1e-9), (b, 1))[s]) for s in range(b)))
    assert not ma._dominates(bare, g)


def test_the_corner_cover_covers_and_is_balanced():
    r = np.array([[0.9375, 0, 0], [1.594, 0.9375, 0], [2.414, 1.594, 0.9375]])
    u, v = ma._cover(r)
    assert np.all(np.outer(u, v) >= r)
    assert math.isclose(u @ u, v @ v, rel_tol=1e-6)
    # no smaller by a uniform shrink of either side
    assert not np.all(np.outer(u * 0.99, v) >= r)


@pytest.mark.parametrize("strategy, epochs", [(bsr(64, 5), 1), (Identity(32), 1), (bsr(32, 8), 2)])
def test_offered_only_for_bands_of_order_one_to_three(strategy, epochs):
    _, g = _gram(strategy, epochs)
    assert ma.fit_moving_average(g) is None


def _tables(sur, sigma, b):
    st, ca = ma.call_bound_table(sur, sigma, b * math.exp(1.2), 1e-3)
    ps, pu = ma.put_bound_table(sur, sigma, b * 1.0001, 1e-3)
    return st, ca, ps, pu


@pytest.mark.parametrize("rows", [
    ((1.0, 0.6), (0.9, 0.5), (1.1, 0.7)),  # MA(1), position-dependent loadings
    ((1.0, 0.5, 0.4), (1.0, 0.5, 0.4), (0.8, 0.6, 0.3)),  # MA(2)
], ids=["ma1", "ma2"])
def test_program_bounds_its_surrogate_by_exact_integration(rows):
    sur = ma.MovingAverageSurrogate(rows)
    cov = sur.covariance()
    b, sigma = 3, 1.1
    st, ca, ps, pu = _tables(sur, sigma, b)
    for eps in (0.1, 0.5, 1.0):
        rem = _interp_call(st, ca, b * math.exp(eps), b) / b
        add = math.exp(eps) * _interp_put(ps, pu, b / math.exp(eps)) / b
        hi, lo = _exact_deltas(cov, sigma, eps), _exact_deltas_low(cov, sigma, eps)
        assert rem >= lo[0] and add >= lo[1]  # never below the surrogate's own pair
        assert rem <= 1.05 * hi[0] + 1e-9 and add <= 1.05 * hi[1] + 1e-9  # and close to it
        # negative control: the exact pair of a surrogate with 0.8x the loadings is below the program
        small = ma.MovingAverageSurrogate(tuple(tuple(0.8 * x for x in r) for r in rows)).covariance()
        assert _exact_deltas(small, sigma, eps)[0] < lo[0]


@pytest.mark.parametrize("strategy, epochs, sigma", [(bsr(64, 4), 2, 2.0), (ToeplitzStrategy([1.0, 0.8, 0.6], 32), 1, 1.5)],
                         ids=["bsr-2-epochs", "toeplitz"])
def test_member_bounds_the_exact_pair_by_monte_carlo(strategy, epochs, sigma):
    delta = 1e-3
    means, g = _gram(strategy, epochs)
    b = means.shape[0]
    sur = ma.fit_moving_average(g)
    eps = markov_epsilon(sur, sigma, b, delta, 3.0)["epsilon"]
    point, lower = _mc_epsilon_interval(means, sigma, delta, 200_000, seed=5)
    assert lower <= eps <= 1.08 * point
    # negative control: the same program with the loadings scaled by 0.8 is caught below the pair
    small = ma.MovingAverageSurrogate(tuple(tuple(0.8 * x for x in r) for r in sur.rows), sur.cut)
    assert markov_epsilon(small, sigma, b, delta, 3.0)["epsilon"] < lower


def test_surrogates_compare_equal_by_value_for_the_accountants_memo():
    _, g = _gram(bsr(32, 4), 2)
    one, two = ma.fit_moving_average(g), ma.fit_moving_average(g.copy())
    assert one == two and hash(one) == hash(two) and one is not two


def test_accountant_offers_it_first_and_takes_it_where_it_is_tighter():
    strategy, scheme, sigma, delta = bsr(32, 4), BallsInBinsSampling(2, 32), 2.0, 1e-3
    report = dpmf.account(strategy, scheme, sigma, delta, method="allocation_pld")
    rows = report.diagnostics["reductions"]
    band = [r for r in rows if r["bound"].startswith("moving average")]
    assert len(band) == 1 and "ring cut" in band[0]["bound"]
    others = [r["epsilon"] for r in rows if not r["bound"].startswith("moving average") and r.get("epsilon") is not None]
    assert report.epsilon == band[0]["epsilon"] <= min(others) and report.certified


@pytest.mark.parametrize("strategy, epochs", [(bsr(32, 4), 2), (ToeplitzStrategy([1.0, 0.8, 0.6], 12), 3)],
                         ids=["bsr-2x16", "toeplitz-3x4-no-interior"])
def test_fresh_epochs_raised_ends_go_into_the_boundary_blocks(strategy, epochs):
    from dpmf.accounting.allocation.fresh_correlated import epoch_grams

    grams = epoch_grams(mixture_means(strategy, 1, strategy.n), epochs)
    sur = ma.fit_moving_average(grams)
    assert sur is not None and sur.cut is None
    cov = sur.covariance()
    for g in grams:  # Lemma K: entrywise above every epoch's Gram (step 1's raised diagonal included)
        assert np.all(cov >= g * (1 - 1e-12))
    w, b = sur.order, len(sur.rows)
    raised = np.diag(np.maximum.reduce(grams)) - np.diag(grams[0] if epochs == 1 else np.minimum.reduce(grams))
    assert raised[:w].max() > 0.1 or raised[b - w:].max() > 0.1
    if b > 2 * w:  # the interior keeps the stationary variance; only the blocks pay the raised ends
        assert np.allclose(cov.diagonal()[w:b - w], cov.diagonal()[w:b - w].min())
        assert cov.diagonal().max() > 1.1 * cov.diagonal()[w:b - w].min()
    # negative control: the stationary rows alone (no boundary blocks) miss the raised diagonal
    a = np.array(sur.rows[b // 2])
    bare = ma.MovingAverageSurrogate(tuple(tuple(a) for _ in range(b)))
    assert not ma._dominates(bare, np.maximum.reduce(grams))


def test_fresh_slots_take_it_where_tighter_and_stay_above_the_exact_pair():
    from test_allocation_fresh_correlated import _pattern_means

    strategy, k, sigma, delta = bsr(16, 4), 2, 2.0, 1e-5
    report = dpmf.account(strategy, BallsInBinsSampling(k, 16, fresh_slots=True), sigma, delta, method="allocation_pld")
    rows = report.diagnostics["reductions"]
    band = [r for r in rows if r["bound"].startswith("moving average")]
    chains = [r["epsilon_by_direction"]["remove"] for r in rows if r["bound"].startswith("Markov")]
    assert band and band[0]["epsilon_by_direction"]["remove"] < min(chains)  # (measured: 2.407 vs 2.474)
    assert "moving average" in report.diagnostics["bound"]
    _, lower = _mc_epsilon_interval(_pattern_means(strategy, k, 16), sigma, delta, 300_000, seed=3)
    assert report.epsilon >= lower
