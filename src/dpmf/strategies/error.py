r"""Error of a matrix mechanism ``A x + B z`` with ``A = B C`` (multi-epoch MF paper, §2.6).

Paper: Choquette-Choo et al., *Multi-Epoch Matrix Factorization Mechanisms for Private Machine
Learning*, ICML 2023 (arXiv 2211.06530), Sec. 3 / Eq. 4; digest ``notes/multi-epoch-mf.md`` §2.6.

Conventions. The mechanism releases ``C x + z`` with ``z ~ N(0, sigma^2 I)``; the decoded estimate
of the workload is ``B (C x + z) = A x + B z``. The noise on query ``i`` has variance
``sigma^2 ||B[i, :]||^2``. To compare strategies at equal privacy we normalize ``C`` to L2
sensitivity 1 under the participation schema (``C -> C / sens``, ``B -> sens B``), so that
``sigma`` is the noise multiplier of a sensitivity-1 Gaussian mechanism. "Per unit noise
multiplier" below means ``sigma = 1`` *after* that normalization:

* ``per_query_error(C, A)``      = ``||B[i, :]||^2`` (strategy **as given**, no sensitivity; mirrors
  ``jax_privacy.matrix_factorization.dense.per_query_error``).
* ``per_step_variance``          = ``sens^2 ||B[i, :]||^2`` (Figs. 4/5 "per-iterate variance").
* ``total_squared_error``        = ``sens^2 ||B||_F^2`` -- the paper's loss ``L(B, C)`` (Eq. 4,
  Table 1); Table 6's "Error" is its square root.
* ``rmse``                       = ``sens sqrt(mean_i ||B[i, :]||^2)`` (RMSE of the queries).
* ``max_error``                  = ``sens max_i ||B[i, :]||`` (std of the worst query; the paper
  defines no max error, this follows jax_privacy / Fichtenberger et al.).

Decoder. By default ``B = A C^{-1}`` (a lower-triangular solve when ``C`` is lower triangular, so
the mechanism stays streaming); for a tall ``C`` (``m > n`` rows) the optimal decoder
``B = A C^+`` (minimum Frobenius norm, paper §2.4). A given ``B`` is checked to satisfy
``B C = A``. The sensitivity is computed with
:func:`dpmf.strategies.sensitivity.sensitivity_squared` (a sound upper bound for vector data, so
these errors are never understated by an optimistic sensitivity), or passed in.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError
from dpmf.strategies.sensitivity import sensitivity_squared
from dpmf.strategies.workloads import prefix_sum

__all__ = [
    "decoder",
    "per_query_error",
    "per_step_variance",
    "total_squared_error",
    "rmse",
    "max_error",
]


def _workload(A: object, n: int) -> np.ndarray:
    if A is None:
        return prefix_sum(n)
    arr = _v.finite_array("A", A, ndim=2)
    if arr.shape[1] != n:
        raise InvalidParameterError(f"A must have n={n} columns (one per step, like C), got shape {arr.shape}")
    return arr


def decoder(C: object, A: object = None) -> np.ndarray:
    """The decoder ``B`` with ``B C = A`` (``A`` defaults to the prefix sum).

    Square ``C``: ``B = A C^{-1}`` (triangular solve if ``C`` is lower triangular). Tall ``C``
    (``m > n``, full column rank): ``B = A C^+``, the minimum-norm decoder.
    """
    C = _v.finite_array("C", C, ndim=2)
    m, n = C.shape
    A = _workload(A, n)
    if m < n:
        raise InvalidParameterError(
            f"C must have at least as many rows as columns to be decodable, got shape {C.shape}"
        )
    if m == n:
        if not np.any(np.triu(C, 1)):
            if np.any(np.diag(C) == 0):
                raise InvalidParameterError("C must be invertible, got a zero on the diagonal of a lower-triangular C")
            # B C = A  <=>  C^T B^T = A^T with C^T upper triangular
            B = scipy.linalg.solve_triangular(C.T, A.T, lower=False).T
        else:
            try:
                B = np.linalg.solve(C.T, A.T).T
            except np.linalg.LinAlgError:
                raise InvalidParameterError("C must be invertible, got a singular matrix") from None
    else:
        if np.linalg.matrix_rank(C) < n:
            raise InvalidParameterError(f"C must have full column rank n={n} to be decodable")
        B = A @ np.linalg.pinv(C)
    if not np.all(np.isfinite(B)):
        raise InvalidParameterError("C is too ill-conditioned: the decoder A C^{-1} is not finite")
    return B


def _decoder_or_given(C: np.ndarray, A: object, B: object) -> np.ndarray:
    if B is None:
        return decoder(C, A)
    n = C.shape[1]
    A = _workload(A, n)
    B = _v.finite_array("B", B, ndim=2)
    if B.shape != (A.shape[0], C.shape[0]):
        raise InvalidParameterError(
            f"B must have shape {(A.shape[0], C.shape[0])} (rows of A x rows of C), got {B.shape}"
        )
    resid = float(np.abs(B @ C - A).max())
    scale = max(1.0, float(np.abs(A).max()))
    if resid > 1e-8 * scale:
        raise InvalidParameterError(f"B must satisfy B @ C == A, got max |B C - A| = {resid:.3g}")
    return B


def per_query_error(C: object, A: object = None, *, B: object = None) -> np.ndarray:
    """``||B[i, :]||^2`` for every query ``i``: noise variance per unit noise std on ``C`` as given."""
    C = _v.finite_array("C", C, ndim=2)
    Bm = _decoder_or_given(C, A, B)
    return np.einsum("ij,ij->i", Bm, Bm)


def _sens_squared(C: np.ndarray, participation: object, sensitivity: object) -> float:
    if sensitivity is not None:
        if participation is not None:
            raise InvalidParameterError("pass either participation or sensitivity, not both")
        return _v.positive("sensitivity", sensitivity) ** 2
    if participation is None:
        raise InvalidParameterError("participation is required (or pass sensitivity=...)")
    return sensitivity_squared(C, participation).value


def per_step_variance(
    C: object, participation: object = None, A: object = None, *, B: object = None, sensitivity: object = None
) -> np.ndarray:
    """``sens^2 ||B[i, :]||^2``: variance of query ``i`` per unit noise multiplier after
    normalizing ``C`` to sensitivity 1 under ``participation`` (or a given ``sensitivity``)."""
    C = _v.finite_array("C", C, ndim=2)
    return _sens_squared(C, participation, sensitivity) * per_query_error(C, A, B=B)


def total_squared_error(
    C: object, participation: object = None, A: object = None, *, B: object = None, sensitivity: object = None
) -> float:
    """The paper's loss (Eq. 4): ``sens^2 ||B||_F^2`` (``A`` defaults to the prefix sum)."""
    return float(per_step_variance(C, participation, A, B=B, sensitivity=sensitivity).sum())


def rmse(
    C: object, participation: object = None, A: object = None, *, B: object = None, sensitivity: object = None
) -> float:
    """Root-mean-squared error of the workload queries per unit noise multiplier (sensitivity 1):
    ``sens sqrt(mean_i ||B[i, :]||^2)``."""
    return math.sqrt(float(per_step_variance(C, participation, A, B=B, sensitivity=sensitivity).mean()))


def max_error(
    C: object, participation: object = None, A: object = None, *, B: object = None, sensitivity: object = None
) -> float:
    """Standard deviation of the worst query per unit noise multiplier: ``sens max_i ||B[i, :]||``."""
    return math.sqrt(float(per_step_variance(C, participation, A, B=B, sensitivity=sensitivity).max()))
