"""Correlated C under k-of-t random allocation (``allocation/k_of_t_correlated.py``).

Oracles: (a) Monte Carlo of the exact pair (the uniform mixture over every pattern, enumerated;
reused and fresh slots): the bound is never below its lower end, and the same computation without the
cross-block correlation (the identity's k-of-t at sigma / max column norm) undercuts it (negative
control: the test sees a bound that ignores the correlation); (b) the identity given as a plain matrix
reproduces the identity's own k-of-t accountant; (c) steps 1-2 on random partitions: the moved
diagonal dominates the Gram (positive semidefinite) and every block's largest eigenvalue is at most the
row-sum bound.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_allocation_correlated import _mc_epsilon_interval

import dpmf
from dpmf.accounting.allocation.correlated import reduced_epsilon
from dpmf.accounting.allocation.dominating_pair import mixture_means
from dpmf.accounting.allocation.k_of_t_correlated import k_of_t_reductions, row_sum_bound
from dpmf.accounting.allocation.pld import allocation_pld_epsilon
from dpmf.accounting.montecarlo._loss_bruteforce import allocation_patterns
from dpmf.errors import UnsupportedConfigurationError
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import ToeplitzStrategy, bsr


def _pattern_means(strategy, scheme) -> np.ndarray:
    """One row per pattern ``x`` (all equally likely): ``C x`` (written out from the enumeration)."""
    pats = allocation_patterns(scheme.epochs, scheme.steps_per_epoch, scheme.num_selected, scheme.fresh_slots)
    dense = np.asarray(strategy.encoder() if hasattr(strategy, "encoder") else strategy, dtype=np.float64)
    return np.array([dense @ np.asarray(x, dtype=np.float64) for _, x in pats])


CASES = [
    (bsr(8, 3), BallsInBinsSampling(1, 8, num_selected=2), 1.5),
    (ToeplitzStrategy([1.0, 0.8, 0.6], 12), BallsInBinsSampling(2, 12, num_selected=2), 2.0),
    (bsr(12, 3), BallsInBinsSampling(2, 12, num_selected=2, fresh_slots=True), 2.0),
    (ToeplitzStrategy([1.0, 0.7], 8), BallsInBinsSampling(1, 8, num_selected=3), 1.5),
]
IDS = ["bsr8-2of8", "toeplitz-2of6-reused2", "bsr12-2of6-fresh2", "toeplitz-3of8"]


@pytest.mark.parametrize("strategy, scheme, sigma", CASES, ids=IDS)
def test_never_below_the_monte_carlo_lower_end_of_the_exact_pair(strategy, scheme, sigma):
    delta = 1e-3
    report = dpmf.account(strategy, scheme, sigma, delta, method="allocation_pld")
    _, lower = _mc_epsilon_interval(_pattern_means(strategy, scheme), sigma, delta, 300_000, seed=5)
    assert report.epsilon >= lower
    assert report.epsilon < dpmf.account(strategy, scheme, sigma, delta, method="unamplified").epsilon
    assert "random blocks" in report.diagnostics["reduction"]


def test_negative_control_ignoring_the_correlation_undercuts_the_exact_pair():
    """The same reduction with Lambda = the largest squared column norm (the cross-block Gram entries
    dropped instead of moved to the diagonal) is below the Monte Carlo lower end: the check has the
    power to catch it."""
    strategy, scheme, sigma, delta = ToeplitzStrategy([1.0, 0.8, 0.6], 12), BallsInBinsSampling(2, 12, num_selected=2), 2.0, 1e-3
    _, lower = _mc_epsilon_interval(_pattern_means(strategy, scheme), sigma, delta, 300_000, seed=5)
    m = mixture_means(strategy, scheme.epochs, scheme.steps)
    norm_sq = float((m * m).sum(axis=1).max())
    naive = allocation_pld_epsilon(sigma / np.sqrt(norm_sq), scheme.steps_per_epoch, delta, num_selected=2)
    assert naive["epsilon"] < lower


@pytest.mark.parametrize("fresh", [False, True])
def test_identity_as_a_matrix_is_the_identity_accountant(fresh):
    n, k, sel, sigma, delta = 24, 2, 3, 1.2, 1e-5
    scheme = BallsInBinsSampling(k, n, num_selected=sel, fresh_slots=fresh)
    red = k_of_t_reductions(np.eye(n), scheme)
    got = reduced_epsilon(red, sigma, delta, allocation_pld_epsilon, epochs=k if fresh else 1, fresh_slots=fresh,
                          num_selected=sel)
    want = allocation_pld_epsilon(sigma, n // k, delta, epochs=k, num_selected=sel, fresh_slots=fresh)
    assert got["epsilon"] == pytest.approx(want["epsilon"], rel=1e-9) and got["epsilon"] >= want["epsilon"]


@pytest.mark.parametrize("strategy", [bsr(16, 4), ToeplitzStrategy([1.0, 0.8, 0.6], 16)])
def test_random_blocks_steps_one_and_two(strategy):
    """For random partitions into blocks: the block-diagonal Gram with the cross-block entries moved
    to the diagonal minus the Gram is positive semidefinite (step 1; without the moved diagonal it is
    not), and every block's largest eigenvalue is at most the row-sum bound (step 2)."""
    m = mixture_means(strategy, 1, strategy.n)
    gram = m @ m.T
    lam = row_sum_bound(m)
    rng = np.random.default_rng(0)
    n = gram.shape[0]
    for _ in range(20):
        perm = rng.permutation(n)
        blocks = np.array_split(perm, 4)
        big, plain = np.zeros_like(gram), np.zeros_like(gram)
        for blk in blocks:
            others = np.setdiff1d(np.arange(n), blk)
            g = gram[np.ix_(blk, blk)].copy()
            plain[np.ix_(blk, blk)] = g
            g[np.diag_indices(blk.size)] += gram[np.ix_(blk, others)].sum(axis=1)
            big[np.ix_(blk, blk)] = g
            assert np.linalg.eigvalsh(g).max() <= lam
        assert np.linalg.eigvalsh(big - gram).min() >= -1e-12 * np.abs(gram).max()
        assert np.linalg.eigvalsh(plain - gram).min() < -1e-6


def test_auto_picks_the_amplified_bound_and_refusals_stay_clear():
    scheme = BallsInBinsSampling(2, 128, num_selected=4)
    auto = dpmf.account(bsr(128, 4), scheme, 3.0, 1e-5)
    assert auto.method == "allocation_pld"
    assert auto.epsilon < dpmf.account(bsr(128, 4), scheme, 3.0, 1e-5, method="unamplified").epsilon
    with pytest.raises(UnsupportedConfigurationError, match="non-negative"):
        dpmf.account(-np.eye(16), BallsInBinsSampling(2, 16, num_selected=2), 2.0, 1e-5, method="allocation_pld")
