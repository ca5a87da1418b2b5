"""Monte Carlo for the balls-in-bins variants (num_selected = k slots per epoch, fresh slots each
epoch) with a correlated C (issue 23): the loss sampler against brute force, its law against a
direct simulation through the scheme's own sampler, and Monte Carlo checks of the proved bound for
these pairs (``allocation_pld``'s k-of-t bound) with a negative control.

The pair is ``P = E_x N(C x, sigma^2 I)`` against ``Q = N(0, sigma^2 I)``, ``x`` the target's pattern
(Dong & Ganesh 2026 Sec. 2.4): it holds for any sampler that draws the target's pattern
independently of the other examples, which both variants do.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

import dpmf
from dpmf.accounting.montecarlo._loss_bruteforce import allocation_patterns, log_mixture_ratio
from dpmf.accounting.montecarlo.losses import (
    MAX_MODES,
    describe_loss_sampler,
    log_likelihood_ratio,
    privacy_loss_samples,
)
from dpmf.errors import UnsupportedConfigurationError
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import ToeplitzStrategy

C = ToeplitzStrategy(np.array([1.0, 0.6, 0.3]), 8)
VARIANTS = [
    BallsInBinsSampling(2, 8, num_selected=2),
    BallsInBinsSampling(2, 8, fresh_slots=True),
    BallsInBinsSampling(2, 8, num_selected=2, fresh_slots=True),
]
IDS = ["k2-reused", "k1-fresh", "k2-fresh"]


@pytest.mark.parametrize("scheme", VARIANTS, ids=IDS)
def test_log_ratio_equals_brute_force(scheme):
    pats = allocation_patterns(scheme.epochs, scheme.steps_per_epoch, scheme.num_selected, scheme.fresh_slots)
    assert describe_loss_sampler(C, scheme)["exact"]
    rng = np.random.default_rng(1)
    dense = C.encoder()
    for sigma in (0.7, 2.0):
        for _ in range(5):
            y = rng.normal(size=8) * 2
            want = log_mixture_ratio(dense, pats, sigma, y)
            assert log_likelihood_ratio(C, scheme, sigma, y) == pytest.approx(want, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("backend", ["numpy", "compiled"])
@pytest.mark.parametrize("scheme", VARIANTS, ids=IDS)
def test_losses_have_the_law_of_a_direct_simulation(scheme, backend):
    """Two-sample KS: the sampler's losses against losses of outputs built from the scheme's own
    slot draws (:meth:`BallsInBinsSampling.slots`) plus noise, at a fixed seed (p > 1e-4)."""
    S, sigma = 4000, 1.0
    rng = np.random.default_rng(7)
    X = np.zeros((S, 8))
    b = scheme.steps_per_epoch
    for e, slot in enumerate(scheme.slots(S, rng)):
        for c in range(slot.shape[1]):
            X[np.arange(S), e * b + slot[:, c]] = 1.0
    y = C.encoder() @ X.T + sigma * rng.standard_normal((8, S))
    direct = log_likelihood_ratio(C, scheme, sigma, y)
    sampled = privacy_loss_samples(C, scheme, sigma, S, np.random.default_rng(3), backend=backend)
    assert stats.ks_2samp(sampled, direct).pvalue > 1e-4
    if scheme.num_selected == 1:
        return  # (fresh vs reused single slot: laws too close at this size for a control)
    # the law of the reused single slot is a different one, and the test sees it
    one_slot = privacy_loss_samples(C, BallsInBinsSampling(2, 8), sigma, S, np.random.default_rng(3), backend=backend)
    assert stats.ks_2samp(one_slot, direct).pvalue < 1e-6


def test_too_many_patterns_are_refused():
    s = BallsInBinsSampling(4, 64, fresh_slots=True)  # 16^4 = 65536 patterns
    with pytest.raises(UnsupportedConfigurationError, match=rf"6.55e\+04 patterns > {MAX_MODES}"):
        describe_loss_sampler(ToeplitzStrategy(np.array([1.0, 0.5]), 64), s)


def _delta_interval(L: np.ndarray, eps: float, alpha: float = 1e-6) -> tuple[float, float]:
    """Empirical-Bernstein interval (Maurer & Pontil 2009) for ``delta(eps) = E[(1 - e^{eps - L})_+]``,
    each side at level ``alpha``."""
    v = np.maximum(0.0, -np.expm1(eps - L))
    S = v.size
    half = math.sqrt(2 * v.var(ddof=1) * math.log(2 / alpha) / S) + 7 * math.log(2 / alpha) / (3 * (S - 1))
    return v.mean() - half, v.mean() + half


@pytest.mark.parametrize("scheme", [VARIANTS[0], VARIANTS[2]], ids=["k2-reused", "k2-fresh"])
def test_monte_carlo_check_of_the_bound_with_a_negative_control(scheme):
    """``auto`` gives ``allocation_pld``'s k-of-t bound for these pairs (``k_of_t_correlated.py``; the
    unamplified one before it); the Monte Carlo delta of the exact pair at its epsilon is below the
    claimed delta. The negative control -- accounting the k = 2 scheme as one reused slot (the
    Renyi/conditional allocation bound of ``BallsInBinsSampling(2, 8)``) -- is caught: the exact
    pair's delta at that epsilon is far above the claim, in both directions."""
    sigma, delta = 2.0, 1e-2
    sound = dpmf.account(C, scheme, sigma, delta)
    assert sound.method == "allocation_pld"
    assert sound.epsilon < dpmf.account(C, scheme, sigma, delta, method="unamplified").epsilon
    wrong = dpmf.account(C, BallsInBinsSampling(2, 8), sigma, delta, method="allocation")
    assert wrong.epsilon < sound.epsilon
    for direction in ("remove", "add"):
        L = privacy_loss_samples(C, scheme, sigma, 20000, np.random.default_rng(11), direction=direction)
        assert _delta_interval(L, sound.epsilon)[0] <= delta
        assert _delta_interval(L, wrong.epsilon)[0] > 3 * delta
