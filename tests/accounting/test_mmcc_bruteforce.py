"""MMCC soundness against the exact privacy curve of tiny matrix mechanisms (brute force).

For ``C`` with ``n <= 3`` columns and Poisson sampling ``q``, the example's worst-case input
(x = 1 in every step, others 0; paper Thm 4.3 step 1) gives the pair

    P = sum_{x in {0,1}^n} q^|x| (1-q)^(n-|x|) N(C x, sigma^2 I),    Q = N(0, sigma^2 I),

enumerating all 2^n participation patterns. In whitened coordinates ``u = y / sigma`` both
hockey-stick divergences are integrals against the standard normal density ``phi``:

    remove (P = with):  delta(eps) = int phi(u) (L(u) - e^eps)_+ du,
    add    (P = without): delta(eps) = int phi(u) (1 - e^eps L(u))_+ du,
    L(u) = sum_x w_x exp(<m_x, u> - |m_x|^2 / 2),  m_x = C x / sigma.

We integrate with the composite midpoint rule on a box that leaves out < 1e-15 of the mass of
every component (``phi(u - m_x)`` bounds the integrand), at steps ``h`` and ``2h``: the rule is
second order (the integrand is Lipschitz with a kink where ``L = e^eps``), so ``|I_h - I_2h|``
estimates the error of ``I_h`` (conservatively). The integrator is validated on ``C = I`` against
the DP-SGD PLD (a tight pessimistic bound). Soundness check: the exact delta at MMCC's epsilon
minus its quadrature error estimate (asserted <= 2e-5 relative) must not exceed MMCC's delta.
Accounting for the quadrature error is needed: when no tail bound is used (diagonal ``C``) MMCC
*is* the exact composition of subsampled Gaussians and its delta agrees with the exact one to ~1e-11 relative.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dpmf.accounting.dpsgd import dpsgd_epsilon_by_direction
from dpmf.accounting.mmcc import account_mmcc
from dpmf.privacy.gaussian_plds import subsampled_gaussian
from dpmf.sampling import PoissonSampling


def _components(C: np.ndarray, q: float, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    n = C.shape[1]
    means, weights = [], []
    for x in itertools.product((0, 1), repeat=n):
        x = np.array(x, dtype=float)
        means.append(C @ x / sigma)
        weights.append(q ** x.sum() * (1 - q) ** (n - x.sum()))
    return np.array(means), np.array(weights)


def _integrate(C, q, sigma, eps, h, chunk=1 << 20):
    means, weights = _components(C, q, sigma)
    d = means.shape[1]
    lo, hi = means.min(axis=0) - 8.5, means.max(axis=0) + 8.5  # phi tails beyond: < 1e-16 each
    axes = [np.arange(lo[k] + h / 2, hi[k], h) for k in range(d)]
    a = np.log(weights) - 0.5 * np.sum(means**2, axis=1)
    total_r = total_a = 0.0
    grids = np.meshgrid(*axes, indexing="ij")
    pts = np.stack([g.ravel() for g in grids], axis=1)
    for s in range(0, pts.shape[0], chunk):
        u = pts[s : s + chunk]
        logphi = -0.5 * np.sum(u * u, axis=1) - 0.5 * d * math.log(2 * math.pi)
        z = u @ means.T + a
        zmax = z.max(axis=1)
        logL = zmax + np.log(np.exp(z - zmax[:, None]).sum(axis=1))
        phi = np.exp(logphi)
        total_r += float(np.sum(phi * np.maximum(np.exp(logL) - math.exp(eps), 0.0)))
        total_a += float(np.sum(phi * np.maximum(1.0 - np.exp(eps + logL), 0.0)))
    vol = h**d
    return total_r * vol, total_a * vol


def exact_delta(C, q, sigma, eps, h):
    """Upper estimate of the exact delta (both directions) with its quadrature error."""
    fine = _integrate(C, q, sigma, eps, h)
    coarse = _integrate(C, q, sigma, eps, 2 * h)
    err = [abs(f - c) for f, c in zip(fine, coarse)]
    trunc = 2 * C.shape[0] * 1e-16
    upper = max(f + e + trunc for f, e in zip(fine, err))
    return upper, max(err), fine


def assert_sound(C, q, sigma, delta, epsilon, h):
    _, err, fine = exact_delta(C, q, sigma, epsilon, h)
    assert err <= 2e-5 * delta, f"quadrature error {err} too large for the check"
    print(f"exact delta at MMCC epsilon {epsilon:.5f}: {max(fine):.6e} (+- {err:.1e}), MMCC delta {delta:g}")
    # fails whenever the exact delta is above MMCC's by more than the quadrature error
    assert max(fine) - err <= delta, f"exact delta {max(fine)} at MMCC epsilon {epsilon} exceeds {delta}"
    return max(fine)


def exact_epsilon(C, q, sigma, delta, h, hi=20.0):
    """Bisection for the exact epsilon at delta (central estimate, for reporting the gap)."""
    lo = 0.0
    for _ in range(24):
        mid = 0.5 * (lo + hi)
        if max(_integrate(C, q, sigma, mid, h)) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def test_integrator_reproduces_dpsgd_for_identity():
    C, q, sigma, eps = np.eye(2), 0.3, 0.8, 1.0
    _, err, (rem, add) = exact_delta(C, q, sigma, eps, 0.01)
    pld = subsampled_gaussian(sigma, q).self_compose(2)
    by_dir = pld.delta_by_direction(eps)
    # the PLD is a pessimistic, tight bound: above the exact value and within its grid error
    assert by_dir["remove"] >= rem - 3 * err
    assert by_dir["remove"] == pytest.approx(rem, rel=2e-3)
    assert by_dir["add"] == pytest.approx(add, rel=2e-3, abs=1e-9)
    assert err < 1e-6


def _random_lower(rng, n, density=1.0):
    C = np.tril(0.1 + rng.random((n, n))) * (rng.random((n, n)) < density)
    np.fill_diagonal(C, 0.3 + rng.random(n))
    return C


@pytest.mark.parametrize("seed,q,sigma", [(0, 0.2, 0.7), (1, 0.5, 1.5), (2, 0.05, 0.5)])
def test_mmcc_is_sound_n2(seed, q, sigma):
    rng = np.random.default_rng(seed)
    C = _random_lower(rng, 2)
    delta = 1e-4
    rep = account_mmcc(C, PoissonSampling(q, 2), sigma, delta, heuristic=False)
    assert rep.diagnostics["delta1"] > 0  # a real tail bound is exercised
    assert_sound(C, q, sigma, delta, rep.epsilon, 0.02)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3, 9))
def test_mmcc_is_sound_n2_more(seed):
    rng = np.random.default_rng(seed)
    C = _random_lower(rng, 2, density=0.7)
    q, sigma, delta = float(rng.choice([0.1, 0.3, 0.7])), float(rng.choice([0.5, 1.0, 3.0])), 1e-4
    rep = account_mmcc(C, PoissonSampling(q, 2), sigma, delta, heuristic=False)
    assert_sound(C, q, sigma, delta, rep.epsilon, 0.01)


def test_mmcc_gap_is_reported_and_moderate_n2():
    # tightness the other way: MMCC is not absurdly loose on a mild case (gap printed with -s)
    C = np.array([[1.0, 0.0], [0.5, 1.0]])
    q, sigma, delta = 0.3, 2.0, 1e-4
    rep = account_mmcc(C, PoissonSampling(q, 2), sigma, delta, heuristic=True)
    exact = exact_epsilon(C, q, sigma, delta, 0.05, hi=4.0)
    print(f"n=2 MMCC {rep.epsilon:.4f} exact {exact:.4f} heuristic "
          f"{rep.diagnostics['independent_rows_heuristic_epsilon']:.4f}")
    assert exact <= rep.epsilon <= 1.5 * exact


@pytest.mark.slow
@pytest.mark.parametrize("seed,q,sigma", [(0, 0.3, 1.0), (1, 0.1, 0.6), (2, 0.5, 2.0)])
def test_mmcc_is_sound_n3(seed, q, sigma):
    rng = np.random.default_rng(10 + seed)
    C = _random_lower(rng, 3)
    delta = 1e-4
    rep = account_mmcc(C, PoissonSampling(q, 3), sigma, delta, heuristic=False)
    assert_sound(C, q, sigma, delta, rep.epsilon, 0.08)


@pytest.mark.slow
def test_mmcc_identity_matches_dpsgd_and_exact_n2():
    q, sigma, delta = 0.3, 0.8, 1e-4
    rep = account_mmcc(np.eye(2), PoissonSampling(q, 2), sigma, delta)
    assert rep.epsilon_by_direction == dpsgd_epsilon_by_direction(sigma, q, 2, delta)
    # tight case: MMCC is the exact composition, so the exact delta equals delta to ~1e-8
    _, err, fine = exact_delta(np.eye(2), q, sigma, rep.epsilon, 0.01)
    assert max(fine) == pytest.approx(delta, rel=1e-5)
    assert err <= 1e-5 * delta
