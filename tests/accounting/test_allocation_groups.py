"""The orthogonal-groups bound of ``allocation_pld`` for non-identity strategies under random allocation.

Oracles: the group structure against a brute-force check of the means' supports; the Toeplitz
shortcut against the generic path; soundness against a Monte Carlo estimate of the *exact* delta
of the dominating pair (Lemma 2.8) at the reported epsilon, with a negative control (the same
accountant with the correlation ignored must fail the check, so the check has power).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import dpmf
from dpmf.accounting.allocation.dominating_pair import mixture_means
from dpmf.accounting.allocation.pld import (
    allocation_pld_epsilon,
    orthogonal_groups,
    strategy_groups,
    toeplitz_orthogonal_groups,
)
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import Identity, ToeplitzStrategy, bsr


def _brute_period(means: np.ndarray) -> int:
    b = means.shape[0]
    supp = means > 0
    for p in range(1, b + 1):
        if all(not np.any(supp[i] & supp[j]) for i in range(b) for j in range(i + 1, b) if (j - i) % p == 0):
            return p
    raise AssertionError("unreachable: p = b has no pairs")


CASES = [
    (bsr(24, 2), 1, 24),
    (bsr(24, 3), 2, 24),
    (bsr(30, 4), 3, 30),
    (bsr(20, 3), 2, 20),  # b = 10: 3 does not divide it, the wrap-around decides
    (ToeplitzStrategy([1.0, 0.0, 0.5], 18), 1, 18),  # a gap in the band
    (ToeplitzStrategy([1.0], 12), 3, 12),
    (ToeplitzStrategy(1.0 / np.sqrt(np.arange(1, 17)), 16), 1, 16),  # dense C: no two slots orthogonal
]


@pytest.mark.parametrize("strategy, epochs, steps", CASES)
def test_groups_match_brute_force_and_the_toeplitz_shortcut(strategy, epochs, steps):
    scheme = BallsInBinsSampling(epochs, steps)
    means = mixture_means(strategy, epochs, steps)
    generic = orthogonal_groups(means)
    assert generic.period == _brute_period(means)
    assert generic.slots == means.shape[0] // generic.period
    assert generic.max_norm_sq >= float((means * means).sum(axis=1).max())
    spans = orthogonal_groups(means, exact=False)  # (the cheap path for large b^2 N: never optimistic)
    assert spans.period >= generic.period and spans.max_norm_sq == generic.max_norm_sq
    if epochs == 1 and np.all(np.asarray(strategy.coefs) > 0):  # contiguous band, one epoch: spans are exact
        assert spans.period == generic.period
    fast = strategy_groups(strategy, scheme)
    assert (fast.period, fast.slots) == (generic.period, generic.slots)
    assert fast.max_norm_sq == pytest.approx(generic.max_norm_sq, rel=1e-12)


def test_the_identity_is_every_slot_alone():
    g = strategy_groups(Identity(12), BallsInBinsSampling(3, 12))
    assert (g.period, g.slots, g.max_norm_sq) == (1, 4, 3.0)


def test_supports_decide_not_float_products_that_underflow():
    # entries 1e-200: their products underflow to 0.0, but the supports overlap, so the slots are
    # dependent and must not be grouped
    m = 1e-200 * (np.eye(4) + np.eye(4, k=1))
    assert float(m[0] @ m[1]) == 0.0
    assert orthogonal_groups(m).period == 2
    h = np.zeros(8)
    h[:2] = [1e-200, 1e-200]
    assert toeplitz_orthogonal_groups(h, 8).period == 2


def test_the_identity_path_is_unchanged():
    # the identity keeps the exact pair (no groups computed, no means built)
    scheme = BallsInBinsSampling(2, 32)
    r = dpmf.account(Identity(32), scheme, 1.3, 1e-5, method="allocation_pld")
    assert r.epsilon == allocation_pld_epsilon(1.3, 16, 1e-5, epochs=2)["epsilon"]
    assert "orthogonal_groups" not in r.diagnostics


def _exact_delta_monte_carlo(means: np.ndarray, sigma: float, eps: float, n: int, seed: int):
    """Monte Carlo mean and standard error of both directions' delta(eps) of the exact pair
    P = (1/b) sum_i N(m_i, sigma^2 I), Q = N(0, sigma^2 I): remove E_Q[(S - e^eps)_+] estimated as
    E_P[(1 - e^eps / S)_+] (x ~ P: values in [0, 1]; under Q the integrand is heavy-tailed at small
    sigma, and its standard error at sigma 0.8 was 8% of delta), add E_Q[(1 - e^eps S)_+]."""
    rng = np.random.default_rng(seed)
    half = 0.5 * (means * means).sum(axis=1) / sigma**2

    def ratio(x):
        return np.exp(x @ means.T / sigma**2 - half).mean(axis=1)

    x = sigma * rng.standard_normal((n, means.shape[1]))
    S_q = ratio(x)
    S_p = ratio(x + means[rng.integers(0, means.shape[0], n)])
    out = []
    for v in (np.maximum(1.0 - math.exp(eps) / S_p, 0.0), np.maximum(1.0 - math.exp(eps) * S_q, 0.0)):
        out.append((float(v.mean()), float(v.std() / math.sqrt(n))))
    return out


@pytest.mark.parametrize(
    "coefs, t, sigma, control",
    [([1.0, 0.6], 4, 1.5, True), ([1.0, 1.0], 6, 1.0, True), ([1.0, 0.8], 8, 0.8, True), ([1.0, 0.5, 0.25], 9, 1.2, False)],
)
def test_sound_against_the_exact_pair(coefs, t, sigma, control):
    delta = 1e-2  # large enough for a precise Monte Carlo estimate of the exact delta
    strategy, scheme = ToeplitzStrategy(coefs, t), BallsInBinsSampling(1, t)
    report = dpmf.account(strategy, scheme, sigma, delta, method="allocation_pld")
    assert report.certified and "orthogonal_groups" in report.diagnostics
    means = mixture_means(strategy, 1, t)
    for mean, se in _exact_delta_monte_carlo(means, sigma, report.epsilon, 1_000_000, seed=7):
        assert mean + 5 * se <= delta  # the exact pair is (epsilon, delta)-DP at the reported epsilon
    if control:
        # negative control: treating the t dependent slots as independent (period 1) is optimistic,
        # and the same check catches it
        g = float((means * means).sum(axis=1).max())
        naive = allocation_pld_epsilon(sigma / math.sqrt(g), t, delta)["epsilon"]
        remove, _ = _exact_delta_monte_carlo(means, sigma, naive, 1_000_000, seed=8)
        assert remove[0] - 5 * remove[1] > delta


def test_auto_takes_the_tighter_of_the_groups_bound_and_the_renyi_program():
    strategy, scheme = bsr(64, 4), BallsInBinsSampling(1, 64)
    r = dpmf.account(strategy, scheme, 3.0, 1e-5)
    both = r.diagnostics["all_methods"]
    assert {"allocation_pld", "allocation"} <= set(both)
    assert r.epsilon == min(both.values())
