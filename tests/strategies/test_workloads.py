"""Workload matrices: prefix sum, SGD with momentum and learning rates (checked against the
optimizer recursion it encodes, and against Table 6 of the multi-epoch MF paper through a tiny
dual-ascent optimum), the cooldown schedule, and the lower-triangular validator."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dpmf.errors import DPMFError, InvalidParameterError
from dpmf.strategies import error
from dpmf.strategies.sensitivity import FixedEpochParticipation, sensitivity_squared
from dpmf.strategies.workloads import linear_cooldown, lower_triangular, momentum_sgd, prefix_sum


def test_prefix_sum():
    S = prefix_sum(4)
    assert S.dtype == np.float64
    np.testing.assert_array_equal(S, [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    assert prefix_sum(1).shape == (1, 1)


@pytest.mark.parametrize("n,beta", [(1, 0.5), (5, 0.0), (7, 0.9), (12, 0.95)])
def test_momentum_entrywise_formula(n, beta):
    rng = np.random.default_rng(n)
    lr = rng.uniform(0.1, 2.0, n)
    A = momentum_sgd(n, beta, lr)
    for i in range(n):
        for j in range(n):
            expect = sum(lr[t] * beta ** (t - j) for t in range(j, i + 1)) if j <= i else 0.0
            assert A[i, j] == pytest.approx(expect, rel=1e-13, abs=1e-15)
    # the matrix-product form of the notes: tri(n) diag(lr) M_beta
    M = np.array([[beta ** (i - j) if i >= j else 0.0 for j in range(n)] for i in range(n)])
    np.testing.assert_allclose(A, np.tri(n) @ np.diag(lr) @ M, rtol=1e-13, atol=1e-15)


def test_momentum_matches_the_optimizer_recursion():
    """theta_t = theta_{t-1} - lr_t m_t, m_t = beta m_{t-1} + g_t  =>  theta_start - theta = A g."""
    n, beta = 20, 0.9
    rng = np.random.default_rng(0)
    lr = linear_cooldown(n, 5, 0.1)
    g = rng.standard_normal(n)
    m, theta, out = 0.0, 0.0, []
    for t in range(n):
        m = beta * m + g[t]
        theta = theta - lr[t] * m
        out.append(-theta)
    np.testing.assert_allclose(momentum_sgd(n, beta, lr) @ g, out, rtol=1e-12, atol=1e-12)


def test_momentum_zero_and_defaults_is_prefix_sum():
    np.testing.assert_array_equal(momentum_sgd(6), prefix_sum(6))
    np.testing.assert_array_equal(momentum_sgd(6, 0.0, np.ones(6)), prefix_sum(6))
    np.testing.assert_allclose(momentum_sgd(6, 0.0, 2 * np.ones(6)), 2 * prefix_sum(6))


def test_linear_cooldown_stackoverflow():
    lr = linear_cooldown(2052)
    assert lr.shape == (2052,)
    np.testing.assert_array_equal(lr[: 2052 - 513], 1.0)
    np.testing.assert_allclose(lr[2052 - 513 :], np.linspace(1.0, 0.05, 513))
    np.testing.assert_array_equal(linear_cooldown(5, 0), np.ones(5))


# --- Table 6 of the multi-epoch MF paper (n = 6, (k, b) = (3, 2)) ---------------------------


def _optimal_encoder_eq34(A: np.ndarray, k: int, b: int, iters: int = 2000) -> np.ndarray:
    """Test oracle: the dual fixed point of Thm. 3.1 / Cor. 3.1 over all b 2^(k-1) sign vectors
    (Eq. 34), multiplicative updates v <- v * diag(H^T X(v) H); C = lower-triangular factor of X."""
    n = A.shape[0]
    T = A.T @ A
    cols = []
    for s in range(b):
        p = [s + j * b for j in range(k)]
        for signs in itertools.product((1.0, -1.0), repeat=k - 1):
            u = np.zeros(n)
            u[p] = (1.0,) + signs
            cols.append(u)
    H = np.array(cols).T
    v = np.ones(H.shape[1])

    def sqrtm(M):
        w, V = np.linalg.eigh((M + M.T) / 2)
        return (V * np.sqrt(np.maximum(w, 0))) @ V.T

    for _ in range(iters):
        w, V = np.linalg.eigh((H * v) @ H.T)
        Uh, Uih = (V * np.sqrt(w)) @ V.T, (V / np.sqrt(w)) @ V.T
        X = Uih @ sqrtm(Uh @ T @ Uh) @ Uih
        v = v * np.einsum("ij,ik,kj->j", H, X, H)
    P = np.eye(n)[::-1]
    return P @ np.linalg.cholesky(P @ X @ P).T @ P  # lower triangular, C^T C = X


def test_table6_prefix_sum_and_momentum_errors():
    part = FixedEpochParticipation(3, 2)
    C_prefix = _optimal_encoder_eq34(prefix_sum(6), 3, 2)
    assert math.sqrt(error.total_squared_error(C_prefix, part, prefix_sum(6))) == pytest.approx(6.461, abs=5e-4)

    A = momentum_sgd(6, 0.95)  # Table 6's momentum workload: beta = 0.95, lr = 1
    C = _optimal_encoder_eq34(A, 3, 2)
    assert float((C.T @ C).min()) == pytest.approx(-0.031, abs=5e-4)  # "min X[i,j]" column
    scalar = sensitivity_squared(C, part, data="scalar")
    assert scalar.exact and scalar.method == "sign enumeration (scalar)"
    err_scalar = math.sqrt(error.total_squared_error(C, A=A, sensitivity=scalar.sensitivity))
    assert err_scalar == pytest.approx(16.114, abs=5e-4)
    # The Eq. (34) optimum has negative X entries and k = 3, so its *vector* sensitivity is
    # larger (certified SDP value), and its vector-data error exceeds even the Eq. (35) 16.134.
    vector = sensitivity_squared(C, part)
    assert vector.exact and vector.value > 1.03
    err_vector = math.sqrt(error.total_squared_error(C, part, A))
    assert err_vector > 16.134


# --- validation ------------------------------------------------------------------------------


def test_lower_triangular_accepts_and_copies():
    M = np.tril(np.arange(1.0, 10.0).reshape(3, 3))
    out = lower_triangular(M, "C")
    np.testing.assert_array_equal(out, M)
    out[0, 0] = 99
    assert M[0, 0] == 1.0
    np.testing.assert_array_equal(lower_triangular([[1, 0], [2, 3]]), [[1.0, 0.0], [2.0, 3.0]])


@pytest.mark.parametrize(
    "bad,match",
    [
        (np.ones((2, 3)), "square"),
        (np.ones(3), "2-dimensional"),
        (np.array([[1.0, 0.0], [np.nan, 1.0]]), "finite"),
        (np.array([[1.0, np.inf], [0.0, 1.0]]), "finite"),
        (np.array([[1.0, 1e-300], [0.0, 1.0]]), "lower triangular"),
        (np.zeros((0, 0)), "empty"),
        ("abc", "C"),
    ],
)
def test_lower_triangular_rejects(bad, match):
    with pytest.raises(InvalidParameterError, match=match) as info:
        lower_triangular(bad, "C")
    assert "C" in str(info.value)


def test_lower_triangular_invertible():
    with pytest.raises(InvalidParameterError, match="invertible"):
        lower_triangular(np.array([[1.0, 0.0], [1.0, 0.0]]), "C", invertible=True)
    lower_triangular(np.array([[1.0, 0.0], [1.0, 0.0]]), "C")  # allowed when not asked


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"n": 0}, "n"),
        ({"n": 2.5}, "n"),
        ({"n": 4, "momentum": -0.1}, "momentum"),
        ({"n": 4, "momentum": 1.0}, "momentum"),
        ({"n": 4, "momentum": float("nan")}, "momentum"),
        ({"n": 4, "learning_rates": [1, 1, 1]}, "learning_rates"),
        ({"n": 4, "learning_rates": [1, 1, 0, 1]}, "learning_rates"),
        ({"n": 4, "learning_rates": [1, 1, -1, 1]}, "learning_rates"),
        ({"n": 4, "learning_rates": [1, 1, np.nan, 1]}, "learning_rates"),
    ],
)
def test_momentum_bad_input(kwargs, match):
    with pytest.raises(InvalidParameterError, match=match):
        momentum_sgd(**kwargs)


@pytest.mark.parametrize("args", [(0,), (5, 6), (5, -1), (5, 2, 0.0), (5, 2.5)])
def test_cooldown_bad_input(args):
    with pytest.raises(DPMFError):
        linear_cooldown(*args)


def test_prefix_sum_bad_n():
    for bad in (0, -1, 1.5, float("nan"), True):
        with pytest.raises(InvalidParameterError, match="n"):
            prefix_sum(bad)
