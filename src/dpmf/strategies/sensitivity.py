r"""L2 sensitivity of an encoder ``C`` under a participation schema (multi-epoch MF paper, Sec. 2).

Paper: Choquette-Choo, McMahan, Rush, Thakurta, *Multi-Epoch Matrix Factorization Mechanisms for
Private Machine Learning*, ICML 2023 (arXiv 2211.06530); digest ``notes/multi-epoch-mf.md`` §2.5,
§3, §4.2. Indices are 0-based: the paper's step ``t`` in ``[n] = {1..n}`` is our ``t - 1``.

Definitions
-----------
One example contributes a vector ``g_t`` (``||g_t||_2 <= 1``, clip norm 1) to each step ``t`` of a
*participation pattern* ``p`` (a set of steps); the schema ``Pi`` is the set of allowed patterns.
Zero-out neighbours differ by such a ``G`` (rows ``g_t`` on ``p``, zero elsewhere), so (Def. 1)::

    sens(C)^2 = sup_{p in Pi} sup_G ||C G||_F^2 = sup_p sup_G tr(X[p,p] G_p G_p^T),   X = C^T C.

* **Vector data** (``data="vector"``, the default; what training needs, ``d`` = model size):
  ``G_p G_p^T`` ranges over correlation matrices, so ``sens^2 = max_p max_{Y psd, diag Y = 1}
  <X[p,p], Y>`` (a small SDP per pattern).
* **Scalar data** (``data="scalar"``, ``d = 1``): ``max_p max_{u in {-1,+1}^p} u^T X[p,p] u``.
  Scalar sensitivity can be *smaller* than vector sensitivity for ``|p| >= 3`` (App. H.2: a 3x3
  ``C`` where the paper's ``G`` gives ``sqrt(1.1)`` against scalar sensitivity 1; the true vector
  sensitivity of that ``C`` is ``sqrt(9/8)``, attained by a rank-2 ``G``). It equals it when a
  condition of Thm. H.1 holds: ``|p| <= 2``, or ``X[p,p] >= 0`` entrywise (Cor. 2.1).

Schemas
-------
* :class:`~dpmf.strategies.participation.Participation` ``(k, b)``: **b-min-sep** -- at most ``k``
  participations, any two at least ``b`` steps apart. This is what the accountants pass (it
  contains fixed-epoch order, so it is a sound choice for it).
* :class:`FixedEpochParticipation` ``(k, b)``: the paper's **(k,b)-participation** -- at most ``k``
  participations *exactly* ``b`` apart (shuffle once, same batch order every epoch). For
  ``n = k b`` the maximal patterns are ``{s, s+b, ..., s+(k-1)b}``, ``s = 0..b-1``.

The effective number of participations is ``k' = min(k, ceil(n / b))``.

Methods (``SensitivityResult.method``; ``exact`` says whether ``value`` is the sensitivity, up
to rounding or a relative 1e-9 certified gap, or only a sound upper bound)
---------------------------------------------------------------------------------------------
Exact closed forms and exact searches:

* ``single-participation (max column norm)``: ``k' = 1``: ``max_i ||C[:, i]||^2`` (Li et al.
  2015; paper §2.5). Any ``C``, vector data.
* ``toeplitz-nonneg-nonincreasing``: ``C`` lower-triangular Toeplitz with first column
  ``c_0 >= c_1 >= ... >= 0``: the worst pattern is ``{0, b, ..., (k'-1)b}`` and
  ``sens^2 = ||sum_{j<k'} C[:, j b]||^2`` (Kalinin & Lampert 2024, arXiv 2405.13763, Thm. 2;
  proof: ``X[a, a+d] = sum_{s <= n-1-a-d} c_s c_{s+d}`` is non-increasing in ``a`` and ``d``, and
  the ``j``-th step of any pattern is ``>= j b`` with gaps ``>= b``). Both schemas.
* ``banded``: ``X[i, j] = 0`` whenever ``|i - j| >= b`` (e.g. lower-triangular ``C`` with at most
  ``b = min_sep`` bands): the steps of a pattern never share a row, so
  ``sens^2 = max_p sum_{i in p} ||C[:, i]||^2`` (a 1-D dynamic program). This is
  ``<= k' max_i ||C[:, i]||^2``, with equality only when ``k'`` maximal-norm columns fit ``b``
  apart -- e.g. column-normalized BandMF, ``sens^2 = k'``.
* ``X = C^T C >= 0 on the patterns (Eq. 3)``: ``X[p,p] >= 0`` for every pattern (H.3: weaker
  than ``C^T C >= 0``, and nothing about the signs of ``C`` itself, whose ``nonnegative`` flag
  may be false): ``sens^2 = max_p 1^T X[p,p] 1`` for vector and scalar data (Eq. 3, Cor. 2.1).
  Fixed-epoch: O(b k^2) over the ``<= n`` maximal patterns. b-min-sep: enumeration of the
  maximal patterns when there are at most ``max_patterns``; otherwise
  ``X = C^T C >= 0 on the patterns (Eq. 3), min-sep dynamic program (attained)`` when the DP
  bound below is attained.
* ``k<=2 (Thm. H.1 (1))``: at most two participations, any ``C``, vector data:
  ``max_p sum |X[p,p]|`` (the scalar optimum ``X_ii + X_jj + 2|X_ij|``, equal to the vector one
  by Thm. H.1 (1)); O(n^2) for b-min-sep without enumeration.
* ``sign enumeration (scalar)``: ``data="scalar"`` only: all maximal patterns x all
  ``2^(k'-1)`` sign vectors (paper §4.2 SENS_EXHAUSTIVE). Never used as the value for vector
  data (App. H.2); there it only serves as a lower bound.

Upper bounds (valid for vector data and any ``C``; ``exact`` when an attained lower bound --
the all-ones or best sign vector, or the SDP's feasible ``G`` -- meets them):

* ``abs-sum``: ``max_p sum_{i,j in p} |X_ij|`` (``|<g_i, g_j>| <= 1``).
* ``spectral (Thm. 2.1)``: ``max_p |p| lambda_max(X[p,p]) = max_p |p| ||C[:, p]||_2^2``
  (``<= k max_p ||C[:, p]||_2^2`` as printed in the paper). ``spectral (Thm. 2.1, whole C)``:
  ``k' lambda_max(C^T C)`` when patterns are not enumerated.
* ``sdp (certified dual)``: the vector sensitivity is ``max_p`` of an SDP; per pattern the mixing
  method (block-coordinate ascent on unit vectors) gives a feasible ``G`` (lower bound) and a dual
  certificate ``y`` with ``Diag(y) >= X[p,p]`` (upper bound ``sum y``).
* ``min-sep dynamic program``: with ``w_i = max_{p ni i} sum_{j in p} |X_ij|`` (DPs over the
  steps left and right of ``i``, O(n^2 k')), ``max_p sum_{i,j in p} |X_ij| <=
  max_p sum_{i in p} w_i`` (a 1-D DP). Alg. 4 of Choquette-Choo et al. 2023 (arXiv 2306.08153)
  lets row ``i`` pick any pattern; requiring ``i`` in it is tighter and still sound.

Soundness: every returned ``value`` is inflated by a relative ``(m + k'^2 + 8) * 4 eps`` so that
floating-point rounding in ``X = C^T C`` and the sums cannot move it below the true value.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.resources import check_allocation
from dpmf.strategies.participation import Participation

__all__ = [
    "FixedEpochParticipation",
    "SensitivityResult",
    "effective_participations",
    "participation_patterns",
    "count_patterns",
    "sensitivity_squared",
    "scalar_sensitivity_squared",
    "spectral_upper_bound",
    "banded_sensitivity_squared",
    "toeplitz_sensitivity_squared",
    "min_sep_dp_upper_bound",
]

_EPS = float(np.finfo(np.float64).eps)


@dataclass(frozen=True)
class FixedEpochParticipation:
    """(k, b)-participation: at most ``max_participations`` steps, consecutive ones *exactly*
    ``separation`` apart (multi-epoch MF paper, Sec. 2; "fixed-epoch-order participation").

    ``FixedEpochParticipation(k, n // k)`` is shuffling once and replaying the same order for
    ``k`` epochs. Its patterns are a subset of ``Participation(k, separation)`` (b-min-sep), so a
    b-min-sep sensitivity is also valid (but may be larger).
    """

    max_participations: int
    separation: int

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "max_participations", _v.positive_int("max_participations", self.max_participations)
        )
        object.__setattr__(self, "separation", _v.positive_int("separation", self.separation))

    @property
    def min_sep(self) -> int:
        return self.separation

    def describe(self) -> dict:
        return {
            "schema": "fixed-epoch",
            "max_participations": self.max_participations,
            "separation": self.separation,
        }


@dataclass(frozen=True)
class SensitivityResult:
    """Squared L2 sensitivity ``value`` (a sound upper bound; the sensitivity itself when
    ``exact``), the ``method`` that produced it, and a ``lower_bound`` attained by some
    neighbouring pair (``value == lower_bound`` up to rounding when exact)."""

    value: float
    exact: bool
    method: str
    lower_bound: float = 0.0
    data: str = "vector"

    @property
    def sensitivity(self) -> float:
        """``sqrt(value)``."""
        return math.sqrt(self.value)


# ----------------------------------------------------------------------------------------------
# validation and patterns


def check_participation(participation: object, n: int) -> tuple[int, int, bool]:
    """(k, b, fixed_epoch) after validating against ``n`` steps."""
    if isinstance(participation, FixedEpochParticipation):
        k, b, fixed = participation.max_participations, participation.separation, True
    elif isinstance(participation, Participation):
        k, b, fixed = participation.max_participations, participation.min_sep, False
    else:
        raise InvalidParameterError(
            "participation must be a Participation (b-min-sep) or FixedEpochParticipation, "
            f"got {type(participation).__name__}"
        )
    if b > n:
        raise InvalidParameterError(
            f"participation.min_sep must be <= n={n} (the number of steps, columns of C), got {b}"
        )
    return k, b, fixed


def _check_matrix(C: object, name: str = "C") -> np.ndarray:
    arr = _v.finite_array(name, C, ndim=2)
    return arr


def _check_data(data: str) -> str:
    if data not in ("vector", "scalar"):
        raise InvalidParameterError(f"data must be 'vector' or 'scalar', got {data!r}")
    return data


def effective_participations(n: int, participation: object) -> int:
    """``k' = min(k, ceil(n / b))``: the most steps one pattern can hold."""
    n = _v.positive_int("n", n)
    k, b, _ = check_participation(participation, n)
    return min(k, -(-n // b))


def count_patterns(n: int, participation: object) -> int:
    """Number of non-empty patterns of the schema (all of them, not only maximal ones), exactly.

    For b-min-sep: ``N_c(j)`` = patterns of size ``c`` ending at ``j``,
    ``N_c(j) = sum_{j' <= j-b} N_{c-1}(j')``. For fixed-epoch: arithmetic runs of step ``b``.
    """
    n = _v.positive_int("n", n)
    k, b, fixed = check_participation(participation, n)
    if fixed:
        total = 0
        for r in range(b):
            m = len(range(r, n, b))
            total += sum(m - c + 1 for c in range(1, min(k, m) + 1))
        return total
    cur = [1] * n  # size 1
    total = n
    for _ in range(2, min(k, -(-n // b)) + 1):
        prefix = list(itertools.accumulate(cur))
        cur = [prefix[j - b] if j - b >= 0 else 0 for j in range(n)]
        total += sum(cur)
    return total


def _fixed_epoch_pattern_array(n: int, k: int, b: int) -> np.ndarray:
    rows = []
    for r in range(b):
        prog = list(range(r, n, b))
        w = min(k, len(prog))
        for s in range(len(prog) - w + 1):
            rows.append(prog[s : s + w])
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _min_sep_pattern_array(n: int, k: int, b: int) -> np.ndarray:
    """All maximal b-min-sep patterns (size k, or impossible to extend), padded with -1."""
    kk = min(k, -(-n // b))
    level = np.arange(n, dtype=np.int64)[:, None]
    keep = []
    for size in range(1, kk + 1):
        last = level[:, -1]
        if size == kk:
            keep.append(level)
            break
        # maximal at this size iff no step can be inserted anywhere
        gaps_ok = np.ones(len(level), dtype=bool) if size == 1 else np.all(np.diff(level, axis=1) < 2 * b, axis=1)
        maximal = (level[:, 0] < b) & (last > n - 1 - b) & gaps_ok
        if np.any(maximal):
            keep.append(level[maximal])
        counts = np.maximum(n - (last + b), 0)
        if counts.sum() == 0:
            break
        parent = np.repeat(np.arange(len(level)), counts)
        starts = np.repeat(last + b, counts)
        offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        level = np.column_stack([level[parent], starts + offsets])
    width = max(a.shape[1] for a in keep)
    out = np.full((sum(len(a) for a in keep), width), -1, dtype=np.int64)
    row = 0
    for a in keep:
        out[row : row + len(a), : a.shape[1]] = a
        row += len(a)
    return out


def participation_patterns(n: int, participation: object) -> list[tuple[int, ...]]:
    """The maximal patterns of the schema on ``n`` steps (0-based step indices).

    Every pattern is a subset of a maximal one, and sub-patterns never have larger sensitivity
    (a zeroed step is the average of its ``+g`` and ``-g`` choices), so maximal ones suffice.
    """
    n = _v.positive_int("n", n)
    k, b, fixed = check_participation(participation, n)
    arr = _fixed_epoch_pattern_array(n, k, b) if fixed else _min_sep_pattern_array(n, k, b)
    return [tuple(int(i) for i in row if i >= 0) for row in arr]


def _gather(X: np.ndarray, P: np.ndarray) -> np.ndarray:
    """``X[p, p]`` for every row ``p`` of ``P`` (padded entries -1 give zero rows/columns)."""
    n = X.shape[0]
    Xpad = np.zeros((n + 1, n + 1))
    Xpad[:n, :n] = X
    Q = np.where(P < 0, n, P)
    return Xpad[Q[:, :, None], Q[:, None, :]]


def _chunks(m: int, width: int, budget: int = 4_000_000):
    step = max(1, budget // max(1, width * width))
    for s in range(0, m, step):
        yield slice(s, min(m, s + step))


def _lambda_max(X: np.ndarray) -> float:
    """Largest eigenvalue of the symmetric psd ``X``, inflated by its backward-error scale."""
    n = X.shape[0]
    lam = float(np.linalg.eigvalsh(X)[-1])
    return lam + 16.0 * n * _EPS * lam


def rounding_margin(value: float, m_rows: int, k: int) -> float:
    """Inflate ``value`` so float rounding (in ``C^T C`` and the sums) cannot push it below."""
    return float(value) * (1.0 + 4.0 * (m_rows + k * k + 8) * _EPS)


# ----------------------------------------------------------------------------------------------
# per-pattern evaluators (batched over patterns)


def _sign_vectors(k: int) -> np.ndarray:
    if k <= 1:
        return np.ones((1, max(k, 1)))
    rest = np.array(list(itertools.product((1.0, -1.0), repeat=k - 1)))
    return np.column_stack([np.ones(len(rest)), rest])


def _sign_enumeration(Xp: np.ndarray) -> tuple[float, np.ndarray]:
    """max over patterns and sign vectors (first entry +1) of ``u^T X[p,p] u``; and the best u."""
    m, k, _ = Xp.shape
    S = _sign_vectors(k)
    best, best_u = -np.inf, S[0]
    step = max(1, 4_000_000 // (len(S) * k))
    for s in range(0, m, step):
        blk = Xp[s : s + step]
        vals = np.einsum("sk,mkl,sl->ms", S, blk, S, optimize=True)
        i, j = np.unravel_index(int(np.argmax(vals)), vals.shape)
        if vals[i, j] > best:
            best, best_u = float(vals[i, j]), S[j]
    return best, best_u


def _sdp_bounds(Xp: np.ndarray, iters: int = 400, seed: int = 0, rtol: float = 1e-10) -> tuple[np.ndarray, np.ndarray]:
    """Per pattern: (lower, upper) on ``max {<X_p, Y> : Y psd, diag(Y) = 1}``.

    Lower: the mixing method (Wang, Chang, Kolter 2017): rows ``v_i`` of a unit-row matrix ``V``
    are updated in turn to ``v_i = g_i / ||g_i||``, ``g_i = sum_{j != i} X_ij v_j`` (monotone
    ascent); ``<X, V V^T>`` is attained by ``G = V`` (rank <= k). Upper: weak duality with
    ``y_i = X_ii + ||g_i|| + t``, ``t = max(0, -lambda_min(Diag(y) - X))`` plus a rounding
    margin, so ``Diag(y) - X_p`` is psd and ``<X, Y> <= sum y`` for every feasible ``Y``.
    Stops when every pattern's gap is below ``rtol`` (relative) or after ``iters`` sweeps.
    """
    m, k, _ = Xp.shape
    rng = np.random.default_rng(seed)
    real = np.abs(Xp).sum(axis=2) > 0  # padded (all-zero) rows
    V = rng.standard_normal((m, k, k))
    V /= np.linalg.norm(V, axis=2, keepdims=True)
    diag = np.einsum("mii->mi", Xp)
    Xoff = Xp.copy()
    idx = np.arange(k)
    Xoff[:, idx, idx] = 0.0
    scale = np.abs(Xp).max(axis=(1, 2))

    def bounds() -> tuple[np.ndarray, np.ndarray]:
        lower = np.einsum("mij,mir,mjr->m", Xp, V, V)
        G = np.einsum("mij,mjr->mir", Xoff, V)
        y = np.where(real, diag + np.linalg.norm(G, axis=2), 0.0)
        S = -Xp.copy()
        S[:, idx, idx] += y
        lam_min = np.linalg.eigvalsh(S)[:, 0]
        t = np.maximum(0.0, -lam_min) + 16.0 * k * _EPS * scale
        return lower, y.sum(axis=1) + real.sum(axis=1) * t

    for it in range(1, iters + 1):
        for i in range(k):
            g = np.einsum("mj,mjr->mr", Xoff[:, i, :], V)
            nrm = np.linalg.norm(g, axis=1)
            ok = nrm > 0
            V[ok, i, :] = g[ok] / nrm[ok, None]
        if it % 20 == 0 or it == iters:
            lower, upper = bounds()
            if np.all(upper - lower <= rtol * np.maximum(upper, 1e-300)):
                return lower, upper
    return bounds()


# ----------------------------------------------------------------------------------------------
# 1-D dynamic programs for b-min-sep


def _best_selection(w: np.ndarray, k: int, b: int) -> tuple[float, list[int]]:
    """max sum_{i in p} w_i over patterns with <= k steps, gaps >= b (w >= 0); and the argmax."""
    n = len(w)
    f = np.zeros((k + 1, n))  # f[c, j]: best with <= c picks among steps <= j
    take = np.zeros((k + 1, n), dtype=bool)
    for j in range(n):
        prev = f[:, j - 1] if j >= 1 else np.zeros(k + 1)
        base = f[:-1, j - b] if j - b >= 0 else np.zeros(k)
        cand = w[j] + base
        take[1:, j] = cand > prev[1:]
        f[1:, j] = np.maximum(prev[1:], cand)
    # backtrack
    sel, c, j = [], k, n - 1
    while c > 0 and j >= 0:
        if take[c, j]:
            sel.append(j)
            c -= 1
            j -= b
        else:
            j -= 1
    return float(f[k, n - 1]), sorted(sel)


def _side_best(Wrows: np.ndarray, pos: np.ndarray, c_max: int, b: int, unbounded: bool = False) -> np.ndarray:
    """``out[c, t]`` = best ``sum_{j in q} Wrows[t, j]`` over ``q`` with ``<= c`` steps, all
    ``j <= pos[t] - b``, gaps ``>= b`` (``c = 0..c_max``). With ``unbounded`` (``c_max = 1``),
    ``out[1]`` has no limit on the number of steps.

    Vectorized over rows; loops over columns ``j`` with the recurrence
    ``f_c(j) = max(f_c(j-1), W[:, j] + f_{c-1}(j-b))`` (``f_c`` on both sides when unbounded),
    kept in a ring buffer of ``b`` states.
    """
    r = Wrows.shape[0]
    out = np.zeros((c_max + 1, r))
    if c_max == 0 or r == 0:
        return out
    last = int(pos.max()) - b
    hist = np.zeros((b, c_max + 1, r))  # hist[j % b]: state after column j
    cur = np.zeros((c_max + 1, r))
    for j in range(last + 1):
        prev = hist[j % b, 1:] if unbounded else hist[j % b, :-1]  # slot j%b holds state j-b
        cand = Wrows[:, j][None, :] + (prev if j >= b else 0.0)
        np.maximum(cur[1:], cand, out=cur[1:])
        hist[j % b] = cur
        hit = np.flatnonzero(pos - b == j)
        if hit.size:
            out[:, hit] = cur[:, hit]
    return out


def min_sep_dp_upper_bound(X: np.ndarray, k: int, b: int) -> tuple[float, list[int], np.ndarray]:
    """Upper bound on ``max_p sum_{i,j in p} |X_ij|`` over b-min-sep patterns (<= k steps).

    ``w_i = |X_ii| + max_{l + r <= k-1} (L_l[i] + R_r[i])`` (best left/right completions of row
    ``i``), then ``max_p sum_{i in p} w_i``. Returns (bound, maximizing pattern, w). O(n^2 k).
    """
    n = X.shape[0]
    kk = min(k, -(-n // b))
    W = np.abs(X)
    # k >= ceil(n/b): the count limit never binds, drop it (one state per column instead of k)
    unbounded = kk == -(-n // b)
    c_max = 1 if unbounded else kk - 1
    rows_budget = max(1, 2_000_000 // max(1, b * (c_max + 1)))
    Lfull = np.zeros((c_max + 1, n))
    Rfull = np.zeros((c_max + 1, n))
    for s in range(0, n, rows_budget):
        rows = np.arange(s, min(n, s + rows_budget))
        # left: steps j <= i - b; right: steps j >= i + b, i.e. j' = n-1-j <= (n-1-i) - b
        Lfull[:, rows] = _side_best(W[rows], rows, c_max, b, unbounded)
        Rfull[:, rows] = _side_best(W[rows][:, ::-1], n - 1 - rows, c_max, b, unbounded)
    if unbounded:
        best_split = Lfull[1] + Rfull[1]
    else:
        best_split = np.zeros(n)
        for left in range(kk):
            best_split = np.maximum(best_split, Lfull[left] + Rfull[kk - 1 - left])
    w = np.diag(W) + best_split
    bound, pat = _best_selection(w, kk, b)
    return bound, pat, w


# ----------------------------------------------------------------------------------------------
# structured exact cases


def _toeplitz_first_column(C: np.ndarray) -> np.ndarray | None:
    """First column ``c`` if ``C`` is square lower-triangular Toeplitz (``C[i,j] = c[i-j]``)."""
    n, m = C.shape
    if n != m:
        return None
    c = C[:, 0]
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    T = np.where(lag >= 0, c[np.maximum(lag, 0)], 0.0)
    return c.copy() if np.array_equal(T, C) else None


def _nonneg_nonincreasing(c: np.ndarray) -> bool:
    return bool(np.all(c >= 0) and np.all(np.diff(c) <= 0))


def _toeplitz_closed_form(c: np.ndarray, n: int, kk: int, b: int) -> float:
    """``||sum_{j<kk} C[:, j b]||^2`` for lower-triangular Toeplitz ``C`` with first column ``c``
    (zero-padded/truncated to ``n``)."""
    col = np.zeros(n)
    m = min(len(c), n)
    col[:m] = c[:m]
    v = np.zeros(n)
    for j in range(kk):
        v[j * b :] += col[: n - j * b]
    return float(v @ v)


def toeplitz_sensitivity_squared(coefs: object, participation: object, n: int | None = None) -> SensitivityResult:
    """Sensitivity of the lower-triangular Toeplitz ``C[i, j] = coefs[i - j]`` (``n x n``).

    ``coefs`` is the first column (``len(coefs) <= n``; shorter means banded Toeplitz, zeros
    beyond). Exact cases without materializing ``C`` (both schemas, vector data):

    * ``coefs`` non-negative and non-increasing: ``||sum_{j<k'} C[:, j b]||^2`` (module
      docstring; Kalinin & Lampert 2024, Thm. 2; mirrors ``jax_privacy``
      ``toeplitz.minsep_sensitivity_squared``).
    * ``len(coefs) <= b`` (banded with at most ``min_sep`` bands): columns of a pattern never
      overlap and column norms decrease with the index, so ``sum_{j<k'} ||C[:, j b]||^2``.

    Otherwise ``C`` is materialized and :func:`sensitivity_squared` decides.
    """
    c = _v.finite_array("coefs", coefs)
    n = len(c) if n is None else _v.positive_int("n", n)
    if len(c) > n:
        raise InvalidParameterError(f"coefs must have at most n={n} entries, got {len(c)}")
    check_allocation(1, n, "the Toeplitz sensitivity's length-n columns", copies=4)
    k, b, _ = check_participation(participation, n)
    kk = min(k, -(-n // b))
    if _nonneg_nonincreasing(c):
        val = _toeplitz_closed_form(c, n, kk, b)
        return SensitivityResult(rounding_margin(val, n, kk), True, "toeplitz-nonneg-nonincreasing", val)
    if len(c) <= b:
        # ||C[:, j b]||^2 = sum_{t < min(len(c), n - j b)} c_t^2, non-increasing in j
        col2 = np.array([np.sum(c[: min(len(c), n - j * b)] ** 2) for j in range(kk)])
        val = float(col2.sum())
        return SensitivityResult(rounding_margin(val, n, kk), True, "banded", val)
    lag = np.subtract.outer(np.arange(n), np.arange(n))
    col = np.zeros(n)
    col[: len(c)] = c
    C = np.where(lag >= 0, col[np.maximum(lag, 0)], 0.0)
    return sensitivity_squared(C, participation)


def _banded_value(X: np.ndarray, kk: int, b: int, fixed: bool) -> tuple[float, list[int]]:
    d = np.diag(X).copy()
    n = len(d)
    if fixed:
        best, pat = -np.inf, []
        for row in _fixed_epoch_pattern_array(n, kk, b):
            p = [int(i) for i in row if i >= 0]
            v = float(d[p].sum())
            if v > best:
                best, pat = v, p
        return best, pat
    return _best_selection(d, kk, b)


def banded_sensitivity_squared(C: object, participation: object) -> SensitivityResult:
    """Exact sensitivity when steps ``>= b`` apart never share a row of ``C`` (``X_ij = 0`` for
    ``|i - j| >= b``; e.g. lower-triangular ``C`` with at most ``b = min_sep`` bands).

    Then ``||C G||_F^2 = sum_{i in p} ||C[:, i]||^2 ||g_i||^2`` and
    ``sens^2 = max_p sum_{i in p} ||C[:, i]||^2`` (a 1-D dynamic program for b-min-sep).
    This is ``<= k' max_i ||C[:, i]||^2``, with equality for column-normalized ``C`` (BandMF:
    ``sens^2 = k'``). Raises :class:`~dpmf.errors.UnsupportedConfigurationError` otherwise.
    """
    C = _check_matrix(C)
    n = C.shape[1]
    k, b, fixed = check_participation(participation, n)
    kk = min(k, -(-n // b))
    X = C.T @ C
    far = np.abs(np.subtract.outer(np.arange(n), np.arange(n))) >= b
    if np.any(X[far] != 0):
        raise UnsupportedConfigurationError(
            f"banded_sensitivity_squared needs columns of C at least min_sep={b} apart to be "
            "orthogonal (at most min_sep bands); use sensitivity_squared"
        )
    val, _ = _banded_value(X, kk, b, fixed)
    return SensitivityResult(rounding_margin(val, C.shape[0], kk), True, "banded", val)


# ----------------------------------------------------------------------------------------------
# generic enumeration-based evaluation


def _patterns(n: int, k: int, b: int, fixed: bool) -> np.ndarray:
    return _fixed_epoch_pattern_array(n, k, b) if fixed else _min_sep_pattern_array(n, k, b)


def _enumerated(X: np.ndarray, P: np.ndarray, data: str, nonneg_tol: float, max_sign_evaluations: int, sdp: bool):
    """Evaluate all patterns ``P``; returns (value, exact, method, lower).

    Cheap per-pattern bounds first (abs-sum, spectral, Eq. 3's all-ones value); the sign
    enumeration and the SDP only run where they can still change the maximum.
    """
    m, w = P.shape
    sizes = (P >= 0).sum(axis=1)
    kk = int(sizes.max())
    abs_p, ones_p, spec_p = np.empty(m), np.empty(m), np.empty(m)
    min_x = np.inf
    for sl in _chunks(m, w):
        Xp = _gather(X, P[sl])
        abs_p[sl] = np.abs(Xp).sum(axis=(1, 2))
        ones_p[sl] = Xp.sum(axis=(1, 2))
        min_x = min(min_x, float(Xp.min()))
        if kk > 2:
            lam = np.linalg.eigvalsh(Xp)[:, -1]
            spec_p[sl] = (lam + 16.0 * w * _EPS * np.abs(lam)) * sizes[sl]
    if min_x >= -nonneg_tol:
        return float(abs_p.max()), True, "X = C^T C >= 0 on the patterns (Eq. 3)", float(ones_p.max())
    if kk <= 2:
        return float(abs_p.max()), True, "k<=2 (Thm. H.1 (1))", float(abs_p.max())
    upper = np.minimum(abs_p, spec_p)
    lower_p = ones_p.copy()  # u = all ones on p: attained for scalar and vector data
    n_signs = 2 ** (kk - 1)
    scalar_done = False
    cand = np.flatnonzero(upper > lower_p.max())
    if cand.size * n_signs <= max_sign_evaluations:
        for sl in _chunks(cand.size, w, budget=max(1, 4_000_000 // n_signs)):
            rows = cand[sl]
            Xp = _gather(X, P[rows])
            S = _sign_vectors(kk)
            lower_p[rows] = np.einsum("sk,mkl,sl->ms", S, Xp, S, optimize=True).max(axis=1)
        scalar_done = True
        if data == "scalar":
            best = float(lower_p.max())
            return best, True, "sign enumeration (scalar)", best
    method = "abs-sum" if float(abs_p.max()) <= float(spec_p.max()) else "spectral (Thm. 2.1)"
    if sdp:
        # refine only patterns whose upper bound exceeds the best attained value; largest first
        order = np.argsort(-upper)
        used_sdp = False
        for sl in _chunks(m, w, budget=40_000):
            rows = order[sl]
            rows = rows[upper[rows] > lower_p.max() * (1 + 1e-10)]
            if rows.size == 0:
                break
            lo, hi = _sdp_bounds(_gather(X, P[rows]))
            if np.any(hi < upper[rows]):
                used_sdp = True
            upper[rows] = np.minimum(upper[rows], hi)
            if data == "vector":
                lower_p[rows] = np.maximum(lower_p[rows], lo)
        if used_sdp:
            method = "sdp (certified dual)"
    value, lower = float(upper.max()), float(lower_p.max())
    exact = value - lower <= 1e-9 * value  # lower is attained, so the bound is the value
    return value, exact, method, lower


# ----------------------------------------------------------------------------------------------
# public entry points


def sensitivity_squared(
    C: object,
    participation: object,
    *,
    data: str = "vector",
    max_patterns: int = 200_000,
    max_sign_evaluations: int = 2_000_000,
    sdp: bool = True,
) -> SensitivityResult:
    """Squared L2 sensitivity of ``x -> C x`` (``C`` is ``m x n``, ``n`` steps) under a schema.

    Dispatches to the cheapest *exact* method that applies (module docstring), else returns the
    tightest sound upper bound it can compute, with ``exact=False``. ``result.value`` is always
    ``>=`` the true squared sensitivity for ``data`` (it is rounded up by a few ulps so float
    rounding cannot make it smaller). For ``data="vector"`` (default; any gradient dimension) the
    scalar sign enumeration is never the value unless Thm. H.1 makes it equal to the vector one.
    Mirrors ``jax_privacy.matrix_factorization.sensitivity`` (``fixed_epoch_sensitivity``,
    ``get_sensitivity_banded``, ``get_min_sep_sensitivity_upper_bound``) in one dispatcher.

    Args:
      C: encoder, finite ``m x n`` (need not be square or triangular).
      participation: :class:`Participation` (b-min-sep, at most ``k``, gaps ``>= min_sep``) or
        :class:`FixedEpochParticipation` (gaps exactly ``separation``); ``min_sep <= n``.
      data: ``"vector"`` or ``"scalar"`` contributions.
      max_patterns: enumerate b-min-sep patterns only up to this many; beyond it the O(n^2 k)
        dynamic-programming bound (exact when attained and ``X >= 0``) is used.
      max_sign_evaluations: budget (patterns x ``2^(k'-1)``) for sign enumeration.
      sdp: compute the certified SDP bound for vector data when ``X`` has negative entries.
    """
    C = _check_matrix(C)
    data = _check_data(data)
    m_rows, n = C.shape
    k, b, fixed = check_participation(participation, n)
    max_patterns = _v.positive_int("max_patterns", max_patterns)
    max_sign_evaluations = _v.positive_int("max_sign_evaluations", max_sign_evaluations)
    kk = min(k, -(-n // b))
    X = C.T @ C
    diag = np.diag(X)

    def done(val: float, exact: bool, method: str, lower: float) -> SensitivityResult:
        return SensitivityResult(rounding_margin(val, m_rows, kk), bool(exact), method, float(lower), data)

    if kk == 1:
        val = float(diag.max())
        return done(val, True, "single-participation (max column norm)", val)

    c = _toeplitz_first_column(C)
    if c is not None and _nonneg_nonincreasing(c):
        val = _toeplitz_closed_form(c, n, kk, b)
        return done(val, True, "toeplitz-nonneg-nonincreasing", val)

    far = np.abs(np.subtract.outer(np.arange(n), np.arange(n))) >= b
    if not np.any(X[far] != 0):
        val, _ = _banded_value(X, kk, b, fixed)
        return done(val, True, "banded", val)

    nonneg_tol = 1e-12 * float(diag.max())
    if fixed or count_patterns(n, participation) <= max_patterns:
        P = _patterns(n, k, b, fixed)
        val, exact, method, lower = _enumerated(X, P, data, nonneg_tol, max_sign_evaluations, sdp)
        return done(val, exact, method, lower)

    # b-min-sep with too many patterns to enumerate
    if kk == 2:
        # every pair (i, j >= i + b): X_ii + X_jj + 2|X_ij|, exact by Thm. H.1 (1); a step
        # that has no partner b away is a maximal singleton
        pair = diag[:, None] + diag[None, :] + 2.0 * np.abs(X)
        val = max(float(pair[np.triu(far)].max()), float(diag.max()))
        return done(val, True, "k<=2 (Thm. H.1 (1))", val)
    bound, pat, _ = min_sep_dp_upper_bound(X, kk, b)
    sub = X[np.ix_(pat, pat)]
    attained_abs = float(np.abs(sub).sum())
    ones = float(sub.sum())
    nonneg = float(X[far].min()) >= -nonneg_tol
    if nonneg and bound <= attained_abs * (1.0 + 1e-12):
        return done(bound, True, "X = C^T C >= 0 on the patterns (Eq. 3), min-sep dynamic program (attained)", ones)
    # a better lower bound on the maximizing pattern (attained by some neighbouring pair)
    lower = ones
    if data == "vector" and sdp and len(pat) <= 64:
        lower = max(lower, float(_sdp_bounds(sub[None])[0][0]))
    elif len(pat) <= 16:
        lower = max(lower, _sign_enumeration(sub[None])[0])
    spectral = kk * _lambda_max(X)  # k' * lambda_max(X) >= k' max_p lambda_max(X[p,p])
    if spectral < bound:
        return done(spectral, False, "spectral (Thm. 2.1, whole C)", lower)
    return done(bound, False, "min-sep dynamic program", lower)


def scalar_sensitivity_squared(
    C: object, participation: object, *, max_sign_evaluations: int = 10_000_000
) -> SensitivityResult:
    """Exact scalar (``d = 1``) sensitivity by enumerating all maximal patterns and all sign
    vectors (paper §4.2 SENS_EXHAUSTIVE, ``|Pi| 2^(k'-1)`` quadratic forms).

    Valid for vector data only under Thm. H.1 (``k' <= 2`` or ``X[p,p] >= 0``); use
    :func:`sensitivity_squared` for that. Raises
    :class:`~dpmf.errors.UnsupportedConfigurationError` when over ``max_sign_evaluations``.
    """
    C = _check_matrix(C)
    m_rows, n = C.shape
    k, b, fixed = check_participation(participation, n)
    budget = _v.positive_int("max_sign_evaluations", max_sign_evaluations)
    kk = min(k, -(-n // b))
    work = count_patterns(n, participation) * 2 ** (kk - 1)
    if work > budget:
        raise UnsupportedConfigurationError(
            f"sign enumeration needs about {work} quadratic forms, over max_sign_evaluations={budget}"
        )
    X = C.T @ C
    P = _patterns(n, k, b, fixed)
    best = -np.inf
    for sl in _chunks(len(P), P.shape[1], budget=max(1, 4_000_000 // 2 ** (kk - 1))):
        val, _ = _sign_enumeration(_gather(X, P[sl]))
        best = max(best, val)
    return SensitivityResult(rounding_margin(best, m_rows, kk), True, "sign enumeration (scalar)", best, "scalar")


def spectral_upper_bound(C: object, participation: object, *, max_patterns: int = 200_000) -> SensitivityResult:
    """Thm. 2.1: ``sens^2 <= max_p |p| * ||C[:, p]||_2^2`` (valid for vector data, any ``C``).

    Enumerates patterns (``O(b k^3)`` for fixed-epoch); beyond ``max_patterns`` b-min-sep
    patterns it uses ``k' ||C||_2^2``.
    """
    C = _check_matrix(C)
    m_rows, n = C.shape
    k, b, fixed = check_participation(participation, n)
    kk = min(k, -(-n // b))
    X = C.T @ C
    if fixed or count_patterns(n, participation) <= _v.positive_int("max_patterns", max_patterns):
        P = _patterns(n, k, b, fixed)
        sizes = (P >= 0).sum(axis=1)
        best = -np.inf
        for sl in _chunks(len(P), P.shape[1]):
            lam = np.linalg.eigvalsh(_gather(X, P[sl]))[:, -1] * sizes[sl]
            best = max(best, float(lam.max()))
    else:
        best = kk * _lambda_max(X)
    lower = float(np.diag(X).max())
    return SensitivityResult(rounding_margin(best, m_rows, kk), False, "spectral (Thm. 2.1)", lower)
