"""Error measures of A = B C: decoders, Eq. (4) loss, RMSE / max error per unit noise multiplier,
against closed forms and published numbers (notes/peer-libraries.md B.5, multi-epoch MF Table 1)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpmf.errors import InvalidParameterError
from dpmf.strategies import Participation, error
from dpmf.strategies.sensitivity import FixedEpochParticipation, sensitivity_squared, spectral_upper_bound
from dpmf.strategies.workloads import momentum_sgd, prefix_sum


def toeplitz(c: np.ndarray, n: int) -> np.ndarray:
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    return np.where(lag >= 0, c[np.maximum(lag, 0)], 0.0)


def sqrt_toeplitz(n: int) -> np.ndarray:
    f = np.ones(n)
    for t in range(1, n):
        f[t] = f[t - 1] * (1 - 1 / (2 * t))
    return toeplitz(f, n)


def fft_mechanism(n: int) -> tuple[np.ndarray, np.ndarray]:
    """App. K real FFT mechanism: B_F (n x 2n), C_F (2n x n), B_F C_F = tri(n)."""
    v = np.r_[np.ones(n), np.zeros(n)]
    c = np.fft.ifft(np.sqrt(np.fft.fft(v).astype(complex))).real
    circ = c[(np.arange(2 * n)[:, None] - np.arange(2 * n)[None, :]) % (2 * n)]
    return circ[:n, :], circ[:, :n]


# --- decoders --------------------------------------------------------------------------------


def test_decoder_lower_triangular_general_and_tall():
    rng = np.random.default_rng(0)
    n = 12
    C = np.tril(rng.standard_normal((n, n))) + 3 * np.eye(n)
    A = momentum_sgd(n, 0.9)
    B = error.decoder(C, A)
    np.testing.assert_allclose(B @ C, A, atol=1e-12)
    assert np.allclose(B, np.tril(B))  # streaming: B lower triangular too
    np.testing.assert_allclose(error.decoder(C) @ C, prefix_sum(n), atol=1e-12)  # default A
    G = rng.standard_normal((n, n)) + n * np.eye(n)  # square, not triangular
    np.testing.assert_allclose(error.decoder(G, A) @ G, A, atol=1e-10)
    BF, CF = fft_mechanism(16)
    np.testing.assert_allclose(BF @ CF, prefix_sum(16), atol=1e-10)
    Bopt = error.decoder(CF)  # optimal (pseudo-inverse) decoder
    np.testing.assert_allclose(Bopt @ CF, prefix_sum(16), atol=1e-10)
    assert np.sum(Bopt**2) <= np.sum(BF**2)  # App. K: optimal decoder never worse


def test_decoder_bad_input():
    with pytest.raises(InvalidParameterError, match="invertible"):
        error.decoder(np.array([[1.0, 0.0], [1.0, 0.0]]))
    with pytest.raises(InvalidParameterError, match="invertible"):
        error.decoder(np.array([[1.0, 1.0], [1.0, 1.0]]))
    with pytest.raises(InvalidParameterError, match="rows"):
        error.decoder(np.ones((2, 3)))
    with pytest.raises(InvalidParameterError, match="rank"):
        error.decoder(np.ones((4, 2)))
    with pytest.raises(InvalidParameterError, match="A"):
        error.decoder(np.eye(3), np.eye(4))
    with pytest.raises(InvalidParameterError, match="finite"):
        error.decoder(np.array([[np.nan]]))


def test_given_decoder_is_checked():
    C = np.eye(3)
    with pytest.raises(InvalidParameterError, match="B @ C == A"):
        error.per_query_error(C, B=np.eye(3))  # prefix sum expected
    with pytest.raises(InvalidParameterError, match="shape"):
        error.per_query_error(C, B=np.ones((3, 2)))
    q = error.per_query_error(C, B=prefix_sum(3))
    np.testing.assert_allclose(q, [1, 2, 3])


# --- closed forms ----------------------------------------------------------------------------


@pytest.mark.parametrize("n,k", [(8, 1), (12, 3), (400, 4)])
def test_identity_is_dp_sgd(n, k):
    """C = I: B = A, per-query variance i+1 (0-based), loss k n(n+1)/2 (notes §9 O22)."""
    part = FixedEpochParticipation(k, n // k)
    C = np.eye(n)
    np.testing.assert_allclose(error.per_query_error(C), np.arange(1, n + 1))
    assert error.total_squared_error(C, part) == pytest.approx(k * n * (n + 1) / 2, rel=1e-12)
    assert error.rmse(C, part) == pytest.approx(math.sqrt(k * (n + 1) / 2), rel=1e-12)
    assert error.max_error(C, part) == pytest.approx(math.sqrt(k * n), rel=1e-12)
    np.testing.assert_allclose(error.per_step_variance(C, part), k * np.arange(1, n + 1), rtol=1e-12)


def test_measures_are_consistent():
    rng = np.random.default_rng(1)
    n = 10
    C = np.tril(rng.random((n, n))) + np.eye(n)
    A = momentum_sgd(n, 0.5)
    part = Participation(3, 3)
    var = error.per_step_variance(C, part, A)
    assert error.total_squared_error(C, part, A) == pytest.approx(var.sum(), rel=1e-12)
    assert error.rmse(C, part, A) ** 2 * n == pytest.approx(var.sum(), rel=1e-12)
    assert error.max_error(C, part, A) ** 2 == pytest.approx(var.max(), rel=1e-12)
    # explicit sensitivity instead of a schema
    s = math.sqrt(error.total_squared_error(C, part, A) / np.sum(error.per_query_error(C, A)))
    assert error.rmse(C, A=A, sensitivity=s) == pytest.approx(error.rmse(C, part, A), rel=1e-12)
    # scale invariance (Sec. 2.4): C -> 3 C leaves the normalized error unchanged
    assert error.rmse(3 * C, part, A) == pytest.approx(error.rmse(C, part, A), rel=1e-12)


def test_sensitivity_arguments():
    with pytest.raises(InvalidParameterError, match="participation"):
        error.rmse(np.eye(3))
    with pytest.raises(InvalidParameterError, match="not both"):
        error.rmse(np.eye(3), Participation(1), sensitivity=1.0)
    with pytest.raises(InvalidParameterError, match="sensitivity"):
        error.rmse(np.eye(3), sensitivity=-1.0)


# --- published numbers -----------------------------------------------------------------------


@pytest.mark.parametrize("part", [Participation(2, 64), FixedEpochParticipation(2, 64)])
def test_peer_libraries_b5_n128_two_epochs(part):
    """notes/peer-libraries.md B.5: RMSE* = sens sqrt(mean_i ||(A C^-1)_i||^2) per unit noise
    multiplier, prefix sum, n = 128, (k, b) = (2, 64)."""
    C = sqrt_toeplitz(128)
    assert error.rmse(C, part) == pytest.approx(3.7496, abs=5e-5)
    assert error.max_error(C, part) == pytest.approx(3.9965, abs=5e-5)
    eye = np.eye(128)
    assert error.rmse(eye, part) == pytest.approx(11.3578, abs=5e-5)  # = sqrt(2) * sqrt(129 / 2)
    assert error.rmse(eye, part) == pytest.approx(math.sqrt(2) * 8.031189202104505, rel=1e-12)
    assert error.max_error(eye, part) == pytest.approx(16.0, rel=1e-12)


def test_table1_fft_n2000_spectral_sensitivity():
    """Multi-epoch MF Table 1 / notes §9 O6: FFT (n = 2000), (k, b) = (20, 100): Thm. 2.1
    sensitivity 18.5645, loss 2.344e6 (paper 2.3e6)."""
    BF, CF = fft_mechanism(2000)
    part = FixedEpochParticipation(20, 100)
    spec = spectral_upper_bound(CF, part)
    assert spec.sensitivity == pytest.approx(18.5645, abs=5e-4)
    loss = error.total_squared_error(CF, A=prefix_sum(2000), B=BF, sensitivity=spec.sensitivity)
    assert loss == pytest.approx(2.344e6, rel=5e-4)
    # the certified vector sensitivity of the same encoder is lower than the spectral bound
    exact = sensitivity_squared(CF, part)
    assert exact.exact and exact.value < spec.value * (1 - 1e-3)
