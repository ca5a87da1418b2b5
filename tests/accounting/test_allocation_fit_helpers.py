"""The PSD fit's means and norms without numpy's per-call checks (``markov_fit._mean``, ``_frobenius``;
issue 50 item 3, 2026-12-03): numpy's own operations, so the fitted members are the same bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from dpmf.accounting.allocation import correlated
from dpmf.accounting.allocation.dominating_pair import mixture_means
from dpmf.accounting.allocation.surrogates import markov_fit
from dpmf.strategies import bsr, catalog


@pytest.mark.parametrize("shape", [(1,), (5,), (8,), (9,), (3, 7), (16, 16), (50, 50), (129, 3)])
def test_fit_helpers_are_numpys_bit_for_bit(shape):
    rng = np.random.default_rng(sum(shape))
    for x in (rng.normal(size=shape), np.expm1(rng.uniform(0, 30, size=shape)), -rng.exponential(size=shape)):
        assert markov_fit._mean(x) == x.mean() and type(markov_fit._mean(x)) is type(x.mean())
        assert markov_fit._frobenius(x) == float(np.linalg.norm(x))
    covs = [rng.uniform(0, 2, size=(n, n)) for n in (5, 6, 16)]
    with np.errstate(over="ignore"):
        old = float(np.mean([np.expm1(c / 0.7).mean() for c in covs]))
    assert markov_fit._second_moment(covs, 0.7) == old


@pytest.mark.parametrize("strategy, epochs, steps", [(bsr(32, 4), 2, 32), (bsr(24, 3), 1, 24),
                                                     (catalog.build("banded-toeplitz", 40, bands=3), 2, 40)])
def test_fitted_members_are_the_same_as_with_numpys_mean_and_norm(monkeypatch, strategy, epochs, steps):
    """Every fitted member (its floats in full: the dataclasses' reprs) is the one fitted with
    ``ndarray.mean`` and ``np.linalg.norm`` in their place."""
    means = mixture_means(strategy, epochs, steps)
    period = steps // epochs
    new = correlated._fit_markov_members(means, period)
    monkeypatch.setattr(markov_fit, "_mean", lambda x: x.mean())
    monkeypatch.setattr(markov_fit, "_frobenius", lambda x: float(np.linalg.norm(x)))
    old = correlated._fit_markov_members(means, period)
    assert new[0] and repr(new) == repr(old)
