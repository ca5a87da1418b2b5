"""Random allocation, Rényi accountant: the dynamic program against brute force of eq. (5), the
digest's oracles O1-O5 and O7 (notes/random-allocation.md §7), the add bound (Lemma 3.4),
Feldman & Shenfeld's numbers for DP-SGD (notes/peer-public-code.md §3.1/§3.3), the dominating
pair, and bad input."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import special

from dpmf.accounting.allocation import (
    AllocationProblem,
    RenyiAllocation,
    account_allocation,
    add_rdp,
    band_truncation,
    calibrate_allocation,
    cyclic_bandwidth,
    gram_matrix,
    mixture_means,
    remove_rdp,
    supports,
)
from dpmf.errors import DPMFError, InvalidParameterError, UnsupportedConfigurationError
from dpmf.privacy.rdp import rdp_to_epsilon
from dpmf.sampling import BallsInBinsSampling, PoissonSampling
from dpmf.strategies import BLT, DenseStrategy, Identity, ToeplitzStrategy, bisr, bsr


# ----------------------------------------------------------------------------- brute force
def brute_force_eq5(G: np.ndarray, sigma: float, alpha: int) -> float:
    """Lemma 3.2 (T1 corrected) summed over all b^alpha tuples."""
    b = G.shape[0]
    tuples = np.array(list(itertools.product(range(b), repeat=alpha)))
    expo = np.zeros(len(tuples))
    for x in range(alpha):
        for y in range(alpha):
            if x != y:
                expo += G[tuples[:, x], tuples[:, y]]
    expo /= 2 * sigma**2
    return (special.logsumexp(expo) - alpha * math.log(b)) / (alpha - 1)


def bsr_gram(coefs, n, k):
    return gram_matrix(mixture_means(ToeplitzStrategy(np.array(coefs), n), k, n))


# ----------------------------------------------------------------------------- dominating pair
def test_means_identity_and_toeplitz_match_dense():
    # DP-SGD with k epochs: G = k I (notes §2.4)
    assert np.array_equal(gram_matrix(mixture_means(Identity(12), 3, 12)), 3 * np.eye(4))
    for strat in (bsr(24, 3), bisr(24, 4)):
        dense = DenseStrategy(strat.encoder())
        np.testing.assert_allclose(mixture_means(strat, 4, 24), mixture_means(dense, 4, 24), rtol=1e-13, atol=1e-15)
    # direct definition m_i = sum_e C[:, i + e b]
    C = bsr(12, 2).encoder()
    m = mixture_means(bsr(12, 2), 3, 12)
    for i in range(4):
        np.testing.assert_allclose(m[i], C[:, i] + C[:, i + 4] + C[:, i + 8])


def test_blt_means_use_toeplitz_coefficients():
    blt = BLT(np.array([0.5, 0.9]), np.array([0.2, 0.1]))
    np.testing.assert_allclose(mixture_means(blt, 2, 10), mixture_means(blt.to_toeplitz(10), 2, 10), rtol=1e-14)


def test_cyclic_band_structure_r7():
    # R7 (Fig. 1, scaled down): p-banded C -> G_ij = 0 iff cyclic distance >= p
    G = gram_matrix(mixture_means(bsr(60, 4), 3, 60))
    b = 20
    idx = np.arange(b)
    d = np.abs(idx[:, None] - idx[None, :])
    d = np.minimum(d, b - d)
    assert np.all(G[d >= 4] == 0) and np.all(G[d < 4] > 0)
    assert cyclic_bandwidth(G) == 4
    # banded inverse: dense C, small but positive off-band entries
    Gi = gram_matrix(mixture_means(bisr(60, 4), 3, 60))
    assert np.all(Gi > 0) and cyclic_bandwidth(Gi) == b // 2 + 1


def test_band_truncation_dominates():
    G = gram_matrix(mixture_means(bisr(40, 3), 2, 40))
    for p in (1, 2, 5):
        gp, tau = band_truncation(G, p)
        assert tau > 0
        assert np.all(G <= gp + tau + 1e-15)


# ----------------------------------------------------------------------------- oracles
def test_o1_no_subsampling_is_gaussian_rdp():
    for alpha, sigma in ((3, 1.0), (5, 0.7)):
        rho = remove_rdp(np.array([[1.0]]), sigma, 1, alpha)
        assert rho[alpha - 2] == pytest.approx(alpha / (2 * sigma**2), rel=1e-12)
        assert add_rdp(np.array([[1.0]]), sigma, [alpha])[0] == pytest.approx(alpha / (2 * sigma**2), rel=1e-12)


def test_o2_dpsgd_order_two_closed_form():
    rho = remove_rdp(np.eye(100), 1.0, 1, 2)[0]
    closed = math.log1p((math.e - 1) / 100)
    # rounded up by the documented floating-point allowance ((b + 16) * 4 ulp * ~19 / 1 ~ 2e-12)
    assert closed <= rho <= closed + 3e-12
    assert rho == pytest.approx(0.0170368632, abs=1e-10)
    assert add_rdp(np.eye(100), 1.0, [2])[0] == pytest.approx(0.505, rel=1e-12)


@pytest.mark.parametrize(
    "coefs, n, k, p, alpha, sigma, expected_remove, expected_add",
    [
        ([1, 0.5], 20, 2, 2, 3, 1.0, 1.6339208697, 1.675),  # O3
        ([1, 0.5, 0.375], 20, 2, 3, 3, 1.0, 2.0552602103, 2.029375),  # O4a
        ([1, 0.5], 30, 3, 2, 4, 2.0, 0.4668643324, 0.7140625),  # O4d
    ],
)
def test_o3_o4_dp_equals_brute_force(coefs, n, k, p, alpha, sigma, expected_remove, expected_add):
    G = bsr_gram(coefs, n, k)
    rho = remove_rdp(G, sigma, p, alpha)[alpha - 2]
    brute = brute_force_eq5(G, sigma, alpha)
    assert rho == pytest.approx(brute, rel=1e-11)
    assert rho >= brute  # the allowance rounds up
    assert rho == pytest.approx(expected_remove, abs=1e-9)
    assert add_rdp(G, sigma, [alpha])[0] == pytest.approx(expected_add, rel=1e-12)
    # every lower order of the same pass is exact too
    for a in range(2, alpha):
        assert remove_rdp(G, sigma, p, alpha)[a - 2] == pytest.approx(brute_force_eq5(G, sigma, a), rel=1e-11)


@pytest.mark.parametrize("p, expected", [(2, 2.1650226400), (1, 2.4962364900)])
def test_o4bc_truncated_bandwidth_is_an_upper_bound(p, expected):
    G = bsr_gram([1, 0.5, 0.375], 20, 2)
    rho = remove_rdp(G, 1.0, p, 3)[1]
    assert rho == pytest.approx(expected, abs=1e-9)
    assert rho > brute_force_eq5(G, 1.0, 3)


def _random_cyclic_banded(b, p, rng):
    idx = np.arange(b)
    d = np.abs(idx[:, None] - idx[None, :])
    d = np.minimum(d, b - d)
    A = rng.uniform(0.1, 1.0, (b, b))
    return np.where(d < p, (A + A.T) / 2, 0.0)


@pytest.mark.parametrize(
    "b, p, paper_exact",
    [(3, 2, True), (4, 2, True), (6, 3, True), (9, 4, True), (2, 2, False), (4, 3, False), (5, 3, False), (7, 4, False), (8, 4, False)],
)
def test_o7_exactness_switch(b, p, paper_exact):
    rng = np.random.default_rng(b * 10 + p)
    G = _random_cyclic_banded(b, p, rng)
    alpha = 4
    brute = brute_force_eq5(G, 1.0, alpha)
    paper = remove_rdp(G, 1.0, p, alpha, closure="paper")[-1]
    ours = remove_rdp(G, 1.0, p, alpha)[-1]
    # Alg. 1 as printed: exact iff b >= 3p - 3, otherwise a strict over-estimate (T15)
    if paper_exact:
        assert paper == pytest.approx(brute, rel=1e-11)
    else:
        assert paper > brute + 1e-3
    # our closure counts each pair once: exact for every p <= b
    assert ours == pytest.approx(brute, rel=1e-11)


def test_dp_matches_brute_force_on_random_grams():
    rng = np.random.default_rng(7)
    for b, p, alpha in ((5, 2, 5), (6, 3, 4), (7, 2, 4)):
        G = _random_cyclic_banded(b, p, rng) * 2
        rho = remove_rdp(G, 0.8, p, alpha)
        for a in range(2, alpha + 1):
            assert rho[a - 2] == pytest.approx(brute_force_eq5(G, 0.8, a), rel=1e-10)
        # a dense G with a smaller effective bandwidth stays an upper bound
        D = rng.uniform(0, 1, (b, b))
        D = D + D.T
        for q in range(1, b + 1):
            assert remove_rdp(D, 0.8, q, 3)[-1] >= brute_force_eq5(D, 0.8, 3)


def test_add_bound_is_lemma_3_4():
    G = bsr_gram([1, 0.5, 0.375], 20, 2)
    b = G.shape[0]
    a = np.array([2.0, 7.0])
    expect = np.trace(G) / (2 * b * 1.3**2) + (a - 1) * G.sum() / (2 * b**2 * 1.3**2)
    np.testing.assert_allclose(add_rdp(G, 1.3, a), expect, rtol=1e-14)


# ----------------------------------------------------------------------------- O5: calibration
O5 = [(0.5, 1.6857), (1.0, 1.2013), (2.0, 0.8623), (4.0, 0.6276), (8.0, 0.4386)]


def _o5_bisection(ra: RenyiAllocation, eps: float, delta: float = 1e-5) -> float:
    """The digest's procedure: 50 geometric bisection steps on [0.2, 50], Alg. 3 (joint)."""
    lo, hi = 0.2, 50.0
    for _ in range(50):
        mid = math.sqrt(lo * hi)
        rho = np.maximum(ra.remove(mid)[0], ra.add(mid))
        if rdp_to_epsilon(ra.orders, rho, delta)[0] <= eps:
            hi = mid
        else:
            lo = mid
    return hi


@pytest.mark.parametrize("k", [1, 10])
def test_o5_renyi_calibrated_sigma_dpsgd(k):
    problem = AllocationProblem.create(Identity(100 * k), BallsInBinsSampling(k, 100 * k))
    # for k > 1 the problem is the exact one-epoch reduction at sigma * noise_scale (issue 16 item 4)
    assert problem.noise_scale == pytest.approx(1 / math.sqrt(k))
    for eps, sigma in O5:
        expect = sigma * math.sqrt(k)
        assert _o5_bisection(problem.renyi, eps) / problem.noise_scale == pytest.approx(expect, abs=6e-5 * math.sqrt(k))


def test_o5_through_calibrate_allocation():
    scheme = BallsInBinsSampling(1, 100)
    joint = calibrate_allocation(Identity(100), scheme, 1.0, 1e-5, which="renyi", renyi_conversion="joint")
    assert joint == pytest.approx(1.2013, abs=2e-4)
    per_dir = calibrate_allocation(Identity(100), scheme, 1.0, 1e-5, which="renyi")
    assert per_dir <= joint  # converting each direction separately is never looser
    report = account_allocation(Identity(100), scheme, per_dir, 1e-5, which="renyi")
    assert report.epsilon <= 1.0


# ----------------------------------------------------------------------------- Feldman & Shenfeld
# notes/peer-public-code.md §3.3: DP-SGD under 1-of-t random allocation, delta = 1e-8;
# (sigma, t, PLD lower, PLD upper, FS25 "direct" RDP remove epsilon)
FS = [(1.0, 8, 3.711, 3.726, 4.036), (1.0, 64, 1.792, 1.806, 2.298), (2.0, 64, 0.315, 0.345, 0.512), (1.0, 128, 1.253, 1.270, 1.893)]


@pytest.mark.parametrize("sigma, t, lower, upper, direct", FS)
def test_feldman_shenfeld_renyi(sigma, t, lower, upper, direct):
    r = account_allocation(Identity(t), BallsInBinsSampling(1, t), sigma, 1e-8, which="renyi")
    assert r.epsilon >= lower  # never below their lower bound
    # our remove direction is their direct RDP bound (Cor. 6.2; the same quantity for p = 1)
    assert r.epsilon_by_direction["remove"] == pytest.approx(direct, abs=1e-3)
    assert r.diagnostics["renyi"]["bandwidth"] == 1


def test_feldman_shenfeld_combined_small():
    r = account_allocation(Identity(8), BallsInBinsSampling(1, 8), 1.0, 1e-8)
    assert r.epsilon >= 3.711
    assert "conditional" in r.diagnostics and "epsilon" in r.diagnostics["conditional"]


# ----------------------------------------------------------------------------- reports
def test_report_fields_and_combination():
    """Per direction the smallest of the bounds; conditional composition (17.3 / 16.0 here, the Renyi
    bound ~2) is skipped where its own lower bound shows it cannot win, and the report says so."""
    strat, scheme = bsr(40, 2), BallsInBinsSampling(2, 40)
    r = account_allocation(strat, scheme, 1.5, 1e-5)
    rr = r.diagnostics["renyi"]["epsilon_by_direction"]
    rc = account_allocation(strat, scheme, 1.5, 1e-5, which="conditional").epsilon_by_direction
    for d in ("remove", "add"):
        assert r.epsilon_by_direction[d] == min(rr[d], rc[d], r.diagnostics["gaussian_epsilon"])
        assert rc[d] > rr[d]  # (the skip below was right)
    assert r.epsilon == max(r.epsilon_by_direction.values())
    assert r.certified and r.method == "allocation"
    assert r.diagnostics["renyi"]["bandwidth"] in (1, 2)
    assert "cannot lower" in r.diagnostics["conditional"]["skipped"]
    assert r.diagnostics["conditional"]["cannot_lower"] == rr
    assert r.diagnostics["conditional"]["delta_e"] == pytest.approx(5e-6)
    assert r.to_json()


def test_conditional_computed_where_it_wins():
    """A nearly diagonal C (one sub-diagonal of 0.05), one epoch of 64 steps at sigma 4: conditional
    composition (0.150 / 0.136) is below the Renyi bound (0.165 / 0.143), so it is computed and taken."""
    C = np.eye(64) + 0.05 * np.eye(64, k=-1)
    r = account_allocation(C, BallsInBinsSampling(1, 64), 4.0, 1e-5)
    rr, rc = r.diagnostics["renyi"]["epsilon_by_direction"], r.diagnostics["conditional"]["epsilon_by_direction"]
    assert all(rc[d] < rr[d] for d in rc)
    assert r.epsilon_by_direction == {d: min(rr[d], rc[d], r.diagnostics["gaussian_epsilon"]) for d in rc}


@pytest.mark.parametrize("n, bands, epochs, sigma", [(40, 2, 2, 1.5), (16, 2, 1, 10.0), (12, 3, 1, 6.0)])
def test_conditional_lower_bound_is_below_the_accountant(n, bands, epochs, sigma):
    """composition_delta_lower_bound of the pairs at the epsilon conditional composition reports is at
    most delta - delta_E (that epsilon is certified, so the exact pairs' delta there is below it);
    10% below that epsilon it is above (the bound is not vacuous: it is what lets the skip happen)."""
    from dpmf.accounting.allocation.conditional import composition_delta_lower_bound, conditional_epsilon, conditional_pairs
    from dpmf.accounting.allocation.dominating_pair import mixture_means

    means = mixture_means(bsr(n, bands), epochs, n)
    prepared = conditional_pairs(means, sigma, 1e-5)
    level = 1e-5 - prepared["delta_e"]
    eps = conditional_epsilon(means, sigma, 1e-5, prepared=prepared)["epsilon_by_direction"]
    for d, e in eps.items():
        assert composition_delta_lower_bound(prepared["pairs"][d], sigma, e, d) <= level
        assert composition_delta_lower_bound(prepared["pairs"][d], sigma, 0.9 * e, d) > level


def test_combined_skips_expensive_conditional_and_says_so():
    strat, scheme = bsr(40, 2), BallsInBinsSampling(2, 40)
    r = account_allocation(strat, scheme, 1.5, 1e-5, conditional_budget=0.0)
    assert "skipped" in r.diagnostics["conditional"]
    assert r.epsilon_by_direction == r.diagnostics["renyi"]["epsilon_by_direction"]


def test_monotone_in_sigma_and_bandwidth_helps():
    strat, scheme = bsr(30, 3), BallsInBinsSampling(3, 30)
    e = [account_allocation(strat, scheme, s, 1e-5, which="renyi", orders=range(2, 33)).epsilon for s in (0.8, 1.2, 2.0)]
    assert e[0] > e[1] > e[2]
    p1 = account_allocation(strat, scheme, 1.2, 1e-5, which="renyi", bandwidth=1, orders=range(2, 20)).epsilon
    p3 = account_allocation(strat, scheme, 1.2, 1e-5, which="renyi", bandwidth=3, orders=range(2, 20)).epsilon
    assert p3 < p1


def test_multi_epoch_dpsgd_is_single_epoch_with_scaled_noise():
    # G = k I: k epochs at sigma == one epoch at sigma / sqrt(k) (notes §2.4)
    a = account_allocation(Identity(300), BallsInBinsSampling(3, 300), 3.0, 1e-5, which="renyi").epsilon
    b = account_allocation(Identity(100), BallsInBinsSampling(1, 100), 3.0 / math.sqrt(3), 1e-5, which="renyi").epsilon
    assert a == pytest.approx(b, rel=1e-9)


# ----------------------------------------------------------------------------- bad input
def test_supports():
    assert supports(bsr(20, 2), BallsInBinsSampling(2, 20)) is None
    assert "BallsInBins" in supports(bsr(20, 2), PoissonSampling(0.1, 20))
    neg = DenseStrategy(np.array([[1.0, 0.0], [-0.5, 1.0]]))
    assert "non-negative" in supports(neg, BallsInBinsSampling(1, 2))


def test_bad_input():
    scheme = BallsInBinsSampling(2, 20)
    with pytest.raises(InvalidParameterError, match="epochs"):
        BallsInBinsSampling(3, 20)  # k * b != N
    with pytest.raises(InvalidParameterError, match="steps"):
        mixture_means(bsr(20, 2), 3, 20)  # k * b != N
    with pytest.raises(InvalidParameterError, match="n=30"):
        account_allocation(bsr(30, 2), scheme, 1.0, 1e-5)
    with pytest.raises(InvalidParameterError, match="bandwidth"):
        account_allocation(bsr(20, 2), scheme, 1.0, 1e-5, bandwidth=11)  # p > b = 10
    with pytest.raises(InvalidParameterError, match="alpha >= 2"):
        account_allocation(bsr(20, 2), scheme, 1.0, 1e-5, orders=[1, 2])
    with pytest.raises(InvalidParameterError, match="integers"):
        account_allocation(bsr(20, 2), scheme, 1.0, 1e-5, orders=[2.5])
    with pytest.raises(InvalidParameterError, match="alpha >= 2"):
        remove_rdp(np.eye(3), 1.0, 1, 1)
    with pytest.raises(InvalidParameterError, match="smaller orders or bandwidth"):
        account_allocation(bsr(20, 8), scheme, 1.0, 1e-5, bandwidth=8, orders=range(2, 65))
    neg = DenseStrategy(np.tril(np.ones((4, 4))) - 2 * np.eye(4, k=-1))
    with pytest.raises(UnsupportedConfigurationError, match="non-negative"):
        account_allocation(neg, BallsInBinsSampling(2, 4), 1.0, 1e-5)
    with pytest.raises(UnsupportedConfigurationError, match="non-negative"):
        account_allocation(ToeplitzStrategy(np.array([1.0, -0.5]), 4), BallsInBinsSampling(2, 4), 1.0, 1e-5)
    with pytest.raises(UnsupportedConfigurationError, match="lower-triangular"):
        mixture_means(np.ones((4, 4)), 2, 4)
    with pytest.raises(InvalidParameterError, match="noise_multiplier"):
        account_allocation(bsr(20, 2), scheme, float("nan"), 1e-5)
    with pytest.raises(InvalidParameterError, match="delta"):
        account_allocation(bsr(20, 2), scheme, 1.0, 0.0)
    with pytest.raises(InvalidParameterError, match="which"):
        account_allocation(bsr(20, 2), scheme, 1.0, 1e-5, which="mc")
    with pytest.raises(UnsupportedConfigurationError):
        account_allocation(bsr(20, 2), PoissonSampling(0.1, 20), 1.0, 1e-5)
    with pytest.raises(InvalidParameterError, match="delta_e"):
        account_allocation(bsr(20, 2), scheme, 1.0, 1e-5, which="conditional", delta_e=1e-5)
    with pytest.raises(InvalidParameterError, match=">= 0"):
        remove_rdp(-np.eye(3), 1.0, 1, 3)
    for exc in (InvalidParameterError, UnsupportedConfigurationError):
        assert issubclass(exc, DPMFError)


def test_docstring_examples():
    import doctest

    import dpmf.accounting.allocation as alloc

    for module in (alloc.dominating_pair, alloc.renyi, alloc.conditional, alloc.accountant):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0


# ----------------------------------------------------------------------------- properties
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 5),
    k=st.integers(1, 3),
    band=st.integers(1, 4),
    alpha=st.integers(2, 4),
    sigma=st.floats(0.5, 3.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_dp_is_exact_for_true_bandwidth_and_monotone(b, k, band, alpha, sigma, seed):
    rng = np.random.default_rng(seed)
    n = k * b
    C = np.tril(rng.uniform(0.0, 1.0, (n, n)))
    C[np.subtract.outer(np.arange(n), np.arange(n)) >= band] = 0.0  # band-limited, C >= 0
    G = gram_matrix(mixture_means(C, k, n))
    p = cyclic_bandwidth(G)
    brute = brute_force_eq5(G, sigma, alpha)
    exact = remove_rdp(G, sigma, min(p, b), alpha)[-1]
    assert exact == pytest.approx(brute, rel=1e-10, abs=1e-12)
    for q in range(1, b + 1):  # any effective bandwidth: an upper bound
        assert remove_rdp(G, sigma, q, alpha)[-1] >= brute - 1e-12
    assert remove_rdp(G, sigma * 1.1, min(p, b), alpha)[-1] <= exact + 1e-12


@pytest.mark.parametrize("bandwidth, max_order", [(1, 30), (2, 12), (3, 8), (4, 6)])
def test_compiled_program_step_equals_the_numpy_formula(bandwidth, max_order):
    """The compiled step (``_compiled.step_lse``) is the numpy formula of its docstring, to a few ulps,
    on every step shape of the program (transitions rebuilt from the step's source windows and counts),
    including a NaN that must propagate."""
    from dpmf.accounting.allocation._compiled import step_lse
    from dpmf.accounting.allocation.renyi import _segment_lse, _shape
    from scipy import special

    rng = np.random.default_rng(bandwidth)
    shape = _shape(bandwidth, max_order)
    w = shape.width
    counts = np.arange(max_order + 1.0)
    for st in shape.steps:
        f = rng.normal(size=st.src_window.shape[0]) * 5
        g_row, g_kk, inv_s2 = rng.uniform(0, 1, size=w), 0.7, 1 / 0.9**2
        t = st.t.astype(np.float64)
        inter = st.src_window[st.src] @ g_row if w else 0.0
        want = _segment_lse(
            f[st.src] + (g_kk * t * (t - 1) / 2 + t * inter) * inv_s2 - special.gammaln(t + 1), st.starts, st.counts
        )
        tab = g_kk * counts * (counts - 1) / 2 * inv_s2 - special.gammaln(counts + 1)
        got = step_lse(f, st.src_window, g_row, inv_s2, st.src, st.t, tab, st.starts, st.counts)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    f[0] = np.nan
    got = step_lse(f, st.src_window, g_row, inv_s2, st.src, st.t, tab, st.starts, st.counts)
    hit = np.unique(np.searchsorted(st.starts, np.flatnonzero(st.src == 0), side="right") - 1)
    assert hit.size and np.isnan(got[hit]).all()
    assert not np.isnan(np.delete(got, hit)).any()


@pytest.mark.parametrize("strategy, scheme", [(bsr(32, 4), BallsInBinsSampling(2, 32)), (bsr(24, 3), BallsInBinsSampling(1, 24))])
def test_skipping_levels_never_changes_epsilon(strategy, scheme):
    """With an exact level (bandwidth = the true one, tau = 0), the others are skipped only when the
    order-monotonicity bound proves they cannot lower the remove epsilon: the epsilon equals the one
    from every level to the rounding allowance, over noises where they are skipped and where not."""
    gram = gram_matrix(mixture_means(strategy, scheme.epochs, scheme.steps))
    renyi = RenyiAllocation.create(gram, budget=1e6)  # (small levels: the logic, not the size, is tested)
    exact = renyi.exact_level
    assert exact is not None and len(renyi.levels) > 1
    skipped = ran_all = 0
    for sigma in (0.5, 0.8, 1.3, 4.0):
        for delta in (1e-5, 1e-10):
            out = renyi.epsilon(sigma, delta)
            every, _ = renyi.remove(sigma)  # (no delta: every level)
            want, _ = rdp_to_epsilon(renyi.orders, every, delta)
            assert out["epsilon_by_direction"]["remove"] == pytest.approx(want, rel=1e-12)
            skipped += out["levels_run"] == [exact.bandwidth]
            ran_all += len(out["levels_run"]) == len(renyi.levels)
    assert skipped >= 4 and ran_all >= 1  # (both branches exercised)


def test_skippable_refuses_when_a_higher_order_could_win():
    """Negative control: an exact level whose largest order is far from the best one (a tiny rho:
    the best order is high) cannot rule the other levels out, nor can an overflowed one."""
    renyi = RenyiAllocation.create(gram_matrix(mixture_means(bsr(32, 4), 2, 32)))
    top = renyi.exact_level.max_order
    small = np.full(top - 1, 1e-3)
    assert not renyi.skippable(small, np.zeros(top - 1), 1e-10)
    big = np.arange(2, top + 1, dtype=float)  # (rho = order: the best order is the smallest)
    assert renyi.skippable(big, np.zeros(top - 1), 1e-5)
    assert not renyi.skippable(np.r_[big[:-1], np.inf], np.zeros(top - 1), 1e-5)
