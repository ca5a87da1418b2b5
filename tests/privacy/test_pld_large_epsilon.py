"""Epsilon of a PLD whose epsilon is above ~700 (``e^{-loss}`` underflows; issue 50 item 2): the PMF's own
epsilon, checked against 40-digit arithmetic, never below it and below dp_accounting's quantile."""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest

from dpmf.privacy import dp_pld
from dpmf.privacy.pld import PrivacyLossDistribution


def _delta_exact(losses: np.ndarray, probs: np.ndarray, inf: float, eps: float) -> mp.mpf:
    """``delta(eps) = inf + sum_{L > eps} p (1 - e^{eps - L})`` in 40 digits."""
    with mp.workdps(40):
        e = mp.mpf(eps)
        out = mp.mpf(inf)
        for loss, p in zip(losses, probs):
            if loss > eps:
                out += mp.mpf(float(p)) * (1 - mp.e ** (e - mp.mpf(float(loss))))
        return out


@pytest.mark.parametrize("center, scale, disc, delta", [
    (3000.0, 2.0, 1e-3, 1e-6),
    (800.0, 0.5, 1e-4, 1e-8),
    (20000.0, 40.0, 0.05, 1e-5),
])
def test_epsilon_above_the_underflow_is_the_pmfs_own(center, scale, disc, delta):
    lower = int(round((center - 12 * scale) / disc))
    idx = np.arange(lower, int(round((center + 12 * scale) / disc)) + 1)
    losses = idx * disc
    probs = np.exp(-0.5 * ((losses - center) / scale) ** 2)
    probs /= probs.sum()
    inf = 1e-14
    pmf = dp_pld.make_dense(lower, probs, inf, disc)
    eps = PrivacyLossDistribution(pmf, pmf).epsilon(delta)
    assert _delta_exact(losses, probs, inf, eps) <= delta  # sound: never below the exact epsilon
    # ... and tight: a hair lower already exceeds delta
    assert _delta_exact(losses, probs, inf, eps - 1e-6 * max(1.0, scale)) > delta
    quantile = float(pmf.get_epsilon_for_delta(delta))  # dp_accounting's loop (underflowed sum)
    assert eps <= quantile


def test_epsilon_below_the_underflow_is_dp_accountings_bit_for_bit():
    disc = 1e-4
    lower = 10_000
    probs = np.exp(-0.5 * ((np.arange(40_000) - 20_000) / 4000.0) ** 2)
    probs /= probs.sum()
    pmf = dp_pld.make_dense(lower, probs, 1e-15, disc)
    assert PrivacyLossDistribution(pmf, pmf).epsilon(1e-5) == float(pmf.get_epsilon_for_delta(1e-5))
