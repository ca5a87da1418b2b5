"""f-DP in every report (report.tradeoff, gdp_mu) and dpmf.compose (issue 25 items 3 and 4).

Oracles: the Gaussian mechanism's closed form Phi(Phi^-1(fpr) + mu); DP-SGD over k T steps for k
composed runs of T steps; GDP's sqrt(sum mu^2); the (epsilon, delta) formula. Files are recomputed,
never trusted: an edited claim does not change the composition."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

import dpmf
from dpmf.accounting.report import report_digest
from dpmf.errors import DPMFError, InvalidParameterError
from dpmf.privacy.gdp import gdp_epsilon
from dpmf.sampling import BallsInBinsSampling, FixedOrderSampling, PoissonSampling
from dpmf.strategies import Identity, bsr

FPR = np.concatenate((np.logspace(-7, -1, 13), np.linspace(0.15, 0.95, 9)))


def gaussian_tpr(mu, alpha):
    return stats.norm.sf(stats.norm.isf(np.asarray(alpha)) - mu)


@pytest.fixture(scope="module")
def dpsgd():
    return dpmf.account(Identity(100), PoissonSampling(0.05, 100), 1.5, 1e-6, method="pld")


# ------------------------------------------------------------------------------ report.tradeoff
def test_unamplified_report_is_the_exact_gaussian_curve():
    """Identity, no amplification, 4 epochs: mu = sqrt(4) / sigma exactly, the closed form."""
    r = dpmf.account(Identity(40), FixedOrderSampling(4, 40), 4.0, 1e-6, method="unamplified")
    t = r.tradeoff(FPR)
    assert t.kind == "gdp" and t.mu == pytest.approx(0.5) and "exact" in t.mu_note
    np.testing.assert_allclose(t.tpr, gaussian_tpr(0.5, FPR), rtol=1e-9)
    assert np.all(t.tpr >= gaussian_tpr(0.5, FPR) * (1 - 1e-14))
    assert r.gdp_mu()[0] == pytest.approx(0.5)
    # a correlated strategy: mu = sensitivity / sigma (BSR's sensitivity under 4 epochs)
    c = dpmf.account(bsr(40, 3), FixedOrderSampling(4, 40), 4.0, 1e-6, method="unamplified")
    assert c.gdp_mu()[0] == pytest.approx(c.diagnostics["sensitivity"] / 4.0)
    assert c.gdp_mu()[0] > 0.5


def test_a_sampler_whose_randomness_is_not_credited_gives_a_gdp_bound_not_exact():
    r = dpmf.account(Identity(50), PoissonSampling(0.1, 50), 10.0, 1e-6, method="unamplified")
    mu, note = r.gdp_mu()
    assert mu == pytest.approx(math.sqrt(50) / 10.0) and "upper bound" in note


def test_dpsgd_without_sampling_is_the_gaussian_curve_from_above():
    """The PLD accountant on T Gaussian steps (q = 1): its curve equals Phi(Phi^-1(fpr) + sqrt(T)/sigma) within
    the discretization's effect, never below it."""
    T, sigma = 16, 4.0
    r = dpmf.account(Identity(T), PoissonSampling(1.0, T), sigma, 1e-6, method="pld")
    t = r.tradeoff(FPR)
    exact = gaussian_tpr(math.sqrt(T) / sigma, FPR)
    assert t.kind == "pld" and t.mu is None
    assert np.all(t.tpr >= exact - 1e-12), np.max(exact - t.tpr)
    assert np.max(t.tpr - exact) < 1e-4
    np.testing.assert_allclose(t.tpr, exact, rtol=2e-3)


def test_a_pld_curve_implies_the_reports_own_claim(dpsgd):
    """The PLD curve is never above the curve of the (epsilon, delta) the report claims from it."""
    t = dpsgd.tradeoff(FPR)
    implied = dpmf.privacy.tpr_epsilon_delta(dpsgd.epsilon, dpsgd.delta, FPR)
    assert np.all(t.tpr <= implied + 1e-12)
    assert np.any(t.tpr < implied - 1e-3)  # and it is strictly more informative


def test_mmcc_curve_carries_delta1_and_matches_dpsgd_on_the_identity(dpsgd):
    m = dpmf.account(Identity(100), PoissonSampling(0.05, 100), 1.5, 1e-6, method="mmcc", heuristic=False)
    assert m.curve is not None and m.curve.kind == "pld"
    np.testing.assert_allclose(m.tradeoff(FPR).tpr, dpsgd.tradeoff(FPR).tpr, rtol=1e-6, atol=1e-12)
    b = dpmf.account(bsr(16, 2), PoissonSampling(0.2, 16), 2.0, 1e-6, method="mmcc", heuristic=False)
    ((pld, offset),) = b.curve.plds
    assert offset == pytest.approx(b.diagnostics["delta1"]) and offset > 0
    t = b.tradeoff(FPR)
    assert t.tpr[0] >= offset  # the conditioning's failure probability caps the curve at FPR -> 0
    assert np.all(t.tpr <= dpmf.privacy.tpr_epsilon_delta(b.epsilon, b.delta, FPR) + 1e-9)


def test_a_method_without_a_pld_falls_back_to_its_epsilon_delta():
    r = dpmf.account(Identity(8), BallsInBinsSampling(1, 8), 1.0, 1e-6, method="allocation")  # (Renyi: no PLD)
    t = r.tradeoff(FPR)
    assert t.kind == "epsilon_delta" and "epsilon, delta" in t.bound and t.mu is None
    np.testing.assert_allclose(t.tpr, dpmf.privacy.tpr_epsilon_delta(r.epsilon, r.delta, FPR))
    assert r.gdp_mu()[0] is None


def test_tradeoff_scalar_default_grid_and_symmetric(dpsgd):
    t = dpsgd.tradeoff(0.01)
    assert isinstance(t.tpr, float) and t.fpr == 0.01 and t.certified
    full = dpsgd.tradeoff()
    assert full.fpr[0] == 0 and full.fpr[-1] == 1 and full.fpr.size > 100
    sym = dpsgd.tradeoff(FPR, symmetric=True)
    assert np.all(sym.tpr >= dpsgd.tradeoff(FPR).tpr - 1e-15)
    json.dumps(t.to_dict()), json.dumps(full.to_dict())


def test_the_curve_is_in_memory_only(dpsgd):
    d = dpsgd.to_dict()
    assert "curve" not in d and d["digest"] == report_digest(d)
    import dataclasses

    bare = dataclasses.replace(dpsgd, curve=None)
    assert bare == dpsgd and bare.to_dict() == d  # not compared, not serialized, same digest
    assert bare.tradeoff(0.01).kind == "epsilon_delta"  # (without it: the claim's curve)
    assert "curve" not in repr(dpsgd)


# ------------------------------------------------------------------------------ compose
def test_k_dpsgd_runs_compose_to_dpsgd_with_k_times_the_steps(dpsgd):
    """Equal within 1e-5, and never below beyond 1e-7 (relative): both are pessimistic bounds on the same
    mechanism, computed by convolutions in a different order (their truncations and roundings differ by
    about 1e-9)."""
    k = 5
    direct = dpmf.account(Identity(100 * k), PoissonSampling(0.05, 100 * k), 1.5, 1e-6, method="pld")
    for composed in (dpmf.compose([dpsgd] * k, 1e-6), dpmf.compose([dpsgd], 1e-6, times=k)):
        assert composed.method == "composition" and composed.certified and composed.diagnostics["tight"]
        assert composed.diagnostics["runs"] == k
        for d in ("remove", "add"):
            got, want = composed.epsilon_by_direction[d], direct.epsilon_by_direction[d]
            assert got >= want * (1 - 1e-7) and got == pytest.approx(want, rel=1e-5)
        np.testing.assert_allclose(composed.tradeoff(FPR).tpr, direct.tradeoff(FPR).tpr, rtol=1e-5, atol=1e-12)
        assert np.all(composed.tradeoff(FPR).tpr >= direct.tradeoff(FPR).tpr * (1 - 1e-7))


def test_gaussian_runs_compose_exactly():
    a = dpmf.account(Identity(10), FixedOrderSampling(1, 10), 2.0, 1e-6, method="unamplified")  # mu 0.5
    b = dpmf.account(Identity(10), FixedOrderSampling(1, 10), 1.0, 1e-6, method="unamplified")  # mu 1
    c = dpmf.compose([a, b], 1e-5, times=[4, 1])
    mu = math.sqrt(4 * 0.25 + 1.0)
    assert c.gdp_mu()[0] == pytest.approx(mu) and c.diagnostics["tight"]
    assert c.epsilon == pytest.approx(gdp_epsilon(mu, 1e-5))
    np.testing.assert_allclose(c.tradeoff(FPR).tpr, gaussian_tpr(mu, FPR), rtol=1e-9)


def test_parts_without_a_pld_are_named_and_bounded(dpsgd):
    alloc = dpmf.account(Identity(8), BallsInBinsSampling(1, 8), 1.0, 1e-6, method="allocation")  # (Renyi: no PLD)
    c = dpmf.compose([dpsgd, alloc], 2e-6)
    assert not c.diagnostics["tight"]
    (why,) = c.diagnostics["not_tight"].values()
    assert "NOT tight" in why and "(epsilon, delta)" in why
    assert c.diagnostics["parts"][0]["composed_as"].startswith("tight")
    assert c.epsilon <= dpsgd.epsilon + alloc.epsilon + 1e-9  # never worse than basic composition
    assert c.epsilon >= max(dpsgd.epsilon, alloc.epsilon)


def test_default_delta_is_the_sum_of_the_parts(dpsgd):
    c = dpmf.compose([dpsgd], times=3)
    assert c.delta == pytest.approx(3e-6) and "sum" in c.diagnostics["delta_choice"]
    assert c.diagnostics["basic_composition"]["epsilon"] == pytest.approx(3 * dpsgd.epsilon)
    assert c.epsilon < 3 * dpsgd.epsilon


def test_report_files_are_recomputed_not_trusted(dpsgd, tmp_path):
    honest = tmp_path / "run.json"
    honest.write_text(dpsgd.to_json())
    edited = dpsgd.to_dict()
    edited["epsilon"], edited["epsilon_by_direction"] = 0.01, {"remove": 0.01, "add": 0.01}
    lying = tmp_path / "lying.json"
    lying.write_text(json.dumps(edited))
    a = dpmf.compose([str(honest)] * 3, 1e-6)
    b = dpmf.compose([lying, honest, honest], 1e-6)
    assert a.epsilon == pytest.approx(dpmf.compose([dpsgd], 1e-6, times=3).epsilon, rel=1e-12)
    assert b.epsilon == pytest.approx(a.epsilon, rel=1e-9)  # the stored 0.01 changed nothing
    part = b.diagnostics["parts"][0]
    assert part["recomputed"] and part["claim_held"] is False and part["edited"] is True
    assert a.diagnostics["parts"][0]["times"] == 3  # (equal files recomputed once)


def test_a_report_that_cannot_be_recomputed_is_refused(tmp_path):
    bad = {"epsilon": 0.1, "delta": 1e-6, "noise_multiplier": 1.0, "method": "montecarlo-evr", "certified": True,
           "strategy": {"name": "identity", "n": 10}, "scheme": {"name": "poisson", "sampling_prob": 0.1, "steps": 10}}
    with pytest.raises(InvalidParameterError, match="cannot compose this report soundly"):
        dpmf.compose([bad])
    with pytest.raises(InvalidParameterError, match="not a dpmf privacy report"):
        dpmf.compose([{"epsilon": 1.0}])
    (tmp_path / "x.json").write_text("not json")
    with pytest.raises(DPMFError):
        dpmf.compose([tmp_path / "x.json"])


def test_a_composition_report_is_recomputed_and_verified(dpsgd):
    c = dpmf.compose([dpsgd.to_dict()], 1e-6, times=2)
    v = dpmf.accounting.verify_report(c.to_json())
    assert v.holds and v.edited is False and v.recomputed_epsilon == pytest.approx(c.epsilon, rel=1e-12)
    d = c.to_dict()
    d["epsilon"] = c.epsilon / 2
    assert not dpmf.accounting.verify_report(d).holds
    nested = dpmf.compose([c.to_dict(), dpsgd], 1e-6)  # a composition file composes again, recomputed
    assert nested.epsilon == pytest.approx(dpmf.compose([dpsgd], 1e-6, times=3).epsilon, rel=1e-6)


@pytest.mark.parametrize("kwargs,match", [
    ({"times": 0}, "times"),
    ({"times": True}, "times"),
    ({"times": "x"}, "times"),
    ({"times": [1, 2]}, "one per report"),
    ({"delta": 1.5}, "delta"),
])
def test_bad_compose_arguments(dpsgd, kwargs, match):
    with pytest.raises(InvalidParameterError, match=match):
        dpmf.compose([dpsgd], **kwargs)
    with pytest.raises(InvalidParameterError, match="at least one"):
        dpmf.compose([])


def test_deltas_that_add_up_to_one_need_an_explicit_delta():
    r = dpmf.account(Identity(10), FixedOrderSampling(1, 10), 2.0, 0.3, method="unamplified")
    with pytest.raises(InvalidParameterError, match="add up to"):
        dpmf.compose([r], times=4)
    assert dpmf.compose([r], 0.5, times=4).delta == 0.5


# ------------------------------------------------------------------------------ plots
def test_tradeoff_plot_with_points(dpsgd, tmp_path):
    import matplotlib.pyplot as plt

    from dpmf.plots import tradeoff_plot

    path = tmp_path / "curve.png"
    assert tradeoff_plot(dpsgd, points=[(0.01, 0.02), (0.1, 0.9)], path=path) == path
    assert path.stat().st_size > 1000
    fig = tradeoff_plot({"a": dpsgd, "b": dpsgd.tradeoff()}, points={"audit": np.array([[1e-3, 1e-3], [0.1, 0.9]])},
                        scale="log")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "a" in labels and "audit" in labels
    assert "audit: ABOVE the curve" in labels  # (0.1, 0.9) is above it: flagged
    plt.close(fig)


@pytest.mark.parametrize("kwargs,match", [
    ({"points": [(0.1, 1.5)]}, "points"),
    ({"points": "x"}, "points"),
    ({"scale": "cubic"}, "scale"),
    ({"path": "/nonexistent-folder/c.png"}, "does not exist"),
    ({"path": "c.txt"}, "extension"),
])
def test_tradeoff_plot_bad_input(dpsgd, kwargs, match):
    from dpmf.plots import tradeoff_plot

    with pytest.raises(InvalidParameterError, match=match):
        tradeoff_plot(dpsgd, **kwargs)
    with pytest.raises(InvalidParameterError, match="PrivacyReport"):
        tradeoff_plot(1.0)
