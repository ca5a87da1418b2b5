"""Lower-triangular Toeplitz strategies: square-root coefficients, inverses, the strategy object
and the streaming noise generator (operator and statistical checks)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg as sl
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmf.errors import DPMFError, InvalidParameterError
from dpmf.strategies.toeplitz import (
    ToeplitzNoise,
    ToeplitzStrategy,
    lower_toeplitz_matmul,
    materialize_lower_toeplitz,
    sqrt_prefix_coefficients,
    toeplitz_inverse_coefficients,
)


def _binom_central(k: int) -> float:
    return math.comb(2 * k, k) / 4**k


# ---- square-root coefficients -------------------------------------------------------------------


def test_sqrt_coefficients_first_values_and_closed_form():
    f = sqrt_prefix_coefficients(40)
    np.testing.assert_allclose(f[:5], [1, 1 / 2, 3 / 8, 5 / 16, 35 / 128], rtol=0, atol=1e-16)
    np.testing.assert_allclose(f, [_binom_central(k) for k in range(40)], rtol=1e-14)
    # f(k) ~ 1 / sqrt(pi k)
    assert sqrt_prefix_coefficients(10**5)[-1] * math.sqrt(math.pi * (10**5 - 1)) == pytest.approx(1, abs=1e-5)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 300])
def test_sqrt_toeplitz_squares_to_prefix_sum_dense(n):
    C = materialize_lower_toeplitz(sqrt_prefix_coefficients(n), n)
    np.testing.assert_allclose(C @ C, np.tri(n), rtol=0, atol=1e-13)


def test_sqrt_coefficients_convolve_to_ones_n2000():
    # (1 - x)^{-1/2} squared is 1 / (1 - x): the coefficient-level statement of C @ C = A
    f = sqrt_prefix_coefficients(2000)
    np.testing.assert_allclose(np.convolve(f, f)[:2000], np.ones(2000), rtol=0, atol=1e-12)


# ---- materialize / matmul ---------------------------------------------------------------------


def test_materialize_matches_scipy_toeplitz_banded_and_truncated():
    c = np.array([2.0, -1.0, 0.5])
    expected = sl.toeplitz(np.r_[c, np.zeros(3)], np.zeros(6))
    np.testing.assert_array_equal(materialize_lower_toeplitz(c, 6), expected)
    np.testing.assert_array_equal(materialize_lower_toeplitz(c, 2), expected[:2, :2])
    np.testing.assert_array_equal(materialize_lower_toeplitz(c), expected[:3, :3])


@pytest.mark.parametrize("transpose", [False, True])
def test_fft_matmul_matches_dense(transpose):
    rng = np.random.default_rng(3)
    c = rng.normal(size=17)
    x = rng.normal(size=(50, 4))
    C = materialize_lower_toeplitz(c, 50)
    expected = (C.T if transpose else C) @ x
    np.testing.assert_allclose(lower_toeplitz_matmul(c, x, transpose=transpose), expected, atol=1e-12)
    np.testing.assert_allclose(lower_toeplitz_matmul(c, x[:, 0], transpose=transpose), expected[:, 0], atol=1e-12)


# ---- inverse coefficients ---------------------------------------------------------------------


def test_inverse_of_sqrt_is_sqrt_of_one_minus_x():
    n = 500
    g = toeplitz_inverse_coefficients(sqrt_prefix_coefficients(n), n)
    expected = np.cumprod(np.r_[1.0, (np.arange(1, n) - 1.5) / np.arange(1, n)])  # (1 - x)^{1/2}
    np.testing.assert_allclose(g, expected, rtol=1e-12, atol=1e-16)
    assert g[1] == -0.5 and g[2] == pytest.approx(-1 / 8)


@pytest.mark.parametrize("method", ["recursion", "newton"])
@pytest.mark.parametrize(
    "coefs",
    [sqrt_prefix_coefficients(120), np.array([1.0, 0.5, 0.25]), np.array([3.0, -1.0, 0.2, 0.7]), np.array([-2.0])],
    ids=["sqrt", "banded3", "banded-mixed-sign", "scalar"],
)
def test_inverse_coefficients_reproduce_dense_inverse(coefs, method):
    n = 120
    g = toeplitz_inverse_coefficients(coefs, n, method=method)
    C = materialize_lower_toeplitz(coefs, n)
    Cinv = np.linalg.inv(C)
    np.testing.assert_allclose(materialize_lower_toeplitz(g, n), Cinv, rtol=0, atol=1e-12 * max(1, np.abs(Cinv).max()))


def test_newton_and_recursion_agree_at_large_n():
    n = 10_000
    c = sqrt_prefix_coefficients(n)
    a = toeplitz_inverse_coefficients(c, n, method="recursion")
    b = toeplitz_inverse_coefficients(c, n, method="newton")
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-13)


@settings(max_examples=40, deadline=None)
@given(
    c0=st.floats(1.0, 4.0) | st.floats(-4.0, -1.0),
    tail=st.lists(st.floats(-0.3, 0.3), min_size=0, max_size=6),
    n=st.integers(1, 40),
)
def test_inverse_property(c0, tail, n):
    coefs = np.r_[c0, tail]
    g = toeplitz_inverse_coefficients(coefs, n)
    prod = materialize_lower_toeplitz(coefs, n) @ materialize_lower_toeplitz(g, n)
    np.testing.assert_allclose(prod, np.eye(n), atol=1e-10)


# ---- the strategy object ----------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 7, 200])
def test_sqrt_strategy_matrices(n):
    s = ToeplitzStrategy.sqrt_prefix_sum(n)
    C = s.encoder()
    np.testing.assert_allclose(C @ C, np.tri(n), atol=1e-13)
    np.testing.assert_allclose(materialize_lower_toeplitz(s.noising_coefficients(), n), np.linalg.inv(C), atol=1e-12)
    # B = A C^{-1} = C for the square-root factorization
    np.testing.assert_allclose(s.decoder_coefficients(), s.coefs, atol=1e-12)
    np.testing.assert_allclose(s.column_norms(), np.linalg.norm(C, axis=0), rtol=1e-13)
    B = np.tri(n) @ np.linalg.inv(C)
    assert s.prefix_sum_rmse() == pytest.approx(np.linalg.norm(B) / math.sqrt(n), rel=1e-12)
    assert s.band == n and s.describe() == {"name": "toeplitz", "n": n, "band": n, "coefs": s.coefs.tolist()}


def test_identity_coefficients_give_dpsgd_rmse():
    # C = I: RMSE of the prefix sums per unit sigma is sqrt((n + 1) / 2) (cf. dpmf.strategies.Identity)
    assert ToeplitzStrategy([1.0], 50).prefix_sum_rmse() == pytest.approx(math.sqrt(51 / 2), rel=1e-14)


def test_sqrt_strategy_beats_identity_rmse():
    n = 1000
    assert ToeplitzStrategy.sqrt_prefix_sum(n).prefix_sum_rmse() < 0.2 * ToeplitzStrategy([1.0], n).prefix_sum_rmse()


def test_banded_strategy_is_structured_and_cut_to_n():
    s = ToeplitzStrategy([1.0, 0.5, 0.0, 0.25, 0.0], 10)
    assert s.band == 4 and s.coefs.size == 5 and s.n == 10
    assert not s.coefs.flags.writeable
    assert ToeplitzStrategy(np.ones(30), 8).coefs.size == 8


# ---- streaming noise -------------------------------------------------------------------------


def _materialize_noise(noise: ToeplitzNoise) -> np.ndarray:
    """Feed z = identity rows (dim = n): the outputs stacked are C^{-1}."""
    return np.array([noise.step(e) for e in np.eye(noise.n)])


@pytest.mark.parametrize(
    "strategy,mode,history",
    [
        (ToeplitzStrategy.sqrt_prefix_sum(150), "full-history", 149),
        (ToeplitzStrategy([1.0, 0.6, 0.3, 0.1], 150), "banded-encoder", 3),
        (ToeplitzStrategy([2.5], 150), "banded-inverse", 0),
    ],
    ids=["sqrt", "banded-encoder", "diagonal"],
)
def test_streaming_operator_equals_inverse(strategy, mode, history):
    noise = ToeplitzNoise(strategy, strategy.n)
    assert noise.mode == mode and noise.history_rows == history
    W = _materialize_noise(noise)
    np.testing.assert_allclose(W, np.linalg.inv(strategy.encoder()), rtol=0, atol=1e-12)
    assert noise.steps_done == strategy.n


def test_streaming_banded_inverse_uses_bounded_memory():
    g = np.array([1.0, -0.9, 0.2])  # C^{-1} banded, C is not
    noise = ToeplitzNoise.from_noising_coefficients(g, 120, 120)
    assert noise.mode == "banded-inverse" and noise.history_rows == 2
    assert noise.strategy.band == 120  # the encoder itself is dense
    W = _materialize_noise(noise)
    np.testing.assert_allclose(W, materialize_lower_toeplitz(g, 120), rtol=0, atol=1e-12)
    np.testing.assert_allclose(W, np.linalg.inv(noise.strategy.encoder()), rtol=0, atol=1e-10)


def test_streaming_covariance_matches_inverse_gram():
    """Columns of the (n x dim) output are i.i.d. draws of sigma C^{-1} z: compare the empirical
    covariance with sigma^2 C^{-1} C^{-T}, entrywise within 5 standard errors."""
    n, dim, sigma = 8, 40_000, 1.5
    strategy = ToeplitzStrategy.sqrt_prefix_sum(n)
    noise = ToeplitzNoise(strategy, dim, noise_multiplier=sigma, rng=np.random.default_rng(20240607))
    W = np.array(list(noise))
    assert W.shape == (n, dim)
    Cinv = np.linalg.inv(strategy.encoder())
    cov = sigma**2 * Cinv @ Cinv.T
    emp = W @ W.T / dim
    # Var of the sample second moment of a centered Gaussian pair: (S_ii S_jj + S_ij^2) / dim
    se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / dim)
    assert np.max(np.abs(emp - cov) / se) < 5.0
    # power check: the same statistic against independent noise (C = I) is far off
    wrong = sigma**2 * np.eye(n)
    se_wrong = np.sqrt((np.outer(np.diag(wrong), np.diag(wrong)) + wrong**2) / dim)
    assert np.max(np.abs(emp - wrong) / se_wrong) > 50.0
    # whitening: C w / sigma should be white
    white = strategy.encoder() @ W / sigma
    emp_white = white @ white.T / dim
    assert np.max(np.abs(emp_white - np.eye(n)) / np.sqrt((1 + np.eye(n)) / dim)) < 5.0


def test_streaming_is_reproducible_from_seed_and_stops():
    s = ToeplitzStrategy.sqrt_prefix_sum(5)
    a = np.array(list(ToeplitzNoise(s, 3, rng=7)))
    b = np.array(list(ToeplitzNoise(s, 3, rng=np.random.default_rng(7))))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (5, 3)
    it = ToeplitzNoise(s, 3, rng=1)
    for _ in range(5):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    with pytest.raises(InvalidParameterError, match="already"):
        it.step(np.zeros(3))
    zero = np.array(list(ToeplitzNoise(s, 2, noise_multiplier=0.0, rng=1)))
    np.testing.assert_array_equal(zero, 0.0)


# ---- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -3, 2.5, float("nan"), True, "10"])
def test_bad_n_raises(bad):
    with pytest.raises(InvalidParameterError, match="n"):
        sqrt_prefix_coefficients(bad)
    with pytest.raises(InvalidParameterError, match="n"):
        ToeplitzStrategy([1.0], bad)


@pytest.mark.parametrize(
    "coefs,match",
    [([0.0, 1.0], "coefs\\[0\\]"), ([1.0, np.nan], "finite"), ([], "empty"), ([[1.0]], "dimensional"), (["a"], "coefs")],
)
def test_bad_coefficients_raise(coefs, match):
    with pytest.raises(InvalidParameterError, match=match):
        ToeplitzStrategy(coefs, 4)
    with pytest.raises(InvalidParameterError, match=match):
        toeplitz_inverse_coefficients(coefs, 4)


def test_bad_method_and_matmul_shape_raise():
    with pytest.raises(InvalidParameterError, match="method"):
        toeplitz_inverse_coefficients([1.0], 3, method="qr")
    with pytest.raises(InvalidParameterError, match="x"):
        lower_toeplitz_matmul([1.0], np.zeros((2, 2, 2)))


def test_bad_noise_arguments_raise():
    s = ToeplitzStrategy.sqrt_prefix_sum(4)
    with pytest.raises(InvalidParameterError, match="strategy"):
        ToeplitzNoise(np.eye(4), 2)
    with pytest.raises(InvalidParameterError, match="dim"):
        ToeplitzNoise(s, 0)
    with pytest.raises(InvalidParameterError, match="noise_multiplier"):
        ToeplitzNoise(s, 2, noise_multiplier=-1.0)
    with pytest.raises(InvalidParameterError, match="rng"):
        ToeplitzNoise(s, 2, rng="seed")
    with pytest.raises(InvalidParameterError, match="rng"):
        next(ToeplitzNoise(s, 2))  # no hidden seeds
    with pytest.raises(InvalidParameterError, match="z must have shape"):
        ToeplitzNoise(s, 2).step(np.zeros(3))
    with pytest.raises(InvalidParameterError, match="noising_coefficients"):
        ToeplitzNoise.from_noising_coefficients([0.0, 1.0], 4, 2)
    with pytest.raises(DPMFError):
        ToeplitzNoise.from_noising_coefficients([1.0, np.inf], 4, 2)
