"""mu-GDP <-> (epsilon, delta): closed-form oracles, dp_accounting's exact Gaussian calibration,
a high-precision (mpmath) oracle far in the tails, safe-side inversions, monotonicity, bad input."""

from __future__ import annotations

import math

import dp_accounting
import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmf.errors import InvalidParameterError
from dpmf.privacy import gaussian_delta, gaussian_epsilon, gdp_delta, gdp_epsilon, gdp_mu


def exact_delta(mu: float, eps: float, dps: int = 120) -> float:
    """delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), in 120-digit arithmetic."""
    with mpmath.workdps(dps):
        mu_, eps_ = mpmath.mpf(mu), mpmath.mpf(eps)
        a = mpmath.ncdf(-eps_ / mu_ + mu_ / 2)
        b = mpmath.exp(eps_) * mpmath.ncdf(-eps_ / mu_ - mu_ / 2)
        return float(max(a - b, mpmath.mpf(0)))


# ------------------------------------------------------------------------------ oracles
def test_delta_oracle_mu1_eps1():
    assert gdp_delta(1.0, 1.0) == pytest.approx(0.12693674, abs=5e-9)


def test_delta_oracle_gaussian_sensitivity_3():
    # sigma = 1, sensitivity 3 is mu = 3 GDP.
    assert gaussian_delta(1.0, 1.0, sensitivity=3.0) == pytest.approx(0.78760074, abs=5e-9)
    assert gdp_delta(3.0, 1.0) == pytest.approx(0.78760074, abs=5e-9)
    assert gaussian_delta(2.0, 1.0, sensitivity=6.0) == pytest.approx(gdp_delta(3.0, 1.0), rel=1e-14)


def test_delta_at_zero_epsilon_is_total_variation():
    # delta(0) = TV(N(0,1), N(mu,1)) = 2 Phi(mu/2) - 1.
    for mu in (1e-3, 0.5, 1.0, 4.0):
        assert gdp_delta(mu, 0.0) == pytest.approx(math.erf(mu / (2 * math.sqrt(2))), rel=1e-12)


@pytest.mark.parametrize("mu", [1e-3, 0.1, 1.0, 5.0, 50.0])
@pytest.mark.parametrize("eps", [0.0, 0.01, 1.0, 10.0, 300.0])
def test_delta_matches_high_precision(mu, eps):
    expected = exact_delta(mu, eps)
    got = gdp_delta(mu, eps)
    if expected < 1e-300:
        assert got < 1e-290
    else:
        assert got == pytest.approx(expected, rel=1e-9)


# ------------------------------------------------------------- dp_accounting agreement
GRID = [(mu, d) for mu in (1e-3, 0.1, 1.0, 5.0, 50.0) for d in (1e-100, 1e-10, 1e-6, 0.1)]


@pytest.mark.parametrize("mu,delta", GRID)
def test_epsilon_equals_dp_accounting(mu, delta):
    # dp_accounting: sensitivity 1, standard deviation sigma = 1/mu.
    expected = dp_accounting.get_epsilon_gaussian(1.0 / mu, delta)
    assert gdp_epsilon(mu, delta) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert gaussian_epsilon(1.0 / mu, delta) == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("eps", [1e-3, 0.1, 1.0, 10.0, 100.0])
@pytest.mark.parametrize("delta", [1e-100, 1e-10, 1e-6, 0.1])
def test_mu_equals_dp_accounting(eps, delta):
    expected_sigma = dp_accounting.get_sigma_gaussian(eps, delta)
    assert gdp_mu(eps, delta) == pytest.approx(1.0 / expected_sigma, rel=1e-8)


def test_gaussian_epsilon_is_gdp_with_mu_sens_over_sigma():
    for sigma, sens in ((1.0, 1.0), (3.0, 2.0), (0.5, 7.0)):
        assert gaussian_epsilon(sigma, 1e-6, sens) == gdp_epsilon(sens / sigma, 1e-6)
        assert gaussian_epsilon(sigma, 1e-6, sens) == pytest.approx(
            dp_accounting.get_epsilon_gaussian(sigma / sens, 1e-6), rel=1e-9
        )


def test_zero_epsilon_when_delta_exceeds_total_variation():
    mu = 1e-3  # TV ~ 4e-4
    assert gdp_epsilon(mu, 0.1) == 0.0
    assert gdp_epsilon(mu, 1e-6) > 0


# --------------------------------------------------------------------- far in the tails
@pytest.mark.parametrize("mu", [1e-3, 50.0])
def test_tail_epsilon_at_delta_1e_100(mu):
    eps = gdp_epsilon(mu, 1e-100)
    assert math.isfinite(eps) and eps > 0
    # the high-precision delta at the returned epsilon is the target (tight) and not above it
    exact = exact_delta(mu, eps)
    assert exact == pytest.approx(1e-100, rel=1e-6)
    assert exact <= 1e-100 * (1 + 1e-9)
    # and a slightly smaller epsilon would not do
    assert exact_delta(mu, eps * (1 - 1e-7)) > 1e-100


@pytest.mark.parametrize("mu", [1e-3, 50.0])
def test_tail_mu_at_delta_1e_100(mu):
    eps = gdp_epsilon(mu, 1e-100)
    back = gdp_mu(eps, 1e-100)
    assert back == pytest.approx(mu, rel=1e-7)
    assert exact_delta(back, eps) <= 1e-100 * (1 + 1e-9)


def test_tail_delta_is_positive_and_accurate():
    # naive Phi(a) - e^eps Phi(b) would cancel to 0 or go negative here
    for mu, eps in ((1e-3, 0.02), (50.0, 2300.0), (1.0, 21.6)):
        expected = exact_delta(mu, eps)
        assert 1e-110 < expected < 1e-90
        assert gdp_delta(mu, eps) == pytest.approx(expected, rel=1e-8)


# ------------------------------------------------------------------ safe-side inversions
mus = st.floats(min_value=1e-3, max_value=50.0)
log_deltas = st.floats(min_value=-100.0, max_value=-0.1)
epsilons = st.floats(min_value=1e-3, max_value=100.0)


@settings(max_examples=150, deadline=None)
@given(mu=mus, log_delta=log_deltas)
def test_gdp_epsilon_is_tight_and_safe_up_to_rounding(mu, log_delta):
    delta = 10.0**log_delta
    eps = gdp_epsilon(mu, delta)
    assert gdp_delta(mu, eps) <= delta * (1 + 1e-12)
    if eps > 0:  # tight: a slightly smaller epsilon exceeds the target
        assert gdp_delta(mu, eps * (1 - 1e-8)) > delta


@settings(max_examples=150, deadline=None)
@given(eps=epsilons, log_delta=log_deltas)
def test_gdp_mu_is_tight_and_safe_up_to_rounding(eps, log_delta):
    delta = 10.0**log_delta
    mu = gdp_mu(eps, delta)
    assert gdp_delta(mu, eps) <= delta * (1 + 1e-12)
    assert gdp_delta(mu * (1 + 1e-8), eps) > delta


# Found by a random search (regression): the inversions once verified the target in log space,
# but gdp_delta exponentiates, and exp(log(delta)) can round one ulp above delta.
EPSILON_COUNTEREXAMPLES = [(0.98564365475186, 9.229582171270584e-74), (0.4847963285074324, 4.370869321263375e-100)]
MU_COUNTEREXAMPLES = [(0.001, 0.1), (0.1, 0.1), (14.093534611895517, 3.2933245776984386e-59)]


@pytest.mark.parametrize("mu,delta", EPSILON_COUNTEREXAMPLES)
def test_gdp_epsilon_exactly_safe_in_floating_point(mu, delta):
    assert gdp_delta(mu, gdp_epsilon(mu, delta)) <= delta


@pytest.mark.parametrize("eps,delta", MU_COUNTEREXAMPLES)
def test_gdp_mu_exactly_safe_in_floating_point(eps, delta):
    assert gdp_delta(gdp_mu(eps, delta), eps) <= delta


# ---------------------------------------------------------------------------- monotonicity
# Floating-point noise, not a defect: for mu ~ 1e-3 and delta < 1e-80 the profile is a difference
# of two nearly equal tails, so gdp_delta at adjacent floats can wiggle by ~4e-9 relative (it agrees
# with 150-digit mpmath to ~2e-9) and the inversions by ~1e-10. The slack is far below any real
# monotonicity error.
DELTA_SLACK = 1e-7
INVERSION_SLACK = 1e-8

@settings(max_examples=100, deadline=None)
@given(mu=mus, e1=st.floats(0.0, 200.0), e2=st.floats(0.0, 200.0))
def test_delta_non_increasing_in_epsilon(mu, e1, e2):
    lo, hi = sorted((e1, e2))
    assert gdp_delta(mu, hi) <= gdp_delta(mu, lo) * (1 + DELTA_SLACK)


@settings(max_examples=100, deadline=None)
@given(m1=mus, m2=mus, eps=st.floats(0.0, 200.0))
def test_delta_non_decreasing_in_mu(m1, m2, eps):
    lo, hi = sorted((m1, m2))
    assert gdp_delta(lo, eps) <= gdp_delta(hi, eps) * (1 + DELTA_SLACK) + 1e-300


@settings(max_examples=60, deadline=None)
@given(m1=mus, m2=mus, log_delta=log_deltas)
def test_epsilon_non_decreasing_in_mu(m1, m2, log_delta):
    lo, hi = sorted((m1, m2))
    delta = 10.0**log_delta
    assert gdp_epsilon(lo, delta) <= gdp_epsilon(hi, delta) * (1 + INVERSION_SLACK)


@settings(max_examples=60, deadline=None)
@given(mu=mus, l1=log_deltas, l2=log_deltas)
def test_epsilon_non_increasing_in_delta(mu, l1, l2):
    small, large = sorted((10.0**l1, 10.0**l2))
    assert gdp_epsilon(mu, large) <= gdp_epsilon(mu, small) * (1 + INVERSION_SLACK)


@settings(max_examples=60, deadline=None)
@given(e1=epsilons, e2=epsilons, log_delta=log_deltas)
def test_mu_non_decreasing_in_epsilon(e1, e2, log_delta):
    lo, hi = sorted((e1, e2))
    delta = 10.0**log_delta
    assert gdp_mu(lo, delta) <= gdp_mu(hi, delta) * (1 + INVERSION_SLACK)


# ------------------------------------------------------------------------------ bad input
NAN = float("nan")


@pytest.mark.parametrize(
    "call",
    [
        lambda: gdp_delta(0.0, 1.0),
        lambda: gdp_delta(-1.0, 1.0),
        lambda: gdp_delta(NAN, 1.0),
        lambda: gdp_delta(math.inf, 1.0),
        lambda: gdp_delta(1.0, -0.5),
        lambda: gdp_delta(1.0, NAN),
        lambda: gdp_delta("1", 1.0),
        lambda: gdp_delta(True, 1.0),
        lambda: gdp_epsilon(1.0, 0.0),
        lambda: gdp_epsilon(1.0, 1.0),
        lambda: gdp_epsilon(1.0, NAN),
        lambda: gdp_epsilon(0.0, 1e-6),
        lambda: gdp_epsilon(NAN, 1e-6),
        lambda: gdp_mu(-1.0, 1e-6),
        lambda: gdp_mu(NAN, 1e-6),
        lambda: gdp_mu(1.0, 0.0),
        lambda: gdp_mu(1.0, 1.5),
        lambda: gaussian_epsilon(0.0, 1e-6),
        lambda: gaussian_epsilon(1.0, 1e-6, sensitivity=0.0),
        lambda: gaussian_epsilon(1.0, 1e-6, sensitivity=NAN),
        lambda: gaussian_delta(-1.0, 1.0),
        lambda: gaussian_delta(1.0, -1.0),
    ],
)
def test_bad_input_raises(call):
    with pytest.raises(InvalidParameterError):
        call()


def test_error_message_names_the_argument():
    with pytest.raises(InvalidParameterError, match="delta"):
        gdp_epsilon(1.0, 2.0)
    with pytest.raises(InvalidParameterError, match="noise_multiplier"):
        gaussian_epsilon(-1.0, 1e-6)


# ----------------------------------------------------------------- safe side in exact arithmetic
def _exact_delta(mu: float, eps: float):
    mpmath.mp.dps = 80
    mu, eps = mpmath.mpf(mu), mpmath.mpf(eps)
    return mpmath.ncdf(-eps / mu + mu / 2) - mpmath.exp(eps) * mpmath.ncdf(-eps / mu - mu / 2)


@pytest.mark.parametrize("eps", [0.0, 1e-12, 1e-8, 1e-6, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0])
@pytest.mark.parametrize("delta", [1e-30, 1e-12, 1e-10, 1e-8, 1e-6, 1e-4, 1e-2, 0.3])
def test_gdp_mu_is_safe_for_the_exact_delta(eps, delta):
    # issue 14: with tiny epsilon and delta the profile is a difference of two nearly equal terms;
    # the float check alone accepted a mu whose exact delta was ~5e-12 (up to 1e-7) relative above
    mu = gdp_mu(eps, delta)
    assert _exact_delta(mu, eps) <= delta
    assert _exact_delta(mu * (1 + 1e-3), eps) > delta or eps <= 1e-8  # and still tight (0.1%)


@pytest.mark.parametrize("mu", [1e-9, 1e-6, 1e-3, 0.01, 0.1, 1.0, 10.0])
@pytest.mark.parametrize("delta", [1e-30, 1e-12, 1e-8, 1e-4, 0.3])
def test_gdp_epsilon_is_safe_for_the_exact_delta(mu, delta):
    from dpmf.privacy.gdp import gdp_epsilon_array

    eps = gdp_epsilon(mu, delta)
    assert _exact_delta(mu, eps) <= delta
    arr = float(gdp_epsilon_array([mu], delta)[0])
    assert _exact_delta(mu, arr) <= delta
    assert arr == pytest.approx(eps, rel=1e-4, abs=1e-12)


def test_gdp_mu_at_the_float_floor_is_a_result_not_an_exception():
    # brentq cannot converge this close to the smallest floats: the inversion bisects instead
    mu = gdp_mu(0.0, 1e-300)
    assert 0 < mu <= 1e-300 * math.sqrt(2 * math.pi) * (1 + 1e-9)
    assert gdp_mu(1e-12, 1e-300) > 0
