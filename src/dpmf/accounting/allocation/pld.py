r"""PLD accountant for DP-SGD (``C = I``) under random allocation (balls-in-bins), sound and tight.

Feldman & Shenfeld, "Privacy amplification by random allocation" (arXiv 2502.08202) and
"Efficient privacy loss accounting for subsampling and random allocation" (arXiv 2602.17284):
the privacy loss of 1-out-of-``t`` random allocation of a Gaussian step is a log-sum-exp of ``t``
i.i.d. Gaussian losses, so its PLD is a ``t``-fold convolution in exp-space. This module computes
that distribution on a grid whose every rounding and truncation is pessimistic.

**The pair.** One epoch of ``t`` steps, each example in exactly one uniformly random step, noise
``sigma`` (clip norm 1). The dominating pair (Lemma 2.8 of the digest ``notes/random-allocation.md``
with ``C = I``) is ``P = (1/t) sum_i N(e_i, sigma^2 I_t)`` and ``Q = N(0, sigma^2 I_t)``: remove is
``(P, Q)``, add is ``(Q, P)``. With ``x ~ Q`` the likelihood ratio is

    S = dP/dQ(x) = (1/t) sum_i X_i,   X_i = exp((x_i - 1/2) / sigma^2)  i.i.d. lognormal,
    log X_i ~ N(-eta/2, eta),  eta = 1 / sigma^2,  E X_i = 1,

and both hockey-stick divergences are expectations of convex functions of ``S`` under ``Q``:

    remove:  delta_R(eps) = E_P[(1 - e^{eps - L})_+] = E[(S - e^eps)_+]
    add:     delta_A(eps) = E_Q[(1 - e^eps dP/dQ)_+] = E[(1 - e^eps S)_+].

``t = 1`` is the Gaussian mechanism (both directions). ``k`` epochs with the slot reused
(:class:`~dpmf.sampling.BallsInBinsSampling`) are one epoch at ``sigma / sqrt(k)``, exactly
(:mod:`dpmf.accounting.reductions`), so ``eta = k / sigma^2``. (A ``k``-fold PLD self-composition of
one epoch would describe a *fresh* slot each epoch, which is a different, more private sampler;
it is not a bound for reused slots and is not used.)

**Pessimistic computation.** Values live on the grid ``j h`` (sum-space, ``j`` integer):

1. *Level one.* ``X`` is replaced by its spread onto the grid (the mass of each cell
   ``[jh, (j+1)h]`` goes to the two ends with the cell's mean preserved): a mean-preserving spread,
   so it dominates ``X`` in convex order (closed forms: ``P(X <= x) = Phi(z)``,
   ``E[X; X <= x] = Phi(z - sqrt(eta))``, ``z = (log x + eta/2)/sqrt(eta)``).
2. *Sums.* The law of ``sum_i X_i`` is built by repeated squaring with exact FFT convolutions on
   the integer grid (``<= 2 log2 t`` of them). Convex order is closed under independent sums, so
   the result dominates ``t S`` for every convex function of ``S`` (both directions).
3. *Windows.* After each convolution the support is cut to a window ``[l, u]``. For the remove
   direction (non-decreasing, 1-Lipschitz ``f``) raising mass below ``l`` to ``l`` can only
   increase ``E f``; lowering mass above ``u`` to ``u`` costs at most ``E[(A - u)_+] / t``, which is
   *added* to delta (and is exact when ``u >= t e^eps``). For the add direction (non-increasing,
   ``e^eps``-Lipschitz) the roles swap: lowering is free (and exact when ``u >= t e^{-eps}``), raising
   costs ``e^eps E[(l - A)_+] / t``, added to delta. The masses and the charged excess of the cut
   parts are computed exactly from the two convolution operands (dot products of non-negative
   terms), not from the FFT output; each charge is multiplied by the number of copies of that
   partial sum in the total.
4. *Floating point.* Each FFT output entry kept gets ``+ 16 u log2(n) (|a|_2 |b|_1 + |a|_1 |b|_2)``
   (the worst-case error of an FFT convolution, Higham, *Accuracy and Stability*, Thm 24.2, with
   margin), so kept masses are never below the exact convolution's. That allowance is multiplied
   by the number of copies of a partial sum, so partial sums used ``>= 64`` times are convolved in
   long double (``u = 2^-64`` on x86-64, about 4x the time), the others in float64. Convolutions
   of at most ``2^26`` products are instead summed directly, with a *relative* allowance
   (``gamma_m`` of a dot product of ``m`` non-negative terms), which keeps the far tail exact
   enough at ``delta = 1e-12`` and ``sigma = 0.5``. The level-one split is nudged to the
   pessimistic side by its rounding bound, and the mass a cell may lose to rounding is added at
   that cell's worst end (not lumped at the window's end, where ``t e^eps`` magnified it); the
   level-one charge carries a rounding allowance relative to its two terms; the exact lumps are
   summed with a relative allowance of ``4 n u``. *Caveat (stated, not proved here):* Higham's bound holds for
   a radix-2 Cooley-Tukey FFT whose twiddle factors are computed to ``O(u)``; SciPy's pocketfft is
   assumed to meet it (its measured errors are about 1000x below the allowance).
5. *Query.* ``E[(S - a)_+]`` and ``E[(b - S)_+]`` of the grid law are piecewise linear in ``a`` and
   ``b`` with kinks on the grid, so the smallest epsilon with ``delta(eps) <= delta`` is found
   exactly by suffix/prefix sums and linear interpolation.

Every choice of ``h`` and windows gives a sound bound; they only decide tightness. The grid is
refined (``h`` halved) until two successive epsilons agree to ``rel_tol`` (the spread error is
``O(h^2)``), and the smallest epsilon seen is reported (each is a bound). The result is also
never above the Gaussian mechanism's epsilon at ``sigma / sqrt(k)`` (post-processing: revealing the
slot), which is the reported value when it is smaller.

**Beyond the identity: orthogonal groups** (:func:`orthogonal_groups`; dpmf's own argument,
not from the papers). For any entrywise non-negative, lower-triangular ``C`` the dominating pair
of Lemma 2.8 has ``S = (1/b) sum_i X_i`` with ``X_i = exp(<m_i, x>/sigma^2 - |m_i|^2/(2 sigma^2))``,
``x ~ N(0, sigma^2 I)``: lognormals of mean 1 and parameter ``eta_i = |m_i|^2 / sigma^2``, now
*dependent* (``Cov(<m_i, x>, <m_j, x>) = sigma^2 G_ij``). If the slots split into the residue
classes modulo ``p`` and ``G_ij = 0`` for any two slots of one class, the ``X_i`` of a class are
jointly Gaussian in the exponent and uncorrelated, hence independent. Then, for any convex ``f``
(both directions' integrands are convex in ``S``),

    E f(S) = E f(sum_r (n_r / b) S_r) <= sum_r (n_r / b) E f(S_r) <= E f(S*),

where ``S_r`` is the mean of class ``r`` (``n_r`` slots) and ``S*`` the mean of ``n_min = min_r n_r``
i.i.d. lognormals of parameter ``eta_max = max_i eta_i``: Jensen's inequality, then convex order
(a mean-one lognormal grows in convex order with ``eta``; independent sums keep convex order; the
mean of ``n`` i.i.d. variables is convex-order smaller than the mean of fewer). So both deltas are
at most those of the identity's pair with ``t = n_min`` steps at noise ``sigma / sqrt(g_max)``
(``g_max = max_i G_ii``), computed by the machinery above. For a ``p``-banded ``C`` in one epoch
(or ``k`` epochs with ``p`` dividing ``b``) ``n_min = floor(b / p)``: the bound counts
``b / p`` slots instead of ``b``. How far it goes: for the identity it *is* the exact pair
(``p = 1``); for BSR / banded Toeplitz with a few bands it is a cheap amplified bound, looser as
``p`` grows (it forgets the partial correlation inside a band); for a dense ``C`` (BLT,
sqrt-Toeplitz, the optimal factorization) ``p = b`` and it is the Gaussian mechanism at
``sigma / sqrt(g_max)``, with no amplification. ``method="auto"`` takes the smaller of it and the
Rényi / conditional-composition bounds. Orthogonality is decided from the supports of the means
(``G_ij = 0`` exactly iff their supports are disjoint, ``C >= 0``), never from float products
that could underflow to zero, and ``g_max`` is rounded up.

**Cost.** ``n`` grid points per window (at most ``max_points``): time ``O(n log n log t)`` per
refinement level (``<= 2 log2 t`` FFTs of length ``<= 2n``), memory ``O(n)``. The window width
tracks the distribution (``O(sqrt(t))`` standard deviations of the sum, or ``t e^eps`` when the tail
is heavy), so ``n`` does not grow with ``t``: at ``t = 10^4`` a few ``10^5`` points suffice.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
import time
from dataclasses import dataclass

import numpy as np
from scipy import fft as _fft
from scipy import special

from dpmf import validation as _v
from dpmf.accounting.allocation import pld_compose
from dpmf.accounting.allocation.correlated import reduced_epsilon, strategy_reductions
from dpmf.accounting.allocation.fresh_correlated import add_markov_compositions, fresh_slot_problem, fresh_slot_reductions
from dpmf.accounting.allocation import k_of_t_correlated
from dpmf.accounting.allocation.k_of_t_correlated import k_of_t_problem, k_of_t_reductions
from dpmf.accounting.allocation.dominating_pair import (
    describe_strategy,
    mixture_means,
    pair_problem,
    toeplitz_coefficients,
)
from dpmf.accounting.guard import check_pair, guarded, recorded_options
from dpmf.accounting.report import PrivacyReport
from dpmf.errors import InvalidParameterError
from dpmf.privacy.calibration import ProgressCallback, check_limit, smallest_noise
from dpmf.privacy.gdp import gaussian_epsilon
from dpmf.sampling.schemes import BallsInBinsSampling
from dpmf.strategies.identity import Identity

__all__ = [
    "NAME",
    "supports",
    "allocation_pld_epsilon",
    "account_allocation_pld",
    "calibrate_allocation_pld",
    "noise_and_report",
    "OrthogonalGroups",
    "orthogonal_groups",
    "toeplitz_orthogonal_groups",
    "strategy_groups",
]

NAME = "allocation_pld"
_U = 2.0**-53
_U_EXTENDED = float(np.finfo(np.longdouble).eps) / 2  # 2^-64 on x86-64; 2^-53 where long double is double
#: Partial sums used at least this many times are convolved in long double (see _convolve).
_EXTENDED_MULT = 64
#: Relative agreement of two successive grid refinements at which refinement stops.
DEFAULT_REL_TOL = 2e-4
#: Largest number of grid points in one window (memory ~ 40 bytes per point).
DEFAULT_MAX_POINTS = 2**20
#: First refinement level's points per window (a pilot that fixes the windows).
_PILOT_POINTS = 2**10
#: Fraction of delta that window cuts may cost in tightness (never in soundness).
_CUT_BUDGET = 1e-4
#: The remove window reaches ``t e^eps_hi (1 + margin)``, so its cut is exact at the answer.
_CAP_MARGIN = 0.02
#: Constant of the FFT convolution error bound (Higham, Thm 24.2, with margin).
_FFT_ERROR_FACTOR = 16.0
#: Convolutions with at most this many products (``|a| |b|``) are summed directly, with a relative
#: error bound (see _direct_convolution); above it, by FFT (about 0.05-0.1 s at the threshold here).
_DIRECT_MAX_PRODUCTS = 2**26


def supports(strategy, scheme) -> str | None:
    """``None`` under balls-in-bins sampling for the identity (the exact pair) and for any
    non-negative lower-triangular ``C`` (the orthogonal-groups bound), else why not."""
    if not isinstance(scheme, BallsInBinsSampling):
        return f"the random-allocation PLD accountant needs BallsInBinsSampling, got {type(scheme).__name__}"
    if isinstance(strategy, Identity):
        return None
    if getattr(scheme, "num_selected", 1) > 1:  # (k_of_t_correlated.py)
        return k_of_t_problem(strategy, scheme)
    if _fresh(scheme):  # (fresh_correlated.py)
        return fresh_slot_problem(strategy, scheme)
    return pair_problem(strategy, scheme)


@dataclass(frozen=True)
class OrthogonalGroups:
    """The reduction of a strategy's allocation pair to the identity's (module docstring).

    ``period``: slots ``i`` and ``j`` with ``i = j (mod period)`` have orthogonal means;
    ``slots``: ``n_min``, the size of the smallest residue class (the identity pair's ``t``);
    ``max_norm_sq``: ``g_max = max_i |m_i|^2``, rounded up (noise scale ``1 / sqrt(g_max)``).
    """

    period: int
    slots: int
    max_norm_sq: float


def orthogonal_groups(means: np.ndarray, *, exact: bool | None = None) -> OrthogonalGroups:
    """The smallest period ``p`` such that slots in one residue class modulo ``p`` have pairwise
    disjoint supports (so orthogonal means and independent lognormals), for the ``b x N`` mixture
    means of :func:`~dpmf.accounting.allocation.dominating_pair.mixture_means`.

    Supports are compared through 0/1 indicator products (exact integer counts), never through
    float products that might underflow: time ``O(b^2 N)``, memory ``O(b^2)``. Every pair of a
    class is checked, so a wrap-around overlap (several epochs) is always seen. Above ``b^2 N =
    2e8`` (or with ``exact=False``) the supports are replaced by their spans ``[first, last]``
    nonzero column: disjoint spans imply disjoint supports, so the period found is never smaller
    than the exact one (a looser, still sound bound): time ``O(b N + b^2)``.

    >>> import numpy as np
    >>> g = orthogonal_groups(np.eye(6))                   # the identity: every slot alone
    >>> (g.period, g.slots), 1.0 <= g.max_norm_sq < 1.0 + 1e-14   # (the norm is rounded up)
    ((1, 6), True)
    >>> m = np.eye(6) + 0.5 * np.eye(6, k=1)               # 2-banded C, one epoch
    >>> g = orthogonal_groups(m); (g.period, g.slots)
    (2, 3)
    """
    M = np.asarray(means, dtype=np.float64)
    b, n = M.shape
    supp = M > 0
    if exact is None:
        exact = float(b) * b * n <= 2e8
    if exact:
        ind = supp.astype(np.float64)
        overlap = ind @ ind.T  # exact: integer counts below 2^53
        lags = np.array([False] + [bool(np.any(np.diagonal(overlap, L) > 0)) for L in range(1, b)])
    else:
        nz = supp.any(axis=1)
        first = np.where(nz, supp.argmax(axis=1), n)  # an empty row overlaps nothing
        last = np.where(nz, n - 1 - supp[:, ::-1].argmax(axis=1), -1)
        lags = np.array([False] + [
            bool(np.any((first[L:] <= last[:-L]) & (first[:-L] <= last[L:]))) for L in range(1, b)
        ])
    return _groups(lags, np.einsum("ij,ij->i", M, M).max(initial=0.0), n)


def toeplitz_orthogonal_groups(h: np.ndarray, b: int) -> OrthogonalGroups:
    """:func:`orthogonal_groups` for Toeplitz means ``m_i[r] = h[r - i]`` (``r >= i``), without the
    ``b x N`` means: slot ``0`` has the whole support ``S`` of ``h``, so slots at distance ``L``
    overlap iff ``S`` meets ``S + L`` (an autocorrelation of 0/1 indicators, by FFT, counts
    rounded at 1/2). ``|m_0|^2 = sum h^2`` is the largest norm. Time ``O(N log N)``, memory ``O(N)``."""
    h = np.asarray(h, dtype=np.float64)
    n = h.size
    ind = (h > 0).astype(np.float64)
    spec = np.fft.rfft(ind, 2 * n)
    auto = np.fft.irfft(spec * np.conj(spec), 2 * n)[:b]  # auto[L] = #{t in S: t + L in S}
    lags = auto > 0.5
    lags[0] = False
    return _groups(lags, float(np.dot(h, h)), n)


def _groups(lags: np.ndarray, max_norm_sq: float, n: int) -> OrthogonalGroups:
    b = lags.size
    period = next((p for p in range(1, b + 1) if not np.any(lags[p::p])), b)
    g_max = float(max_norm_sq) * (1.0 + 2.0 * (n + 2) * _U) + float(np.finfo(np.float64).tiny)  # rounded up
    return OrthogonalGroups(period, b // period, g_max)


def strategy_groups(strategy, scheme) -> OrthogonalGroups:
    """:class:`OrthogonalGroups` of ``strategy`` under balls-in-bins ``scheme`` (Toeplitz strategies
    from their coefficients, others from the means)."""
    k, b = scheme.epochs, scheme.steps_per_epoch
    if isinstance(strategy, Identity):
        return OrthogonalGroups(1, b, float(k))
    c = None if isinstance(strategy, (np.ndarray, list, tuple)) else toeplitz_coefficients(strategy, scheme.steps)
    if c is not None and np.all(np.isfinite(c)) and np.all(c >= 0):
        return toeplitz_orthogonal_groups(np.cumsum(c.reshape(k, b), axis=0).ravel(), b)
    return orthogonal_groups(mixture_means(strategy, k, scheme.steps))


# ----------------------------------------------------------------------------- grid laws
@dataclass(frozen=True)
class _Law:
    """Masses ``p`` at grid indices ``lo, lo+1, ...`` (values ``index * h``); not normalized."""

    lo: int
    p: np.ndarray
    #: an upper bound on the exact law's total mass (entries may be inflated by error allowances)
    mass: float = 1.0

    def tables(self):
        """``T[k] = P(A >= k)``, ``E[k] = E[(A - k)_+]``, ``H[k] = P(A <= k)``, ``D[k] = E[(k - A)_+]``
        for relative ``k = 0..n-1`` (grid units), by sums of non-negative terms."""
        p = self.p
        T = np.cumsum(p[::-1])[::-1]
        E = np.zeros_like(p)
        E[:-1] = np.cumsum(T[:0:-1])[::-1]
        H = np.cumsum(p)
        D = np.zeros_like(p)
        D[1:] = np.cumsum(H[:-1])
        return T, E, H, D


def _extend(T, E, H, D, k: np.ndarray):
    """The four tables at arbitrary integer ``k`` (linear/constant beyond the support)."""
    n = T.size
    kc = np.clip(k, 0, n - 1)
    below, above = k < 0, k > n - 1
    total = T[0]
    t_k = np.where(below, total, np.where(above, 0.0, T[kc]))
    e_k = np.where(below, E[0] + (-k) * total, np.where(above, 0.0, E[kc]))
    h_k = np.where(below, 0.0, np.where(above, total, H[kc]))
    d_k = np.where(below, 0.0, np.where(above, D[-1] + (k - (n - 1)) * total, D[kc]))
    return t_k, e_k, h_k, d_k


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """``sum(a * b)`` by numpy's pairwise summation (no BLAS: it is slower under load here)."""
    return float(np.sum(a * b))


def _lognormal_tables(eta: float, x: np.ndarray):
    """``P(X <= x), P(X > x), E[X; X <= x], E[X; X > x]`` for the mean-one lognormal."""
    s = math.sqrt(eta)
    with np.errstate(divide="ignore"):
        z = (np.log(x) + eta / 2) / s
    w = z - s
    return special.ndtr(z), special.ndtr(-z), special.ndtr(w), special.ndtr(-w)


def _call(eta: float, k: float) -> float:
    """``E[(X - k)_+]``."""
    if k <= 0:
        return 1.0 - k
    _, fb, _, mb = _lognormal_tables(eta, np.array([k]))
    return max(float(mb[0] - k * fb[0]), 0.0)


def _put(eta: float, k: float) -> float:
    """``E[(k - X)_+]``."""
    if k <= 0:
        return 0.0
    f, _, m, _ = _lognormal_tables(eta, np.array([k]))
    return max(float(k * f[0] - m[0]), 0.0)


def _charge_bound(eta: float, k: float, direction: str) -> float:
    """An upper bound on the level-one cut's charge: remove ``E[(X - k)_+] = M_>(k) - k F_>(k)``, add
    ``E[(k - X)_+] = k F(k) - M(k)``, each computed from ndtr values of a few ulps' relative error,
    so its absolute error is at most ``8 u`` times the two terms' sum (plus ``1e-9`` relative for
    the closed forms). The bound is relative to those terms, not an absolute ``4 u``: the add charge
    is multiplied by ``e^eps`` in delta, and an absolute ``4u`` (as before) alone exceeded
    ``delta = 1e-12`` at ``eps ~ 10`` (sigma 0.7, t = 2 returned the unamplified epsilon)."""
    if direction == "remove":
        if k <= 0:
            return (1.0 - k) * (1 + 4 * _U)
        _, fb, _, mb = _lognormal_tables(eta, np.array([k]))
        value, scale = float(mb[0] - k * fb[0]), float(mb[0] + k * fb[0])
    else:
        if k <= 0:
            return 0.0
        f, _, m, _ = _lognormal_tables(eta, np.array([k]))
        value, scale = float(k * f[0] - m[0]), float(k * f[0] + m[0])
    return max(value, 0.0) * (1 + 1e-9) + 8 * _U * scale + 1e-300


def _level_one(eta: float, h: float, l: int, u: int, direction: str) -> tuple[_Law, float]:
    """The spread of ``X`` onto ``h * [l..u]`` (mass below/above lumped at the ends) and the charge
    (remove: ``E[(X - uh)_+]``; add: ``E[(lh - X)_+]``) per copy, in sum units."""
    x = np.arange(l, u + 1, dtype=np.float64) * h
    F, Fb, M, Mb = _lognormal_tables(eta, x)
    if u == l:
        return _Law(l, np.array([1.0 + 4 * _U]), 1.0 + 4 * _U), _charge_bound(eta, x[0], direction)
    low = Fb[1:] >= F[1:]  # lower-tail differences where they are accurate
    p = np.where(low, F[1:] - F[:-1], Fb[:-1] - Fb[1:])
    # |computed - exact| of a cell's mass: the two ndtr values (a few ulps each) and the subtraction
    p_err = 4 * _U * np.where(low, F[1:] + F[:-1], Fb[:-1] + Fb[1:])
    loww = Mb[1:] >= M[1:]
    m = np.where(loww, M[1:] - M[:-1], Mb[:-1] - Mb[1:])
    m_err = 2 * _U * np.where(loww, M[1:] + M[:-1], Mb[:-1] + Mb[1:])
    p = np.maximum(p, 0.0)
    m = np.maximum(m, 0.0)
    x0 = x[:-1]
    right = (m - x0 * p) / h  # the cell's mass moved to its right end (mean preserved)
    slack = 4 * (m_err + x0 * p_err + _U * (m + x0 * p)) / h
    right = right + slack if direction == "remove" else right - slack
    right = np.clip(right, 0.0, p)
    q = np.zeros(u - l + 1)
    q[:-1] += p - right
    q[1:] += right
    q[0] += F[0] * (1 + 8 * _U)  # P(X <= lh)
    q[-1] += Fb[-1] * (1 + 8 * _U)  # P(X > uh)
    # mass a cell may have lost to rounding goes to the cell's worst end (remove: right, add: left):
    # the cell's law is then dominated in the direction's convex order (a missing mass ``e`` inside
    # ``[x0, x0 + h]`` is below ``e`` at ``x0 + h`` for every non-decreasing ``f >= 0``). Lumping it
    # at the window's end instead (as before) cost ``~1e-14 t e^eps`` in delta: 0.06 at sigma 0.5.
    if direction == "remove":
        q[1:] += p_err
    else:
        q[:-1] += p_err
    return _Law(l, q, float(q.sum()) * (1 + 4 * _U * q.size)), _charge_bound(eta, x[-1] if direction == "remove" else x[0], direction)


def _convolve(a: _Law, b: _Law | None, extended: bool = False, tilt: float = 0.0):
    """The FFT convolution (``b = None``: square) and an entrywise bound on its error.

    ``extended``: transform in long double (x87, unit roundoff ``2^-64``), which shrinks the
    error bound ~2000x at ~4x the time; used where the result is copied many times.

    ``tilt`` (``theta`` per grid index): the operands are exponentially tilted,
    ``a_i e^{theta i}`` (``i`` relative to the operand's first index, scaled so the largest entry
    is 1), convolved, and untilted by ``e^{-theta k}``. Tilting commutes with convolution
    (``e^{theta i} e^{theta j} = e^{theta (i + j)}``), so the result is the same convolution; the
    FFT's absolute error (Higham's bound on the tilted vectors) becomes, after untilting, an
    allowance ``err e^{s - theta k}`` that is tiny where the tilt is large. With ``theta > 0`` the
    upper tail (where the remove direction's ``E[(A - c)_+]`` lives) is computed to a relative
    accuracy, so deltas of ``1e-12`` are not drowned by the allowance (``theta < 0``: the lower
    tail, for the add direction). Entries of the tilted operands below the float range are
    dropped and their largest possible contribution is added to the allowance.
    Returns ``(out, err)``, ``err`` an array (one bound per output entry).
    """
    pa = a.p
    pb = pa if b is None else b.p
    if pa.size * pb.size <= _DIRECT_MAX_PRODUCTS:
        return _direct_convolution(pa, pb)
    n = pa.size + pb.size - 1
    nf = _fft.next_fast_len(n, real=True)
    unit = _U_EXTENDED if extended else _U
    dtype = np.longdouble if extended else np.float64

    def tilted(p):
        if tilt == 0.0:
            return p, 0.0
        with np.errstate(divide="ignore"):
            lw = np.log(p) + tilt * np.arange(p.size)
        m = float(np.max(lw))
        return np.exp(lw - m), m

    ta, ma = tilted(pa)
    tb, mb = (ta, ma) if b is None else tilted(pb)
    fa = _fft.rfft(ta.astype(dtype), nf)
    fb = fa if b is None else _fft.rfft(tb.astype(dtype), nf)
    out = _fft.irfft(fa * fb, nf)[:n]
    na2, nb2 = math.sqrt(float(_dot(ta, ta))), math.sqrt(float(_dot(tb, tb)))
    err = _FFT_ERROR_FACTOR * unit * math.log2(nf) * (na2 * float(tb.sum()) + float(ta.sum()) * nb2)
    if tilt != 0.0:
        err += 2.0 * n * 1e-300  # entries lost to underflow in the tilted operands
    if extended:  # back to float64, rounded up (a relative 2^-53 at most)
        out = out.astype(np.float64) * (1 + 2 * _U)
        err = err * (1 + 2 * _U) + 4 * _U_EXTENDED
    if tilt == 0.0:
        return out, np.full(n, err)
    scale = (ma + mb) - tilt * np.arange(n)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        out = np.exp(np.log(np.maximum(out, 0.0)) + scale) * (1 + 8 * _U)
        err = np.exp(math.log(err) + scale) * (1 + 8 * _U)
    return out, err


def _direct_convolution(pa: np.ndarray, pb: np.ndarray):
    """The convolution by direct sums (``np.convolve``), for operands with at most
    ``_DIRECT_MAX_PRODUCTS`` products. Each output entry is a dot product of ``m <= min(|a|, |b|)``
    non-negative terms, so its rounding error is at most ``gamma_m = m u / (1 - m u)`` times the
    exact entry (Higham, *Accuracy and Stability*, Sec. 3.1): a *relative* error, however small the
    entry (the FFT's bound is absolute, relative to the operands' norms, and swamps the far tail
    where the answer at ``delta = 1e-12`` and ``sigma = 0.5`` lives). The allowance
    ``4 (m + 2) u out + m 1e-300`` covers ``gamma_m / (1 - gamma_m)`` relative to the computed
    entry and products lost to underflow."""
    out = np.convolve(pa, pb)
    m = min(pa.size, pb.size)
    err = out * (4.0 * (m + 2) * _U) + m * 1e-300
    return out, err


@dataclass
class _Plan:
    """Direction, grid and cut rules of one computation."""

    direction: str
    t: int
    h: float
    cap: int  # grid index of the exact cut (remove: >= t e^eps_hi; add: >= t e^-eps_lo)
    budget: float  # tightness budget per cut, in delta units
    scale: float  # add: e^eps_hi (charges are multiplied by e^eps)
    tilt: float = 0.0  # theta per grid index of the tilted FFTs (see _convolve; tightness only)
    target: float = 0.0  # S value where the answer is expected (sets the tilt; 0: no tilt)


def _cut(plan: _Plan, a: _Law, b: _Law | None, mult: int) -> tuple[_Law, float, int]:
    """Convolve, cut to a window, lump the cut mass exactly; returns law, charge and width."""
    c, err = _convolve(a, b, extended=mult >= _EXTENDED_MULT, tilt=plan.tilt)
    lo = a.lo + (a.lo if b is None else b.lo)
    n = c.size
    mass = a.mass * (a.mass if b is None else b.mass) * (1 + 4 * _U)  # no entry or lump exceeds it
    c = np.minimum(c, mass)
    # choose the window from the FFT output (tightness only)
    cpos = np.maximum(c, 0.0)
    _, Ec, _, Dc = _Law(lo, cpos).tables()
    unit = plan.h / plan.t * mult
    s = plan.scale if plan.direction == "add" else 1.0
    ok = np.flatnonzero(Ec * unit * s <= plan.budget)
    u = int(ok[0]) if ok.size else n - 1
    u = max(0, min(u, plan.cap - lo, n - 1))
    ok = np.flatnonzero(Dc[: u + 1] * unit * s <= plan.budget)
    l = int(ok[-1]) if ok.size else 0
    # exact lumps from the operands: A = A1 + A2, sum over A1's support
    b2 = a if b is None else b
    tabs = b2.tables()
    j = np.arange(a.p.size)
    infl = 1 + 4 * _U * (a.p.size + b2.p.size + 8)
    t_u, e_u, _, _ = _extend(*tabs, (u + lo - a.lo - b2.lo) - j)
    _, _, h_l, d_l = _extend(*tabs, (l + lo - a.lo - b2.lo) - j)
    top_mass = float(_dot(a.p, t_u)) * infl
    top_exc = float(_dot(a.p, e_u)) * infl
    bot_mass = float(_dot(a.p, h_l)) * infl
    bot_def = float(_dot(a.p, d_l)) * infl
    if l >= u:
        q = np.array([mass])
        l = u
    else:
        q = np.minimum(np.maximum(c[l : u + 1] + err[l : u + 1], 0.0), mass)
        q[0], q[-1] = min(bot_mass, mass), min(top_mass, mass)
    charge = (top_exc if plan.direction == "remove" else bot_def) * plan.h / plan.t * mult
    return _Law(lo + l, q, mass), charge, u - l + 1


def _sum_law(plan: _Plan, eta: float) -> tuple[_Law, float, int]:
    """Law of ``sum_{i<t} X_i`` (grid, windowed) with its accumulated charge (delta units)."""
    t, h = plan.t, plan.h
    bits = bin(t)[2:][::-1]
    ops = 1 + 2 * len(bits)
    plan.budget /= ops
    # level one: window from closed forms
    s = plan.scale if plan.direction == "add" else 1.0
    u = _first_index(lambda k: _call(eta, k * h) * s <= plan.budget, plan.cap)
    u = min(u, plan.cap)
    l = _last_index(lambda k: _put(eta, k * h) * s <= plan.budget, u)
    base, c1 = _level_one(eta, h, l, u, plan.direction)
    if plan.target > 0:
        plan.tilt = _tilt_for(base, plan.target / h)
    charge = t * c1 / t  # t copies, each charged c1 / t
    width = base.p.size
    result = None
    for i, bit in enumerate(bits):
        if bit == "1":
            if result is None:
                result = base
            else:
                result, c, w = _cut(plan, result, base, 1)
                charge += c
                width = max(width, w)
        if i < len(bits) - 1:
            mult = t >> (i + 1)
            base, c, w = _cut(plan, base, None, mult)
            charge += c
            width = max(width, w)
    return result, charge, width


def _tilt_for(base: _Law, target: float) -> float:
    """``theta`` (per grid index) whose tilt of ``base`` has mean ``target`` (grid units): the
    Chernoff tilt of the sum of ``t`` copies towards ``t * target`` (tightness only: any
    ``theta`` is sound). Clamped so the tilt spans at most 600 nats over the window."""
    idx = np.arange(base.p.size, dtype=np.float64)
    with np.errstate(divide="ignore"):
        logp = np.log(base.p)
    rel = target - base.lo

    def mean(th):
        lw = logp + th * idx
        w = np.exp(lw - lw.max())
        return float(_dot(w, idx) / w.sum())

    cap = 600.0 / max(base.p.size - 1, 1)
    lo_, hi_ = (0.0, cap) if mean(0.0) < rel else (-cap, 0.0)
    if mean(hi_) <= rel:
        return hi_
    if mean(lo_) >= rel:
        return lo_
    for _ in range(60):
        mid = 0.5 * (lo_ + hi_)
        lo_, hi_ = (mid, hi_) if mean(mid) < rel else (lo_, mid)
    return 0.5 * (lo_ + hi_)


def _first_index(ok, hi: int) -> int:
    """Smallest ``k`` in ``[0, hi]`` with ``ok(k)`` (``ok`` monotone), else ``hi``."""
    if not ok(hi):
        return hi
    lo = 0
    if ok(0):
        return 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def _last_index(ok, hi: int) -> int:
    """Largest ``k`` in ``[0, hi]`` with ``ok(k)`` (``ok`` true at 0, monotone), else 0."""
    if ok(hi):
        return hi
    lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


# ----------------------------------------------------------------------------- queries
def _remove_delta_table(law: _Law, h: float, t: int, charge: float):
    """Grid ``a_k`` (S units) and ``delta_R(a_k) = E[(S - a_k)_+] + charge``."""
    _, E, _, _ = law.tables()
    a = (law.lo + np.arange(law.p.size)) * h / t
    return a, E * (h / t) + charge


def _remove_epsilon(law: _Law, h: float, t: int, charge: float, delta: float) -> float:
    a, g = _remove_delta_table(law, h, t, charge)
    idx = np.flatnonzero(g <= delta)
    if idx.size == 0:
        return math.inf
    k = int(idx[0])
    if k == 0:  # below the window delta_R is linear: E[S] - a + charge
        mean = float(_dot(law.p, a))
        root = mean + charge - delta
        return math.log(root) if root > 1 else 0.0
    frac = (g[k - 1] - delta) / (g[k - 1] - g[k])
    root = a[k - 1] + frac * (a[k] - a[k - 1])
    return math.log(root) if root > 1 else 0.0


def _add_epsilon(law: _Law, h: float, t: int, charge: float, delta: float) -> float:
    """Smallest ``eps >= 0`` with ``E[(1 - e^eps S)_+] + e^eps charge <= delta``."""
    _, _, _, D = law.tables()
    b = (law.lo + np.arange(law.p.size)) * h / t
    mass = float(law.p.sum())
    mean = float(_dot(law.p, b))

    def g_at(x: float) -> float:  # E[(x - S)_+] + charge - delta x  (convex, piecewise linear)
        if x <= b[0]:
            return charge - delta * x
        if x >= b[-1]:
            return x * mass - mean + charge - delta * x
        j = min(int((x - b[0]) / (b[1] - b[0])), b.size - 2)
        f = (x - b[j]) / (b[j + 1] - b[j])
        return (D[j] + f * (D[j + 1] - D[j])) * (h / t) + charge - delta * x

    if g_at(1.0) <= 0:
        return 0.0
    g = D * (h / t) + charge - delta * b
    ok = np.flatnonzero((g <= 0) & (b < 1.0))
    if ok.size == 0:
        root = charge / delta  # g is linear below the window
        if root <= 0 or root > b[0]:
            return math.inf
        return -math.log(root)
    j = int(ok[-1])
    if j + 1 < b.size and b[j + 1] < 1.0:
        root = b[j] + (b[j + 1] - b[j]) * g[j] / (g[j] - g[j + 1])
    else:  # the crossing lies between b[j] and 1 (maybe past the window): bisect the convex g
        lo_, hi_ = b[j], 1.0
        for _ in range(200):
            mid = 0.5 * (lo_ + hi_)
            lo_, hi_ = (mid, hi_) if g_at(mid) <= 0 else (lo_, mid)
        root = lo_
    if root <= 0:  # only S = 0 meets the target on this grid: no finite bound from it
        return math.inf
    return -math.log(root) if root < 1 else 0.0


# ----------------------------------------------------------------------------- driver
def _direction_pass(direction, eta, t, delta, h, eps_hi, eps_lo, eps_est=None):
    """One grid level of one direction; ``eps_est`` (a guess of the answer) aims the FFT tilt."""
    aim = eps_est is not None and math.isfinite(eps_est)
    if direction == "remove":
        cap = int(math.ceil(t * math.exp(eps_hi) * (1 + _CAP_MARGIN) / h))
        plan = _Plan("remove", t, h, cap, _CUT_BUDGET * delta, 1.0, target=math.exp(eps_est) if aim else 0.0)
        law, charge, width = _sum_law(plan, eta)
        return _remove_epsilon(law, h, t, charge, delta), width
    cap = int(math.ceil(t * math.exp(-eps_lo) / h)) + 1
    plan = _Plan("add", t, h, cap, _CUT_BUDGET * delta, math.exp(eps_hi), target=math.exp(-eps_est) if aim else 0.0)
    law, charge, width = _sum_law(plan, eta)
    return _add_epsilon(law, h, t, charge, delta), width


def _refine(direction, eta, t, delta, eps_gauss, rel_tol, max_points, enough=-1.0):
    """Pilot on a coarse grid, then grids of 4x, 8x, ... the pilot's points over the pilot's
    window, until two levels agree to ``rel_tol`` or a level stops improving (then the FFT error
    allowance, which grows with the number of points, outweighs the finer spread). Returns the
    smallest epsilon seen (each one a sound bound) and the levels. Refinement also stops once the
    bound is ``<= enough`` (the other direction's epsilon: this one can no longer decide the max)."""
    best = eps_gauss
    eps_lo = 0.0  # add: the window reaches t e^-eps_lo, exact for every eps >= eps_lo
    reach = t * (math.exp(eps_gauss) * (1 + _CAP_MARGIN) if direction == "remove" else 1.0)
    h = reach / _PILOT_POINTS
    levels, prev, points = [], None, _PILOT_POINTS
    est = None  # the previous level's epsilon aims the next level's FFT tilt (the pilot is untilted)
    while True:
        eps, width = _direction_pass(direction, eta, t, delta, h, best, eps_lo, est)
        while direction == "add" and eps_lo > 0 and eps <= eps_lo * (1 + 1e-3) and eps > enough:
            # the answer sits at the window's end, where the cut is not exact (lowering the mass
            # above it is free, so ``eps`` is still a bound, only maybe a loose one): reach further,
            # in steps (the window grows like e^{-eps_lo}; jumping to eps_lo = 0 at a fine grid made
            # windows of 10^7 points at small sigma). Once ``eps <= enough`` it cannot decide the max.
            eps_lo = 0.8 * eps_lo if eps_lo > 0.5 else 0.0
            eps, width = _direction_pass(direction, eta, t, delta, h, best, eps_lo, est)
        best = min(best, eps)
        est = best if math.isfinite(best) else None
        levels.append({"h": h, "points": width, "epsilon": eps})
        if prev is not None and (abs(prev - eps) <= 3 * rel_tol * max(eps, 1e-12) or eps >= prev):
            break
        if best <= enough:
            break
        reach = width * h  # value width of the widest window: the next grid spans it
        if len(levels) == 1:  # after the pilot
            points = 4 * _PILOT_POINTS
        else:
            prev, points = eps, 2 * points
        if direction == "add" and math.isfinite(best):
            eps_lo = 0.8 * best
        if points > max_points:
            break
        h = reach / points
    return best, levels


def allocation_pld_epsilon(
    noise_multiplier: float,
    steps: int,
    delta: float,
    *,
    epochs: int = 1,
    num_selected: int = 1,
    fresh_slots: bool = False,
    rel_tol: float = DEFAULT_REL_TOL,
    max_points: int = DEFAULT_MAX_POINTS,
) -> dict:
    """Epsilon (both directions) of ``epochs`` epochs of ``num_selected``-out-of-``steps`` random
    allocation of a Gaussian step with noise ``noise_multiplier`` (sensitivity 1, ``C = I``).

    ``steps`` is ``t``, the steps per epoch; each example is in ``k = num_selected`` distinct
    uniformly random steps of an epoch. ``fresh_slots=False``: the steps are drawn once and reused
    every epoch (``E`` epochs = one epoch at ``sigma / sqrt(E)``, exact); ``True``: drawn anew each
    epoch (the ``E``-fold composition). ``k > 1`` is bounded by a composition of 1-of-``floor(t/k)``
    and 1-of-``ceil(t/k)`` allocations (:mod:`~dpmf.accounting.allocation.pld_compose`). A single
    copy (``k = 1``, reused slots or one epoch) is computed directly (module docstring), so
    ``fresh_slots`` over one epoch equals reused slots exactly, and ``num_selected=1`` is one-slot
    allocation.

    Returns a dict with ``epsilon``, ``epsilon_by_direction``, ``refinements`` (per direction: the
    grid spacing ``h`` in sum units, the widest window's points and the epsilon of each level; or
    ``compositions`` for a composition), ``gaussian_epsilon`` and ``seconds``.
    """
    start = time.perf_counter()
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    t = _v.positive_int("steps", steps)
    k = _v.positive_int("epochs", epochs)
    sel = _v.positive_int("num_selected", num_selected)
    if sel > t:
        raise InvalidParameterError(f"num_selected must be <= steps ({t}), got {sel}")
    d = _v.open_unit("delta", delta)
    rel_tol = _v.positive("rel_tol", rel_tol)
    max_points = _v.positive_int("max_points", max_points)
    if max_points < 8 * _PILOT_POINTS:
        raise InvalidParameterError(f"max_points must be >= {8 * _PILOT_POINTS}, got {max_points}")
    fresh = bool(fresh_slots) and k > 1
    if sel > 1 or fresh:
        sigma_eff = sigma if fresh else sigma / math.sqrt(k)
        rounds = k if fresh else 1
        parts = [(m, c * rounds) for m, c in pld_compose.split_k_of_t(t, sel)]
        out = {"noise_multiplier_one_epoch": sigma_eff, "steps_per_epoch": t, "epochs": k,
               "num_selected": sel, "fresh_slots": bool(fresh_slots),
               "gaussian_epsilon": gaussian_epsilon(sigma / math.sqrt(k * sel), d),
               "composition": [{"steps": m, "copies": c} for m, c in parts]}
        comp = pld_compose.composition_epsilon(
            1.0 / sigma_eff**2, parts, d, rel_tol=rel_tol, max_points=max_points, grid=sys.modules[__name__]
        )
        by_dir = {key: min(v, out["gaussian_epsilon"]) for key, v in comp["epsilon_by_direction"].items()}
        out.update({"epsilon": max(by_dir.values()), "epsilon_by_direction": by_dir,
                    "compositions": comp["compositions"], "seconds": time.perf_counter() - start})
        return out
    sigma_eff = sigma / math.sqrt(k)
    eta = 1.0 / sigma_eff**2
    eps_gauss = gaussian_epsilon(sigma_eff, d)
    out = {"noise_multiplier_one_epoch": sigma_eff, "steps_per_epoch": t, "epochs": k,
           "gaussian_epsilon": eps_gauss}
    by_dir, levels = {}, {}
    if t == 1 or eps_gauss == 0.0 or eps_gauss > 300:
        by_dir = {"remove": eps_gauss, "add": eps_gauss}
        out["note"] = "the Gaussian mechanism's epsilon (t = 1, or a grid beyond float range)"
    else:
        by_dir["remove"], levels["remove"] = _refine("remove", eta, t, d, eps_gauss, rel_tol, max_points)
        by_dir["add"], levels["add"] = _refine(
            "add", eta, t, d, eps_gauss, rel_tol, max_points, enough=by_dir["remove"]
        )
    out.update({
        "epsilon": max(by_dir.values()),
        "epsilon_by_direction": by_dir,
        "refinements": levels,
        "seconds": time.perf_counter() - start,
    })
    return out


# ----------------------------------------------------------------------------- accountant
#: Results of :func:`_epsilon` for a correlated C by (reductions, scheme, noise, delta, options): the
#: reductions (frozen: every member's numbers) and the scheme determine the computation, so equal keys
#: give equal results. A calibration repeated in one process (the README's two training examples, a
#: plan row and its report) costs nothing the second time.
_MEMO: dict = {}
_MEMO_SIZE = 256


def _epsilon(strategy, scheme, groups, sigma: float, d: float, accuracy, max_points) -> dict:
    """The identity's exact pair, or for any other C the best of the reductions ``groups``
    (:class:`~dpmf.accounting.allocation.correlated.Reductions`; memoized, :data:`_MEMO`)."""
    if groups is None:
        return _epsilon_of(strategy, scheme, groups, sigma, d, accuracy, max_points)
    key = (groups, scheme, float(sigma), float(d), float(accuracy), int(max_points))
    if key not in _MEMO:
        if len(_MEMO) >= _MEMO_SIZE:
            _MEMO.pop(next(iter(_MEMO)))
        _MEMO[key] = _epsilon_of(strategy, scheme, groups, sigma, d, accuracy, max_points)
    return copy.deepcopy(_MEMO[key])


def _epsilon_of(strategy, scheme, groups, sigma: float, d: float, accuracy, max_points) -> dict:
    if groups is None:
        return allocation_pld_epsilon(
            sigma, scheme.steps_per_epoch, d, epochs=scheme.epochs, num_selected=getattr(scheme, "num_selected", 1),
            fresh_slots=getattr(scheme, "fresh_slots", False), rel_tol=accuracy, max_points=max_points,
        )
    if getattr(scheme, "num_selected", 1) != 1:  # the identity's k-of-t at sigma / sqrt(Lambda) (k_of_t_correlated.py)
        fresh = _fresh(scheme)
        return reduced_epsilon(groups, sigma, d, allocation_pld_epsilon, rel_tol=accuracy, max_points=max_points,
                               epochs=scheme.epochs if fresh else 1, fresh_slots=fresh, num_selected=scheme.num_selected)
    if _fresh(scheme):  # the k-fold composition of each member's identity pair (fresh_correlated.py)
        out = reduced_epsilon(groups, sigma, d, allocation_pld_epsilon, rel_tol=accuracy, max_points=max_points,
                              epochs=scheme.epochs, fresh_slots=True)
        add_markov_compositions(out, groups, sigma, d, scheme.epochs, grid=sys.modules[__name__])
        return out
    # the smallest epsilon over orthogonal and spectral groups, each a sound reduction (correlated.py)
    return reduced_epsilon(groups, sigma, d, allocation_pld_epsilon, rel_tol=accuracy, max_points=max_points)


def _fresh(scheme) -> bool:
    return bool(getattr(scheme, "fresh_slots", False)) and scheme.epochs > 1


def _reductions(strategy, scheme):
    """``None`` for the identity, else the reductions of :mod:`.correlated` (orthogonal groups and,
    when the Gram matrix is small enough, spectral groups)."""
    if isinstance(strategy, Identity):
        return None
    if getattr(scheme, "num_selected", 1) > 1:
        return k_of_t_reductions(strategy, scheme)
    if _fresh(scheme):
        return fresh_slot_reductions(strategy, scheme)
    return strategy_reductions(strategy, scheme, strategy_groups(strategy, scheme))


@guarded(NAME, supports)
def account_allocation_pld(
    strategy,
    scheme,
    noise_multiplier: float,
    delta: float,
    *,
    accuracy: float = DEFAULT_REL_TOL,
    max_points: int = DEFAULT_MAX_POINTS,
) -> PrivacyReport:
    """Epsilon of ``strategy`` under balls-in-bins ``scheme`` (module docstring): exact (up to the
    pessimistic grid) for DP-SGD (``Identity(N)``); for any other non-negative lower-triangular
    ``C`` the smallest bound, per direction, over the orthogonal groups (:func:`strategy_groups`),
    the spectral groups and the Markov members (:mod:`.correlated`, :mod:`.markov`) -- with fresh
    slots over the epochs' compositions (:mod:`.fresh_correlated`), with ``num_selected > 1`` the
    random-blocks bound (:mod:`.k_of_t_correlated`); the diagnostics' ``bound`` names the member
    used and ``reductions`` lists every member's epsilon.

    Args:
      strategy: :class:`~dpmf.strategies.Identity` with ``n = scheme.steps``, or any strategy the
        random-allocation pair covers (Toeplitz / banded / BLT from their coefficients).
      scheme: :class:`~dpmf.sampling.BallsInBinsSampling` (``k`` epochs of ``b`` steps; slots reused or
        fresh, ``num_selected`` of them per epoch).
      noise_multiplier: ``sigma > 0`` (clip norm 1).
      delta: target delta in (0, 1).
      accuracy: grid refinement stops when two levels agree to this relative tolerance.
      max_points: most grid points in one window (bounds memory and time).

    Returns:
      A certified :class:`PrivacyReport`, epsilon the worst of both directions; diagnostics hold
      the refinement levels, the Gaussian-mechanism bound and the exact epochs reduction.
    """
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    d = _v.open_unit("delta", delta)
    groups = _reductions(strategy, scheme)
    return _report(strategy, scheme, groups, sigma, d, _epsilon(strategy, scheme, groups, sigma, d, accuracy, max_points))


def _report(strategy, scheme, groups, sigma: float, d: float, out: dict) -> PrivacyReport:
    """The report of :func:`account_allocation_pld` from :func:`_epsilon`'s result ``out``."""
    out = dict(out)
    by_dir = dict(out.pop("epsilon_by_direction"))
    eps = out.pop("epsilon")
    if groups is not None and groups.label == k_of_t_correlated.LABEL:
        n_sel, fresh = scheme.num_selected, _fresh(scheme)
        out["reduction"] = (
            f"{n_sel} of {scheme.steps_per_epoch} steps per epoch, {'fresh' if fresh else 'reused'} slots: random "
            "blocks made independent (cross-block Gram entries moved to the diagonal), every block bounded by the "
            "identity's pair at sigma / sqrt(largest row sum of the Gram), so the identity's "
            f"{n_sel}-of-{scheme.steps_per_epoch} allocation{f' over {scheme.epochs} fresh epochs' if fresh else ''} "
            "at that noise (k_of_t_correlated.py)"
        )
    elif groups is not None and groups.orthogonal is None:
        out["reduction"] = (
            f"{scheme.epochs} epochs of fresh slots: the epochs made independent (cross-epoch Gram entries "
            "moved to the diagonal), each reduced to the identity's pair by spectral groups, then the "
            f"{scheme.epochs}-fold composition (fresh_correlated.py)"
        )
    elif groups is not None:
        out["orthogonal_groups"] = {
            "period": groups.period, "slots": groups.slots, "max_norm_sq": groups.max_norm_sq,
            "bound": f"the identity's pair with {groups.slots} steps at sigma / sqrt({groups.max_norm_sq:.6g}) "
                     "(Jensen + convex order over orthogonal residue classes; module docstring)",
        }
    elif "composition" in out:
        out["reduction"] = (
            f"identity, {scheme.epochs} epochs, {out['num_selected']} of {scheme.steps_per_epoch} steps per epoch, "
            f"{'fresh' if out['fresh_slots'] else 'reused'} slots = a composition of one-slot allocations "
            + ", ".join(f"{c['copies']} x 1-of-{c['steps']}" for c in out["composition"])
            + (f" at sigma / sqrt({scheme.epochs})" if not out["fresh_slots"] and scheme.epochs > 1 else "")
        )
    elif scheme.epochs > 1:
        out["reduction"] = (
            f"identity, {scheme.epochs} epochs with the same slot each epoch = one epoch of "
            f"{scheme.steps_per_epoch} steps at sigma / sqrt({scheme.epochs})"
        )
    return PrivacyReport(
        epsilon=eps,
        delta=d,
        noise_multiplier=sigma,
        method=NAME,
        certified=True,
        epsilon_by_direction=by_dir,
        strategy=describe_strategy(strategy),
        scheme=scheme.describe(),
        diagnostics=out,
    )


@guarded(NAME, supports)
def calibrate_allocation_pld(
    strategy,
    scheme,
    target_epsilon: float,
    delta: float,
    *,
    rel_tol: float = 1e-4,
    callback: ProgressCallback | None = None,
    accuracy: float = DEFAULT_REL_TOL,
    max_points: int = DEFAULT_MAX_POINTS,
) -> float:
    """Smallest noise multiplier whose :func:`account_allocation_pld` epsilon is ``<= target``.

    ``rel_tol`` is the search's relative tolerance on sigma, ``accuracy`` the accountant's
    ``rel_tol``; ``callback(sigma, epsilon)`` after each evaluation.
    """
    return noise_and_report(strategy, scheme, target_epsilon, delta, rel_tol=rel_tol, callback=callback,
                            accuracy=accuracy, max_points=max_points)[0]


def noise_and_report(
    strategy,
    scheme,
    target_epsilon: float,
    delta: float,
    *,
    rel_tol: float = 1e-4,
    callback: ProgressCallback | None = None,
    limit: float | None = None,
    **options,
) -> tuple[float, PrivacyReport]:
    """:func:`calibrate_allocation_pld` for the dispatcher (the registry's ``fast_calibration``): the
    noise and the :func:`account_allocation_pld` report at it (with ``options``: ``accuracy``,
    ``max_points``), built from the search's own evaluation there (not evaluated twice).

    ``limit``: only noises up to it are of interest (the noise another accountant reached):
    evaluated first, :class:`~dpmf.privacy.calibration.NoiseLimitExceeded` when the epsilon there is
    above the target; otherwise the search runs as without it (from the active
    :func:`~dpmf.privacy.calibration.search_hint`, so its answer does not depend on the limit).
    """
    check_pair(NAME, supports, strategy, scheme)
    target = _v.positive("target_epsilon", target_epsilon)
    d = _v.open_unit("delta", delta)
    unknown = sorted(set(options) - {"accuracy", "max_points"})
    if unknown:
        raise InvalidParameterError(f"unknown option(s) {unknown} for allocation_pld (accepted: accuracy, max_points)")
    accuracy, max_points = options.get("accuracy", DEFAULT_REL_TOL), options.get("max_points", DEFAULT_MAX_POINTS)
    groups = _reductions(strategy, scheme)
    seen: dict[float, dict] = {}

    def eps_of(s: float) -> float:
        if s not in seen:
            seen[s] = _epsilon(strategy, scheme, groups, s, d, accuracy, max_points)
        return seen[s]["epsilon"]

    if limit is not None:
        check_limit(eps_of, target, limit, callback=callback)
    sigma = smallest_noise(eps_of, target, rel_tol=rel_tol, callback=callback).value
    report = _report(strategy, scheme, groups, sigma, d, seen[sigma])
    return sigma, dataclasses.replace(report, options=recorded_options(options))
