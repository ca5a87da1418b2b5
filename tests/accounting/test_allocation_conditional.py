"""Random allocation, conditional composition (Alg. 4, §3.5-§3.7 of the digest) and soundness of
both accountants against Monte Carlo estimates of the exact dominating pair's epsilon."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from dpmf.accounting.allocation import account_allocation, mixture_means
from dpmf.accounting.allocation.conditional import (
    _prefix_labels,
    conditional_epsilon,
    reverse_hazard_bounds,
    step_weights,
)
from dpmf.privacy.gdp import gaussian_epsilon
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import Identity, ToeplitzStrategy, bisr, bsr


def _sorted_step(M, n):
    """Prefix Gram, labels and order of step n (0-based), as conditional_epsilon builds them."""
    b = M.shape[0]
    labels = np.zeros(b, dtype=np.int64)
    for j in range(n):
        labels = _prefix_labels(labels, M[:, j])
    H = M[:, :n] @ M[:, :n].T
    order = np.lexsort((labels, M[:, n]))
    return H[np.ix_(order, order)], labels[order], order


# ----------------------------------------------------------------------------- O6 / T14
def test_o6_reverse_hazard_dpsgd():
    b = 100
    M = mixture_means(Identity(b), 1, b)
    beta = (1e-5 / 2) / (b * (b - 1))  # 5.05e-10
    H, lab, _ = _sorted_step(M, 1)  # step n = 2 in the paper's 1-based count
    lam = reverse_hazard_bounds(H, lab, 2.0, beta, "add")
    # exact-offset form: 0.01010 (true posterior <= 1/(b - 1) = 0.010101...)
    assert lam[-1] == pytest.approx(0.01010, abs=5e-6)
    # psi uniform over *all* predecessors (no identity information, no Option 3): 0.01032
    lam_u = reverse_hazard_bounds(H, np.arange(b), 2.0, beta, "add", temperatures=())
    assert lam_u[-1] == pytest.approx(0.01032, abs=5e-6)


def test_first_step_is_uniform_and_weights_telescope():
    lam = np.concatenate([[1.0], 1.0 / (2.0 + np.arange(9))])
    np.testing.assert_allclose(step_weights(lam), np.full(10, 0.1), rtol=1e-14)
    rng = np.random.default_rng(0)
    lam = np.concatenate([[1.0], rng.uniform(0, 1, 7)])
    p = step_weights(lam)
    assert p.sum() == pytest.approx(1.0, abs=1e-14)
    # reverse hazards of p are lam: p_i / sum_{j <= i} p_j
    np.testing.assert_allclose(p / np.cumsum(p), lam, rtol=1e-12)


# ----------------------------------------------------------------------------- tail bounds by MC
def _exact_L(y, mu, i, ident_excluded=False):
    """L_i(y) = log((1/i) sum_{j<i} N(y; mu_j) / N(y; mu_i)), sigma = 1 units handled by caller."""
    d = -0.5 * ((y[:, None, :] - mu[None, :i, :]) ** 2).sum(-1)
    di = -0.5 * ((y - mu[i]) ** 2).sum(-1)
    return special.logsumexp(d, axis=1) - math.log(i) - di


@pytest.mark.parametrize("direction", ["add", "remove"])
def test_tail_bounds_hold_by_monte_carlo(direction):
    # BSR, k = 2 epochs, b = 6 steps per epoch, at step 8 (second epoch); beta large so that the
    # frequency Pr[L_i < tau_i] is measurable. sigma = 1.
    M = mixture_means(bsr(12, 3), 2, 12)
    b, n, sigma, beta = 6, 8, 1.0, 0.05
    H, lab, order = _sorted_step(M, n)
    lam = reverse_hazard_bounds(H, lab, sigma, beta, direction)
    mu = M[order][:, :n] / sigma
    rng = np.random.default_rng(11)
    draws = 200_000
    if direction == "add":
        y = rng.standard_normal((draws, n))
    else:  # the full mixture over all b components (T12)
        y = mu[rng.integers(0, b, draws)] + rng.standard_normal((draws, n))
    for i in range(1, b):
        tau = math.log(1 / lam[i] - 1) - math.log(i)  # invert lam = 1 / (1 + i e^tau)
        L = _exact_L(y, mu, i)
        freq = np.mean(L < tau - 1e-9)
        assert freq <= beta + 4 * math.sqrt(beta / draws), (i, freq)


# ----------------------------------------------------------------------------- reductions
def test_no_subsampling_is_the_gaussian_mechanism():
    # b = 1: every step a single Gaussian; the composition is N(||m||, sigma^2) vs N(0, sigma^2)
    strat, scheme = bsr(6, 2), BallsInBinsSampling(6, 6)
    M = mixture_means(strat, 6, 6)
    sens = float(np.linalg.norm(M[0]))
    exact = gaussian_epsilon(2.0, 1e-6, sens)
    c = conditional_epsilon(M, 2.0, 2e-6, delta_e=1e-6, discretization=1e-4)
    assert exact <= c["epsilon"] <= exact + 2e-3
    r = account_allocation(strat, scheme, 2.0, 1e-6, which="renyi")
    assert r.epsilon >= exact


# ----------------------------------------------------------------------------- soundness vs MC
def _mc_epsilon_lower(M, sigma, delta, direction, draws, seed, z=4.0):
    """Lower confidence limit of the exact dominating pair's epsilon at ``delta``.

    With f(eps) = (1 - exp(eps - L))_+ per draw, delta_hat(eps) - z SE <= delta(eps) w.h.p., so
    epsilon(delta) >= the eps where that lower limit crosses delta.
    """
    rng = np.random.default_rng(seed)
    b, N = M.shape
    mu = M / sigma
    if direction == "remove":
        y = mu[rng.integers(0, b, draws)] + rng.standard_normal((draws, N))
    else:
        y = rng.standard_normal((draws, N))
    L = special.logsumexp(y @ mu.T - 0.5 * (mu**2).sum(1), axis=1) - math.log(b)
    if direction == "add":
        L = -L

    def lower(eps):
        f = -np.expm1(np.minimum(eps - L, 0.0))
        return f.mean() - z * f.std() / math.sqrt(draws)

    lo, hi = 0.0, 50.0
    if lower(0.0) <= delta:
        return 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if lower(mid) > delta else (lo, mid)
    return lo


CASES_FAST = [
    (bsr(6, 2), BallsInBinsSampling(2, 6), 0.8, 1e-2),
    (Identity(4), BallsInBinsSampling(1, 4), 0.7, 1e-2),
]


@pytest.mark.parametrize("strategy, scheme, sigma, delta", CASES_FAST)
def test_sound_against_monte_carlo_fast(strategy, scheme, sigma, delta):
    M = mixture_means(strategy, scheme.epochs, scheme.steps)
    rep = account_allocation(strategy, scheme, sigma, delta)
    for which in ("renyi", "conditional"):
        key = rep.diagnostics[which]["epsilon_by_direction"]
        for direction in ("remove", "add"):
            mc = _mc_epsilon_lower(M, sigma, delta, direction, 200_000, seed=3)
            assert key[direction] >= mc, (which, direction, key[direction], mc)


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy, scheme, sigma, delta",
    [
        (bsr(20, 3), BallsInBinsSampling(2, 20), 1.0, 1e-3),
        (bisr(20, 3), BallsInBinsSampling(2, 20), 1.0, 1e-3),
        (Identity(10), BallsInBinsSampling(1, 10), 0.6, 1e-3),
        (ToeplitzStrategy(np.array([1.0, 0.6, 0.3]), 12), BallsInBinsSampling(3, 12), 1.5, 1e-3),
    ],
)
def test_sound_against_monte_carlo_slow(strategy, scheme, sigma, delta):
    M = mixture_means(strategy, scheme.epochs, scheme.steps)
    rep = account_allocation(strategy, scheme, sigma, delta)
    for which in ("renyi", "conditional"):
        key = rep.diagnostics[which]["epsilon_by_direction"]
        for direction in ("remove", "add"):
            mc = _mc_epsilon_lower(M, sigma, delta, direction, 2_000_000, seed=5)
            assert key[direction] >= mc, (which, direction, key[direction], mc)


def test_conditional_monotone_in_sigma_and_delta_e_budget():
    M = mixture_means(bsr(20, 2), 2, 20)
    out = conditional_epsilon(M, 1.0, 1e-5)
    assert out["epsilon"] > conditional_epsilon(M, 2.0, 1e-5)["epsilon"]
    assert out["delta_e"] == 5e-6 and out["beta"] == pytest.approx(5e-6 / (19 * 9))



def test_remove_tail_bound_with_rounded_up_xi_holds_for_every_smaller_xi():
    # the caller rounds xi up; that is safe only because tau stays below every component mean
    from scipy import special

    from dpmf.accounting.allocation.conditional import _tau_remove

    for nu, beta in (([-3.0, 0.0, 4.0], 0.05), ([-2.0, 0.0, 0.0], 0.35), ([1.0, 1.5, 9.0], 1e-6)):
        nu_k = np.array([nu])
        mult = np.ones(3)
        tau = _tau_remove(nu_k, mult, np.array([1.0]), beta, 3)[0]
        assert tau <= min(nu)
        for xi in np.linspace(0.5, 1.0, 26):
            lhs = (special.ndtr((tau - nu_k[0]) / xi) * mult).sum() / 3
            assert lhs <= beta * (1 + 1e-9), (nu, xi)
