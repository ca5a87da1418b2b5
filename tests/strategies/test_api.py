"""The uniform strategy API (dpmf.strategies.api): every kind has ``normalized`` and the error
methods, checked against closed forms, notes/peer-libraries.md §B.5 and the paper's Table 6."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpmf.errors import InvalidParameterError
from dpmf.strategies import catalog, error
from dpmf.strategies.dense import DenseStrategy
from dpmf.strategies.identity import Identity
from dpmf.strategies.optimal import optimal_multi_epoch_gram, single_epoch_optimal
from dpmf.strategies.participation import Participation
from dpmf.strategies.sensitivity import FixedEpochParticipation
from dpmf.strategies.workloads import momentum_sgd, prefix_sum

METHODS = (
    "n", "name", "describe", "encoder", "sensitivity", "normalized", "prefix_sum_rmse", "per_query_error",
    "per_step_variance", "total_squared_error", "rmse", "max_error", "noising_matrix", "streaming_noise",
)
PART = FixedEpochParticipation(2, 8)


def _build(kind):
    m = np.tril(np.full((16, 16), 0.3)) + np.eye(16)
    return catalog.build(kind, 16, epochs=2, bands=3, matrix=m if kind == "matrix" else None)


@pytest.mark.parametrize("kind", catalog.KINDS)
def test_every_kind_has_the_method_set(kind):
    s = _build(kind)
    for name in METHODS:
        assert hasattr(s, name), name


@pytest.mark.parametrize("kind", catalog.KINDS)
def test_normalized_has_unit_sensitivity_and_same_rmse(kind):
    s = _build(kind)
    ns = s.normalized(PART)
    sens = ns.sensitivity(PART)
    assert sens <= 1.0 + 1e-9
    assert sens == pytest.approx(1.0, abs=1e-6)  # every built kind has an exact (or tight) value here
    # the errors at sensitivity 1 are those of the normalized strategy as given
    assert ns.rmse(PART) == pytest.approx(s.rmse(PART), rel=1e-9)
    np.testing.assert_allclose(ns.per_query_error(), s.per_step_variance(PART), rtol=1e-9)
    # and agree with the dense formulas of dpmf.strategies.error on the encoder
    C = s.encoder()
    B = s._decoder_for(None)
    assert s.rmse(PART) == pytest.approx(error.rmse(C, B=B, sensitivity=s.sensitivity(PART)), rel=1e-12)
    assert s.max_error(PART) >= s.rmse(PART)
    assert s.total_squared_error(PART) == pytest.approx(float(s.per_step_variance(PART).sum()), rel=1e-12)


@pytest.mark.parametrize("kind", catalog.KINDS)
def test_summary_and_methods_agree(kind):
    s = _build(kind)
    summary = catalog.summarize(s, PART)
    assert s.rmse(PART) == pytest.approx(summary["rmse"], rel=1e-9)
    assert s.max_error(PART) == pytest.approx(summary["max_error"], rel=1e-9)


def test_identity_closed_forms():
    s = Identity(128)
    part = FixedEpochParticipation(2, 64)
    # sens^2 = 2, ||A[i]||^2 = i + 1: total 2 * n (n + 1) / 2, rmse sqrt((n + 1)), max sqrt(2 n)
    assert s.total_squared_error(part) == pytest.approx(128 * 129, rel=1e-12)
    assert s.rmse(part) == pytest.approx(11.3578, abs=1e-4)  # §B.5
    assert s.max_error(part) == pytest.approx(16.0, rel=1e-12)  # §B.5
    np.testing.assert_allclose(s.per_query_error(), np.sum(prefix_sum(128) ** 2, axis=1))
    assert s.normalized(part).encoder()[0, 0] == pytest.approx(1 / math.sqrt(2))
    assert s.sensitivity(Participation(2, 200)) == 1.0  # min_sep beyond n: one participation
    with pytest.raises(InvalidParameterError, match="participation"):
        s.sensitivity((2, 64))


@pytest.mark.parametrize(
    "kind, bands, rmse, max_error",
    [
        ("identity", None, 11.3578, 16.0),
        ("sqrt-toeplitz", None, 3.7496, 3.9965),
        ("optimal", None, 3.2681, 3.9306),
        ("banded-toeplitz", 64, 3.4345, 3.9790),
    ],
)
def test_n128_two_epochs_peer_table(kind, bands, rmse, max_error):
    """notes/peer-libraries.md §B.5 (jax_privacy, n = 128, (k, b) = (2, 64)): our optimizers must
    be at least as good (<=), closed forms equal."""
    s = catalog.build(kind, 128, epochs=2, bands=bands)
    part = FixedEpochParticipation(2, 64)
    assert s.rmse(part) <= rmse + 1e-4
    assert s.rmse(part) >= rmse - 2e-3  # not suspiciously better than the peer's optimum
    assert s.max_error(part) == pytest.approx(max_error, abs=2e-2)


def test_workload_errors_table6_momentum():
    """Table 6 (n=6, k=3, b=2), beta = 0.95: Eq. (35) optimum has Error 16.134 (notes §9)."""
    A = momentum_sgd(6, 0.95)
    res = optimal_multi_epoch_gram(A, 3, tol=1e-9)
    s = DenseStrategy(res.C, name="optimal")
    part = FixedEpochParticipation(3, 2)
    assert math.sqrt(s.total_squared_error(part, A)) == pytest.approx(16.134, abs=6e-4)
    assert math.sqrt(s.total_squared_error(part)) < math.sqrt(s.total_squared_error(part, A))
    with pytest.raises(InvalidParameterError, match="columns"):
        s.rmse(part, np.eye(5))


def test_single_epoch_fixed_point_via_catalog_matches_newton():
    """§4.4: the fixed point and the Newton dual (orthogonal constraints, k = 1) solve the same
    single-participation problem: equal loss within the tolerance."""
    fp = catalog.build("optimal", 32, solver="fixed-point")
    newton = optimal_multi_epoch_gram(32, 1, constraints="orthogonal", tol=1e-8)
    single = Participation(1, 1)
    assert fp.sensitivity(single) == pytest.approx(1.0, abs=1e-9)
    assert fp.total_squared_error(single) == pytest.approx(newton.loss, rel=2e-6)
    assert single_epoch_optimal(32).loss == pytest.approx(fp.total_squared_error(single), rel=1e-9)
    with pytest.raises(InvalidParameterError, match="fixed-point"):
        catalog.build("optimal", 32, epochs=2, solver="fixed-point")


def test_momentum_workload_changes_the_optimal_strategy():
    spec = catalog.workload_spec(12, 0.9, np.linspace(1.0, 0.2, 12))
    A = catalog.workload_matrix(spec, 12)
    s = catalog.build("optimal", 12, epochs=2, workload=spec)
    plain = catalog.build("optimal", 12, epochs=2)
    part = FixedEpochParticipation(2, 6)
    assert s.total_squared_error(part, A) < plain.total_squared_error(part, A) * (1 - 1e-3)
    assert catalog.workload_spec(12, 0.0, np.ones(12)) is None
    for bad, match in [((1.0, None), "momentum"), ((0.5, np.zeros(12)), "learning_rates"),
                       ((0.5, np.ones(5)), "learning_rates"), ((float("nan"), None), "momentum")]:
        with pytest.raises(InvalidParameterError, match=match):
            catalog.workload_spec(12, *bad)
