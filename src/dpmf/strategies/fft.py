"""The FFT mechanism for prefix sums and its optimal (pseudo-inverse) decoder.

Choquette-Choo et al., *Multi-Epoch Matrix Factorization Mechanisms for Private ML* (ICML 2023),
Sec. 4 (Algorithm 1), App. J and App. K (digest ``notes/multi-epoch-mf.md`` Sec. 4.6). Indices are
0-based, as in the paper's Sec. 4 and App. J.

The ``n x n`` prefix-sum matrix ``A`` is the top-left block of the ``2n x 2n`` circulant
``A_circ`` with first column ``v = [1]*n + [0]*n``. With the unnormalized DFT
``v_hat = fft(v)`` (``v_hat[0] = n``, ``v_hat[k] = 0`` for even ``k > 0`` and, for odd ``k``,
``v_hat[k] = exp(i (pi k / (2n) - pi / 2)) / sin(pi k / (2n))``), the principal square root
``lam = sqrt(v_hat)`` is Hermitian (Lemma K.1), so ``c = ifft(lam)`` is real and the circulant
``Circ[i, j] = c[(i - j) mod 2n]`` satisfies ``Circ @ Circ = A_circ``. The real-valued
mechanism of App. K (distributionally equal to the complex Algorithm 1, Prop. K.1) is::

    encoder  C_F = Circ[:, :n]      (2n x n)
    decoder  B_F = Circ[:n, :]      (n x 2n),      B_F @ C_F = A.

We compute ``lam`` from the closed form above rather than by ``sqrt(fft(v))``: the even-index
DFT values are exactly 0, and a principal square root of their ~1e-13 rounding residue would
inject ~1e-7 errors.

* Every column of ``C_F`` has squared norm ``||v_hat||_1 / (2n)``, where
  ``||v_hat||_1 = n + sum_{a=0}^{n-1} 1 / sin(pi (2a + 1) / (2n))`` (:func:`dft_l1_norm`).
* ``C_F^T C_F = G`` is the symmetric ``n x n`` Toeplitz matrix with first column
  ``irfft(|v_hat|)[:n]`` (top-left block of the circulant with eigenvalues ``|v_hat|``).
* **FFT Optimal Decoder** (Prop. K.2): ``B_opt = A C_F^+ = A G^{-1} C_F^T``. ``C_F^T y`` costs one
  FFT; ``G^{-1}`` is applied with the Gohberg-Semencul formula
  ``G^{-1} = (L(x) L(x)^T - L(y) L(y)^T) / x_0``, where ``x = G^{-1} e_0`` (one Levinson solve,
  ``O(n^2)`` once), ``y = (0, x_{n-1}, ..., x_1)`` and ``L(a)`` is lower-triangular Toeplitz with
  first column ``a``; each application is four FFT products, ``O(n log n)`` per column (the paper
  quotes ``O(n log^2 n)`` with a superfast Toeplitz solver; the one-off Levinson here is
  ``O(n^2)``).

Noise: releasing ``B (C_F x + z)`` adds ``B z`` to the prefix sums; the per-step (gradient-space)
noise of training is its first difference. Privacy depends only on ``C_F``; ``C_F`` has negative
entries and ``C_F^T C_F`` is not entrywise non-negative in general, so use the spectral bound
(Thm. 2.1) for its multi-participation sensitivity, as Table 1 does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np
import scipy.fft as _fft
import scipy.linalg as _sl

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError
from dpmf.resources import check_allocation
from dpmf.strategies.api import ErrorMethods
from dpmf.strategies.streaming import resolve_rng

__all__ = ["FFTMechanism", "dft_l1_norm", "fft_sqrt_eigenvalues", "fft_circulant_coefficients"]

_CHUNK = 256  # columns per batch when applying G^{-1} to many vectors (bounds FFT workspace)


def dft_l1_norm(n: int) -> float:
    """``||fft([1]*n + [0]*n)||_1 = n + sum_{a=0}^{n-1} 1 / sin(pi (2a+1) / (2n))`` (Cor. J.1)."""
    n = _v.positive_int("n", n)
    a = np.arange(n, dtype=np.float64)
    return float(n + np.sum(1.0 / np.sin(np.pi * (2.0 * a + 1.0) / (2.0 * n))))


def _sqrt_eigenvalues(n: int) -> np.ndarray:
    # lam[k] for k = 0 .. n (the rfft half of the Hermitian 2n-point spectrum)
    k = np.arange(n + 1, dtype=np.float64)
    lam = np.zeros(n + 1, dtype=np.complex128)
    odd = (np.arange(n + 1) % 2) == 1
    theta = np.pi * k[odd] / (2.0 * n)
    lam[odd] = np.exp(1j * (theta / 2.0 - np.pi / 4.0)) / np.sqrt(np.sin(theta))
    lam[0] = math.sqrt(n)
    return lam


def fft_sqrt_eigenvalues(n: int) -> np.ndarray:
    """The principal square roots ``sqrt(v_hat[k])``, ``k = 0 .. 2n-1`` (complex, Hermitian)."""
    n = _v.positive_int("n", n)
    half = _sqrt_eigenvalues(n)
    return np.concatenate([half, np.conj(half[1:n][::-1])])


def fft_circulant_coefficients(n: int) -> np.ndarray:
    """The real first column ``c`` (length ``2n``) of the circulant square root of ``A_circ``."""
    n = _v.positive_int("n", n)
    return _fft.irfft(_sqrt_eigenvalues(n), 2 * n)


def _columns(name: str, value: object, rows: int) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"{name} must be an array of numbers: {exc}") from None
    if arr.ndim not in (1, 2) or arr.shape[0] != rows:
        raise InvalidParameterError(f"{name} must have shape ({rows},) or ({rows}, d), got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise InvalidParameterError(f"{name} must contain only finite numbers (no NaN/inf)")
    return arr


@dataclass(frozen=True)
class FFTMechanism(ErrorMethods):
    """The real FFT factorization ``(B_F, C_F)`` of the ``n``-step prefix sum (App. K).

    Structured as its ``2n`` circulant coefficients; dense ``C_F`` (``2n x n``), ``B_F``
    (``n x 2n``) and the optimal decoder (``n x 2n``) only on request. The encoder is held as
    given (not normalized to a sensitivity); :meth:`normalized` returns a dense non-adaptive
    :class:`~dpmf.strategies.dense.DenseStrategy`. Shares the method set of every strategy
    (:mod:`dpmf.strategies.api`; the workload errors use the FFT Optimal Decoder ``A C_F^+``).
    **Not streaming**: every step's noise depends on all ``2n`` Gaussian vectors, so
    :meth:`streaming_noise` generates the whole noise up front (``n * dim`` floats, §4.6).
    """

    n: int

    name = "fft"

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _v.positive_int("n", self.n))

    def describe(self) -> dict:
        return {"name": self.name, "n": self.n}

    # ---- structure -------------------------------------------------------------------------
    @cached_property
    def _lam(self) -> np.ndarray:
        return _sqrt_eigenvalues(self.n)

    def circulant_coefficients(self) -> np.ndarray:
        """``c`` with ``Circ[i, j] = c[(i - j) mod 2n]``, ``C_F = Circ[:, :n]``, ``B_F = Circ[:n, :]``."""
        return _fft.irfft(self._lam, 2 * self.n)

    def gram_coefficients(self) -> np.ndarray:
        """First column of the symmetric Toeplitz ``G = C_F^T C_F`` (length ``n``)."""
        return self._gram[: self.n].copy()

    @cached_property
    def _gram(self) -> np.ndarray:
        return _fft.irfft(np.abs(self._lam) ** 2, 2 * self.n)

    @cached_property
    def _gohberg_semencul(self) -> tuple[int, np.ndarray, np.ndarray, float]:
        n = self.n
        g = self._gram[:n]
        e0 = np.zeros(n)
        e0[0] = 1.0
        x = _sl.solve_toeplitz(g, e0, check_finite=False)
        y = np.concatenate(([0.0], x[:0:-1]))
        size = _fft.next_fast_len(2 * n - 1, real=True)
        return size, _fft.rfft(x, size), _fft.rfft(y, size), float(x[0])

    def _circulant(self) -> np.ndarray:
        c = self.circulant_coefficients()
        N = 2 * self.n
        idx = np.arange(N)
        return c[(idx[:, None] - idx[None, :]) % N]

    def encoder(self) -> np.ndarray:
        """Dense ``C_F`` (``2n x n``)."""
        check_allocation(2 * self.n, 2 * self.n, "the FFT mechanism's dense encoder")
        return self._circulant()[:, : self.n]

    def decoder(self) -> np.ndarray:
        """Dense ``B_F`` (``n x 2n``), the FFT decoder with ``B_F C_F = A``."""
        check_allocation(2 * self.n, 2 * self.n, "the FFT mechanism's dense decoder")
        return self._circulant()[: self.n, :]

    def column_norms(self) -> np.ndarray:
        """Column norms of ``C_F``: all equal to ``sqrt(||v_hat||_1 / (2n))``."""
        return np.full(self.n, math.sqrt(self._gram[0]))

    # ---- fast products -----------------------------------------------------------------------
    def _circ(self, y: np.ndarray, *, transpose: bool = False) -> np.ndarray:
        N = 2 * self.n
        lam = np.conj(self._lam) if transpose else self._lam
        if y.ndim == 2:
            lam = lam[:, None]
        return _fft.irfft(lam * _fft.rfft(y, N, axis=0), N, axis=0)

    def encode(self, x: object) -> np.ndarray:
        """``C_F @ x`` by FFT; ``x`` of shape ``(n,)`` or ``(n, d)``, result ``(2n, ...)``."""
        x = _columns("x", x, self.n)
        return self._circ(x)

    def decode(self, y: object) -> np.ndarray:
        """``B_F @ y`` by FFT; ``y`` of shape ``(2n,)`` or ``(2n, d)``, result ``(n, ...)``."""
        y = _columns("y", y, 2 * self.n)
        return self._circ(y)[: self.n]

    def _gram_solve(self, r: np.ndarray) -> np.ndarray:
        # G^{-1} r = (L(x) L(x)^T r - L(y) L(y)^T r) / x_0 with L(a)^T = J L(a) J (J: reversal).
        # Work on rows (columns of r transposed) so the FFTs run along contiguous memory; three
        # forward and three inverse transforms per column.
        n = self.n
        size, fx, fy, x0 = self._gohberg_semencul
        rt = np.atleast_2d(r.T)
        out = np.empty_like(rt)
        for j in range(0, rt.shape[0], _CHUNK):
            block = rt[j : j + _CHUNK, ::-1]
            fr = _fft.rfft(block, size, axis=-1)
            ux = _fft.irfft(fx * fr, size, axis=-1)[:, n - 1 :: -1]  # L(x)^T r
            uy = _fft.irfft(fy * fr, size, axis=-1)[:, n - 1 :: -1]  # L(y)^T r
            both = fx * _fft.rfft(ux, size, axis=-1) - fy * _fft.rfft(uy, size, axis=-1)
            out[j : j + _CHUNK] = _fft.irfft(both, size, axis=-1)[:, :n] / x0
        return out[0] if r.ndim == 1 else out.T

    def gram_solve(self, r: object) -> np.ndarray:
        """``G^{-1} r`` with ``G = C_F^T C_F`` (Gohberg-Semencul, ``O(n log n)`` per column)."""
        return self._gram_solve(_columns("r", r, self.n))

    def pseudo_inverse_apply(self, y: object) -> np.ndarray:
        """``C_F^+ y = G^{-1} C_F^T y`` for ``y`` of shape ``(2n,)`` or ``(2n, d)``."""
        y = _columns("y", y, 2 * self.n)
        return self._pinv_apply(y)

    def _pinv_apply(self, y: np.ndarray) -> np.ndarray:
        return self._gram_solve(self._circ(y, transpose=True)[: self.n])

    def optimal_decode(self, y: object, workload: object | None = None) -> np.ndarray:
        """``A C_F^+ y`` (default ``A``: prefix sum, applied as a cumulative sum)."""
        y = _columns("y", y, 2 * self.n)
        return self._apply_workload(self._pinv_apply(y), workload)

    def _apply_workload(self, u: np.ndarray, workload: object | None) -> np.ndarray:
        if workload is None:
            return np.cumsum(u, axis=0)
        A = _v.finite_array("workload", workload, ndim=2)
        if A.shape != (self.n, self.n):
            raise InvalidParameterError(
                f"workload must have shape {(self.n, self.n)}, got {A.shape}"
            )
        return A @ u

    def pseudo_inverse(self) -> np.ndarray:
        """Dense ``C_F^+`` (``n x 2n``), computed with FFTs (``O(n^2 log n)``)."""
        return self._gram_solve(self.encoder().T.copy())

    def optimal_decoder(self, workload: object | None = None) -> np.ndarray:
        """Dense FFT Optimal Decoder ``A C_F^+`` (``n x 2n``; default ``A``: prefix sum)."""
        return self._apply_workload(self.pseudo_inverse(), workload)

    # ---- noise and error ---------------------------------------------------------------------
    def prefix_sum_noise(
        self,
        rng: np.random.Generator | int,
        dim: int = 1,
        *,
        noise_multiplier: float = 1.0,
        decoder: Literal["fft", "optimal"] = "fft",
    ) -> np.ndarray:
        """Noise ``B z`` on the ``n`` prefix sums, ``z ~ N(0, noise_multiplier^2 I)`` of shape
        ``(2n, dim)``; returns ``(n, dim)``. Pre-generates all noise (``O(n dim)`` memory, as the
        paper notes). The per-step noise for training is ``np.diff(noise, axis=0, prepend=0)``."""
        gen = resolve_rng(rng, required=True)
        dim = _v.positive_int("dim", dim)
        sigma = _v.non_negative("noise_multiplier", noise_multiplier)
        check_allocation(2 * self.n, dim, "the FFT mechanism's noise (drawn up front)", copies=3,
                         hint="use a smaller dim or fewer steps")
        z = sigma * gen.standard_normal((2 * self.n, dim))
        if decoder == "fft":
            return self._circ(z)[: self.n]
        if decoder == "optimal":
            return np.cumsum(self._pinv_apply(z), axis=0)
        raise InvalidParameterError(f"decoder must be 'fft' or 'optimal', got {decoder!r}")

    def prefix_sum_rmse(self, decoder: Literal["fft", "optimal"] = "fft") -> float:
        """RMSE over the ``n`` prefix sums per unit noise multiplier, ``||B||_F / sqrt(n)``, for
        ``C_F`` as given (not normalized to a participation schema).

        ``"fft"``: every row of ``B_F`` is a permutation of ``c``, so this is ``||c||_2``.
        ``"optimal"``: ``sqrt(tr(A G^{-1} A^T) / n)``.
        """
        if decoder == "fft":
            return math.sqrt(self._gram[0])
        if decoder == "optimal":
            S_T = np.triu(np.ones((self.n, self.n)))  # A^T, columns e_0 + ... + e_i
            Y = self._gram_solve(S_T)  # G^{-1} A^T
            return math.sqrt(float(np.sum(np.triu(Y))) / self.n)  # tr(A Y) = sum_{j <= i} Y[j, i]
        raise InvalidParameterError(f"decoder must be 'fft' or 'optimal', got {decoder!r}")

    # ---- uniform strategy API ----------------------------------------------------------------
    def normalized(self, participation):
        """``C_F / sens`` as a non-adaptive :class:`~dpmf.strategies.dense.DenseStrategy` named
        ``"fft"`` (sensitivity <= 1 under ``participation``; its decoder is the optimal one)."""
        from dpmf.strategies.dense import DenseStrategy
        from dpmf.strategies.sensitivity import sensitivity_squared

        sens = sensitivity_squared(self.encoder(), participation).sensitivity
        return DenseStrategy(self.encoder() / sens, adaptive=False, name=self.name)

    def sensitivity(self, participation) -> float:
        """Sound L2 sensitivity of ``C_F x`` under ``participation``
        (:func:`~dpmf.strategies.sensitivity.sensitivity_squared` on the dense ``C_F``: the spectral
        bound or the SDP certificate, since ``C_F^T C_F`` has negative entries)."""
        from dpmf.strategies.sensitivity import sensitivity_squared

        return sensitivity_squared(self.encoder(), participation).sensitivity

    def _decoder_for(self, workload: object) -> np.ndarray:
        return self.optimal_decoder(workload)

    def noising_matrix(self, decoder: Literal["fft", "optimal"] = "fft") -> np.ndarray:
        """The ``n x 2n`` left inverse ``L`` (``L C_F = I``) whose ``L z`` training adds:
        ``A^{-1} B_F`` (first differences of the rows of ``B_F``) or ``C_F^+`` (optimal decoder)."""
        if decoder == "fft":
            return np.diff(self.decoder(), axis=0, prepend=0.0)
        if decoder == "optimal":
            return self.pseudo_inverse()
        raise InvalidParameterError(f"decoder must be 'fft' or 'optimal', got {decoder!r}")

    def _streaming_noise(self, dim: int, rng: object, noise_multiplier: float, dtype: object,
                         decoder: Literal["fft", "optimal"] = "fft", z: object = None):
        # streaming_noise (NoiseMethod): L z drawn up front from z of shape (2n, dim), or a given
        # z (used as is); not streaming, so no step(z)
        from dpmf.strategies.streaming import PregeneratedNoise, StreamingNoise

        if decoder not in ("fft", "optimal"):
            raise InvalidParameterError(f"decoder must be 'fft' or 'optimal', got {decoder!r}")
        base = StreamingNoise(self.n, dim, noise_multiplier=noise_multiplier, rng=rng, dtype=dtype)
        check_allocation(2 * self.n, base.dim, "the FFT mechanism's noise (drawn up front)", copies=3,
                         hint="use a smaller dim or fewer steps (the FFT mechanism is not streaming)")
        if z is None:
            if base._rng is None:
                raise InvalidParameterError(
                    "rng is required: the FFT mechanism draws all its noise up front (or pass z)"
                )
            zz = base._draw((2 * self.n, base.dim)).astype(np.float64)
        else:
            zz = _columns("z", z, 2 * self.n)
            if zz.shape != (2 * self.n, base.dim):
                raise InvalidParameterError(f"z must have shape {(2 * self.n, base.dim)}, got {zz.shape}")
        if decoder == "fft":
            rows = np.diff(self._circ(zz)[: self.n], axis=0, prepend=0.0)
        else:
            rows = self._pinv_apply(zz)
        return PregeneratedNoise(
            rows.astype(base.dtype),
            reason="the FFT mechanism is not streaming (each step needs all 2n z's)",
            shape=base.shape,
        )
