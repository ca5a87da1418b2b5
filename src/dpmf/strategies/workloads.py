"""Workload (query) matrices ``A``: the linear functions of the gradient stream training needs.

The matrix mechanism releases ``A x + B z`` for a factorization ``A = B C`` (multi-epoch MF paper,
Choquette-Choo et al. 2023, arXiv 2211.06530, Sec. 2 / Eq. 1). Workloads are ``n x n``, lower
triangular (query ``i`` may only read inputs ``0..i``: the stream is adaptive) and full rank.

* **Prefix sum** ``S = tri(n)``: ``S[i, j] = 1`` for ``j <= i``. SGD with a constant learning rate
  ``eta`` releases ``theta_i = theta_{-1} - eta * (S g)_i``.
* **SGD with momentum and a learning-rate schedule** (paper Sec. 5.3 / Fig. 2; the matrix is not
  written in the paper, this form is the authors' code and reproduces Table 6's 16.114)::

      m_t = beta * m_{t-1} + g_t,    theta_t = theta_{t-1} - eta * lr_t * m_t
      =>  theta = theta_start - eta * A g   with   A = tri(n) @ diag(lr) @ M_beta,
      M_beta[i, j] = beta**(i - j) for i >= j (else 0),
      A[i, j] = sum_{t=j}^{i} lr_t * beta**(t - j).

  ``beta = 0`` and ``lr = 1`` give the prefix sum. Table 6's "momentum" workload is ``beta = 0.95``,
  ``lr = 1``; the StackOverflow runs add a linear cooldown (:func:`linear_cooldown`).

Indices are 0-based throughout: the paper's step ``t`` in ``[n] = {1..n}`` is our ``t - 1``.
"""

from __future__ import annotations

import numpy as np

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError
from dpmf.resources import check_allocation

__all__ = ["prefix_sum", "momentum_sgd", "linear_cooldown", "lower_triangular", "square_matrix"]


def prefix_sum(n: int) -> np.ndarray:
    """The ``n x n`` prefix-sum workload ``S`` (lower-triangular ones, float64)."""
    n = _v.positive_int("n", n)
    check_allocation(n, n, "the dense prefix-sum workload")
    return np.tri(n, dtype=np.float64)


def momentum_sgd(n: int, momentum: float = 0.0, learning_rates: object = None) -> np.ndarray:
    """SGD with heavy-ball momentum and a per-step learning-rate schedule, as a workload.

    ``A = tri(n) @ diag(learning_rates) @ M_momentum`` with ``M[i, j] = momentum**(i - j)`` for
    ``i >= j``, i.e. ``A[i, j] = sum_{t=j}^{i} learning_rates[t] * momentum**(t - j)`` (module
    docstring). Row ``i`` is the model change after step ``i`` per unit of the base learning rate.

    Args:
      n: number of steps.
      momentum: ``beta`` in ``[0, 1)``. ``0`` is plain SGD.
      learning_rates: ``None`` (all ones) or ``n`` finite numbers ``> 0``, the multipliers ``lr_t``
        of the base learning rate (zero would make ``A`` singular and break the factorization).

    Mirrors ``jax_privacy.matrix_factorization`` ``momentum_sgd_matrix``.
    """
    n = _v.positive_int("n", n)
    beta = _v.non_negative("momentum", momentum)
    if not beta < 1:
        raise InvalidParameterError(f"momentum must be in [0, 1), got {momentum!r}")
    if learning_rates is None:
        lr = np.ones(n)
    else:
        lr = _v.finite_array("learning_rates", learning_rates)
        if lr.shape != (n,):
            raise InvalidParameterError(f"learning_rates must have length n={n}, got shape {lr.shape}")
        if np.any(lr <= 0):
            raise InvalidParameterError(
                f"learning_rates must all be > 0 (a zero rate makes A singular), got min {float(lr.min())!r}"
            )
    check_allocation(n, n, "the dense momentum workload", copies=4)  # (lags, powers, product, sums)
    lag = np.subtract.outer(np.arange(n), np.arange(n))  # i - j
    with np.errstate(under="ignore"):
        m_beta = np.where(lag >= 0, beta ** np.maximum(lag, 0).astype(np.float64), 0.0)
    if beta == 0.0:
        m_beta = np.eye(n)  # 0**0 = 1 on the diagonal only
    # tri(n) @ diag(lr) @ M  ==  cumulative sum over rows of (lr[:, None] * M)
    return np.cumsum(lr[:, None] * m_beta, axis=0)


def linear_cooldown(n: int, cooldown_steps: int | None = None, final: float = 0.05) -> np.ndarray:
    """Learning-rate multipliers: ``1`` then a linear ramp ``1 -> final`` over the last steps.

    ``cooldown_steps`` defaults to ``n // 4`` (the StackOverflow runs of the multi-epoch MF paper,
    Sec. 5.3: "last 25% of rounds"; the paper also says "final 512 rounds" for n = 2052, the code
    uses ``2052 // 4 = 513``). The ramp is ``linspace(1, final, cooldown_steps)``.
    """
    n = _v.positive_int("n", n)
    steps = n // 4 if cooldown_steps is None else cooldown_steps
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 0 <= steps <= n:
        raise InvalidParameterError(f"cooldown_steps must be an integer in [0, n={n}], got {cooldown_steps!r}")
    final = _v.positive("final", final)
    lr = np.ones(n)
    if steps:
        lr[n - steps :] = np.linspace(1.0, final, int(steps))
    return lr


def square_matrix(name: str, value: object) -> np.ndarray:
    """A finite, square, non-empty float64 matrix (a copy)."""
    arr = _v.finite_array(name, value, ndim=2)
    if arr.shape[0] != arr.shape[1]:
        raise InvalidParameterError(f"{name} must be square, got shape {arr.shape}")
    return arr.copy()


def lower_triangular(value: object, name: str = "A", *, invertible: bool = False) -> np.ndarray:
    """Validate a streaming workload/encoder: square, finite, lower triangular (exact zeros above).

    With ``invertible=True`` the diagonal must also be non-zero (a triangular matrix is invertible
    iff its diagonal is). Returns a float64 copy. Raises
    :class:`~dpmf.errors.InvalidParameterError` naming ``name``.
    """
    arr = square_matrix(name, value)
    upper = np.triu(arr, 1)
    if np.any(upper != 0):
        i, j = np.unravel_index(int(np.argmax(np.abs(upper))), upper.shape)
        raise InvalidParameterError(
            f"{name} must be lower triangular (query i may only use steps 0..i), "
            f"got {name}[{i}, {j}] = {float(arr[i, j])!r} above the diagonal"
        )
    if invertible and np.any(np.diag(arr) == 0):
        i = int(np.flatnonzero(np.diag(arr) == 0)[0])
        raise InvalidParameterError(
            f"{name} must be invertible (non-zero diagonal), got {name}[{i}, {i}] = 0"
        )
    return arr
