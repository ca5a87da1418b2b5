import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmf.errors import InvalidParameterError
from dpmf.strategies.blt import BLT, BLTNoise, optimize_blt
from dpmf.strategies.sensitivity import FixedEpochParticipation, toeplitz_sensitivity_squared
from dpmf.strategies.toeplitz import ToeplitzStrategy, toeplitz_inverse_coefficients

# measured optimum of jax_privacy's BufferedToeplitz (n=128, 2 epochs), notes §B
JAX_THETA = [0.9595671206493162, 0.5045255271836953]
JAX_OMEGA = [0.28538257759252805, 0.22240689948791612]


def _recursion_coefs(theta, omega, n):
    # definition via buffers: s_i(1) = 1, s_i(t) = theta_i s_i(t-1); c_t = sum_i omega_i s_i(t)
    c = [1.0]
    s = [1.0] * len(theta)
    for _ in range(1, n):
        c.append(sum(o * x for o, x in zip(omega, s)))
        s = [th * x for th, x in zip(theta, s)]
    return np.array(c)


blt_params = st.integers(1, 4).flatmap(
    lambda d: st.tuples(
        st.lists(st.floats(0.05, 0.99), min_size=d, max_size=d, unique=True),
        st.lists(st.floats(0.0, 0.5), min_size=d, max_size=d),
    )
)


def _separated(theta):
    t = np.sort(theta)
    return t.size < 2 or np.min(np.diff(t)) > 0.02


@settings(max_examples=40, deadline=None)
@given(blt_params)
def test_coefficients_match_recursion(params):
    theta, omega = params
    b = BLT(theta, omega)
    np.testing.assert_allclose(b.toeplitz_coefs(50), _recursion_coefs(theta, omega, 50), rtol=1e-13, atol=1e-15)
    assert b.to_toeplitz(50).n == 50


def test_coefficients_small_n_and_example():
    b = BLT(JAX_THETA, JAX_OMEGA)
    np.testing.assert_array_equal(b.toeplitz_coefs(1), [1.0])
    c = b.toeplitz_coefs(3)
    assert c[1] == pytest.approx(sum(JAX_OMEGA))
    assert c[2] == pytest.approx(sum(o * t for o, t in zip(JAX_OMEGA, JAX_THETA)))


inverse_params = st.integers(1, 4).flatmap(
    lambda d: st.tuples(
        st.lists(st.floats(0.05, 0.99), min_size=d, max_size=d, unique=True),
        st.lists(st.one_of(st.just(0.0), st.floats(1e-4, 0.5)), min_size=d, max_size=d),
    )
)


@settings(max_examples=60, deadline=None)
@given(inverse_params)
def test_inverse_matches_toeplitz_inverse(params):
    theta, omega = params
    if not _separated(theta):
        theta = list(np.linspace(0.1, 0.9, len(theta)))
    b = BLT(theta, omega)
    inv = b.inverse()
    assert not inv.nonnegative
    assert inv.num_buffers == max(1, sum(o > 0 for o in omega))
    n = 200
    g = toeplitz_inverse_coefficients(b.toeplitz_coefs(n), n)
    # a pole of 1/C can lie below -1 (sum omega/theta > 2): then g grows geometrically
    scale = max(1.0, float(np.max(np.abs(g))))
    np.testing.assert_allclose(inv.toeplitz_coefs(n), g, rtol=0, atol=1e-10 * scale)
    # non-negative case: all inverse output scales <= 0 (< 0 for positive omega), poles < max(theta)
    assert np.all(inv.output_scale <= 0)
    assert np.all((inv.buf_decay < max(theta)) | (inv.output_scale == 0))
    if min(omega) > 0:
        assert np.all(inv.output_scale < 0)
        # inverse of the inverse is the original
        back = inv.inverse()
        np.testing.assert_allclose(back.toeplitz_coefs(n), b.toeplitz_coefs(n), rtol=0, atol=1e-9)


def test_inverse_degenerate_terms():
    # equal decays merge, zero scales drop, identity inverts to identity
    b = BLT([0.5, 0.5, 0.9], [0.1, 0.2, 0.0])
    inv = b.inverse()
    assert inv.num_buffers == 1
    np.testing.assert_allclose(inv.toeplitz_coefs(40), toeplitz_inverse_coefficients(b.toeplitz_coefs(40), 40), atol=1e-12)
    # a negligible term (1e-87) is dropped rather than giving a numerically double pole
    b = BLT([0.625, 0.125], [0.5, 5e-87])
    np.testing.assert_allclose(b.inverse().toeplitz_coefs(40), toeplitz_inverse_coefficients(b.toeplitz_coefs(40), 40), atol=1e-12)
    ident = BLT([0.3, 0.6], [0.0, 0.0]).inverse()
    np.testing.assert_array_equal(ident.toeplitz_coefs(5), [1, 0, 0, 0, 0])


def test_inverse_example_and_large_omega():
    b = BLT(JAX_THETA, JAX_OMEGA)
    n = 500
    g = toeplitz_inverse_coefficients(b.toeplitz_coefs(n), n)
    np.testing.assert_allclose(b.inverse().toeplitz_coefs(n), g, rtol=0, atol=1e-12)
    # sum omega/theta > 1: one pole of 1/C is negative
    b = BLT([0.5, 0.8], [0.9, 0.7])
    inv = b.inverse()
    assert np.min(inv.buf_decay) < 0
    np.testing.assert_allclose(inv.toeplitz_coefs(60), toeplitz_inverse_coefficients(b.toeplitz_coefs(60), 60), atol=1e-10)


def test_streaming_materializes_inverse():
    b = BLT(JAX_THETA, JAX_OMEGA)
    n = 64
    noise = b.streaming_noise(n, n=n)
    assert noise.buffers.shape == (2, n)
    M = np.column_stack([noise.step(np.eye(n)[t]) for t in range(n)])  # column t = w_t = row t of C^{-1}
    Cinv = np.linalg.inv(b.to_toeplitz(n).encoder())
    np.testing.assert_allclose(M.T, Cinv, rtol=0, atol=1e-10)
    with pytest.raises(InvalidParameterError):
        noise.step(np.zeros(n))
    with pytest.raises(InvalidParameterError):
        b.streaming_noise(3).step(np.zeros(4))


@pytest.mark.parametrize("theta,omega", [([0.3, 0.7, 0.95], [0.1, 0.2, 0.3]), ([0.5], [1.5])])
def test_streaming_general_and_inverse_blt(theta, omega):
    for b in (BLT(theta, omega), BLT(theta, omega).inverse()):
        n = 30
        noise = BLTNoise(b, n)
        assert noise.buffers.shape == (len(theta), n)
        M = np.vstack([noise.step(np.eye(n)[t]) for t in range(n)])
        np.testing.assert_allclose(M, np.linalg.inv(b.to_toeplitz(n).encoder()), rtol=0, atol=1e-10)


def test_streaming_draws_from_rng_reproducibly():
    b = BLT(JAX_THETA, JAX_OMEGA)
    a = list(b.streaming_noise(5, rng=1, n=4, noise_multiplier=2.0))
    assert len(a) == 4
    rng = np.random.default_rng(1)
    z = np.vstack([2.0 * rng.standard_normal(5) for _ in range(4)])
    g = b.inverse().toeplitz_coefs(4)
    expected = np.vstack([sum(g[j] * z[t - j] for j in range(t + 1)) for t in range(4)])
    np.testing.assert_allclose(np.vstack(a), expected, atol=1e-12)
    with pytest.raises(InvalidParameterError):
        next(b.streaming_noise(5))  # no rng


@settings(max_examples=30, deadline=None)
@given(blt_params, st.integers(1, 300))
def test_sensitivity_squared_is_column_norm(params, n):
    b = BLT(*params)
    C = b.to_toeplitz(n).encoder()
    col = float(np.sum(C[:, 0] ** 2))
    assert b.sensitivity_squared(n) == pytest.approx(col, rel=1e-12)
    assert b.sensitivity_squared(n) == pytest.approx(np.max(np.sum(C**2, axis=0)), rel=1e-12)


def test_prefix_sum_rmse_matches_dense():
    b = BLT(JAX_THETA, JAX_OMEGA)
    n = 40
    C = b.to_toeplitz(n).encoder()
    B = np.tril(np.ones((n, n))) @ np.linalg.inv(C)
    assert b.prefix_sum_rmse(n) == pytest.approx(math.sqrt(np.sum(B**2) / n), rel=1e-12)


@pytest.mark.parametrize(
    "theta,omega",
    [
        ([0.5, 1.0], [0.1, 0.1]),
        ([0.0], [0.1]),
        ([-0.2], [0.1]),
        ([1.5], [0.1]),
        ([float("nan")], [0.1]),
        ([0.5], [float("nan")]),
        ([0.5], [float("inf")]),
        ([0.5, 0.6], [0.1]),
        ([0.5], [-0.1]),
        ([], []),
        ([[0.5]], [[0.1]]),
        ("a", [0.1]),
    ],
)
def test_bad_input_raises(theta, omega):
    with pytest.raises(InvalidParameterError):
        BLT(theta, omega)


def test_general_blt_accepts_signs_but_not_nan_or_mismatch():
    BLT([-0.5, 0.0], [-1.0, 2.0], nonnegative=False)
    with pytest.raises(InvalidParameterError):
        BLT([float("nan")], [1.0], nonnegative=False)
    with pytest.raises(InvalidParameterError):
        BLT([0.1, 0.2], [1.0], nonnegative=False)
    b = BLT(JAX_THETA, JAX_OMEGA)
    for bad in (0, -1, 1.5, None):
        with pytest.raises(InvalidParameterError):
            b.toeplitz_coefs(bad)
    with pytest.raises(InvalidParameterError):
        b.streaming_noise(0)
    with pytest.raises(InvalidParameterError):
        b.streaming_noise(3, rng=None, n=0)


def test_optimize_blt_two_epochs_recovers_jax_privacy_optimum():
    n = 128
    part = FixedEpochParticipation(2, 64)
    blt, rmse = optimize_blt(n, 2, epochs=2)
    assert blt.nonnegative and blt.num_buffers == 2
    ref = BLT(JAX_THETA, JAX_OMEGA)
    ref_rmse = ref.prefix_sum_rmse(n) * toeplitz_sensitivity_squared(ref.toeplitz_coefs(n), part, n).sensitivity
    assert ref_rmse == pytest.approx(3.50578, abs=1e-4)
    assert rmse <= ref_rmse * (1 + 1e-6)
    sqrt_strat = ToeplitzStrategy.sqrt_prefix_sum(n)
    assert rmse < 0.95 * sqrt_strat.prefix_sum_rmse() * sqrt_strat.sensitivity(part)  # 3.7496
    # reported value is consistent with the returned BLT
    recomputed = blt.prefix_sum_rmse(n) * toeplitz_sensitivity_squared(blt.toeplitz_coefs(n), part, n).sensitivity
    assert rmse == pytest.approx(recomputed, rel=1e-12)


def test_optimize_blt_single_epoch_beats_sqrt_factorization():
    n = 128
    blt, rmse = optimize_blt(n, 2)
    # single participation: sensitivity is the column-0 norm
    assert rmse == pytest.approx(blt.prefix_sum_rmse(n) * math.sqrt(blt.sensitivity_squared(n)), rel=1e-9)
    sqrt_strat = ToeplitzStrategy.sqrt_prefix_sum(n)
    assert rmse < sqrt_strat.prefix_sum_rmse() * sqrt_strat.sensitivity(FixedEpochParticipation(1, n))  # 2.4488
    one, rmse1 = optimize_blt(n, 1)
    assert rmse <= rmse1 * (1 + 1e-9)
    with pytest.raises(InvalidParameterError):
        optimize_blt(n, 0)
    with pytest.raises(InvalidParameterError):
        optimize_blt(4, 1, epochs=5)
