"""Banded Toeplitz strategies: BSR, BISR and optimized banded Toeplitz encoders.

All three return a :class:`~dpmf.strategies.toeplitz.ToeplitzStrategy` (the encoder ``C`` held
as its coefficient vector, 0-based: ``C[i, j] = c[i - j]``).

* :func:`bsr` -- *banded square root* (Kalinin & Lampert, NeurIPS 2024; digest
  ``notes/random-allocation.md`` Sec. 5): ``C`` has the first ``bands`` coefficients of
  ``(1 - x)^{-1/2}`` (``f(0) = 1, f(k) = f(k-1)(1 - 1/(2k))``) and zeros beyond.
* :func:`bisr` -- *banded inverse square root* (Kalinin, McKenna, Upadhyay & Lampert 2025,
  arXiv 2505.12128): ``C^{-1}`` has the first ``bands`` coefficients of ``(1 - x)^{1/2}``
  (``r_0 = 1, r_k = r_{k-1}(k - 3/2)/k``) and zeros beyond; ``C`` is its (dense) Toeplitz inverse.
* :func:`optimize_banded_toeplitz` -- ``bands`` coefficients minimizing the mean squared error
  of the ``n`` prefix sums, ``L(c) = (1/n) sum_i ||(A C^{-1})_i||^2``, at ``||c||_2 = 1``.
  Mirrors ``jax_privacy.matrix_factorization.toeplitz.optimize_banded_toeplitz`` in purpose
  (no code shared).

Strategies are returned *as given*, not normalized to a participation schema: the caller
multiplies errors by ``strategy.sensitivity(participation)`` to compare at equal privacy.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import scipy.fft as _fft
import scipy.optimize as _opt

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError, NumericalError
from dpmf.resources import check_allocation
from dpmf.strategies.toeplitz import (
    ToeplitzStrategy,
    sqrt_prefix_coefficients,
    toeplitz_inverse_coefficients,
)

__all__ = [
    "bsr",
    "bisr",
    "bisr_noising_coefficients",
    "inverse_sqrt_coefficients",
    "prefix_sum_loss",
    "prefix_sum_loss_and_grad",
    "optimize_banded_toeplitz",
]


def check_bands(n: object, bands: object) -> tuple[int, int]:
    n = _v.positive_int("n", n)
    if isinstance(bands, float) and not math.isfinite(bands):
        raise InvalidParameterError(f"bands must be an integer in [1, n={n}], got {bands!r}")
    try:
        bands = _v.positive_int("bands", bands)
    except InvalidParameterError:
        raise InvalidParameterError(
            f"bands must be an integer in [1, n={n}], got {bands!r}"
        ) from None
    if bands > n:
        raise InvalidParameterError(f"bands must be an integer in [1, n={n}], got {bands}")
    return n, bands


def check_epochs(n: int, epochs: object) -> int:
    """``epochs`` as an integer in ``[1, n]`` (participations ``n // epochs`` apart)."""
    epochs = _v.positive_int("epochs", epochs)
    if epochs > n:
        raise InvalidParameterError(f"epochs must be an integer in [1, n={n}], got {epochs}")
    return epochs


def check_series(name: str, coefs: object, n: int, why: str) -> np.ndarray:
    """Finite coefficients of a power series truncated at ``n`` (at most ``n`` of them) whose
    constant term is nonzero (``why`` says what for, in the error message)."""
    c = _v.finite_array(name, coefs)
    if c.size > n:
        raise InvalidParameterError(f"{name} must have at most n={n} entries, got {c.size}")
    if c[0] == 0:
        raise InvalidParameterError(f"{name}[0] must be nonzero {why}, got 0.0")
    return c


def inverse_sqrt_coefficients(m: int) -> np.ndarray:
    """The first ``m`` coefficients of ``(1 - x)^{1/2}``: ``1, -1/2, -1/8, -1/16, ...``

    ``r_0 = 1``, ``r_k = r_{k-1} (k - 3/2) / k``: the inverse of the square-root prefix-sum
    Toeplitz (:func:`~dpmf.strategies.toeplitz.sqrt_prefix_coefficients`).
    """
    m = _v.positive_int("m", m)
    k = np.arange(1, m, dtype=np.float64)
    return np.cumprod(np.concatenate(([1.0], (k - 1.5) / k)))


def bsr(n: int, bands: int) -> ToeplitzStrategy:
    """Banded square root: ``C = Toeplitz(f_0, ..., f_{bands-1})``, ``f`` of ``(1 - x)^{-1/2}``.

    ``bands = n`` is the (unbanded) square-root factorization ``C @ C = A``. ``C >= 0`` and its
    coefficients are non-increasing, so sensitivities are exact in closed form.
    """
    n, bands = check_bands(n, bands)
    return ToeplitzStrategy(sqrt_prefix_coefficients(bands), n)


def bisr_noising_coefficients(n: int, bands: int) -> np.ndarray:
    """The exact (banded) coefficients of ``C^{-1}`` for :func:`bisr` ``(n, bands)``, length
    ``bands``. Feed them to :meth:`ToeplitzNoise.from_noising_coefficients` for streaming noise
    with ``bands - 1`` rows of history."""
    n, bands = check_bands(n, bands)
    return inverse_sqrt_coefficients(bands)


def bisr(n: int, bands: int) -> ToeplitzStrategy:
    """Banded inverse square root: ``C^{-1} = Toeplitz(r_0, ..., r_{bands-1})`` with ``r`` the
    coefficients of ``(1 - x)^{1/2}``; the returned encoder ``C`` is its Toeplitz inverse (dense,
    non-negative). The exact band of ``C^{-1}`` is kept as ``strategy.inverse_coefs``, so
    ``strategy.streaming_noise`` needs only ``(bands - 1) * dim`` floats of history
    (:func:`bisr_noising_coefficients` gives the same coefficients).
    """
    n, bands = check_bands(n, bands)
    r = inverse_sqrt_coefficients(bands)
    return ToeplitzStrategy(toeplitz_inverse_coefficients(r, n), n, inverse_coefs=r)


# ----------------------------------------------------------------------------------------------
# prefix-sum loss and its gradient


def _conv_trunc(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """First ``n`` coefficients of the power-series product ``a(x) b(x)`` (FFT)."""
    size = _fft.next_fast_len(a.size + b.size - 1, real=True)
    return _fft.irfft(_fft.rfft(a, size) * _fft.rfft(b, size), size)[:n]


def _loss_and_grad(c: np.ndarray, n: int, weights: np.ndarray) -> tuple[float, np.ndarray]:
    # g = coefficients of C^{-1}, b = cumsum(g) those of B = A C^{-1}.
    # L = sum_j w_j b_j^2 with w_j = (n - j) / n (b_j appears in the rows i >= j of B).
    # Adjoint: dL/db_j = 2 w_j b_j; dL/dg = reverse cumsum of that (=: u); from c g = 1 (mod x^n),
    # dg = -g^2 dc, so dL/dc_k = -sum_{j >= k} u_j (g^2)_{j-k}, for k < len(c).
    g = toeplitz_inverse_coefficients(c, n)
    b = np.cumsum(g)
    loss = float(np.dot(weights, b * b))
    u = np.cumsum((2.0 * weights * b)[::-1])[::-1]
    h = _conv_trunc(g, g, n)
    m = c.size
    # correlation: grad_k = -sum_{t=0}^{n-1-k} u_{t+k} h_t = -(h * reversed u)[n - 1 - k]
    full = _conv_trunc(h, u[::-1], n)
    grad = -full[n - 1 - np.arange(m)]
    return loss, grad


def prefix_sum_loss(coefs: object, n: int) -> float:
    """Mean squared error of the ``n`` prefix sums per unit noise multiplier for
    ``C = Toeplitz(coefs)``: ``(1/n) sum_i ||(A C^{-1})_i||^2`` (not sensitivity-normalized;
    equals ``ToeplitzStrategy(coefs, n).prefix_sum_rmse() ** 2``)."""
    return prefix_sum_loss_and_grad(coefs, n)[0]


def prefix_sum_loss_and_grad(coefs: object, n: int) -> tuple[float, np.ndarray]:
    """:func:`prefix_sum_loss` and its gradient with respect to ``coefs`` (``O(n log n)`` after
    computing ``C^{-1}``, which is ``O(n * len(coefs))`` or ``O(n log n)``)."""
    n = _v.positive_int("n", n)
    c = check_series("coefs", coefs, n, "for C to be invertible")
    weights = np.arange(n, 0, -1, dtype=np.float64) / n
    return _loss_and_grad(c, n, weights)


def optimize_banded_toeplitz(
    n: int,
    bands: int,
    epochs: int = 1,
    *,
    max_iter: int = 1000,
    tol: float = 1e-10,
    callback: Callable[[int, float], None] | None = None,
) -> ToeplitzStrategy:
    """Banded Toeplitz encoder (``bands`` coefficients) minimizing the prefix-sum mean squared
    error at unit coefficient norm.

    Minimizes ``log(L(c) ||c||^2) = log L(c / ||c||)`` (scale invariant) over
    ``c in R^bands`` with L-BFGS-B and the analytic gradient (:func:`prefix_sum_loss_and_grad`),
    starting from :func:`bsr`; returns ``c / ||c||`` with ``c_0 > 0``. The log keeps the line
    search sane where ``C^{-1}`` blows up (roots of ``c(x)`` inside the unit disk).

    When ``bands <= n // epochs`` (at most ``min_sep`` bands under
    ``FixedEpochParticipation(epochs, n // epochs)`` or b-min-sep with ``b = n // epochs``) the
    columns of a pattern never share a row and the squared sensitivity is ``epochs`` (column
    norms at most 1), so this minimizes the sensitivity-normalized error. For more bands the
    objective is only a proxy: compute the sensitivity with ``strategy.sensitivity(...)``.

    ``epochs`` is validated and recorded for the caller's use only (the objective does not depend
    on it). ``callback(iteration, loss)`` is called after each L-BFGS iteration; raise from it to
    interrupt. Raises :class:`~dpmf.errors.NumericalError` if the optimizer produces non-finite
    values.
    """
    n, bands = check_bands(n, bands)
    check_allocation(1, n, "the banded Toeplitz optimization", copies=8)
    check_epochs(n, epochs)
    max_iter = _v.positive_int("max_iter", max_iter)
    tol = _v.positive("tol", tol)
    weights = np.arange(n, 0, -1, dtype=np.float64) / n
    x0 = sqrt_prefix_coefficients(bands)
    x0 = x0 / np.linalg.norm(x0)

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        nrm2 = float(np.dot(x, x))
        if x[0] == 0 or not np.all(np.isfinite(x)):
            return math.inf, np.zeros_like(x)
        loss, grad = _loss_and_grad(x, n, weights)
        f = loss * nrm2
        if not (math.isfinite(f) and f > 0):
            return math.inf, np.zeros_like(x)
        # log of the objective: same minimizer, tame where C^{-1} explodes (unstable c(x))
        return math.log(f), (grad * nrm2 + 2.0 * loss * x) / f

    it = [0]

    def cb(xk: np.ndarray) -> None:
        it[0] += 1
        if callback is not None:
            callback(it[0], math.exp(fun(xk)[0]))

    if bands == 1:
        x = x0
    else:
        res = _opt.minimize(
            fun,
            x0,
            jac=True,
            method="L-BFGS-B",
            callback=cb,
            options={"maxiter": max_iter, "ftol": tol, "gtol": tol * 1e-2, "maxcor": 20},
        )
        x = np.asarray(res.x, dtype=np.float64)
        # never return something worse than the (feasible) starting point
        if not (np.isfinite(res.fun) and res.fun <= fun(x0)[0]):
            x = x0
    if not np.all(np.isfinite(x)) or x[0] == 0:
        raise NumericalError(f"optimize_banded_toeplitz(n={n}, bands={bands}) did not converge")
    x = x / np.linalg.norm(x)
    if x[0] < 0:
        x = -x
    return ToeplitzStrategy(x, n)
