"""Tests for dpmf.strategies.banded (BSR, BISR, optimized banded Toeplitz)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpmf.errors import InvalidParameterError
from dpmf.strategies.banded import (
    bisr,
    bisr_noising_coefficients,
    bsr,
    inverse_sqrt_coefficients,
    optimize_banded_toeplitz,
    prefix_sum_loss,
    prefix_sum_loss_and_grad,
)
from dpmf.strategies.sensitivity import FixedEpochParticipation
from dpmf.strategies.toeplitz import ToeplitzNoise, ToeplitzStrategy, sqrt_prefix_coefficients


def _rmse_star(strategy: ToeplitzStrategy, k: int) -> float:
    """Sensitivity under FixedEpochParticipation(k, n // k) x sqrt(mean per-query variance)."""
    p = FixedEpochParticipation(k, strategy.n // k)
    return strategy.sensitivity(p) * strategy.prefix_sum_rmse()


# --- BSR ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 5, 32])
def test_bsr_full_bands_is_sqrt_prefix(n):
    s = bsr(n, n)
    np.testing.assert_array_equal(s.coefs, sqrt_prefix_coefficients(n))
    C = s.encoder()
    A = np.tril(np.ones((n, n)))
    np.testing.assert_allclose(C @ C, A, atol=1e-12)


def test_bsr_is_banded_prefix_of_sqrt():
    s = bsr(20, 4)
    assert s.n == 20 and s.band == 4
    np.testing.assert_allclose(s.coefs, [1.0, 0.5, 0.375, 0.3125])
    C = s.encoder()
    assert np.all(np.triu(C, 1) == 0)
    assert np.all(np.tril(C, -4) == 0)


# --- BISR ---------------------------------------------------------------------------------------


def test_inverse_sqrt_coefficients_values():
    np.testing.assert_allclose(inverse_sqrt_coefficients(4), [1.0, -0.5, -0.125, -0.0625])
    # inverse of the square-root series
    n = 30
    prod = np.convolve(inverse_sqrt_coefficients(n), sqrt_prefix_coefficients(n))[:n]
    np.testing.assert_allclose(prod, np.eye(n)[0], atol=1e-14)


@pytest.mark.parametrize("n,bands", [(16, 1), (16, 4), (64, 4), (64, 16), (40, 40)])
def test_bisr_inverse_is_banded(n, bands):
    s = bisr(n, bands)
    g = s.noising_coefficients()
    assert g.shape == (n,)
    np.testing.assert_allclose(g[:bands], inverse_sqrt_coefficients(bands), atol=1e-12)
    np.testing.assert_allclose(g[bands:], 0.0, atol=1e-12)
    exact = bisr_noising_coefficients(n, bands)
    np.testing.assert_array_equal(exact, inverse_sqrt_coefficients(bands))
    C = s.encoder()
    Cinv = ToeplitzStrategy(bisr_noising_coefficients(n, bands), n).encoder()
    np.testing.assert_allclose(C @ Cinv, np.eye(n), atol=1e-12)
    np.testing.assert_allclose(Cinv @ C, np.eye(n), atol=1e-12)
    assert np.all(C >= 0)  # needed by amplification analyses
    if bands == n:
        np.testing.assert_allclose(s.coefs, sqrt_prefix_coefficients(n), atol=1e-12)


def test_bisr_streaming_noise_uses_band_history():
    n, bands = 32, 4
    noise = ToeplitzNoise.from_noising_coefficients(bisr_noising_coefficients(n, bands), n, 1)
    assert noise.history_rows == bands - 1
    impulse = np.eye(n)[0]
    out = np.array([noise.step(impulse[t : t + 1])[0] for t in range(n)])
    np.testing.assert_allclose(out, bisr(n, bands).noising_coefficients(), atol=1e-12)


# --- loss and gradient --------------------------------------------------------------------------


def test_loss_matches_dense_and_rmse():
    rng = np.random.default_rng(1)
    n = 24
    c = np.concatenate(([1.3], rng.uniform(-0.3, 0.5, 6)))
    s = ToeplitzStrategy(c, n)
    C = s.encoder()
    B = np.tril(np.ones((n, n))) @ np.linalg.inv(C)
    dense = float(np.mean(np.sum(B**2, axis=1)))
    assert prefix_sum_loss(c, n) == pytest.approx(dense, rel=1e-10)
    assert s.prefix_sum_rmse() ** 2 == pytest.approx(dense, rel=1e-10)


@pytest.mark.parametrize("n,m,seed", [(20, 7, 0), (64, 16, 1), (33, 33, 2), (10, 1, 3)])
def test_gradient_matches_finite_differences(n, m, seed):
    rng = np.random.default_rng(seed)
    c = np.concatenate(([1.0 + rng.uniform()], rng.uniform(-0.2, 0.4, m - 1)))
    _, grad = prefix_sum_loss_and_grad(c, n)
    h = 1e-6
    fd = np.array(
        [(prefix_sum_loss(c + h * e, n) - prefix_sum_loss(c - h * e, n)) / (2 * h)
         for e in np.eye(m)]
    )
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-7 * np.max(np.abs(fd)))


# --- optimizer ----------------------------------------------------------------------------------

# jax_privacy toeplitz.optimize_banded_toeplitz, n=128, 2 epochs (notes/peer-libraries.md B.5)
_REFERENCE = {4: 6.1717, 16: 4.0624, 64: 3.4345}


@pytest.mark.parametrize("bands", sorted(_REFERENCE))
def test_optimized_banded_matches_reference(bands):
    s = optimize_banded_toeplitz(128, bands, epochs=2)
    assert isinstance(s, ToeplitzStrategy)
    assert s.n == 128 and s.band == bands
    assert np.linalg.norm(s.coefs) == pytest.approx(1.0, rel=1e-12)
    assert s.coefs[0] > 0
    rmse = _rmse_star(s, 2)
    assert rmse <= _REFERENCE[bands] * 1.001
    assert rmse <= _rmse_star(bsr(128, bands), 2) * (1 + 1e-12)
    # sensitivity^2 = epochs for unit-norm coefficients with bands <= min_sep
    assert s.sensitivity(FixedEpochParticipation(2, 64)) == pytest.approx(math.sqrt(2), rel=1e-9)


@pytest.mark.parametrize(
    "n,bands,epochs", [(1, 1, 1), (8, 1, 2), (8, 8, 1), (50, 3, 5), (128, 128, 2), (100, 7, 3)]
)
def test_optimized_never_worse_than_bsr(n, bands, epochs):
    s = optimize_banded_toeplitz(n, bands, epochs)
    s0 = bsr(n, bands)
    loss = prefix_sum_loss(s.coefs, n)
    loss0 = prefix_sum_loss(s0.coefs / np.linalg.norm(s0.coefs), n)
    assert loss <= loss0 * (1 + 1e-12)
    assert np.linalg.norm(s.coefs) == pytest.approx(1.0)


def test_optimized_is_stationary():
    s = optimize_banded_toeplitz(64, 8, 2)
    c = s.coefs
    loss, grad = prefix_sum_loss_and_grad(c, 64)
    # gradient of L(c / ||c||) on the sphere: tangential part vanishes at the optimum
    tang = grad - np.dot(grad, c) * c
    assert np.linalg.norm(tang) <= 1e-5 * np.linalg.norm(grad)


def test_callback_is_called():
    seen = []
    optimize_banded_toeplitz(64, 8, 2, callback=lambda i, f: seen.append((i, f)))
    assert seen and seen[0][0] == 1
    assert all(np.isfinite(f) and f > 0 for _, f in seen)
    assert seen[-1][1] <= seen[0][1] * (1 + 1e-12)


# --- validation ---------------------------------------------------------------------------------


_BAD_N_BANDS = [
    (8, 0), (8, 9), (8, -1), (8, float("nan")), (8, float("inf")), (8, 2.5),
    (0, 1), (float("nan"), 1), (8, None), (8, True),
]


@pytest.mark.parametrize("fn", [bsr, bisr, bisr_noising_coefficients, optimize_banded_toeplitz])
@pytest.mark.parametrize("n,bands", _BAD_N_BANDS)
def test_bad_bands_raise(fn, n, bands):
    with pytest.raises(InvalidParameterError):
        fn(n, bands)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"epochs": 0}, {"epochs": 9}, {"epochs": float("nan")},
        {"max_iter": 0}, {"tol": 0.0}, {"tol": float("nan")},
    ],
)
def test_optimizer_bad_options_raise(kwargs):
    with pytest.raises(InvalidParameterError):
        optimize_banded_toeplitz(8, 2, **kwargs)


@pytest.mark.parametrize(
    "coefs,n", [([np.nan, 0.5], 4), ([0.0, 1.0], 4), ([1.0] * 5, 4), ([], 4), ([1.0], 0)]
)
def test_loss_bad_input_raises(coefs, n):
    with pytest.raises(InvalidParameterError):
        prefix_sum_loss_and_grad(coefs, n)
