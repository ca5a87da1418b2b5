"""Calibration under random allocation: the combined search's shortcut, the limit, and the order in
which ``dpmf.calibrate`` runs the allocation accountants.

Oracles: the accountant itself evaluated afresh (a calibrated noise passes and a noise just below it
fails), the two-stage search the shortcut replaces (Rényi search, then a combined search from its
answer), and each method calibrated alone.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

import dpmf
from dpmf.accounting import dispatch
from dpmf.accounting.allocation import account_allocation, calibrate_allocation
from dpmf.accounting.allocation import pld as allocation_pld
from dpmf.accounting.allocation.accountant import noise_and_report
from dpmf.privacy.calibration import NoiseLimitExceeded, smallest_noise
from dpmf.sampling import BallsInBinsSampling
from dpmf.strategies import Identity, bsr

DELTA = 1e-5


def _eps(strategy, scheme, sigma, **options):
    return account_allocation(strategy, scheme, sigma, DELTA, **options).epsilon


def _two_stage(strategy, scheme, target, rel_tol=1e-4):
    """The calibration before the shortcut: Renyi search, then a combined search from its answer."""
    renyi = smallest_noise(lambda s: _eps(strategy, scheme, s, which="renyi"), target, rel_tol=rel_tol).value
    return smallest_noise(lambda s: _eps(strategy, scheme, s), target, initial=renyi, rel_tol=rel_tol).value


def test_renyi_answer_when_conditional_cannot_help():
    """BandMF (2 bands, one epoch of 8 steps): conditional composition and the Gaussian cap are above the
    target at the Renyi answer, so the combined answer is the Renyi one, found to rel_tol / 100: it
    passes, a noise 1.01e-6 below it fails, and it is not above the two-stage search's answer."""
    strategy, scheme, target = bsr(8, 2), BallsInBinsSampling(1, 8), 2.0
    sigma, report = noise_and_report(strategy, scheme, target, DELTA)
    cond = report.diagnostics["conditional"]["epsilon_by_direction"]
    assert min(cond.values()) > target and report.diagnostics["gaussian_epsilon"] > target  # (the shortcut's case)
    fresh = account_allocation(strategy, scheme, sigma, DELTA)
    assert report.epsilon == pytest.approx(fresh.epsilon, rel=1e-12) and fresh.epsilon <= target
    assert report.epsilon_by_direction == pytest.approx(fresh.epsilon_by_direction, rel=1e-12)
    assert _eps(strategy, scheme, sigma * (1 - 1.01e-6)) > target
    assert sigma <= _two_stage(strategy, scheme, target) * (1 + 1e-6)


def test_combined_search_when_conditional_helps():
    """DP-SGD, 64 steps, epsilon 0.2: conditional composition meets the target in the add direction at
    the Renyi answer, so the combined search runs; its answer passes and 1.01e-4 below it fails."""
    strategy, scheme, target = Identity(64), BallsInBinsSampling(1, 64), 0.2
    sigma, report = noise_and_report(strategy, scheme, target, DELTA)
    renyi = calibrate_allocation(strategy, scheme, target, DELTA, which="renyi")
    assert sigma < renyi * (1 - 1e-3)  # (conditional composition lowered the noise)
    assert report.epsilon == pytest.approx(_eps(strategy, scheme, sigma), rel=1e-12) and report.epsilon <= target
    assert _eps(strategy, scheme, sigma * (1 - 1.01e-4)) > target


def test_limit_raises_below_the_answer_and_changes_nothing_above():
    strategy, scheme, target = Identity(64), BallsInBinsSampling(1, 64), 0.2
    sigma, _ = noise_and_report(strategy, scheme, target, DELTA)
    below = sigma * 0.97
    with pytest.raises(NoiseLimitExceeded) as err:
        noise_and_report(strategy, scheme, target, DELTA, limit=below)
    assert err.value.limit == below and err.value.epsilon == pytest.approx(_eps(strategy, scheme, below), rel=1e-12)
    # above the answer: at 1.005 sigma the Renyi bound alone fails (the combined bound decides there)
    above = sigma * 1.005
    assert _eps(strategy, scheme, above, which="renyi") > target >= _eps(strategy, scheme, above)
    assert noise_and_report(strategy, scheme, target, DELTA, limit=above)[0] == sigma
    assert noise_and_report(strategy, scheme, target, DELTA, limit=sigma * 1.5)[0] == sigma


def _fake_pld(monkeypatch, threshold: float, target: float) -> list[float]:
    """``allocation_pld`` on a pair replaced by ``epsilon = target (threshold / sigma)^2`` (it passes
    exactly from ``threshold`` on); returns the list of noises it is evaluated at."""
    calls: list[float] = []

    def fake(strategy, scheme, groups, sigma, d, accuracy, max_points):
        calls.append(sigma)
        eps = target * (threshold / sigma) ** 2
        return {"epsilon": eps, "epsilon_by_direction": {"remove": eps, "add": eps}}

    monkeypatch.setattr(allocation_pld, "_epsilon", fake)
    return calls


def test_allocation_goes_first_and_allocation_pld_is_probed_once(monkeypatch):
    """For C != I allocation is calibrated before allocation_pld; an allocation_pld that needs more noise
    is then evaluated once, at allocation's noise. Negative control: without ``search_first`` it is
    searched (several evaluations). The answer is allocation's alone either way."""
    strategy, scheme, target = bsr(8, 2), BallsInBinsSampling(1, 8), 4.0
    alone = dpmf.calibrate(strategy, scheme, target, DELTA, method="allocation").noise_multiplier
    calls = _fake_pld(monkeypatch, 1.02 * alone, target)
    cal = dpmf.calibrate(strategy, scheme, target, DELTA)
    assert cal.report.method == "allocation" and cal.noise_multiplier == alone
    assert calls == [alone] and "allocation_pld" in cal.report.diagnostics["not_calibrated"]
    calls.clear()
    plain = dataclasses.replace(dispatch.METHODS["allocation"], search_first=None)
    monkeypatch.setitem(dispatch.METHODS, "allocation", plain)
    # (allocation then searches from allocation_pld's noise: the same answer to its rel_tol / 100)
    assert dpmf.calibrate(strategy, scheme, target, DELTA).noise_multiplier == pytest.approx(alone, rel=1e-6)
    assert len(calls) > 2


def test_a_method_after_allocation_searches_as_it_would_alone(monkeypatch):
    """When allocation_pld wins after allocation ran first, its search starts where it did before the
    reordering (the unamplified noise), so its answer is the one it gives alone, to the last bit."""
    strategy, scheme, target = bsr(8, 2), BallsInBinsSampling(1, 8), 4.0
    alone = dpmf.calibrate(strategy, scheme, target, DELTA, method="allocation").noise_multiplier
    calls = _fake_pld(monkeypatch, 0.9 * alone, target)
    pld_alone = dpmf.calibrate(strategy, scheme, target, DELTA, method="allocation_pld")
    n_alone = len(calls)
    calls.clear()
    cal = dpmf.calibrate(strategy, scheme, target, DELTA)
    assert cal.report.method == "allocation_pld" and cal.noise_multiplier == pld_alone.noise_multiplier
    assert math.isclose(cal.noise_multiplier, 0.9 * alone, rel_tol=1e-4)
    assert calls[0] == alone and len(calls) == n_alone + 1  # (the probe at allocation's noise, then the same search)


@pytest.mark.slow
def test_readme_training_pair(monkeypatch):
    """The README's training examples (BandMF 32 x 4 bands, 2 epochs of 16, epsilon 4): allocation is
    calibrated first and allocation_pld probed at its noise; there the anchored ring member is below
    the target, so allocation_pld is searched and wins with less noise; its answer is the smallest
    passing noise of the real accountant (1.01e-6 below it fails)."""
    strategy, scheme, target = bsr(32, 4), BallsInBinsSampling(2, 32), 4.0
    alone = dpmf.calibrate(strategy, scheme, target, DELTA, method="allocation").noise_multiplier
    calls: list[float] = []
    real = allocation_pld._epsilon
    monkeypatch.setattr(allocation_pld, "_epsilon", lambda *a: calls.append(a[3]) or real(*a))
    cal = dpmf.calibrate(strategy, scheme, target, DELTA)
    assert calls[0] == alone and cal.report.method == "allocation_pld" and cal.noise_multiplier < alone
    assert cal.report.epsilon <= target and "ring:" in cal.report.diagnostics["bound"]
    below = cal.noise_multiplier * (1 - 1.01e-4)
    assert dpmf.account(strategy, scheme, below, DELTA, method="allocation_pld").epsilon > target
    assert _eps(strategy, scheme, alone * (1 - 1.01e-6)) > target

def test_allocation_pld_evaluations_are_memoized_by_their_inputs(monkeypatch):
    """The same reductions, scheme, noise, delta and options give the stored result (a copy: the
    caller may change it); any other noise, delta or scheme is computed."""
    strategy, scheme = bsr(8, 2), BallsInBinsSampling(1, 8)
    monkeypatch.setattr(allocation_pld, "_MEMO", {})
    runs: list[float] = []
    real = allocation_pld._epsilon_of
    monkeypatch.setattr(allocation_pld, "_epsilon_of", lambda *a: runs.append(a[3]) or real(*a))
    first = dpmf.account(strategy, scheme, 1.5, DELTA, method="allocation_pld")
    again = dpmf.account(strategy, scheme, 1.5, DELTA, method="allocation_pld")
    assert runs == [1.5] and again.epsilon == first.epsilon and again.diagnostics == first.diagnostics
    dpmf.account(strategy, scheme, 1.6, DELTA, method="allocation_pld")
    dpmf.account(strategy, scheme, 1.5, 1e-6, method="allocation_pld")
    dpmf.account(strategy, BallsInBinsSampling(2, 8), 1.5, DELTA, method="allocation_pld")
    assert runs == [1.5, 1.6, 1.5, 1.5]
