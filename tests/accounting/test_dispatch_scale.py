"""Dispatch at training sizes: the identity (DP-SGD) is never materialized as a dense matrix."""

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
