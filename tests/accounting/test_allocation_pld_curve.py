"""Issue 40 item 6: an ``allocation_pld`` report carries a PLD valid at every delta, so ``dpmf.compose``
composes it as a PLD (``allocation/pld_curve.py``).

Oracles: exact integration of the one-epoch pair (``_brute_delta`` of test_allocation_pld) and of two
fresh epochs at t = 2 (``_two_epochs_delta`` of test_allocation_pld_compose), at deltas and epsilons
other than the report's; ``allocation_pld``'s own fresh-slot composition; the report's epsilon.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import dpmf
from dpmf.accounting.allocation.pld_curve import identity_pair_curve
from dpmf.privacy.tradeoff import PrivacyCurve
from dpmf.sampling import BallsInBinsSampling, PoissonSampling
from dpmf.strategies import Identity, bsr

from test_allocation_pld import _brute_delta, _brute_epsilon  # noqa: E402  (exact one-epoch pair)
from test_allocation_pld_compose import _solve, _two_epochs_delta  # noqa: E402  (exact two epochs, t = 2)


def _report(t, sigma, delta, **scheme):
    epochs = scheme.pop("epochs", 1)
    return dpmf.account(Identity(epochs * t), BallsInBinsSampling(epochs, epochs * t, **scheme), sigma, delta,
                        method="allocation_pld")


def _pld(report):
    curve = report.privacy_curve
    assert curve.kind == "pld" and len(curve.plds) == 1 and curve.plds[0][1] == 0.0
    return curve.plds[0][0]


def test_the_curve_is_built_on_first_use_only_and_is_not_written():
    r = _report(5, 1.0, 1e-5)
    assert callable(r.curve) and not isinstance(r.curve, PrivacyCurve)  # nothing built by account()
    text = r.to_json()
    first = r.privacy_curve
    assert isinstance(r.curve, PrivacyCurve) and r.privacy_curve is first  # built once, kept
    assert r.to_json() == text and "curve" not in json.loads(text)


@pytest.mark.parametrize("t,sigma", [(2, 1.0), (3, 0.8), (2, 0.6)])
def test_the_pld_bounds_the_exact_pair_at_every_epsilon_and_delta(t, sigma):
    """Sound away from the report's delta (where its windows were fitted), both directions."""
    r = _report(t, sigma, 1e-5)
    pld = _pld(r)
    for eps in (0.05, 0.3, 1.0, 2.0, 3.5):
        got = pld.delta_by_direction(eps)
        for d in ("remove", "add"):
            assert got[d] >= _brute_delta(d, eps, t, sigma) * (1 - 1e-9) - 1e-300, (eps, d)
    for delta in (1e-2, 1e-3, 1e-8, 1e-9):
        got = pld.epsilon_by_direction(delta)
        exact = max(_brute_epsilon(d, t, sigma, delta) for d in ("remove", "add"))
        assert max(got.values()) >= exact * (1 - 1e-9), delta
        assert max(got.values()) <= exact * 1.05 + 5e-3, delta  # (tight, not only sound: loss grid 1e-3)
    # at the report's delta it is the report's epsilon up to the hull on the loss grid
    assert pld.epsilon(1e-5) == pytest.approx(r.epsilon, rel=5e-3)


def test_two_reports_compose_tightly_to_the_exact_two_fresh_epochs():
    t, sigma, delta = 2, 1.0, 1e-5
    r = _report(t, sigma, delta)
    c = dpmf.compose([r], times=2, delta=delta)
    assert c.diagnostics["tight"] and not c.diagnostics.get("not_tight")
    exact = max(_solve(lambda e: _two_epochs_delta(d, e, t, sigma)) for d in ("remove", "add"))
    assert exact * (1 - 1e-9) <= c.epsilon <= exact * 1.01
    # the (epsilon, delta) fallback the report had before: much looser
    old = dpmf.compose([dpmf.accounting.PrivacyReport(**{**r.__dict__, "curve": None})], times=2, delta=delta)
    assert not old.diagnostics["tight"] and old.epsilon > 1.3 * c.epsilon


@pytest.mark.parametrize("sigma,t,epochs,delta", [(2.0, 50, 10, 1e-5), (1.0, 100, 4, 1e-6)])
def test_composing_one_epoch_reports_equals_accounting_the_fresh_epochs(sigma, t, epochs, delta):
    one = _report(t, sigma, delta)
    c = dpmf.compose([one], times=epochs, delta=delta)
    fresh = _report(t, sigma, delta, epochs=epochs, fresh_slots=True)
    assert c.diagnostics["tight"]
    assert c.epsilon == pytest.approx(fresh.epsilon, rel=5e-3)


def test_fresh_and_k_of_t_reports_carry_their_composition_and_compose_with_dpsgd():
    fresh = _report(20, 2.0, 1e-6, epochs=3, fresh_slots=True)
    k_of_t = _report(30, 1.5, 1e-6, num_selected=3)
    for r in (fresh, k_of_t):
        assert _pld(r).epsilon(r.delta) == pytest.approx(r.epsilon, rel=5e-3)
    dpsgd = dpmf.account(Identity(100), PoissonSampling(0.05, 100), 2.0, 1e-6)
    c = dpmf.compose([fresh, k_of_t, dpsgd], delta=3e-6)
    assert c.diagnostics["tight"]
    assert max(fresh.epsilon, k_of_t.epsilon, dpsgd.epsilon) < c.epsilon < fresh.epsilon + k_of_t.epsilon + dpsgd.epsilon


def test_a_correlated_report_carries_its_best_identity_member():
    strategy, scheme = bsr(16, 2), BallsInBinsSampling(1, 16)
    r = dpmf.account(strategy, scheme, 1.5, 1e-6, method="allocation_pld")
    curve = r.privacy_curve
    rows = [m for m in r.diagnostics["reductions"] if "noise_scale_sq" in m and m.get("epsilon") is not None]
    best = min(rows, key=lambda m: m["epsilon"])
    assert best["bound"] in curve.note
    same = identity_pair_curve(1.5 / math.sqrt(best["noise_scale_sq"]), best["slots"], 1e-6, rel_tol=2e-4,
                               max_points=2**20)
    assert curve.plds[0][0].epsilon(1e-6) == same.plds[0][0].epsilon(1e-6)
    assert curve.plds[0][0].epsilon(1e-6) == pytest.approx(best["epsilon"], rel=5e-3)
    assert dpmf.compose([r], times=3, delta=1e-5).diagnostics["tight"]


def test_a_report_file_is_recomputed_and_composed_as_a_pld(tmp_path):
    r = _report(10, 1.0, 1e-6)
    path = tmp_path / "alloc.json"
    path.write_text(r.to_json())
    from_file = dpmf.compose([str(path)], times=3, delta=1e-5)
    in_memory = dpmf.compose([r], times=3, delta=1e-5)
    assert from_file.diagnostics["tight"] and from_file.epsilon == in_memory.epsilon


def test_one_step_per_epoch_carries_the_gaussian_curve():
    r = _report(1, 2.0, 1e-6, epochs=4)
    curve = r.privacy_curve
    assert curve.kind == "gdp" and curve.mu == pytest.approx(math.sqrt(4) / 2.0)
    assert np.isclose(dpmf.compose([r], delta=1e-6).epsilon, r.epsilon, rtol=1e-6)
