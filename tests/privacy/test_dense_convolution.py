"""dpmf.privacy.dense_convolution against dp_accounting's own DensePLDPmf.compose / self_compose (the
construction it vectorizes) on random PMFs, wide and narrow, with and without tail truncation."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.pld import common, pld_pmf

from dpmf.privacy import dense_convolution as dc
from dpmf.privacy import dp_pld
from dpmf.privacy.mixture import mixture_of_gaussians


def _random_pmf(rng, n: int, lower: int, inf: float = 0.0, tails: bool = True):
    p = rng.random(n) ** 4
    if tails:  # long near-empty tails, as composed PLDs have
        p *= np.exp(-0.5 * ((np.arange(n) - n / 2) / (n / 12)) ** 2)
    p *= (1 - inf) / p.sum()
    return pld_pmf.DensePLDPmf(1e-4, lower, p, inf, True)


@pytest.mark.parametrize("tail", [0.0, 1e-15, 1e-6, 0.3])
@pytest.mark.parametrize("seed", range(3))
def test_truncate_tails_is_dp_accountings(seed, tail):
    rng = np.random.default_rng(seed)
    p = _random_pmf(rng, 5000 + 3000 * seed, 0)._probs
    ours = dc.truncate_tails(p.copy(), tail)
    theirs = pld_pmf._truncate_tails(p.copy(), tail, True)
    assert ours[0] == theirs[0]
    np.testing.assert_array_equal(ours[1], theirs[1])
    assert ours[2] == theirs[2]


def test_truncate_tails_edge_cases():
    # (an array holding less than tail / 2 in all cannot be truncated by either: not a PMF)
    for p in (np.array([1.0]), np.r_[np.full(9000, 1e-20), 0.5, np.full(9000, 1e-20)], np.r_[np.full(10000, 1e-22), 1.0]):
        ours = dc.truncate_tails(p.copy(), 1e-15)
        theirs = pld_pmf._truncate_tails(p.copy(), 1e-15, True)
        assert ours[0] == theirs[0] and ours[2] == theirs[2]
        np.testing.assert_array_equal(ours[1], theirs[1])


@pytest.mark.parametrize("seed", range(3))
def test_compose_dense_is_bit_for_bit_dp_accountings(seed):
    rng = np.random.default_rng(10 + seed)
    a = _random_pmf(rng, 3000, -700, inf=1e-9 * seed)
    b = _random_pmf(rng, 12000, 40, inf=1e-12)
    ours = dc.compose_dense(a, b, 1e-15)
    theirs = a.compose(b, 1e-15)
    assert dp_pld.dense_arrays(ours)[0] == dp_pld.dense_arrays(theirs)[0]
    np.testing.assert_array_equal(dp_pld.dense_arrays(ours)[1], dp_pld.dense_arrays(theirs)[1])
    assert dp_pld.infinity_mass(ours) == dp_pld.infinity_mass(theirs)


@pytest.mark.parametrize("count", [2, 7, 300])
@pytest.mark.parametrize("seed", range(2))
def test_self_compose_dense_is_bit_for_bit_dp_accountings(seed, count):
    rng = np.random.default_rng(20 + seed)
    a = _random_pmf(rng, 2000, -300, inf=1e-10)
    lo_b, hi_b = dc.self_convolve_bounds(a._probs, count, 1e-15)
    lo_d, hi_d = common.compute_self_convolve_bounds(a._probs, count, 1e-15)
    assert lo_d - 1 <= lo_b <= lo_d and hi_d <= hi_b <= hi_d + 1  # never narrower, a point wider at most
    if (lo_b, hi_b) != (lo_d, hi_d):
        return
    ours = dc.self_compose_dense(a, count, 1e-15)
    theirs = a.self_compose(count, 1e-15)
    lo, p, inf, _ = dp_pld.dense_arrays(ours)
    lo2, p2, inf2, _ = dp_pld.dense_arrays(theirs)
    assert lo == lo2 and inf == inf2
    np.testing.assert_array_equal(p, p2)


def test_pld_composition_epsilons_match_dp_accountings_engine():
    """A mixture PLD composed through dpmf (dense, vectorized) and through dp_accounting's own
    PrivacyLossDistribution: the same epsilons at several deltas."""
    pld = mixture_of_gaussians([0.0, 0.5, 1.0], [0.9, 0.07, 0.03], 0.9)
    other = mixture_of_gaussians([0.0, 1.0], [0.95, 0.05], 1.2)
    ours = pld.self_compose(40).compose(other.self_compose(25))
    ref = pld.to_dp_accounting().self_compose(40).compose(other.to_dp_accounting().self_compose(25))
    for delta in (1e-3, 1e-6, 1e-9):
        assert ours.epsilon(delta) == ref.get_epsilon_for_delta(delta)


@pytest.mark.parametrize("seed", range(4))
def test_compiled_epsilon_for_delta_is_bit_for_bit_dp_accountings(seed):
    from dpmf.privacy.pld import _epsilon_for_delta

    rng = np.random.default_rng(40 + seed)
    pmf = _random_pmf(rng, 20000 + 5000 * seed, -3000 + 2000 * seed, inf=[0.0, 1e-12, 1e-7, 0.2][seed])
    for delta in (0.5, 1e-2, 1e-5, 1e-9, 1e-14):
        assert _epsilon_for_delta(pmf, delta) == pmf.get_epsilon_for_delta(delta)
    pld = mixture_of_gaussians([0.0, 0.5, 1.0], [0.9, 0.07, 0.03], 0.9).self_compose(60)
    for direction in ("remove", "add"):
        for delta in (1e-3, 1e-6, 1e-10):
            assert _epsilon_for_delta(pld._direction(direction), delta) == pld._direction(direction).get_epsilon_for_delta(delta)
