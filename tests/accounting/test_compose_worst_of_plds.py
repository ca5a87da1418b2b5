"""``dpmf.compose`` of a report whose curve is the worst of several PLDs (multi-phase MMCC): each
choice of one PLD per run is composed as PLDs (tight), never looser than the (epsilon, delta)
fallback, never below one run, and a saved composition is recomputed and verified."""

from __future__ import annotations

import math
import warnings

import pytest

import dpmf
import dpmf.accounting.composed as composed_mod
from dpmf.accounting.verify import load_report, verify_report
from dpmf.privacy.tradeoff import PrivacyCurve
from dpmf.sampling import CyclicPoissonSampling
from dpmf.strategies import BinaryTree


@pytest.fixture(scope="module")
def phased():
    """The tree under cyclic Poisson with cycle 3: not Toeplitz, so all 3 phases are analysed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpmf.errors.DPMFWarning)
        scheme = CyclicPoissonSampling(0.3, 8, 3)
    r = dpmf.account(BinaryTree(8), scheme, 2.0, 1e-6, method="mmcc")
    assert r.curve is not None and len(r.curve.plds) == 3
    return r


def test_one_run_composes_to_its_own_claim(phased):
    """The carried curve dominates the report: its epsilon at the report's delta is the report's."""
    one = dpmf.compose([phased], 1e-6)
    assert one.diagnostics["tight"] and one.diagnostics["alternatives"] == 3
    assert one.epsilon >= phased.epsilon * (1 - 1e-12)
    assert one.epsilon == pytest.approx(phased.epsilon, rel=1e-9)


def test_two_runs_tighter_than_the_epsilon_delta_fallback(phased, monkeypatch):
    new = dpmf.compose([phased], 2e-6, times=2)
    assert new.diagnostics["tight"] and "not_tight" not in new.diagnostics
    assert "worst of its 3" in new.diagnostics["parts"][0]["composed_as"]
    assert new.diagnostics["alternatives"] == 6  # multisets of 2 phases out of 3
    # lower reference: both runs dominated by the same phase's PLD (one of the choices), at the same delta
    for pld, offset in phased.curve.plds:
        same = PrivacyCurve.from_pld([(pld, offset)]).self_compose(2)
        ((p2, o2),) = same.plds
        assert new.epsilon >= p2.epsilon(2e-6 - o2) * (1 - 1e-12)
    assert new.epsilon >= phased.epsilon
    monkeypatch.setattr(composed_mod, "MAX_ALTERNATIVES", 0)  # the old way: through (epsilon, delta)
    old = dpmf.compose([phased], 2e-6, times=2)
    assert not old.diagnostics["tight"]
    assert new.epsilon < 0.8 * old.epsilon  # measured 15.60 vs 22.38
    # a composition saved before parts like this were composed tightly still verifies (its claim holds,
    # now with room to spare), and is not taken for an edited file
    monkeypatch.setattr(composed_mod, "MAX_ALTERNATIVES", 64)
    v = verify_report(load_report(old.to_json()))
    assert v.holds and not v.edited
    assert v.report.epsilon == pytest.approx(new.epsilon, rel=1e-12)


def test_a_composition_of_phased_parts_composes_again_and_verifies(phased):
    twice = dpmf.compose([phased], 2e-6, times=2)
    again = dpmf.compose([twice, phased], 3e-6)  # a worst-of curve as a part again
    thrice = dpmf.compose([phased], 3e-6, times=3)
    assert again.diagnostics["tight"]
    assert again.epsilon == pytest.approx(thrice.epsilon, rel=1e-6)
    d = load_report(twice.to_json())
    v = verify_report(d)
    assert v.holds and not v.edited
    assert v.report.epsilon == pytest.approx(twice.epsilon, rel=1e-12)


def test_truncated_runs_compose_to_the_truncated_run_with_their_rounds():
    """``truncated_pld`` carries its PLD: two runs of 30 truncated Poisson rounds compose to one run of
    60 rounds (the same pessimistic PLD, convolved in another order), far below the (epsilon, delta)
    route."""
    import dataclasses

    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import Identity

    def run(steps):
        scheme = PoissonSampling(0.02, steps, max_batch_size=60, dataset_size=2000)
        return dpmf.account(Identity(steps), scheme, 0.9, 1e-5, method="truncated_pld")

    one, direct = run(30), run(60)
    two = dpmf.compose([one], 1e-5, times=2)
    assert two.diagnostics["tight"]
    assert dpmf.compose([one], 1e-5).epsilon == pytest.approx(one.epsilon, rel=1e-9)
    assert two.epsilon >= direct.epsilon * (1 - 1e-7) and two.epsilon == pytest.approx(direct.epsilon, rel=1e-6)
    old = dpmf.compose([dataclasses.replace(one, curve=None)], 2e-5, times=2)  # (needs delta > 2 x 1e-5)
    new = dpmf.compose([one], 2e-5, times=2)
    assert not old.diagnostics["tight"] and one.epsilon < new.epsilon < old.epsilon < math.inf
