"""Calibration on closed-form accountants: the result passes, a slightly smaller noise (or one
more step) fails, the exact answer is bracketed, impossible targets raise, callbacks fire."""

from __future__ import annotations

import math

import pytest

from dpmf.errors import CalibrationError, InvalidParameterError
from dpmf.privacy import gaussian_epsilon, gdp_mu, largest_count, smallest_noise

DELTA = 1e-6


def gaussian_accountant(sensitivity: float):
    return lambda sigma: gaussian_epsilon(sigma, DELTA, sensitivity)


@pytest.mark.parametrize("sensitivity", [1.0, 3.0, 40.0])
@pytest.mark.parametrize("target", [0.1, 1.0, 8.0])
@pytest.mark.parametrize("initial", [0.01, 1.0, 100.0])  # grow and shrink branches
@pytest.mark.parametrize("rel_tol", [1e-4, 1e-7])
def test_smallest_noise_passes_and_is_smallest(sensitivity, target, initial, rel_tol):
    eps_of = gaussian_accountant(sensitivity)
    res = smallest_noise(eps_of, target, initial=initial, rel_tol=rel_tol)
    assert eps_of(res.value) <= target
    assert res.epsilon == eps_of(res.value)
    assert eps_of(res.value * (1 - 2 * rel_tol)) > target
    # the exact smallest noise is sens / mu*(eps, delta)
    exact = sensitivity / gdp_mu(target, DELTA)
    assert exact * (1 - 1e-12) <= res.value <= exact * (1 + 2 * rel_tol)
    assert res.evaluations == len(res.trace)
    assert (res.value, res.epsilon) in res.trace


def _allocation_like(sigma: float) -> float:
    """epsilon ~ sigma^-p with p steepening as sigma falls (``d log eps / d log sigma = -(1.6 + 0.6 / (1 +
    sigma^2))``: -1.65 at sigma 3.4, -1.8 at 1.5, the shape of random allocation's curves, README CLI
    example), times a jitter of 1e-5 relative (a grid's digits); non-increasing."""
    x = math.log(sigma)
    smooth = 2.2 * x - 0.3 * math.log1p(math.exp(2 * x))
    return 4.0 * math.exp(-smooth + 1e-5 * math.sin(1e4 * x))


@pytest.mark.parametrize("target", [0.5, 2.0, 4.0])
@pytest.mark.parametrize("initial", [0.05, 3.44, 40.0])  # grow and shrink branches
@pytest.mark.parametrize("accountant", ["allocation-like", "gaussian", "steps"])
def test_secant_search_keeps_the_contract_in_fewer_evaluations(target, initial, accountant):
    """``secant=True``: the answer passes, a noise less than ``rel_tol`` below it was evaluated and
    fails (the same contract as the default search), and on smooth accountants it takes no more
    evaluations than the default; a step function (no slope to follow) still ends."""
    eps_of = {"allocation-like": _allocation_like, "gaussian": gaussian_accountant(3.0),
              "steps": lambda s: math.ceil(8.0 / s) / 4.0}[accountant]
    plain = smallest_noise(eps_of, target, initial=initial, rel_tol=1e-4)
    fast = smallest_noise(eps_of, target, initial=initial, rel_tol=1e-4, secant=True)
    assert fast.epsilon == eps_of(fast.value) <= target
    assert any(fast.value * (1 - 1e-4) <= x < fast.value and e > target for x, e in fast.trace)
    assert fast.value == pytest.approx(plain.value, rel=2e-4) or accountant == "steps"
    if accountant != "steps":
        assert fast.evaluations <= plain.evaluations
    else:  # (a step function: both land on the same step's edge, to the tolerance)
        assert fast.value == pytest.approx(plain.value, rel=1e-4)


def test_secant_search_reads_revised_epsilons_for_its_steps_only():
    """``revised``: the secant steps read its epsilon in place of the one evaluated (``nan``: the point
    left out), the verdicts stay the evaluations'. Oracle: an accountant that reads 1% high at one noise
    above the answer (a cheaper bound steering there) bends the steps; ``revised`` giving the true
    epsilon there restores the path of the accountant read truly everywhere, step for step, and leaving
    the point out also keeps the contract; with ``revised=None`` the trace is read as evaluated
    (negative control: a different path)."""
    true = _allocation_like
    high = {}

    def biased(s: float) -> float:  # (1% high at the second noise, 13% above the answer 1.6368)
        e = true(s)
        if 1.850 <= s <= 1.852:
            high[s] = e
            return e * 1.01
        return e

    exact = smallest_noise(true, 2.0, initial=3.44, rel_tol=1e-4, secant=True)
    bent = smallest_noise(biased, 2.0, initial=3.44, rel_tol=1e-4, secant=True)
    fixed = smallest_noise(biased, 2.0, initial=3.44, rel_tol=1e-4, secant=True, revised=lambda s: high.get(s))
    assert high and [x for x, _ in fixed.trace] == [x for x, _ in exact.trace] != [x for x, _ in bent.trace]
    left_out = smallest_noise(biased, 2.0, initial=3.44, rel_tol=1e-4, secant=True,
                              revised=lambda s: math.nan if s in high else None)
    for res in (fixed, left_out):
        assert res.epsilon == biased(res.value) <= 2.0
        assert any(res.value * (1 - 1e-4) <= x < res.value and e > 2.0 for x, e in res.trace)


def test_smallest_noise_calls_callback_for_every_evaluation():
    calls = []
    res = smallest_noise(gaussian_accountant(2.0), 1.0, callback=lambda s, e: calls.append((s, e)))
    assert len(calls) == res.evaluations >= 2
    assert tuple(calls) == res.trace
    assert all(e == gaussian_epsilon(s, DELTA, 2.0) for s, e in calls)


def test_smallest_noise_impossible_target_raises():
    # epsilon never drops below 1 for this accountant
    with pytest.raises(CalibrationError):
        smallest_noise(lambda s: 1.0 + 1.0 / s, 0.5)
    # the Gaussian needs sigma ~ 5e4 for epsilon 1e-4: more than max_value
    with pytest.raises(CalibrationError, match="noise_multiplier"):
        smallest_noise(gaussian_accountant(1.0), 1e-4, max_value=100.0)


def test_smallest_noise_nan_accountant_raises():
    with pytest.raises(CalibrationError, match="NaN"):
        smallest_noise(lambda s: math.nan, 1.0)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_smallest_noise_bad_target_raises(bad):
    with pytest.raises(InvalidParameterError):
        smallest_noise(gaussian_accountant(1.0), bad)


# ------------------------------------------------------------------------- largest count
@pytest.mark.parametrize("sigma", [6.0, 15.0, 37.3])
@pytest.mark.parametrize("target", [1.0, 4.0])
def test_largest_count_for_repeated_gaussian(sigma, target):
    """n Gaussian releases of sensitivity 1 are one Gaussian of sensitivity sqrt(n)."""

    def eps_of(n: int) -> float:
        return gaussian_epsilon(sigma, DELTA, math.sqrt(n))

    res = largest_count(eps_of, target)
    n = int(res.value)
    assert n == res.value >= 1
    assert eps_of(n) <= target and res.epsilon == eps_of(n)
    assert eps_of(n + 1) > target
    # closed form: largest n with sqrt(n)/sigma <= mu*
    assert abs(n - math.floor((sigma * gdp_mu(target, DELTA)) ** 2)) <= 1


def test_largest_count_caps_at_max_count():
    res = largest_count(lambda n: 0.0 * n, 1.0, max_count=1000)
    assert res.value == 1000


def test_largest_count_callback_and_impossible():
    calls = []
    res = largest_count(lambda n: 0.1 * n, 1.05, callback=lambda n, e: calls.append((n, e)))
    assert res.value == 10
    assert tuple(calls) == res.trace and len(calls) == res.evaluations
    with pytest.raises(CalibrationError):
        largest_count(lambda n: 2.0 * n, 1.0)
    with pytest.raises(CalibrationError):  # one sigma = 1 Gaussian already costs 4.89
        largest_count(lambda n: gaussian_epsilon(1.0, DELTA, math.sqrt(n)), 4.0)
    with pytest.raises(InvalidParameterError):
        largest_count(lambda n: 0.1 * n, -1.0)


def test_check_limit_passes_or_raises_with_the_epsilon_there():
    from dpmf.errors import NoiseTooSmallError
    from dpmf.privacy.calibration import NoiseLimitExceeded, check_limit

    eps_of = gaussian_accountant(1.0)
    exact = 1.0 / gdp_mu(1.0, DELTA)  # (the smallest noise meeting epsilon 1)
    seen = []
    assert check_limit(eps_of, 1.0, exact * 1.01, callback=lambda s, e: seen.append((s, e))) == eps_of(exact * 1.01)
    assert seen == [(exact * 1.01, eps_of(exact * 1.01))]
    with pytest.raises(NoiseLimitExceeded) as err:
        check_limit(eps_of, 1.0, exact * 0.99)
    assert err.value.limit == exact * 0.99 and err.value.epsilon == eps_of(exact * 0.99) > 1.0

    def refuses(sigma):
        raise NoiseTooSmallError("too small", smallest=2.0 * sigma)

    with pytest.raises(NoiseLimitExceeded) as err:
        check_limit(refuses, 1.0, 0.5)
    assert err.value.limit == 0.5 and math.isinf(err.value.epsilon)
