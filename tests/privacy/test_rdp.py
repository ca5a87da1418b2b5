"""Tests for dpmf.privacy.rdp: closed forms, brute force, quadrature oracles, dp_accounting
cross-checks, properties, and bad input."""

from __future__ import annotations

import decimal
import math
import warnings

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as dpa_pld
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate

from dpmf.errors import InvalidParameterError
from dpmf.privacy.rdp import (
    DEFAULT_ORDERS,
    epsilon_subsampled_gaussian_rdp,
    gaussian_rdp,
    rdp_to_delta,
    rdp_to_epsilon,
    subsampled_gaussian_rdp,
)

# A small order set used by the property tests: integers and fractions, near 1 and large.
ORDERS = np.array([1.1, 1.5, 2.0, 2.5, 3.75, 8.0, 16.5, 64.0])
PROP = settings(max_examples=40, deadline=None)


# ----------------------------------------------------------------------------------------------
# independent oracles


def _log_a_quadrature(q: float, sigma: float, alpha: float, *, reverse: bool = False) -> float:
    """log of the defining integral, by adaptive quadrature (independent of any series).

    Forward (add): A = int mu0 (mu/mu0)^alpha.  Reverse (remove): B = int mu (mu0/mu)^alpha
    = int mu0 (mu/mu0)^(1 - alpha).  mu0 = N(0, s^2), mu = (1 - q) mu0 + q N(1, s^2).
    """
    lo, hi = -40.0 * sigma - 1.0, alpha + 40.0 * sigma + 1.0
    lq, l1q = math.log(q), math.log1p(-q)
    c = -0.5 * math.log(2.0 * math.pi * sigma * sigma)
    p = (1.0 - alpha) if reverse else alpha

    def log_f(z):
        return c - z * z / (2 * sigma * sigma) + p * np.logaddexp(
            l1q, lq + (2 * z - 1) / (2 * sigma * sigma)
        )

    zs = np.linspace(lo, hi, 20001)
    lz = log_f(zs)
    i = int(np.argmax(lz))
    peak = float(lz[i])
    val, _ = integrate.quad(
        lambda z: math.exp(log_f(z) - peak),
        lo,
        hi,
        points=[float(zs[i]), 0.0, 1.0],
        epsabs=0.0,
        epsrel=1e-13,
        limit=2000,
    )
    return peak + math.log(val)


def _log_a_brute_int(q: float, sigma: float, alpha: int) -> float:
    """Integer order by the binomial sum in 60-digit decimal arithmetic:
    A - 1 = sum_{k=2}^{alpha} C(alpha, k) (1-q)^(alpha-k) q^k (exp(k(k-1)/(2 sigma^2)) - 1)."""
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        dq, ds = decimal.Decimal(q), decimal.Decimal(sigma)
        total = sum(
            math.comb(alpha, k)
            * (1 - dq) ** (alpha - k)
            * dq**k
            * ((decimal.Decimal(k * (k - 1)) / (2 * ds * ds)).exp() - 1)
            for k in range(2, alpha + 1)
        )
        return float((1 + total).ln())


def _dpa_rdp(q: float, sigma: float, orders) -> np.ndarray:
    return np.asarray(dpa_rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, orders))


def _log_a_close(ours_log_a, ref_log_a, *, abs_tol=2e-13, rel_tol=1e-12):
    """log A agrees to ~1e-13 absolute (the floating-point floor of a log-space sum near 1) and
    1e-12 relative for large values."""
    ours_log_a, ref_log_a = np.asarray(ours_log_a), np.asarray(ref_log_a)
    return np.abs(ours_log_a - ref_log_a) <= abs_tol + rel_tol * np.abs(ref_log_a)


# ----------------------------------------------------------------------------------------------
# DEFAULT_ORDERS and the Gaussian


def test_default_orders_shape_and_content():
    o = DEFAULT_ORDERS
    assert o.dtype == np.float64 and o.ndim == 1
    assert np.all(np.diff(o) > 0) and np.all(o > 1) and np.all(np.isfinite(o))
    for must in (1.25, 1.5, 2.0, 2.375, 10.0, 11.0, 64.0, 80.0, 96.0, 128.0, 256.0, 512.0, 1024.0):
        assert must in o
    with pytest.raises(ValueError):
        o[0] = 3.0  # read-only: a module constant must not be mutated


def test_gaussian_rdp_closed_form():
    orders = np.array([1.5, 2.0, 32.0])
    np.testing.assert_allclose(gaussian_rdp(2.0, orders), orders / 8.0, rtol=1e-15)
    np.testing.assert_allclose(
        gaussian_rdp(2.0, orders, sensitivity=3.0), orders * 9.0 / 8.0, rtol=1e-15
    )
    assert gaussian_rdp(1.0, 4.0).tolist() == [2.0]  # scalar order -> one-element array
    assert np.all(gaussian_rdp(1.0, orders, sensitivity=0.0) == 0.0)


def test_sampling_prob_one_is_gaussian_and_zero_is_zero():
    np.testing.assert_array_equal(
        subsampled_gaussian_rdp(1.3, 1.0, DEFAULT_ORDERS), gaussian_rdp(1.3, DEFAULT_ORDERS)
    )
    assert np.all(subsampled_gaussian_rdp(1.3, 0.0, DEFAULT_ORDERS) == 0.0)


@pytest.mark.parametrize("q,sigma", [(1e-8, 1.0), (1e-4, 10.0), (0.3, 0.7), (0.999, 2.0)])
def test_order_two_closed_form(q, sigma):
    # A_2 = 1 + q^2 (exp(1/sigma^2) - 1): exact, and our A - 1 formulation keeps tiny values.
    expected = math.log1p(q * q * math.expm1(1.0 / sigma**2))
    got = subsampled_gaussian_rdp(sigma, q, [2.0])[0]
    assert got == pytest.approx(expected, rel=1e-13)


@pytest.mark.parametrize(
    "q,sigma", [(1e-6, 1.0), (1e-3, 0.8), (0.01, 2.0), (0.2, 1.5), (0.7, 3.0), (0.95, 4.0)]
)
def test_integer_orders_match_brute_force(q, sigma):
    orders = [2, 3, 5, 8, 13, 32, 64]
    got = subsampled_gaussian_rdp(sigma, q, orders)
    want = np.array([_log_a_brute_int(q, sigma, a) / (a - 1) for a in orders])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


# ----------------------------------------------------------------------------------------------
# dp_accounting cross-checks


def test_epsilon_matches_dp_accounting_rdp_accountant():
    q, sigma, steps, delta = 0.01, 1.0, 1000, 1e-6
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    theirs = acc.get_epsilon(delta)
    assert theirs == pytest.approx(2.436694, abs=1e-6)  # the published reference value
    dpa_orders = np.array(dpa_rdp.DEFAULT_RDP_ORDERS, dtype=float)
    ours = epsilon_subsampled_gaussian_rdp(sigma, q, steps, delta, orders=dpa_orders)
    assert ours == pytest.approx(2.436694, abs=1e-5)
    assert ours == pytest.approx(theirs, rel=1e-9)
    # Our default grid contains the optimal order (8), so it gives the same number.
    ours_default = epsilon_subsampled_gaussian_rdp(sigma, q, steps, delta)
    assert ours_default == pytest.approx(theirs, rel=1e-9)


GRID_Q = [1e-3, 0.01, 0.05, 0.2, 0.5, 0.9]
GRID_SIGMA = [0.5, 0.8, 1.0, 2.0, 5.0]


@pytest.mark.parametrize("q", GRID_Q)
def test_integer_orders_equal_dp_accounting(q):
    orders = np.array([2.0, 3.0, 4.0, 8.0, 16.0, 32.0, 64.0, 256.0])
    for sigma in GRID_SIGMA:
        ours = subsampled_gaussian_rdp(sigma, q, orders)
        theirs = _dpa_rdp(q, sigma, orders)
        np.testing.assert_allclose(ours, theirs, rtol=1e-8, err_msg=f"q={q}, sigma={sigma}")


@pytest.mark.parametrize("q", GRID_Q)
def test_fractional_orders_never_above_dp_accounting(q):
    # dp_accounting 0.6.0 sums |C(alpha, k)| (gammaln drops the sign), an upper bound on the
    # exact series; ours is the exact value (next test), so it is never above theirs where
    # theirs is finite. Compared on log A = (alpha - 1) * rdp, the computed quantity.
    orders = np.array([1.1, 1.25, 1.5, 1.75, 2.5, 3.3, 4.5, 7.25, 9.9, 20.5, 60.5])
    for sigma in GRID_SIGMA:
        ours = subsampled_gaussian_rdp(sigma, q, orders) * (orders - 1)
        theirs = _dpa_rdp(q, sigma, orders) * (orders - 1)
        fin = np.isfinite(theirs)
        assert np.all(ours[fin] <= theirs[fin] + 2e-13 + 1e-12 * theirs[fin]), (q, sigma)


def test_dp_accounting_fractional_overestimate_is_real():
    # The documented gap: dp_accounting is ~4% above the exact value here, and quadrature
    # (independent of both series) sides with us.
    q, sigma, alpha = 0.01, 1.0, 1.5
    ours = subsampled_gaussian_rdp(sigma, q, [alpha])[0]
    theirs = _dpa_rdp(q, sigma, [alpha])[0]
    exact = _log_a_quadrature(q, sigma, alpha) / (alpha - 1)
    assert ours == pytest.approx(exact, rel=1e-9)
    assert theirs / ours - 1 == pytest.approx(0.0402, abs=5e-4)


@pytest.mark.parametrize(
    "q,sigma",
    [(1e-3, 0.5), (0.01, 1.0), (0.06, 1.0), (0.1, 0.8), (0.3, 2.0), (0.5, 5.0), (0.9, 0.6)],
)
def test_fractional_orders_match_quadrature(q, sigma):
    orders = [1.1, 1.3, 1.75, 2.5, 4.2, 9.9, 30.5]
    ours = subsampled_gaussian_rdp(sigma, q, orders) * (np.array(orders) - 1)
    exact = np.array([_log_a_quadrature(q, sigma, a) for a in orders])
    assert np.all(_log_a_close(ours, exact)), (ours, exact)
    # Soundness: never below the truth beyond the quadrature's own error.
    assert np.all(ours >= exact - 1e-13 * (1 + np.abs(exact)))
    # Where the value is not tiny, relative agreement of the RDP itself.
    big = exact > 1e-4
    np.testing.assert_allclose(ours[big], exact[big], rtol=1e-8)


@pytest.mark.parametrize(
    "q,sigma,alpha", [(0.01, 1.0, 2.0), (0.2, 0.7, 3.5), (0.6, 1.5, 1.4), (0.05, 0.5, 8.0)]
)
def test_add_direction_dominates_remove_direction(q, sigma, alpha):
    # The value is valid for both adjacency directions: B_alpha <= A_alpha (Mironov et al.).
    log_a = subsampled_gaussian_rdp(sigma, q, [alpha])[0] * (alpha - 1)
    log_b = _log_a_quadrature(q, sigma, alpha, reverse=True)
    assert log_b <= log_a * (1 + 1e-12)
    assert log_b > 0  # the check is not vacuous


# ----------------------------------------------------------------------------------------------
# the dp_accounting trouble region


def test_no_warnings_and_no_nan_in_trouble_region():
    orders = np.linspace(1.1, 2.3, 13)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for q in (0.06, 0.1, 0.25, 0.5, 0.9):
            for sigma in (0.8, 1.0, 1.25, 5.0):
                v = subsampled_gaussian_rdp(sigma, q, orders)
                assert not np.any(np.isnan(v))
                assert np.all(np.isfinite(v) & (v >= 0)), (q, sigma, v)
                assert np.all(v <= gaussian_rdp(sigma, orders))
    # A point where dp_accounting gives up (inf plus a warning): we have the exact value.
    q, sigma, alpha = 0.5, 5.0, 1.1
    exact = _log_a_quadrature(q, sigma, alpha) / (alpha - 1)
    assert subsampled_gaussian_rdp(sigma, q, [alpha])[0] == pytest.approx(exact, rel=1e-8)


def test_extreme_inputs_are_finite_or_inf_never_nan():
    orders = np.array([1.0000001, 1.001, 1.5, 2.0, 7.7, 100.5, 1000.5, 1024.0, 4096.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for q in (1e-12, 1e-6, 0.5, 1 - 1e-12):
            for sigma in (1e-3, 0.1, 30.0, 1e6):
                v = subsampled_gaussian_rdp(sigma, q, orders)
                assert not np.any(np.isnan(v)) and np.all(v >= 0)
                assert np.all(v <= gaussian_rdp(sigma, orders) * (1 + 1e-12))
        assert np.all(np.isinf(subsampled_gaussian_rdp(1e-200, 0.5, [1.5, 2.0])))
        # Orders beyond the series range fall back to the convexity bound: finite, <= Gaussian.
        huge = np.array([1e5, 1e300])
        v = subsampled_gaussian_rdp(100.0, 0.01, huge)
        assert np.all(np.isfinite(v)) and np.all(v <= gaussian_rdp(100.0, huge))


# ----------------------------------------------------------------------------------------------
# conversion


def _random_rdp(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.uniform(-9, 2)
    rdp = scale * DEFAULT_ORDERS[:n] ** rng.uniform(0.5, 2.0) * rng.lognormal(0, 0.3, n)
    rdp[rng.random(n) < 0.1] = np.inf
    rdp[rng.random(n) < 0.05] = 0.0
    return rdp


@PROP
@given(seed=st.integers(0, 2**32 - 1), log_delta=st.floats(-12, -0.5))
def test_conversion_equals_dp_accounting(seed, log_delta):
    delta = 10.0**log_delta
    o = DEFAULT_ORDERS
    rdp = _random_rdp(seed, o.size)
    eps, order = rdp_to_epsilon(o, rdp, delta)
    t_eps, t_order = dpa_rdp.compute_epsilon(o, rdp, delta)
    if math.isinf(t_eps):
        assert math.isinf(eps) and math.isnan(order)
    else:
        assert eps == pytest.approx(t_eps, rel=1e-12, abs=1e-15)
        assert order == t_order
    if np.isfinite(eps) and eps > 0:
        d, d_order = rdp_to_delta(o, rdp, eps)
        t_d, t_d_order = dpa_rdp.compute_delta(o, rdp, eps)
        assert d == pytest.approx(t_d, rel=1e-9, abs=1e-300)
        assert d_order == t_d_order
        # Converting back never claims more than the delta we started from.
        assert d <= delta * (1 + 1e-9)


@PROP
@given(
    alpha=st.floats(1.02, 200.0),
    rdp=st.floats(1e-3, 50.0),
    log_delta=st.floats(-12, -1),
)
def test_rdp_to_delta_inverts_rdp_to_epsilon(alpha, rdp, log_delta):
    delta = 10.0**log_delta
    eps, _ = rdp_to_epsilon([alpha], [rdp], delta)
    kl_log_delta = 0.5 * math.log(-math.expm1(-rdp))
    if eps > 1e-9 and kl_log_delta > math.log(delta) + 1e-6:  # the CKS branch is active
        d, _ = rdp_to_delta([alpha], [rdp], eps)
        assert d == pytest.approx(delta, rel=1e-8)


def test_conversion_edge_cases():
    o = np.array([2.0, 4.0])
    assert rdp_to_epsilon(o, [np.inf, np.inf], 1e-5)[0] == math.inf
    assert math.isnan(rdp_to_epsilon(o, [np.inf, np.inf], 1e-5)[1])
    assert rdp_to_epsilon(o, [0.0, 0.0], 1e-5) == (0.0, 2.0)
    assert rdp_to_delta(o, [np.inf, np.inf], 1.0)[0] == 1.0
    assert rdp_to_delta(o, [0.0, 0.0], 0.0)[0] == 0.0
    # delta is capped at one
    assert rdp_to_delta(o, [50.0, 80.0], 0.0)[0] == 1.0
    # a single finite order among infinities is used
    eps, order = rdp_to_epsilon([2.0, 3.0], [np.inf, 0.5], 1e-5)
    expected = 0.5 + math.log1p(-1 / 3) - (math.log(1e-5) + math.log(3)) / 2
    assert order == 3.0 and eps == pytest.approx(expected, rel=1e-14)


# ----------------------------------------------------------------------------------------------
# properties


def _log_a(sigma, q):
    return subsampled_gaussian_rdp(sigma, q, ORDERS) * (ORDERS - 1)


_SLACK = lambda v: 2e-13 + 1e-12 * np.abs(v)  # noqa: E731  (log A floating-point floor)


@PROP
@given(
    q1=st.floats(1e-4, 1.0),
    q2=st.floats(1e-4, 1.0),
    sigma=st.floats(0.4, 20.0),
)
def test_monotone_non_decreasing_in_sampling_prob(q1, q2, sigma):
    lo, hi = sorted((q1, q2))
    a, b = _log_a(sigma, lo), _log_a(sigma, hi)
    assert np.all(b >= a - _SLACK(a))


@PROP
@given(
    s1=st.floats(0.4, 20.0),
    s2=st.floats(0.4, 20.0),
    q=st.floats(1e-4, 1.0),
)
def test_monotone_non_increasing_in_sigma(s1, s2, q):
    lo, hi = sorted((s1, s2))
    a, b = _log_a(lo, q), _log_a(hi, q)
    assert np.all(b <= a + _SLACK(a))


@PROP
@given(q=st.floats(1e-4, 1.0), sigma=st.floats(0.4, 20.0))
def test_bounded_by_gaussian_and_non_decreasing_in_order(q, sigma):
    v = subsampled_gaussian_rdp(sigma, q, DEFAULT_ORDERS)
    assert np.all(v >= 0) and not np.any(np.isnan(v))
    assert np.all(v <= gaussian_rdp(sigma, DEFAULT_ORDERS) * (1 + 1e-12))
    # Rényi divergence is non-decreasing in the order.
    assert np.all(np.diff(v) >= -(1e-12 * v[1:] + 2e-13 / (DEFAULT_ORDERS[1:] - 1)))


@PROP
@given(
    d1=st.floats(1e-12, 0.5),
    d2=st.floats(1e-12, 0.5),
    q=st.floats(1e-3, 1.0),
    sigma=st.floats(0.5, 10.0),
    steps=st.integers(1, 10_000),
)
def test_epsilon_non_increasing_in_delta(d1, d2, q, sigma, steps):
    lo, hi = sorted((d1, d2))
    e_lo = epsilon_subsampled_gaussian_rdp(sigma, q, steps, lo, orders=ORDERS)
    e_hi = epsilon_subsampled_gaussian_rdp(sigma, q, steps, hi, orders=ORDERS)
    assert e_hi <= e_lo


@PROP
@given(
    t1=st.integers(1, 100_000),
    t2=st.integers(1, 100_000),
    q=st.floats(1e-3, 1.0),
    sigma=st.floats(0.5, 10.0),
)
def test_epsilon_non_decreasing_in_steps(t1, t2, q, sigma):
    lo, hi = sorted((t1, t2))
    e_lo = epsilon_subsampled_gaussian_rdp(sigma, q, lo, 1e-6, orders=ORDERS)
    e_hi = epsilon_subsampled_gaussian_rdp(sigma, q, hi, 1e-6, orders=ORDERS)
    assert e_hi >= e_lo


@pytest.mark.parametrize(
    "q,sigma,steps,delta",
    [(0.01, 1.0, 200, 1e-5), (0.1, 2.0, 50, 1e-6), (1.0, 3.0, 10, 1e-5), (0.5, 4.0, 20, 1e-5)],
)
def test_rdp_epsilon_at_least_optimistic_pld_epsilon(q, sigma, steps, delta):
    # The optimistic PLD (rounding down) gives a lower bound on the true epsilon; any sound
    # upper bound must be above it. RDP is known to be loose, but not wildly so.
    pld = dpa_pld.from_gaussian_mechanism(
        sigma, pessimistic_estimate=False, sampling_prob=q, value_discretization_interval=1e-3
    ).self_compose(steps)
    lower = pld.get_epsilon_for_delta(delta)
    ours = epsilon_subsampled_gaussian_rdp(sigma, q, steps, delta)
    assert lower > 0
    assert lower <= ours <= 2.0 * lower


def test_rdp_epsilon_at_least_pld_accountant_epsilon():
    q, sigma, steps, delta = 0.05, 1.5, 100, 1e-5
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    pld_eps = acc.get_epsilon(delta)  # pessimistic, but far tighter than RDP
    ours = epsilon_subsampled_gaussian_rdp(sigma, q, steps, delta)
    assert pld_eps < ours < 2.0 * pld_eps


# ----------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize(
    "call,name",
    [
        (lambda: gaussian_rdp(float("nan"), [2.0]), "noise_multiplier"),
        (lambda: gaussian_rdp(-1.0, [2.0]), "noise_multiplier"),
        (lambda: gaussian_rdp(0.0, [2.0]), "noise_multiplier"),
        (lambda: gaussian_rdp(float("inf"), [2.0]), "noise_multiplier"),
        (lambda: gaussian_rdp(1.0, [2.0], sensitivity=-1.0), "sensitivity"),
        (lambda: subsampled_gaussian_rdp(-1.0, 0.1, [2.0]), "noise_multiplier"),
        (lambda: subsampled_gaussian_rdp(float("nan"), 0.1, [2.0]), "noise_multiplier"),
        (lambda: subsampled_gaussian_rdp(1.0, 1.5, [2.0]), "sampling_prob"),
        (lambda: subsampled_gaussian_rdp(1.0, -0.1, [2.0]), "sampling_prob"),
        (lambda: subsampled_gaussian_rdp(1.0, float("nan"), [2.0]), "sampling_prob"),
        (lambda: subsampled_gaussian_rdp(1.0, 0.1, [1.0, 2.0]), "orders"),
        (lambda: subsampled_gaussian_rdp(1.0, 0.1, [0.5]), "orders"),
        (lambda: subsampled_gaussian_rdp(1.0, 0.1, [2.0, float("nan")]), "orders"),
        (lambda: subsampled_gaussian_rdp(1.0, 0.1, [2.0, float("inf")]), "orders"),
        (lambda: subsampled_gaussian_rdp(1.0, 0.1, []), "orders"),
        (lambda: subsampled_gaussian_rdp(1.0, 0.1, [[2.0, 3.0]]), "orders"),
        (lambda: subsampled_gaussian_rdp(1.0, 0.1, ["a"]), "orders"),
        (lambda: rdp_to_epsilon([2.0], [0.1], 0.0), "delta"),
        (lambda: rdp_to_epsilon([2.0], [0.1], 1.0), "delta"),
        (lambda: rdp_to_epsilon([2.0], [0.1], float("nan")), "delta"),
        (lambda: rdp_to_epsilon([2.0, 3.0], [0.1], 1e-5), "rdp"),
        (lambda: rdp_to_epsilon([2.0], [float("nan")], 1e-5), "rdp"),
        (lambda: rdp_to_epsilon([2.0], [-0.1], 1e-5), "rdp"),
        (lambda: rdp_to_epsilon([1.0], [0.1], 1e-5), "orders"),
        (lambda: rdp_to_delta([2.0], [0.1], -1.0), "epsilon"),
        (lambda: rdp_to_delta([2.0], [0.1], float("nan")), "epsilon"),
        (lambda: epsilon_subsampled_gaussian_rdp(1.0, 0.1, 0, 1e-5), "steps"),
        (lambda: epsilon_subsampled_gaussian_rdp(1.0, 0.1, 2.5, 1e-5), "steps"),
        (lambda: epsilon_subsampled_gaussian_rdp(1.0, 0.1, -3, 1e-5), "steps"),
        (lambda: epsilon_subsampled_gaussian_rdp(1.0, 0.1, 10, 0.0), "delta"),
        (lambda: epsilon_subsampled_gaussian_rdp(1.0, 0.1, 10, 1.0), "delta"),
        (lambda: epsilon_subsampled_gaussian_rdp(-1.0, 0.1, 10, 1e-5), "noise_multiplier"),
        (lambda: epsilon_subsampled_gaussian_rdp(1.0, 2.0, 10, 1e-5), "sampling_prob"),
    ],
)
def test_bad_input_raises_naming_the_argument(call, name):
    with pytest.raises(InvalidParameterError, match=name):
        call()
