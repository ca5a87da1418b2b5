"""Dispatch at training sizes: the identity (DP-SGD) is never materialized as a dense matrix."""

import dataclasses

import pytest

import dpmf
from dpmf.strategies import Identity


@pytest.fixture
def no_dense_identity(monkeypatch):
    def refuse(self):
        raise AssertionError(f"Identity({self.n}).encoder() was called")

    monkeypatch.setattr(Identity, "encoder", refuse)


def test_auto_account_dpsgd_at_100k_steps_never_builds_the_identity(no_dense_identity):
    n = 100_000
    report = dpmf.account(Identity(n), dpmf.sampling.PoissonSampling(1e-3, n), 1.0, 1e-6)
    assert report.method == "pld" and report.certified
    assert "mmcc" in report.diagnostics["skipped_methods"]


def test_auto_calibrate_dpsgd_at_100k_steps_never_builds_the_identity(no_dense_identity):
    n = 100_000
    cal = dpmf.calibrate(Identity(n), dpmf.sampling.PoissonSampling(1e-3, n), 2.0, 1e-6)
    assert cal.report.epsilon <= 2.0 and cal.report.method == "pld"


def test_skipping_mmcc_does_not_change_the_result_on_a_small_case():
    n = 64
    scheme = dpmf.sampling.PoissonSampling(0.05, n)
    auto = dpmf.account(Identity(n), scheme, 1.2, 1e-5)
    mmcc = dpmf.account(Identity(n), scheme, 1.2, 1e-5, method="mmcc")
    assert auto.epsilon <= mmcc.epsilon * (1 + 1e-9)  # MMCC on the identity is DP-SGD: never tighter


@pytest.mark.parametrize("t, epochs, sigma", [(4, 1, 0.5), (8, 1, 0.8), (16, 2, 1.0), (48, 1, 2.0), (300, 1, 1.3)])
def test_auto_runs_both_allocation_accountants_for_the_identity(t, epochs, sigma):
    # auto runs allocation_pld and the Renyi/conditional accountant at every size (the fast paths of
    # allocation/identity.py) and reports the smaller
    scheme = dpmf.sampling.BallsInBinsSampling(epochs, t * epochs)
    auto = dpmf.account(Identity(t * epochs), scheme, sigma, 1e-5)
    assert "allocation" not in auto.diagnostics.get("skipped_methods", {})
    assert set(auto.diagnostics["all_methods"]) >= {"allocation_pld", "allocation"}
    pld = dpmf.account(Identity(t * epochs), scheme, sigma, 1e-5, method="allocation_pld")
    renyi = dpmf.account(Identity(t * epochs), scheme, sigma, 1e-5, method="allocation")
    assert auto.epsilon <= min(pld.epsilon, renyi.epsilon) * (1 + 1e-12)


def _auto_at_scale(n, monkeypatch):
    from dpmf.accounting import dispatch

    ran = []
    m = dispatch.METHODS["allocation"]

    def spy(*args, **kwargs):
        ran.append(args[2])
        return m.run(*args, **kwargs)

    monkeypatch.setitem(dispatch.METHODS, "allocation", dataclasses.replace(m, run=spy))
    scheme = dpmf.sampling.BallsInBinsSampling(1, n)
    report = dpmf.account(Identity(n), scheme, 1.0, 1e-6)
    assert ran and set(report.diagnostics["all_methods"]) >= {"allocation_pld", "allocation"}
    assert "skipped_methods" not in report.diagnostics
    cal = dpmf.calibrate(Identity(n), scheme, 1.0, 1e-6)
    assert cal.report.epsilon <= 1.0 and "skipped_methods" not in cal.report.diagnostics
    return report


def test_auto_runs_the_allocation_bounds_for_the_identity_without_building_it(no_dense_identity, monkeypatch):
    _auto_at_scale(1000, monkeypatch)


@pytest.mark.slow
def test_auto_runs_the_allocation_bounds_for_the_identity_at_10k_steps(no_dense_identity, monkeypatch):
    _auto_at_scale(10_000, monkeypatch)


def test_a_calibration_probe_skips_diagnostics_only_work(monkeypatch):
    # the probe at a bound only needs epsilon: MMCC's probe gets probe_options (no independent-rows
    # heuristic, a diagnostic that doubles the row work) and the full run is not called there
    from dpmf.accounting import dispatch
    from dpmf.strategies import bsr

    seen, runs = [], []
    m = dispatch.METHODS["mmcc"]

    def spy_probe(*args, **kwargs):
        seen.append(kwargs.get("heuristic", True))
        return m.probe(*args, **kwargs)

    def spy_run(*args, **kwargs):
        runs.append(args)
        return m.run(*args, **kwargs)

    monkeypatch.setitem(dispatch.METHODS, "mmcc", dataclasses.replace(m, probe=spy_probe, run=spy_run))
    scheme = dpmf.sampling.PoissonSampling(0.1, 16)
    with pytest.raises(dpmf.privacy.calibration.NoiseLimitExceeded):
        dpmf.calibrate(bsr(16, 2), scheme, 2.0, 1e-5, method="mmcc", max_noise_multiplier=0.3)
    assert seen == [False] and runs == []
    on = m.run(bsr(16, 2), scheme, 0.9, 1e-5, heuristic=True)
    off = m.run(bsr(16, 2), scheme, 0.9, 1e-5, heuristic=False)
    assert on.epsilon == off.epsilon


def test_a_partial_probe_prunes_with_a_lower_bound_and_a_full_one_is_reused(monkeypatch):
    from dpmf.accounting import dispatch
    from dpmf.privacy.calibration import NoiseLimitExceeded

    scheme = dpmf.sampling.PoissonSampling(0.05, 64)
    pld = dispatch.METHODS["pld"]
    calls = []

    def partial(strategy, scheme, sigma, delta, target, **opts):
        calls.append(sigma)
        return 99.0  # "at least 99": part of the work already shows the method fails here

    monkeypatch.setitem(dispatch.METHODS, "pld", dataclasses.replace(pld, probe=partial))
    with pytest.raises(NoiseLimitExceeded, match=">= 99") as info:
        dpmf.calibrate(Identity(64), scheme, 1.0, 1e-5, method="pld", max_noise_multiplier=0.5)
    assert info.value.lower_bound and info.value.limit == 0.5 and calls == [0.5]

    def full(strategy, scheme, sigma, delta, target, **opts):
        calls.append(sigma)
        return pld.run(strategy, scheme, sigma, delta, **opts)

    monkeypatch.setitem(dispatch.METHODS, "pld", dataclasses.replace(pld, probe=full))
    cal = dpmf.calibrate(Identity(64), scheme, 1.0, 1e-5, method="pld", max_noise_multiplier=50.0)
    plain = dpmf.calibrate(Identity(64), scheme, 1.0, 1e-5, method="pld")
    assert cal.noise_multiplier == pytest.approx(plain.noise_multiplier, rel=2e-4) and calls[-1] == 50.0


def test_mmcc_calibration_reuses_the_report_its_search_computed(monkeypatch):
    from dpmf.accounting import dispatch
    from dpmf.accounting.mmcc import account_mmcc
    from dpmf.strategies import bsr

    m = dispatch.METHODS["mmcc"]

    def refuse(*args, **kwargs):
        raise AssertionError("the calibrated noise was evaluated again")

    monkeypatch.setitem(dispatch.METHODS, "mmcc", dataclasses.replace(m, run=refuse))
    scheme = dpmf.sampling.PoissonSampling(0.05, 64)
    cal = dpmf.calibrate(bsr(64, 4), scheme, 2.0, 1e-6, method="mmcc")
    again = account_mmcc(bsr(64, 4), scheme, cal.noise_multiplier, 1e-6)  # the report a user would get
    assert cal.report.epsilon == again.epsilon <= 2.0
    assert cal.report.options == again.options
    assert cal.report.diagnostics["independent_rows_heuristic_epsilon"] == again.diagnostics["independent_rows_heuristic_epsilon"]
