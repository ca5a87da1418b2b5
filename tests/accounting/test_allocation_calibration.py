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
from dpmf.accounting.report import PrivacyReport
from dpmf.memo import BoundedMemo
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
    cond = account_allocation(strategy, scheme, sigma, DELTA, which="conditional").epsilon_by_direction
    assert min(cond.values()) > target and report.diagnostics["gaussian_epsilon"] > target  # (the shortcut's case)
    assert "cannot_lower" in report.diagnostics["conditional"]  # (skipped: its lower bound is above the Renyi one)
    fresh = account_allocation(strategy, scheme, sigma, DELTA)
    assert report.epsilon == pytest.approx(fresh.epsilon, rel=1e-12) and fresh.epsilon <= target
    assert report.epsilon_by_direction == pytest.approx(fresh.epsilon_by_direction, rel=1e-12)
    assert _eps(strategy, scheme, sigma * (1 - 1.01e-6)) > target
    assert sigma <= _two_stage(strategy, scheme, target) * (1 + 1e-6)


def test_renyi_answer_checks_a_skipped_conditional_against_the_target(monkeypatch):
    """Negative control of the shortcut: where conditional composition was skipped at the Renyi answer (below
    the Renyi bound there is proved) but its lower bound does not show it above the *target*, the search
    computes it there before taking the Renyi answer (here it is above: the same answer as without the skip)."""
    import dpmf.accounting.allocation.accountant as acc

    strategy, scheme, target = bsr(8, 2), BallsInBinsSampling(1, 8), 2.0
    expected, _ = noise_and_report(strategy, scheme, target, DELTA)
    real, computed = acc.composition_delta_lower_bound, []
    monkeypatch.setattr(acc, "composition_delta_lower_bound",
                        lambda pairs, s, e, d: 0.0 if e == target else real(pairs, s, e, d))
    real_eps = acc.conditional_epsilon
    monkeypatch.setattr(acc, "conditional_epsilon", lambda *a, **k: computed.append(1) or real_eps(*a, **k))
    sigma, report = noise_and_report(strategy, scheme, target, DELTA)
    assert computed and sigma == expected and report.epsilon <= target


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
    # (the fake has no cheaper bound to steer a search by: every evaluation is the accountant's)
    monkeypatch.setattr(allocation_pld, "_steering_set", lambda *args, **kw: None)
    return calls


def _counting_allocation(monkeypatch) -> list:
    """Record the ``limit`` of every calibration of the Renyi/conditional ``allocation`` accountant
    (its probe at another method's noise) and each noise it evaluates."""
    seen: list = []
    real = dispatch.METHODS["allocation"]

    def fast(*args, limit=None, callback=None, **kw):
        seen.append(("limit", limit))
        return real.fast_calibration(*args, limit=limit, callback=lambda s, e: seen.append(s) or callback(s, e), **kw)

    monkeypatch.setitem(dispatch.METHODS, "allocation", dataclasses.replace(real, fast_calibration=fast))
    return seen


def test_allocation_pld_goes_first_with_markov_members_and_allocation_is_probed_once(monkeypatch):
    """For C != I with Markov members allocation_pld is calibrated first (registry order) and the
    Renyi/conditional allocation, when it needs more noise, is evaluated once, at allocation_pld's noise.
    Why this order: with Markov members one allocation_pld evaluation costs seconds and its search
    usually wins, so the Renyi search (10 evaluations, ~5 CPU-s on the README snippet) and the probe of
    allocation_pld at the Renyi noise (~4 CPU-s, not reused) served nothing; the Renyi probe costs a
    fraction of a second. allocation_pld's search starts where it did (the unamplified noise), so its
    answer is the one it gives alone. Negative control: with allocation moved first (the old order)
    allocation_pld's first evaluation is the probe at allocation's noise; the answer is the same."""
    strategy, scheme, target = bsr(8, 2), BallsInBinsSampling(1, 8), 4.0
    assert allocation_pld.searches_markov_members(strategy, scheme)
    alone = dpmf.calibrate(strategy, scheme, target, DELTA, method="allocation").noise_multiplier
    calls = _fake_pld(monkeypatch, 0.9 * alone, target)
    pld_alone = dpmf.calibrate(strategy, scheme, target, DELTA, method="allocation_pld")
    n_alone, first = len(calls), calls[0]
    calls.clear()
    renyi = _counting_allocation(monkeypatch)
    cal = dpmf.calibrate(strategy, scheme, target, DELTA)
    assert cal.report.method == "allocation_pld" and cal.noise_multiplier == pld_alone.noise_multiplier
    assert calls[0] == first and len(calls) == n_alone  # (the same search as alone, no probe)
    assert renyi == [("limit", cal.noise_multiplier), cal.noise_multiplier]  # (one evaluation, at its noise)
    assert "allocation" in cal.report.diagnostics["not_calibrated"]
    calls.clear()
    monkeypatch.setattr(allocation_pld, "searches_markov_members", lambda strategy, scheme: False)
    old = dpmf.calibrate(strategy, scheme, target, DELTA)
    assert calls[0] == alone and old.noise_multiplier == cal.noise_multiplier


def test_allocation_goes_first_without_markov_members_and_allocation_pld_is_probed_once(monkeypatch):
    """For C != I without Markov members (here the pair declared so) allocation is calibrated before
    allocation_pld, and an allocation_pld that needs more noise is then evaluated once, at
    allocation's noise. Negative control: without ``search_first`` it is searched (several
    evaluations). The answer is allocation's alone either way, to the last bit (a method with a
    ``search_first`` rule starts its search from the closed forms' noise, whatever ran before it)."""
    strategy, scheme, target = bsr(8, 2), BallsInBinsSampling(1, 8), 4.0
    monkeypatch.setattr(allocation_pld, "searches_markov_members", lambda strategy, scheme: False)
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


def test_allocation_after_allocation_pld_searches_as_it_would_alone(monkeypatch):
    """When allocation wins after allocation_pld ran first (Markov members), it is probed at
    allocation_pld's noise and then searched from where it starts alone (the unamplified noise), so its
    answer is the one it gives alone, to the last bit."""
    strategy, scheme, target = bsr(8, 2), BallsInBinsSampling(1, 8), 4.0
    alone = dpmf.calibrate(strategy, scheme, target, DELTA, method="allocation").noise_multiplier
    _fake_pld(monkeypatch, 1.02 * alone, target)
    pld_alone = dpmf.calibrate(strategy, scheme, target, DELTA, method="allocation_pld").noise_multiplier
    renyi = _counting_allocation(monkeypatch)
    cal = dpmf.calibrate(strategy, scheme, target, DELTA)
    assert cal.report.method == "allocation" and cal.noise_multiplier == alone < pld_alone
    assert renyi[0] == ("limit", pld_alone) and len(renyi) > 3  # (probed at allocation_pld's noise, then its own search)


@pytest.mark.slow
def test_readme_training_pair(monkeypatch):
    """The README's training examples (BandMF 32 x 4 bands, 2 epochs of 16, epsilon 4): allocation_pld
    is calibrated first (Markov members) from the unamplified noise, and wins; allocation is probed once
    at its noise and fails there; the answer is the smallest passing noise of the real accountant
    (1.01e-4 below it fails), and allocation alone needs more noise."""
    strategy, scheme, target = bsr(32, 4), BallsInBinsSampling(2, 32), 4.0
    alone = dpmf.calibrate(strategy, scheme, target, DELTA, method="allocation").noise_multiplier
    calls: list[float] = []
    real = allocation_pld._epsilon
    monkeypatch.setattr(allocation_pld, "_epsilon", lambda *a: calls.append(a[3]) or real(*a))
    renyi = _counting_allocation(monkeypatch)
    cal = dpmf.calibrate(strategy, scheme, target, DELTA)
    assert cal.report.method == "allocation_pld" and cal.noise_multiplier < alone
    assert calls[0] == dpmf.calibrate(strategy, scheme, target, DELTA, method="unamplified").noise_multiplier
    assert renyi == [("limit", cal.noise_multiplier), cal.noise_multiplier]
    assert cal.report.epsilon <= target and "ring:" in cal.report.diagnostics["bound"]
    below = cal.noise_multiplier * (1 - 1.01e-4)
    assert dpmf.account(strategy, scheme, below, DELTA, method="allocation_pld").epsilon > target
    assert _eps(strategy, scheme, alone * (1 - 1.01e-6)) > target


def test_allocation_pld_evaluations_are_memoized_by_their_inputs(monkeypatch):
    """The same reductions, scheme, noise, delta and options give the stored result (a copy: the
    caller may change it); any other noise, delta or scheme is computed."""
    strategy, scheme = bsr(8, 2), BallsInBinsSampling(1, 8)
    monkeypatch.setattr(allocation_pld, "_MEMO", BoundedMemo(256))
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


def _recording_pld(monkeypatch) -> list:
    """Record ``(sigma, steering)`` of every ``allocation_pld`` evaluation on a fresh memo: ``steering``
    is True for a proper subset of the Markov members (``Reductions.steering``: the moving average
    alone; ``Reductions.contenders``), False for the accountant's own."""
    monkeypatch.setattr(allocation_pld, "_MEMO", BoundedMemo(256))
    real, calls = allocation_pld._epsilon, []
    every = {}

    def recording(strategy, scheme, groups, sigma, *rest):
        total = every.setdefault(id(strategy), len(allocation_pld._reductions(strategy, scheme).markov))
        calls.append((sigma, len(groups.markov) < total))
        return real(strategy, scheme, groups, sigma, *rest)

    monkeypatch.setattr(allocation_pld, "_epsilon", recording)
    return calls


def test_the_steering_bound_is_at_least_the_accountant_per_direction():
    """``Reductions.steering`` (the moving average alone): a bound at least the accountant's in each
    direction, equal where the moving average wins (large noise), above it where a ring wins."""
    strategy, scheme = bsr(20, 4), BallsInBinsSampling(epochs=2, steps=20)
    groups = allocation_pld._reductions(strategy, scheme)
    cheap = groups.steering()
    assert cheap is not None and len(cheap.markov) == 1 and len(groups.markov) > 2
    above = equal = 0
    for sigma in (1.0, 3.0):
        full = allocation_pld._epsilon(strategy, scheme, groups, sigma, DELTA, allocation_pld.DEFAULT_REL_TOL,
                                       allocation_pld.DEFAULT_MAX_POINTS)
        steer = allocation_pld._epsilon(strategy, scheme, cheap, sigma, DELTA, allocation_pld.DEFAULT_REL_TOL,
                                        allocation_pld.DEFAULT_MAX_POINTS)
        for d in ("remove", "add"):
            assert steer["epsilon_by_direction"][d] >= full["epsilon_by_direction"][d], (sigma, d)
        above += steer["epsilon"] > full["epsilon"]
        equal += steer["epsilon"] == full["epsilon"]
    assert above and equal  # (both cases occur: the test would notice a steering bound that is the accountant)


def test_a_calibration_is_steered_by_cheaper_member_sets_and_reports_the_accountant(monkeypatch):
    """The first noise of ``allocation_pld``'s calibration (its limit check, far above the answer) is
    evaluated by the moving average alone when that passes there (a certified pass: the accountant is
    at most that bound); the next ones by the accountant (no ring family on this pair: nothing to steer
    by on the way down) until it has failed at a noise and passed at a larger one; every later one by the contenders of the last evaluation (the members that came out
    finite there), bit for bit the accountant's numbers where
    the members left out lose again -- so the answer is the one of a search by the accountant at every
    noise (negative control: ``contenders`` disabled), the report is ``account_allocation_pld``'s, and
    a noise within rel_tol below the answer fails for the accountant. Negative control: at a target
    the steering bound fails at the first noise, the accountant is evaluated there too."""
    from dpmf.accounting.allocation.correlated import Reductions
    from dpmf.privacy.calibration import search_hint

    # (bsr(20, 4) over 2 epochs at epsilon 2: the moving average wins from the start to the answer)
    strategy, scheme, target, start = bsr(20, 4), BallsInBinsSampling(epochs=2, steps=20), 2.0, 3.0

    def calibrate():
        with search_hint(start):
            return allocation_pld.noise_and_report(strategy, scheme, target, DELTA, limit=start)

    calls = _recording_pld(monkeypatch)
    sigma, report = calibrate()
    calls = list(calls)  # (the checks below evaluate the accountant too)
    assert calls[0] == (start, True) and calls[1][1] is False and calls[-1] == (sigma, False)
    first = next(i for i, (_, steering) in enumerate(calls) if i and steering)  # (the contenders' first)
    full = {s: allocation_pld.account_allocation_pld(strategy, scheme, s, DELTA).epsilon for s, _ in calls[1:first]}
    fails = [s for s, e in full.items() if e > target]
    assert fails and any(s > min(fails) and e <= target for s, e in full.items())  # (bracketed by the accountant)
    assert all(steering for _, steering in calls[first:-1])  # (contenders from then on)
    fresh = allocation_pld.account_allocation_pld(strategy, scheme, sigma, DELTA)
    assert report.epsilon == fresh.epsilon <= target
    below = [s for s, _ in calls if s < sigma <= s * (1 + 1e-4)]
    assert below and all(allocation_pld.account_allocation_pld(strategy, scheme, s, DELTA).epsilon > target
                         for s in below)
    # negative control: the accountant at every noise after the first -> the same answer, bit for bit
    calls = _recording_pld(monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(Reductions, "contenders", lambda self, out: None)
        assert calibrate()[0] == sigma and not any(steering for _, steering in calls[1:])
    # negative control: a target the steering bound misses at the start -> the accountant there too
    high = allocation_pld._epsilon(strategy, scheme, allocation_pld._reductions(strategy, scheme).steering(), 1.0,
                                   DELTA, allocation_pld.DEFAULT_REL_TOL, allocation_pld.DEFAULT_MAX_POINTS)
    calls = _recording_pld(monkeypatch)
    with pytest.raises(NoiseLimitExceeded):
        allocation_pld.noise_and_report(strategy, scheme, 0.5 * high["epsilon"], DELTA, limit=1.0)
    assert calls == [(1.0, True), (1.0, False)]


def test_contenders_that_are_not_the_accountant_at_the_answer_are_checked_below_it(monkeypatch):
    """Where the steering set is not the accountant at the answer -- bsr(16, 4) over 2 epochs at
    epsilon 5, the contenders forced to the moving average alone, which a plain chain beats near the
    answer -- the failing end of the bracket is evaluated by the accountant, which passes there, and
    the search goes on from it by the accountant: the answer passes, a noise within rel_tol below it
    fails *for the accountant*, and it is within rel_tol of the answer of a search by the accountant
    at every noise (negative control: ``contenders`` disabled)."""
    from dpmf.accounting.allocation.correlated import Reductions
    from dpmf.privacy.calibration import search_hint

    strategy, scheme, target, start = bsr(16, 4), BallsInBinsSampling(epochs=2, steps=16), 5.0, 2.0

    def calibrate():
        with search_hint(start):
            return allocation_pld.noise_and_report(strategy, scheme, target, DELTA, limit=start)

    with monkeypatch.context() as m:
        m.setattr(Reductions, "contenders", lambda self, out: self.steering())
        calls = _recording_pld(monkeypatch)
        sigma, report = calibrate()
    calls = list(calls)
    assert report.epsilon == allocation_pld.account_allocation_pld(strategy, scheme, sigma, DELTA).epsilon <= target
    steered = max(s for s, steering in calls[1:] if steering)
    assert sigma < steered  # (the moving average alone ended above the accountant's answer)
    fails = [s for s, steering in calls if not steering and s < sigma <= s * (1 + 1e-4)]
    assert fails and all(allocation_pld.account_allocation_pld(strategy, scheme, s, DELTA).epsilon > target
                         for s in fails)
    with monkeypatch.context() as m:
        m.setattr(Reductions, "contenders", lambda self, out: None)
        plain = calibrate()[0]
    assert abs(sigma - plain) <= 1e-4 * max(sigma, plain)


def test_an_answer_at_the_steered_noise_reports_the_accountant(monkeypatch):
    """Where the search ends at its first (steered) noise -- the target is the epsilon there, where the
    moving average wins -- the report is the accountant's, computed at the end."""
    from dpmf.privacy.calibration import search_hint

    strategy, scheme, start = bsr(20, 4), BallsInBinsSampling(epochs=2, steps=20), 3.0
    exact = allocation_pld.account_allocation_pld(strategy, scheme, start, DELTA)
    calls = _recording_pld(monkeypatch)
    with search_hint(start):
        sigma, report = allocation_pld.noise_and_report(strategy, scheme, exact.epsilon, DELTA)
    assert sigma == start and calls[0] == (start, True) and calls[-1] == (start, False)
    assert report.epsilon == exact.epsilon and report.diagnostics["reductions"] == exact.diagnostics["reductions"]


def test_contenders_keep_the_members_finite_in_an_evaluation_and_give_its_numbers():
    """``Reductions.contenders(out)`` keeps exactly the Markov members with a finite epsilon (a
    direction) in ``out``, in their order, ``None`` when that is every member; evaluated at the same
    noise, its epsilon per direction is the whole set's, bit for bit (the members left out were
    searched below the best and never lowered the bound the later ones are searched below)."""
    import math

    strategy, scheme = bsr(16, 4), BallsInBinsSampling(epochs=2, steps=16)
    groups = allocation_pld._reductions(strategy, scheme)
    opts = (DELTA, allocation_pld.DEFAULT_REL_TOL, allocation_pld.DEFAULT_MAX_POINTS)
    out = allocation_pld._epsilon(strategy, scheme, groups, 1.3, *opts)
    rows = out["reductions"][-len(groups.markov):]
    finite = [m for m, row in zip(groups.markov, rows)
              if any(math.isfinite(v) for v in row.get("epsilon_by_direction", {}).values())]
    kept = groups.contenders(out)
    assert kept is not None and list(kept.markov) == finite and 0 < len(finite) < len(groups.markov)
    again = allocation_pld._epsilon(strategy, scheme, kept, 1.3, *opts)
    assert again["epsilon_by_direction"] == out["epsilon_by_direction"]
    assert kept.contenders(again) is None  # (every member kept is finite again)


#: bsr(24, 4) over 2 epochs: 11 Markov members, a ring family the tenth; the family wins at sigma 1.6
#: (2.976 against 2.997 for the members before it) and loses at 1.4 (both 3.679)
FAMILY_PAIR = (bsr(24, 4), BallsInBinsSampling(epochs=2, steps=24))


def test_the_members_before_the_first_family_are_a_prefix_computed_as_in_the_whole_set():
    """``Reductions.before_families()``: the Markov members before the first ring family, in their order;
    evaluated alone, each of its rows is the whole set's, bit for bit (the same members with the same
    bounds to search below), so its epsilon is at least the accountant's in each direction -- above it
    where the family wins (sigma 1.6), equal where it loses (1.4). ``None`` where there is no family."""
    from dpmf.accounting.allocation.surrogates.markov_ring import SurrogateFamily

    strategy, scheme = FAMILY_PAIR
    groups = allocation_pld._reductions(strategy, scheme)
    first = next(i for i, m in enumerate(groups.markov) if isinstance(m[1], SurrogateFamily))
    prefix = groups.before_families()
    assert 0 < first < len(groups.markov) - 1 and prefix.markov == groups.markov[:first]
    opts = (DELTA, allocation_pld.DEFAULT_REL_TOL, allocation_pld.DEFAULT_MAX_POINTS)
    above = equal = 0
    for sigma in (1.4, 1.6):
        whole = allocation_pld._epsilon(strategy, scheme, groups, sigma, *opts)
        part = allocation_pld._epsilon(strategy, scheme, prefix, sigma, *opts)
        kept = len(part["reductions"])
        assert part["reductions"] == whole["reductions"][:kept]  # (the identity-pair members, then the prefix)
        for d in ("remove", "add"):
            assert part["epsilon_by_direction"][d] >= whole["epsilon_by_direction"][d], (sigma, d)
        above += part["epsilon"] > whole["epsilon"]
        equal += part["epsilon"] == whole["epsilon"]
    assert above == 1 and equal == 1
    assert allocation_pld._reductions(bsr(20, 4), BallsInBinsSampling(epochs=2, steps=20)).before_families() is None


def _recording_members(monkeypatch) -> list:
    """Record ``(sigma, number of Markov members)`` of every ``allocation_pld`` evaluation on fresh memos."""
    from dpmf.accounting.allocation.surrogates import markov_programs

    monkeypatch.setattr(allocation_pld, "_MEMO", BoundedMemo(256))
    monkeypatch.setattr(markov_programs, "_RESULTS", BoundedMemo(256))
    real, calls = allocation_pld._epsilon, []
    monkeypatch.setattr(allocation_pld, "_epsilon", lambda s, sc, groups, sigma, *rest: calls.append(
        (sigma, len(groups.markov))) or real(s, sc, groups, sigma, *rest))
    return calls


def test_a_calibration_steers_by_the_members_before_the_family_on_its_way_down(monkeypatch):
    """On a pair with a ring family, the noises between the first one (the moving average alone) and the
    accountant's first failure are evaluated by the members before the family: where they pass, the
    accountant is not evaluated there (a prefix's pass is its pass); where they first fail, the
    accountant is evaluated at that noise, so the bracket's failing end is its own. The answer passes
    (the report is ``account_allocation_pld``'s), a noise within rel_tol below it fails for the
    accountant, and a search by the accountant at every noise (no steering) lands within rel_tol of it."""
    from dpmf.privacy.calibration import search_hint

    strategy, scheme = FAMILY_PAIR
    target, start = 3.6, 2.2
    groups = allocation_pld._reductions(strategy, scheme)
    whole, prefix = len(groups.markov), len(groups.before_families().markov)

    def calibrate():
        with search_hint(start):
            return allocation_pld.noise_and_report(strategy, scheme, target, DELTA, limit=start)

    calls = _recording_members(monkeypatch)
    sigma, report = calibrate()
    calls = list(calls)
    assert calls[0] == (start, 1)  # (the limit: the moving average alone passes there)
    down = [i for i, (_, n) in enumerate(calls) if n == prefix]
    assert down and calls[down[0] - 1][1] == 1  # (the members before the family right after the first noise)
    passed = [calls[i][0] for i in down if i + 1 == len(calls) or calls[i + 1] != (calls[i][0], whole)]
    failed = [calls[i][0] for i in down if i + 1 < len(calls) and calls[i + 1] == (calls[i][0], whole)]
    assert passed and len(failed) == 1  # (passes steer alone; the first failure is the accountant's too)
    for s in passed:  # (certified: the accountant passes where the prefix passed)
        assert allocation_pld.account_allocation_pld(strategy, scheme, s, DELTA).epsilon <= target
    assert allocation_pld.account_allocation_pld(strategy, scheme, failed[0], DELTA).epsilon > target
    assert calls[-1] == (sigma, whole) and report.epsilon == allocation_pld.account_allocation_pld(
        strategy, scheme, sigma, DELTA).epsilon <= target
    below = [s for s, _ in calls if s < sigma <= s * (1 + 1e-4)]
    assert below and all(allocation_pld.account_allocation_pld(strategy, scheme, s, DELTA).epsilon > target
                         for s in below)
    monkeypatch.setattr(allocation_pld, "_steering_set", lambda *args, **kw: None)
    plain = calibrate()[0]
    assert abs(sigma - plain) <= 1e-4 * max(sigma, plain)


def test_a_steered_answer_the_accountant_does_not_confirm_is_searched_on_by_the_accountant(monkeypatch):
    """Should a steering set pass where the accountant fails (impossible for a prefix of its members; the
    contenders are the accountant's only where the members they leave out lose again), the search goes on
    from that answer by the accountant alone, so the answer is always one of its passes. Forced here:
    ``allocation_pld`` replaced by ``epsilon = target (threshold / sigma)^2`` for the accountant and 3%
    less for every smaller member set (an optimistic steering bound, at every noise), the contenders the
    moving average alone."""
    strategy, scheme = FAMILY_PAIR
    target, threshold = 3.0, 1.5
    total = len(allocation_pld._reductions(strategy, scheme).markov)
    calls: list = []

    def fake(strategy, scheme, groups, sigma, d, accuracy, max_points):
        whole = len(groups.markov) == total
        calls.append((sigma, whole))
        eps = target * (threshold / sigma) ** 2 * (1.0 if whole else 0.97)
        return {"epsilon": eps, "epsilon_by_direction": {"remove": eps, "add": eps}}

    from dpmf.accounting.allocation.correlated import Reductions

    monkeypatch.setattr(allocation_pld, "_epsilon", fake)
    monkeypatch.setattr(Reductions, "contenders", lambda self, out: self.steering())  # (the fake has no rows)
    monkeypatch.setattr(allocation_pld, "_report", lambda strategy, scheme, groups, s, d, out, *rest: PrivacyReport(
        epsilon=out["epsilon"], delta=d, noise_multiplier=s, method="allocation_pld", certified=True,
        epsilon_by_direction=out["epsilon_by_direction"], strategy="bsr(24, 4)", scheme="balls-in-bins"))
    sigma, report = allocation_pld.noise_and_report(strategy, scheme, target, DELTA, limit=3.0)
    assert report.epsilon <= target and threshold <= sigma <= threshold * (1 + 1e-4)
    below = [s for s, whole in calls if whole and s < sigma <= s * (1 + 1e-4)]
    assert below  # (the bracket's failing end is the accountant's own)
    steered = [s for s, whole in calls if not whole and target * (threshold / s) ** 2 * 0.97 <= target < target * (threshold / s) ** 2]
    assert steered  # (the steering sets did pass where the accountant fails: the test would notice no fallback)


def _family_wins_calibration(monkeypatch) -> tuple[float, list]:
    """bsr(24, 4) over 2 epochs to epsilon 2.98 from 2.6: near the answer (sigma ~1.599) the ring family
    wins by 0.7%, so the members before it steer the way down with epsilons above the accountant's."""
    from dpmf.privacy.calibration import search_hint

    strategy, scheme = FAMILY_PAIR
    calls = _recording_members(monkeypatch)
    with search_hint(2.6):
        sigma, report = allocation_pld.noise_and_report(strategy, scheme, 2.98, DELTA, limit=2.6)
    assert report.epsilon == allocation_pld.account_allocation_pld(strategy, scheme, sigma, DELTA).epsilon <= 2.98
    below = [s for s, _ in calls if s < sigma <= s * (1 + 1e-4)]
    assert below and all(allocation_pld.account_allocation_pld(strategy, scheme, s, DELTA).epsilon > 2.98
                         for s in below)
    return sigma, list(calls)


def test_where_the_family_wins_near_the_answer_the_steps_leave_the_prefix_out_nearby(monkeypatch):
    """Where the accountant, run where the members before the family failed, comes out below them (the
    family won there), the search's steps leave their epsilons within 2% of that noise out of the chords
    (``revised``): the calibration keeps its contract in 10 evaluations (with the chords across the two sets
    of members: 22; the accountant at every noise: 7)."""
    sigma, calls = _family_wins_calibration(monkeypatch)
    assert len(calls) <= 12, calls


@pytest.mark.slow
def test_where_the_family_wins_near_the_answer_chords_across_the_two_sets_take_more_steps(monkeypatch):
    """Negative control of the test above: without ``revised`` the same calibration keeps its contract in
    more evaluations."""
    real = allocation_pld.smallest_noise_and_report
    monkeypatch.setattr(allocation_pld, "smallest_noise_and_report",
                        lambda *a, revised=None, **kw: real(*a, **kw))
    sigma, calls = _family_wins_calibration(monkeypatch)
    assert len(calls) > 12, calls


#: a pair with fresh slots (composed members, no prefix to steer by): bsr(80, 4) over 2 fresh epochs of 40
FRESH_PAIR = (bsr(80, 4), BallsInBinsSampling(epochs=2, steps=80, fresh_slots=True))


def test_composed_contenders_keep_the_binding_winners_and_give_the_whole_sets_epsilon(monkeypatch):
    """With fresh slots ``Reductions.contenders(out)`` keeps the composed members whose row attains
    ``out``'s binding direction (and no spectral group where one of them attains it); evaluated at the
    same noise, its epsilon is the whole set's, bit for bit, its rows are the kept members' rows of the
    whole set, and no member is computed twice (each is computed on its own, memoized by member and
    noise). At another noise it is a bound at least the whole set's in each direction."""
    from dpmf.accounting.allocation import fresh_correlated

    strategy, scheme = FRESH_PAIR
    groups = allocation_pld._reductions(strategy, scheme)
    opts = (DELTA, allocation_pld.DEFAULT_REL_TOL, allocation_pld.DEFAULT_MAX_POINTS)
    monkeypatch.setattr(fresh_correlated, "_COMPOSED", BoundedMemo(256))
    real, computed = fresh_correlated._composed_row, []
    monkeypatch.setattr(fresh_correlated, "_composed_row",
                        lambda member, *args: computed.append(member) or real(member, *args))
    out = allocation_pld._epsilon_of(strategy, scheme, groups, 1.3, *opts)
    rows = out["reductions"][-len(groups.composed_markov):]
    binding = max(out["epsilon_by_direction"], key=out["epsilon_by_direction"].get)
    winners = [m for m, row in zip(groups.composed_markov, rows)
               if row["epsilon_by_direction"][binding] == out["epsilon_by_direction"][binding]]
    kept = groups.contenders(out)
    assert kept is not None and list(kept.composed_markov) == winners and kept.spectral == ()
    assert 0 < len(winners) < len(groups.composed_markov) and len(computed) == len(groups.composed_markov)
    again = allocation_pld._epsilon_of(strategy, scheme, kept, 1.3, *opts)
    assert len(computed) == len(groups.composed_markov)  # (memoized: nothing computed again)
    assert again["epsilon"] == out["epsilon"]
    assert again["reductions"] == [row for m, row in zip(groups.composed_markov, rows) if m in winners]
    steer = allocation_pld._epsilon_of(strategy, scheme, kept, 1.6, *opts)["epsilon_by_direction"]
    whole = allocation_pld._epsilon_of(strategy, scheme, groups, 1.6, *opts)["epsilon_by_direction"]
    assert all(steer[d] >= whole[d] for d in whole)


def _fresh_calibration(monkeypatch, target: float) -> tuple:
    """``(sigma, report, calls)`` of ``allocation_pld``'s calibration of :data:`FRESH_PAIR` on a fresh memo,
    ``calls`` the ``(sigma, steering)`` of every evaluation (``steering``: fewer members than the whole set)."""
    strategy, scheme = FRESH_PAIR
    whole = allocation_pld._reductions(strategy, scheme)
    size = (len(whole.spectral), len(whole.composed_markov))
    monkeypatch.setattr(allocation_pld, "_MEMO", BoundedMemo(256))
    real, calls = allocation_pld._epsilon, []

    def recording(strategy, scheme, groups, sigma, *rest):
        calls.append((sigma, (len(groups.spectral), len(groups.composed_markov)) != size))
        return real(strategy, scheme, groups, sigma, *rest)

    monkeypatch.setattr(allocation_pld, "_epsilon", recording)
    sigma, report = allocation_pld.noise_and_report(strategy, scheme, target, DELTA)
    return sigma, report, list(calls)


def test_a_fresh_slot_calibration_steers_by_the_last_contenders_and_reports_the_accountant(monkeypatch):
    """With fresh slots the calibration's first noise is the accountant's; from then on the contenders of
    the last evaluation steer it (a pass of theirs is the accountant's: the minimum over fewer of the same
    members), and the accountant runs where they fail on the way down. The answer passes with the
    accountant's own report, and a noise within rel_tol below it fails *for the accountant*."""
    strategy, scheme = FRESH_PAIR
    sigma, report, calls = _fresh_calibration(monkeypatch, 3.0)
    assert calls[0][1] is False and sum(s for _, s in calls) >= 3 and calls[-1] == (sigma, False)
    assert report.epsilon == allocation_pld.account_allocation_pld(strategy, scheme, sigma, DELTA).epsilon <= 3.0
    below = [s for s, _ in calls if s < sigma <= s * (1 + 1e-4)]
    assert below and all(allocation_pld.account_allocation_pld(strategy, scheme, s, DELTA).epsilon > 3.0
                         for s in below)


@pytest.mark.slow
def test_a_fresh_slot_calibration_lands_where_the_accountant_at_every_noise_does(monkeypatch):
    """Negative control of the steering: with ``contenders`` disabled (the accountant at every noise, every
    evaluation whole) the answer is within rel_tol of the steered one."""
    from dpmf.accounting.allocation.correlated import Reductions

    sigma, _, calls = _fresh_calibration(monkeypatch, 3.0)
    assert any(s for _, s in calls)
    with monkeypatch.context() as m:
        m.setattr(Reductions, "contenders", lambda self, out: None)
        plain, _, calls = _fresh_calibration(monkeypatch, 3.0)
    assert not any(s for _, s in calls)
    assert abs(sigma - plain) <= 1e-4 * max(sigma, plain)
