"""BandMF: optimized general (non-Toeplitz) banded lower-triangular encoders.

Choquette-Choo et al. 2023, "(Amplified) Banded Matrix Factorizations": ``C`` is lower
triangular and ``b``-banded (``C[i, j] = 0`` unless ``0 <= i - j < b``) with every column of unit
L2 norm. Under ``k`` participations at least ``b`` apart the participating columns never share a
row, so the squared sensitivity is exactly ``k``, and minimizing the prefix-sum error
``L(C) = ||A C^{-1}||_F^2 / n`` (``A`` the prefix-sum matrix) minimizes the
sensitivity-normalized error. Mirrors ``jax_privacy.matrix_factorization.banded`` in purpose
(no code shared).

Parameterization: the ``n x b`` band entries ``V[j, d] = C[j + d, j]`` (only ``j + d < n``),
normalized column by column inside the objective (scale-free per column). Gradient:
with ``G = C^{-1}``, ``dL/dG = 2 A^T A G / n`` and ``dG = -G dC G``, so
``dL/dC = -G^T (2 A^T A G / n) G^T``, restricted to the band and chained through
``c = v / ||v||``: ``dL/dv = (g - c (c . g)) / ||v||``.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg as _la
import scipy.optimize as _opt

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError, NumericalError
from dpmf.resources import check_allocation
from dpmf.strategies.banded import check_bands, optimize_banded_toeplitz
from dpmf.strategies.dense import DenseStrategy
from dpmf.strategies.toeplitz import materialize_lower_toeplitz

__all__ = ["bandmf_loss_and_grad", "optimize_bandmf"]


def _band_index(n: int, bands: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices of the band entries (column-major: column j, then offset d)."""
    j, d = np.meshgrid(np.arange(n), np.arange(bands), indexing="ij")
    keep = (j + d) < n
    return (j + d)[keep], j[keep]


def _objective(x: np.ndarray, rows: np.ndarray, cols: np.ndarray, n: int) -> tuple[float, np.ndarray]:
    """Loss ``||A Cn^{-1}||_F^2 / n`` (``Cn`` the column-normalized band matrix with band
    entries ``x``) and its gradient with respect to ``x``."""
    nrm = np.sqrt(np.bincount(cols, weights=x * x, minlength=n))
    if not np.all(np.isfinite(x)) or np.any(nrm == 0):
        return math.inf, np.zeros_like(x)
    cvals = x / nrm[cols]
    C = np.zeros((n, n))
    C[rows, cols] = cvals
    diag = np.diag(C)
    if np.any(diag == 0):
        return math.inf, np.zeros_like(x)
    with np.errstate(all="ignore"):
        G = _la.solve_triangular(C, np.eye(n), lower=True, check_finite=False)
        B = np.cumsum(G, axis=0)  # A G
        loss = float(np.sum(B * B)) / n
        if not (math.isfinite(loss) and loss > 0):
            return math.inf, np.zeros_like(x)
        AtAG = np.cumsum(B[::-1], axis=0)[::-1]  # A^T (A G)
        dC = -(2.0 / n) * (G.T @ AtAG @ G.T)
    g = dC[rows, cols]
    proj = np.bincount(cols, weights=cvals * g, minlength=n)
    grad = (g - cvals * proj[cols]) / nrm[cols]
    if not np.all(np.isfinite(grad)):
        return math.inf, np.zeros_like(x)
    return loss, grad


def bandmf_loss_and_grad(C: object, bands: int) -> tuple[float, np.ndarray]:
    """Prefix-sum loss ``||A Cn^{-1}||_F^2 / n`` of the ``bands``-band part of ``C`` after
    normalizing every column to unit norm, and its gradient with respect to the band entries of
    ``C`` (an ``n x n`` matrix, zero outside the band). Entries of ``C`` outside the band are
    ignored."""
    C = _v.finite_array("C", C, ndim=2)
    if C.shape[0] != C.shape[1]:
        raise InvalidParameterError(f"C must be square, got shape {C.shape}")
    n, bands = check_bands(C.shape[0], bands)
    rows, cols = _band_index(n, bands)
    loss, grad = _objective(C[rows, cols].astype(np.float64), rows, cols, n)
    if not math.isfinite(loss):
        raise InvalidParameterError("C (band part, column-normalized) must be invertible")
    out = np.zeros((n, n))
    out[rows, cols] = grad
    return loss, out


def optimize_bandmf(
    n: int,
    bands: int,
    *,
    max_iter: int = 1000,
    tol: float = 1e-10,
    init: object = None,
) -> DenseStrategy:
    """BandMF encoder: lower-triangular ``bands``-banded ``C`` with unit-norm columns minimizing
    the prefix-sum mean squared error ``||A C^{-1}||_F^2 / n``.

    L-BFGS-B on ``log L`` over the band entries (column-normalized inside the objective) with the
    analytic gradient, ``O(n^3)`` per iteration (fine for ``n <= 512``). The default start is the
    :func:`~dpmf.strategies.banded.optimize_banded_toeplitz` optimum, materialized and
    column-normalized (never worse than banded Toeplitz: normalizing the truncated last columns
    only lowers the error, and the optimizer's result is kept only if it does not increase the
    loss). ``init`` may be an ``n x n`` matrix whose band part is used as the start.

    Returns ``DenseStrategy(C, name="banded")``; its squared sensitivity under ``k``
    participations at least ``bands`` apart is exactly ``k``.
    """
    n, bands = check_bands(n, bands)
    check_allocation(n, n, "BandMF's dense matrices", copies=6)
    max_iter = _v.positive_int("max_iter", max_iter)
    tol = _v.positive("tol", tol)
    rows, cols = _band_index(n, bands)
    if init is None:
        coefs = optimize_banded_toeplitz(n, bands).coefs
        M = materialize_lower_toeplitz(coefs, n)
    else:
        M = _v.finite_array("init", init, ndim=2)
        if M.shape != (n, n):
            raise InvalidParameterError(f"init must have shape ({n}, {n}), got {M.shape}")
    x0 = np.asarray(M[rows, cols], dtype=np.float64)
    f0, _ = _objective(x0, rows, cols, n)
    if not math.isfinite(f0):
        raise InvalidParameterError("init (band part) must have nonzero columns and diagonal")

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        loss, grad = _objective(x, rows, cols, n)
        if not math.isfinite(loss):
            return math.inf, np.zeros_like(x)
        return math.log(loss), grad / loss

    x = x0
    if bands > 1:
        res = _opt.minimize(
            fun,
            x0,
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": max_iter, "ftol": tol, "gtol": tol * 1e-2, "maxcor": 20},
        )
        xr = np.asarray(res.x, dtype=np.float64)
        if np.isfinite(res.fun) and fun(xr)[0] <= math.log(f0):
            x = xr
    nrm = np.sqrt(np.bincount(cols, weights=x * x, minlength=n))
    C = np.zeros((n, n))
    C[rows, cols] = x / nrm[cols]
    d = np.diag(C).copy()
    if not np.all(np.isfinite(C)) or np.any(d == 0):
        raise NumericalError(f"optimize_bandmf(n={n}, bands={bands}) did not converge")
    C = C * np.sign(d)[None, :]  # positive diagonal (column sign flips leave error unchanged)
    return DenseStrategy(C, name="banded")
