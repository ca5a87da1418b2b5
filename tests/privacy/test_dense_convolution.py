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


def _long_double_self_convolution(probs: np.ndarray, count: int, lo: int, hi: int) -> np.ndarray:
    """The ``count``-fold circular self-convolution on ``[lo, hi]`` by long-double transforms
    (~2e-4 of float64's rounding): the reference both float64 engines are measured against."""
    from scipy import fft

    length = fft.next_fast_len(max(hi - lo + 1, probs.size), real=True)
    full = fft.irfft(fft.rfft(probs.astype(np.longdouble), length) ** count, length)
    return np.roll(full, -lo)[: hi - lo + 1].astype(np.float64)


@pytest.mark.parametrize("count", [2, 7, 300])
@pytest.mark.parametrize("seed", range(2))
def test_self_compose_dense_is_dp_accountings_up_to_fft_rounding(seed, count):
    """The same range, offset and infinity mass as dp_accounting's ``self_compose``; the masses
    differ only by the transforms' rounding (real instead of complex ones, the power by squaring),
    and measured against a long-double transform ours are no further off than dp_accounting's
    (within 4x pointwise and in every tail sum, the quantity delta reads)."""
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
    assert lo == lo2 and inf == inf2 and p.size == p2.size
    ref = _long_double_self_convolution(a._probs, count, lo_b, hi_b)
    floor = 1e-18 * np.max(ref)  # (both can round a zero to +-1e-35; not a difference)
    assert np.max(np.abs(p - ref)) <= 4 * np.max(np.abs(p2 - ref)) + floor
    tails, tails2, tails_ref = (np.cumsum(x[::-1]) for x in (p, p2, ref))
    assert np.max(np.abs(tails - tails_ref)) <= 4 * np.max(np.abs(tails2 - tails_ref)) + floor


@pytest.mark.parametrize("count", [3, 40])
def test_self_compose_convolve_dense_is_self_compose_then_compose(count):
    """``p^{*k} * b`` in one spectrum = self-composing and then composing, to the transforms'
    rounding and the tail truncations (``1e-15`` each, which may cut ~100 near-empty points more or
    fewer: where a running sum of the FFT's noise crosses ``5e-16``): on a common index range, every tail sum (what delta reads) within ``1e-14`` of the
    two-step one, the infinity masses equal to 1e-12."""
    rng = np.random.default_rng(30 + count)
    a = _random_pmf(rng, 1500, -200, inf=1e-11)
    b = _random_pmf(rng, 700, 30, inf=1e-9)
    fused = dc.self_compose_convolve_dense(a, count, b, 1e-15)
    two_step = dc.compose_dense(dc.self_compose_dense(a, count, 1e-15), b, 1e-15)
    (lo, p, inf, _), (lo2, p2, inf2, _) = dp_pld.dense_arrays(fused), dp_pld.dense_arrays(two_step)
    start, stop = min(lo, lo2), max(lo + p.size, lo2 + p2.size)
    x, y = np.zeros(stop - start), np.zeros(stop - start)
    x[lo - start:lo - start + p.size] = p
    y[lo2 - start:lo2 - start + p2.size] = p2
    np.testing.assert_allclose(np.cumsum(x[::-1]), np.cumsum(y[::-1]), rtol=0, atol=1e-14)
    assert inf == pytest.approx(inf2, rel=1e-12)


def test_pld_composition_epsilons_match_dp_accountings_engine():
    """A mixture PLD composed through dpmf (dense, vectorized) and through dp_accounting's own
    PrivacyLossDistribution: the same epsilons at several deltas, to the transforms' rounding."""
    pld = mixture_of_gaussians([0.0, 0.5, 1.0], [0.9, 0.07, 0.03], 0.9)
    other = mixture_of_gaussians([0.0, 1.0], [0.95, 0.05], 1.2)
    ours = pld.self_compose(40).compose(other.self_compose(25))
    ref = pld.to_dp_accounting().self_compose(40).compose(other.to_dp_accounting().self_compose(25))
    # (equal up to the FFT's rounding, real vs complex transforms: its noise floor, ~1e-19 per
    # point of either sign, is what delta reads at 1e-9 and below)
    for delta, rel in ((1e-3, 1e-10), (1e-6, 1e-9), (1e-9, 1e-6)):
        assert ours.epsilon(delta) == pytest.approx(ref.get_epsilon_for_delta(delta), rel=rel)


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
