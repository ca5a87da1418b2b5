r"""The dominating pair of random allocation (balls-in-bins) for a matrix mechanism.

Schuchardt & Kalinin, "Sampling-free privacy accounting for matrix mechanisms under random
allocation" (arXiv 2601.21636), Lemma 2.8 (= Choquette-Choo et al. 2025, Lemma 3.2, with the
add/remove orientation of App. G); digest ``notes/random-allocation.md`` §2.3-§2.5.

Setting: ``k`` epochs of ``b`` steps (``N = k b``); an example draws one step ``i`` uniformly from
``{0..b-1}`` (0-based; the paper is 1-based) and participates at steps ``i, i + b, ..., i + (k-1) b``.
For a lower-triangular, entrywise non-negative encoder ``C`` (``N x N``) define the mixture means

    m_i = sum_{e=0}^{k-1} C[:, i + e b]  in R^N_{>=0},     i = 0..b-1,

``P = (1/b) sum_i N(m_i, sigma^2 I_N)`` and ``Q = N(0, sigma^2 I_N)``. The *remove* relation
(P = with the example) is dominated by ``(P, Q)``, the *add* relation by ``(Q, P)``.

Everything the accountants need is the ``b x N`` matrix of means and the ``b x b`` Gram matrix
``G_ij = <m_i, m_j>`` (all entries >= 0). If ``C`` is ``p``-banded (``C[r, c] = 0`` for
``r - c >= p``) and ``p <= b`` then ``G`` is *cyclically* ``p``-banded: ``G_ij = 0`` whenever the
cyclic distance ``d_c(i, j) = min(|i - j|, b - |i - j|) >= p``.

Band truncation (App. B.1): for an effective bandwidth ``p``,
``tau = max_{d_c(i,j) >= p} G_ij`` (0 if no such pair) and ``G^(p)_ij = max(G_ij - tau, 0)`` inside
the cyclic band, 0 outside, so that ``G <= G^(p) + tau`` entrywise.
"""

from __future__ import annotations

import numpy as np

from dpmf import validation as _v
from dpmf.errors import DPMFError, InvalidParameterError, UnsupportedConfigurationError
from dpmf.resources import check_allocation

__all__ = [
    "encoder_matrix",
    "mixture_means",
    "gram_matrix",
    "cyclic_distance",
    "cyclic_bandwidth",
    "band_truncation",
    "toeplitz_coefficients",
    "describe_strategy",
    "pair_problem",
]


def pair_problem(strategy, scheme) -> str | None:
    """Why the dominating pair of random allocation does not exist for ``strategy`` under the
    balls-in-bins ``scheme`` (e.g. a negative or non-lower-triangular ``C``), or ``None``.

    Only one slot reused every epoch is covered: the mixture means below are the patterns of that
    scheme, and the Rényi, conditional and orthogonal-groups analyses built on them assume it.
    ``num_selected > 1`` or ``fresh_slots=True`` (with several epochs) are refused here."""
    if not getattr(scheme, "reused_single_slot", True):
        return (
            f"the Renyi, conditional-composition and orthogonal-groups random-allocation analyses (on the pair "
            f"of Lemma 2.8) assume one slot per example reused every epoch; this scheme has num_selected="
            f"{scheme.num_selected}, fresh_slots={scheme.fresh_slots}, for which no extension is proved here: for "
            "the identity, and for a correlated C with fresh slots or num_selected > 1, use allocation_pld; "
            "otherwise 'montecarlo' (an estimate, certified by calibration) or 'unamplified'"
        )
    try:
        mixture_means(strategy, scheme.epochs, scheme.steps)
    except DPMFError as exc:
        return str(exc)
    return None


def describe_strategy(strategy) -> dict:
    """The report's description of ``strategy`` (a plain matrix has only its type name)."""
    if hasattr(strategy, "describe"):
        return strategy.describe()
    return {"name": type(strategy).__name__}


def toeplitz_coefficients(strategy, n: int) -> np.ndarray | None:
    """The Toeplitz coefficients of ``strategy`` (length ``n``) if it is Toeplitz, else None."""
    coefs = getattr(strategy, "coefs", None)
    if coefs is not None and getattr(strategy, "name", None) == "toeplitz":
        check_allocation(1, n, "the Toeplitz coefficients of all n steps")
        c = np.zeros(n)
        c_arr = np.asarray(coefs, dtype=np.float64)[:n]
        c[: c_arr.size] = c_arr
        return c
    if hasattr(strategy, "toeplitz_coefs") and not hasattr(strategy, "encoder"):  # a BLT
        return np.asarray(strategy.toeplitz_coefs(n), dtype=np.float64)
    return None


def encoder_matrix(strategy, steps: int) -> np.ndarray:
    """The dense ``steps x steps`` encoder of ``strategy`` (checked lower-triangular, >= 0).

    ``strategy`` may be any dpmf strategy with ``encoder()`` (its ``n`` must equal ``steps``), a
    :class:`~dpmf.strategies.BLT` (materialized at ``steps``), or a square array.
    """
    steps = _v.positive_int("steps", steps)
    if isinstance(strategy, np.ndarray) or isinstance(strategy, (list, tuple)):
        C = _v.finite_array("C", strategy, ndim=2)
    else:
        c = toeplitz_coefficients(strategy, steps)
        if c is not None and not hasattr(strategy, "encoder"):
            from dpmf.strategies.toeplitz import materialize_lower_toeplitz

            C = materialize_lower_toeplitz(c, steps)
        elif hasattr(strategy, "encoder"):
            C = np.asarray(strategy.encoder(), dtype=np.float64)
        else:
            raise InvalidParameterError(
                f"strategy must expose encoder() (or be a BLT or a matrix), got {type(strategy).__name__}"
            )
    if C.shape != (steps, steps):
        raise InvalidParameterError(
            f"the encoder must be steps x steps = {steps} x {steps} (N = epochs * steps_per_epoch), "
            f"got shape {C.shape}"
        )
    if not np.all(np.isfinite(C)):
        raise InvalidParameterError("the encoder C must contain only finite numbers")
    if np.any(np.triu(C, 1) != 0):
        raise UnsupportedConfigurationError(
            "random-allocation accounting needs a lower-triangular encoder C (adaptive streams); "
            "C has non-zero entries above the diagonal"
        )
    if np.any(C < 0):
        raise UnsupportedConfigurationError(
            "random-allocation accounting needs an entrywise non-negative encoder C "
            f"(Lemma 2.8); C has a negative entry (min {float(C.min())!r})"
        )
    return C


def _check_layout(steps: int, epochs: int) -> tuple[int, int, int]:
    n = _v.positive_int("steps", steps)
    k = _v.positive_int("epochs", epochs)
    if n % k:
        raise InvalidParameterError(
            f"steps must equal epochs * steps_per_epoch (k * b = N), got steps={n}, epochs={k}"
        )
    return n, k, n // k


def mixture_means(strategy, epochs: int, steps: int) -> np.ndarray:
    """The ``b x N`` matrix whose row ``i`` is ``m_i = sum_e C[:, i + e b]`` (see module docstring).

    Toeplitz strategies (``ToeplitzStrategy``, ``BLT``) never materialize ``C``: with coefficients
    ``c``, ``m_i[r] = h[r - i]`` for ``r >= i`` where ``h[t] = sum_{e >= 0, e b <= t} c[t - e b]``.

    >>> import numpy as np
    >>> from dpmf.strategies import Identity
    >>> mixture_means(Identity(4), epochs=2, steps=4)
    array([[1., 0., 1., 0.],
           [0., 1., 0., 1.]])
    """
    n, k, b = _check_layout(steps, epochs)
    c = None if isinstance(strategy, (np.ndarray, list, tuple)) else toeplitz_coefficients(strategy, n)
    if c is not None:
        if getattr(strategy, "n", n) != n:
            raise InvalidParameterError(f"the strategy has n={strategy.n} steps but steps={n}")
        if not np.all(np.isfinite(c)):
            raise InvalidParameterError("the encoder coefficients must be finite")
        if np.any(c < 0):
            raise UnsupportedConfigurationError(
                "random-allocation accounting needs an entrywise non-negative encoder C "
                f"(Lemma 2.8); a Toeplitz coefficient is negative (min {float(c.min())!r})"
            )
        h = np.cumsum(c.reshape(k, b), axis=0).ravel()  # h[t] = c[t] + h[t - b]
        means = np.zeros((b, n))
        for i in range(b):
            means[i, i:] = h[: n - i]
        return means
    C = encoder_matrix(strategy, n)
    return C.reshape(n, k, b).sum(axis=1).T.copy()


def gram_matrix(means: np.ndarray) -> np.ndarray:
    """``G = means @ means.T`` (``b x b``, symmetric, entries >= 0 for non-negative means)."""
    m = _v.finite_array("means", means, ndim=2)
    g = m @ m.T
    g = 0.5 * (g + g.T)
    return np.maximum(g, 0.0)


def cyclic_distance(b: int) -> np.ndarray:
    """``d_c(i, j) = min(|i - j|, b - |i - j|)`` for ``i, j`` in ``0..b-1``."""
    idx = np.arange(b)
    d = np.abs(idx[:, None] - idx[None, :])
    return np.minimum(d, b - d)


def cyclic_bandwidth(gram: np.ndarray) -> int:
    """Smallest ``p >= 1`` such that ``G_ij == 0`` whenever ``d_c(i, j) >= p`` (``<= b//2 + 1``)."""
    g = np.asarray(gram, dtype=np.float64)
    d = cyclic_distance(g.shape[0])
    nz = d[g != 0]
    return int(nz.max()) + 1 if nz.size else 1


def band_truncation(gram: np.ndarray, bandwidth: int) -> tuple[np.ndarray, float]:
    """``(G^(p), tau)`` for effective bandwidth ``p`` (App. B.1; module docstring).

    ``G <= G^(p) + tau`` holds entrywise, which makes the Rényi bound computed from ``G^(p)`` plus
    ``alpha tau / (2 sigma^2)`` an upper bound on the one for ``G``.

    >>> import numpy as np
    >>> g = np.array([[2.0, 1.0, 0.5], [1.0, 2.0, 1.0], [0.5, 1.0, 2.0]])
    >>> gp, tau = band_truncation(g, 1)
    >>> tau, np.diag(gp).tolist()
    (1.0, [1.0, 1.0, 1.0])
    """
    g = _v.finite_array("gram", gram, ndim=2)
    b = g.shape[0]
    p = _v.positive_int("bandwidth", bandwidth)
    if p > b:
        raise InvalidParameterError(
            f"bandwidth must be an integer in [1, b={b}] (b = steps per epoch), got {p}"
        )
    d = cyclic_distance(b)
    outside = d >= p
    tau = float(g[outside].max()) if np.any(outside) else 0.0
    tau = max(tau, 0.0)
    gp = np.where(outside, 0.0, np.maximum(g - tau, 0.0))
    return gp, tau
