import math

import numpy as np
import pytest

from dpmf.errors import InvalidParameterError
from dpmf.strategies.banded import optimize_banded_toeplitz
from dpmf.strategies.bandmf import bandmf_loss_and_grad, optimize_bandmf
from dpmf.strategies.dense import DenseStrategy
from dpmf.strategies.sensitivity import FixedEpochParticipation, sensitivity_squared


def _band_mask(n, bands):
    d = np.subtract.outer(np.arange(n), np.arange(n))
    return (d >= 0) & (d < bands)


@pytest.mark.parametrize("n,bands", [(1, 1), (5, 1), (12, 3), (12, 12), (20, 5)])
def test_structure_unit_columns(n, bands):
    s = optimize_bandmf(n, bands, max_iter=200)
    assert isinstance(s, DenseStrategy) and s.name == "banded" and s.n == n
    C = s.encoder()
    assert np.all(C[~_band_mask(n, bands)] == 0)
    np.testing.assert_allclose(np.linalg.norm(C, axis=0), 1.0, rtol=1e-12)
    assert np.all(np.diag(C) > 0)


def test_bands_one_is_identity():
    np.testing.assert_allclose(optimize_bandmf(7, 1).encoder(), np.eye(7))


def test_gradient_finite_differences():
    n, bands = 8, 3
    rng = np.random.default_rng(0)
    mask = _band_mask(n, bands)
    C = np.where(mask, rng.normal(scale=0.3, size=(n, n)), 0.0) + 2.0 * np.eye(n)
    loss, grad = bandmf_loss_and_grad(C, bands)
    assert np.all(grad[~mask] == 0)
    h = 1e-6
    for i, j in zip(*np.nonzero(mask)):
        E = np.zeros((n, n))
        E[i, j] = h
        fd = (bandmf_loss_and_grad(C + E, bands)[0] - bandmf_loss_and_grad(C - E, bands)[0]) / (2 * h)
        assert fd == pytest.approx(grad[i, j], rel=1e-5, abs=1e-8)
    # scale-free per column: gradient orthogonal to each column
    np.testing.assert_allclose(np.sum(grad * C, axis=0), 0.0, atol=1e-10)
    assert bandmf_loss_and_grad(3.0 * C, bands)[0] == pytest.approx(loss, rel=1e-12)


def test_loss_matches_strategy_rmse():
    s = optimize_bandmf(16, 4)
    loss, _ = bandmf_loss_and_grad(s.encoder(), 4)
    assert loss == pytest.approx(s.prefix_sum_rmse() ** 2, rel=1e-10)


@pytest.mark.parametrize("bands,reference", [(4, 6.1359), (16, 3.9863)])
def test_matches_jax_privacy_n128(bands, reference):
    n = 128
    p = FixedEpochParticipation(2, 64)
    s = optimize_bandmf(n, bands)
    res = sensitivity_squared(s.C, p)
    assert res.exact
    assert res.value == pytest.approx(2.0, rel=1e-12)
    rmse = math.sqrt(res.value) * s.prefix_sum_rmse()
    assert rmse <= reference * 1.002
    t = optimize_banded_toeplitz(n, bands)
    assert rmse <= t.sensitivity(p) * t.prefix_sum_rmse() * (1 + 1e-12)


def test_init_matrix_and_never_worse():
    n, bands = 24, 4
    init = np.tril(np.ones((n, n))) * _band_mask(n, bands)
    s0 = DenseStrategy(init / np.linalg.norm(init, axis=0), name="x")
    s = optimize_bandmf(n, bands, init=init)
    assert s.prefix_sum_rmse() <= s0.prefix_sum_rmse()


@pytest.mark.parametrize(
    "n,bands", [(0, 1), (-3, 1), (4, 0), (4, 5), (4, 2.5), (4, float("nan")), ("4", 2), (4, None)]
)
def test_bad_input(n, bands):
    with pytest.raises(InvalidParameterError):
        optimize_bandmf(n, bands)


def test_bad_options():
    with pytest.raises(InvalidParameterError):
        optimize_bandmf(8, 2, max_iter=0)
    with pytest.raises(InvalidParameterError):
        optimize_bandmf(8, 2, tol=-1.0)
    with pytest.raises(InvalidParameterError):
        optimize_bandmf(8, 2, init=np.eye(7))
    with pytest.raises(InvalidParameterError):
        optimize_bandmf(8, 2, init=np.zeros((8, 8)))
