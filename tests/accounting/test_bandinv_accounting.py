"""dpmf.account for a BandInvMF strategy (C^{-1} banded, C dense) under every scheme an accountant
covers: unamplified (against the Gaussian mechanism with a brute-force sensitivity), random
allocation (Renyi, conditional composition, orthogonal groups), MMCC, Monte Carlo (an estimate;
certified through calibration in the slow test), and the refusals for a C with negative entries."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import dpmf
from dpmf.errors import UnsupportedConfigurationError
from dpmf.privacy.gdp import gaussian_epsilon
from dpmf.sampling import BallsInBinsSampling, FixedOrderSampling, PoissonSampling
from dpmf.strategies.bandinv import BandInvStrategy, optimize_banded_inverse_toeplitz

N, K = 8, 2
S = optimize_banded_inverse_toeplitz(N, 2, K, nonnegative=True)
NEG = BandInvStrategy.from_noising_coefficients([1.0, 0.5], N)  # C = 1 / (1 + x/2): alternating signs
SIGMA, DELTA = 1.5, 1e-5
FAST_RENYI = {"which": "renyi", "orders": list(range(2, 13)), "bandwidth": 2}


def _brute_force_sens2(C: np.ndarray, k: int, b: int) -> float:
    """max over all b-min-sep patterns of 1^T X_pp 1 (exact for C >= 0, Eq. 3)."""
    X = C.T @ C
    n = C.shape[1]
    best = 0.0
    for size in range(1, k + 1):
        for p in itertools.combinations(range(n), size):
            if all(q - r >= b for r, q in zip(p, p[1:])):
                best = max(best, float(X[np.ix_(p, p)].sum()))
    return best


def test_the_strategy_is_non_negative_and_its_inverse_banded():
    assert S.nonnegative and S.bands == 2 and np.all(S.inverse_coefs[1:] <= 0)
    assert not NEG.nonnegative


def test_unamplified_is_the_gaussian_mechanism_with_the_brute_force_sensitivity():
    r = dpmf.account(S, FixedOrderSampling(K, N), SIGMA, DELTA)
    assert r.method == "unamplified" and r.certified
    sens = math.sqrt(_brute_force_sens2(S.encoder(), K, N // K))
    assert r.epsilon == pytest.approx(gaussian_epsilon(SIGMA, DELTA, sens), rel=1e-9)
    assert r.epsilon >= gaussian_epsilon(SIGMA, DELTA, sens) * (1 - 1e-12)  # never below: sound rounding


def test_random_allocation_accountants_certify_and_amplify():
    scheme = BallsInBinsSampling(K, N)
    unamp = dpmf.account(S, scheme, SIGMA, DELTA, method="unamplified").epsilon
    renyi = dpmf.account(S, scheme, SIGMA, DELTA, method="allocation", **FAST_RENYI)
    cond = dpmf.account(S, scheme, SIGMA, DELTA, method="allocation", which="conditional")
    groups = dpmf.account(S, scheme, SIGMA, DELTA, method="allocation_pld")
    for r in (renyi, cond, groups):
        assert r.certified and math.isfinite(r.epsilon) and r.strategy["name"] == "band-inv"
    assert groups.epsilon <= unamp * (1 + 1e-9)  # the orthogonal-groups bound is never worse than no credit
    assert renyi.epsilon < 0.9 * unamp  # and the Renyi program really amplifies at this noise


def test_mmcc_certifies_under_poisson_sampling():
    scheme = PoissonSampling(0.1, N)
    r = dpmf.account(S, scheme, 3.0, DELTA, method="mmcc", heuristic=False, discretization=1e-2)
    assert r.certified and r.method == "mmcc"
    assert r.epsilon < dpmf.account(S, scheme, 3.0, DELTA, method="unamplified").epsilon


def test_monte_carlo_is_an_estimate_labelled_as_such():
    r = dpmf.account(S, BallsInBinsSampling(K, N), SIGMA, 1e-3, method="montecarlo", num_samples=20_000, seed=1)
    assert r.method == "montecarlo" and not r.certified and math.isfinite(r.epsilon)


@pytest.mark.parametrize(
    "scheme,method",
    [
        (PoissonSampling(0.1, N), "mmcc"),
        (BallsInBinsSampling(K, N), "allocation"),
        (BallsInBinsSampling(K, N), "allocation_pld"),
        (BallsInBinsSampling(K, N), "montecarlo"),
    ],
)
def test_amplification_refuses_a_C_with_negative_entries(scheme, method):
    with pytest.raises(UnsupportedConfigurationError, match="non-negative"):
        dpmf.account(NEG, scheme, SIGMA, DELTA, method=method)


def test_auto_falls_back_to_the_unamplified_bound_for_a_negative_C():
    r = dpmf.account(NEG, PoissonSampling(0.1, N), SIGMA, DELTA)
    assert r.method == "unamplified" and r.certified


@pytest.mark.slow
def test_monte_carlo_calibration_certifies():
    c = dpmf.calibrate(S, BallsInBinsSampling(K, N), 4.0, 1e-3, method="montecarlo", seed=3, num_candidates=4)
    assert c.report.certified and c.report.epsilon <= 4.0
    # its noise is at most the proved accountants' (the fallback it would release otherwise)
    assert c.noise_multiplier <= c.report.diagnostics["fallback_noise_multiplier"]
