"""`dpmf.account` / `dpmf.calibrate`: DP-SGD against dp_accounting and the published 2.1245,
fixed order against the closed-form Gaussian, C = I as a mixture of Gaussians, the report,
dispatch rules, calibration, and monotonicity properties."""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st

import dpmf
from dpmf.accounting import PrivacyReport
from dpmf.errors import DPMFError, InvalidParameterError, UnsupportedConfigurationError
from dpmf.privacy import gaussian_epsilon, mixture_of_gaussians
from dpmf.sampling import FixedOrderSampling, PoissonSampling
from dpmf.strategies import Identity

Q, SIGMA, T, DELTA = 0.01, 1.0, 1000, 1e-6


@pytest.fixture(scope="module")
def dpsgd_report() -> PrivacyReport:
    return dpmf.account(Identity(T), PoissonSampling(Q, T), SIGMA, DELTA)


# ----------------------------------------------------------------------------- DP-SGD
def test_dpsgd_published_value(dpsgd_report):
    # notes/peer-libraries.md: dp_accounting and prv_accountant agree on 2.1245
    assert dpsgd_report.epsilon == pytest.approx(2.1245, abs=2e-3)
    assert dpsgd_report.method == "pld"
    assert dpsgd_report.certified is True
    by_dir = dpsgd_report.epsilon_by_direction
    assert dpsgd_report.epsilon == max(by_dir.values()) == by_dir["remove"]
    assert by_dir["add"] < by_dir["remove"] - 0.3  # the directions really differ
    assert dpsgd_report.noise_multiplier == SIGMA and dpsgd_report.delta == DELTA


def test_dpsgd_equals_dp_accounting(dpsgd_report):
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA)), T)
    expected = acc.get_epsilon(DELTA)
    assert dpsgd_report.epsilon == pytest.approx(expected, abs=1e-6)
    assert dpsgd_report.epsilon >= expected - 1e-6


def test_dpsgd_equals_self_composed_mixture_of_gaussians(dpsgd_report):
    pld = mixture_of_gaussians([0.0, 1.0], [1 - Q, Q], SIGMA).self_compose(T)
    assert pld.epsilon(DELTA) == pytest.approx(dpsgd_report.epsilon, abs=1e-5)


def test_auto_reports_every_method_and_picks_the_smallest(dpsgd_report):
    others = dpsgd_report.diagnostics["all_methods"]
    assert set(others) == {"pld", "unamplified"}  # never the Monte Carlo estimate
    assert dpsgd_report.epsilon == min(others.values()) == others["pld"]
    # MMCC with C = I is exactly DP-SGD: auto skips it and says so (it cannot win)
    assert "mmcc" in dpsgd_report.diagnostics["skipped_methods"]
    mmcc = dpmf.account(Identity(T), PoissonSampling(Q, T), SIGMA, DELTA, method="mmcc")
    assert mmcc.epsilon == others["pld"]
    # unamplified = Gaussian with sensitivity sqrt(T): an example may be drawn every step
    assert others["unamplified"] == pytest.approx(gaussian_epsilon(SIGMA, DELTA, math.sqrt(T)), rel=1e-12)


def test_auto_picks_unamplified_when_it_is_tighter():
    # q = 1: every step is the full Gaussian, T of them are exactly one Gaussian of sensitivity
    # sqrt(T); the closed form is exact, the PLD pessimistic, so 'unamplified' must win.
    strat, scheme = Identity(10), PoissonSampling(1.0, 10)
    auto = dpmf.account(strat, scheme, 3.0, 1e-5)
    pld = dpmf.account(strat, scheme, 3.0, 1e-5, method="pld")
    unamp = dpmf.account(strat, scheme, 3.0, 1e-5, method="unamplified")
    assert unamp.epsilon == pytest.approx(gaussian_epsilon(3.0, 1e-5, math.sqrt(10)), rel=1e-14)
    assert unamp.epsilon <= pld.epsilon <= unamp.epsilon + 1e-3
    assert auto.method == "unamplified" and auto.epsilon == unamp.epsilon


# ------------------------------------------------------------------------ fixed order
@pytest.mark.parametrize("epochs,sigma", [(1, 1.0), (4, 2.0), (10, 7.5), (50, 3.0)])
def test_fixed_order_identity_is_gaussian_with_sensitivity_sqrt_k(epochs, sigma):
    steps = 100 * epochs
    report = dpmf.account(Identity(steps), FixedOrderSampling(epochs, steps), sigma, DELTA)
    expected = dp_accounting.get_epsilon_gaussian(sigma / math.sqrt(epochs), DELTA)
    assert report.epsilon == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert report.method == "unamplified" and report.certified
    assert report.epsilon_by_direction == {"remove": report.epsilon, "add": report.epsilon}
    assert report.diagnostics["sensitivity"] == pytest.approx(math.sqrt(epochs))


def test_fixed_order_calibration_is_exact():
    cal = dpmf.calibrate(Identity(400), FixedOrderSampling(4, 400), 1.0, DELTA)
    expected = 2.0 * dp_accounting.get_sigma_gaussian(1.0, DELTA)
    assert cal.noise_multiplier == pytest.approx(expected, rel=1e-9)
    assert cal.report.epsilon <= 1.0
    assert cal.report.noise_multiplier == cal.noise_multiplier


# ------------------------------------------------------------------------------ report
def test_report_json_round_trips(dpsgd_report):
    text = dpsgd_report.to_json()
    data = json.loads(text)
    for key in ("epsilon", "delta", "noise_multiplier", "method", "certified", "dpmf_version"):
        assert key in data
    assert data == dpsgd_report.to_dict()
    assert data["epsilon"] == dpsgd_report.epsilon
    assert data["dpmf_version"] == dpmf.__version__
    assert data["epsilon_by_direction"] == dpsgd_report.epsilon_by_direction
    assert data["scheme"] == {"name": "poisson", "sampling_prob": Q, "steps": T}
    assert "worst of both directions" in data["adjacency"]
    assert "2.1245" in dpsgd_report.summary() and "certified" in dpsgd_report.summary()


def test_report_with_infinite_epsilon_is_strict_json():
    report = PrivacyReport(
        epsilon=math.inf, delta=1e-6, noise_multiplier=1.0, method="x", certified=False,
        epsilon_by_direction={"remove": math.inf, "add": 1.0}, strategy={}, scheme={},
    )

    def reject(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    data = json.loads(report.to_json(), parse_constant=reject)
    assert data["epsilon"] == "inf" and data["epsilon_by_direction"]["remove"] == "inf"
    assert "ESTIMATE" in report.summary()


# ------------------------------------------------------------------------------ dispatch
def test_unsupported_method_raises():
    with pytest.raises(UnsupportedConfigurationError, match="pld"):
        dpmf.account(Identity(100), FixedOrderSampling(2, 100), 1.0, DELTA, method="pld")
    with pytest.raises(UnsupportedConfigurationError):
        dpmf.calibrate(Identity(100), FixedOrderSampling(2, 100), 1.0, DELTA, method="pld")
    with pytest.raises(InvalidParameterError, match="method"):
        dpmf.account(Identity(100), FixedOrderSampling(2, 100), 1.0, DELTA, method="nonsense")


def test_strategy_length_must_match_steps():
    with pytest.raises(InvalidParameterError, match="steps"):
        dpmf.account(Identity(100), PoissonSampling(Q, 1000), 1.0, DELTA)
    with pytest.raises(InvalidParameterError, match="steps"):
        dpmf.calibrate(Identity(100), FixedOrderSampling(2, 200), 1.0, DELTA)


@pytest.mark.parametrize(
    "sigma,delta",
    [(0.0, DELTA), (-1.0, DELTA), (float("nan"), DELTA), (1.0, 0.0), (1.0, 1.0), (1.0, float("nan"))],
)
def test_bad_noise_or_delta_raises(sigma, delta):
    with pytest.raises(InvalidParameterError):
        dpmf.account(Identity(10), PoissonSampling(Q, 10), sigma, delta)


def test_bad_scheme_and_target_raise():
    with pytest.raises(InvalidParameterError, match="scheme"):
        dpmf.account(Identity(10), object(), 1.0, DELTA)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(DPMFError):
            dpmf.calibrate(Identity(10), PoissonSampling(Q, 10), bad, DELTA)


# ---------------------------------------------------------------------------- calibrate
def test_calibrate_dpsgd_to_epsilon_1():
    cal = dpmf.calibrate(Identity(T), PoissonSampling(Q, T), 1.0, DELTA)
    assert cal.noise_multiplier == pytest.approx(1.5627, abs=5e-3)
    assert cal.report.epsilon <= 1.0
    assert cal.report.noise_multiplier == cal.noise_multiplier
    assert cal.report.method == "pld"
    # it is (nearly) the smallest: 2 rel_tol less noise misses the target
    below = dpmf.account(Identity(T), PoissonSampling(Q, T), cal.noise_multiplier * (1 - 2e-4), DELTA)
    assert below.epsilon > 1.0


def test_calibrate_reports_progress():
    calls = []
    cal = dpmf.calibrate(
        Identity(5), PoissonSampling(0.05, 5), 0.1, 1e-5, method="pld", callback=lambda s, e: calls.append((s, e))
    )
    assert len(calls) == cal.evaluations >= 2
    assert (cal.noise_multiplier, cal.report.epsilon) in calls


# --------------------------------------------------------------------------- properties
# sigma >= 1.5 keeps the PLD grid small (each account call ~0.2 s); T <= 8.
PROPS = settings(max_examples=5, deadline=None)
sigmas = st.floats(min_value=1.5, max_value=4.0)
qs = st.floats(min_value=0.001, max_value=0.3)
ts = st.integers(min_value=1, max_value=8)


def eps(sigma: float, q: float, steps: int) -> float:
    return dpmf.account(Identity(steps), PoissonSampling(q, steps), sigma, 1e-5).epsilon


@PROPS
@given(sigma=sigmas, factor=st.floats(1.01, 2.0), q=qs, steps=ts)
def test_epsilon_non_increasing_in_sigma(sigma, factor, q, steps):
    assert eps(sigma * factor, q, steps) <= eps(sigma, q, steps)


@PROPS
@given(sigma=sigmas, q=qs, factor=st.floats(1.01, 3.0), steps=ts)
def test_epsilon_non_decreasing_in_q(sigma, q, factor, steps):
    assert eps(sigma, q, steps) <= eps(sigma, min(1.0, q * factor), steps)


@PROPS
@given(sigma=sigmas, q=qs, steps=ts, extra=st.integers(1, 4))
def test_epsilon_non_decreasing_in_steps(sigma, q, steps, extra):
    assert eps(sigma, q, steps) <= eps(sigma, q, steps + extra)
