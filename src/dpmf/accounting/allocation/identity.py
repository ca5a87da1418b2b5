r"""Fast paths of the Rényi and conditional-composition accountants for ``C = I`` (DP-SGD).

Schuchardt & Kalinin (arXiv 2601.21636), Secs. 3-4, specialized to the identity under one epoch
of ``b`` steps of random allocation (``k`` epochs with the slot reused reduce to one epoch at
``sigma / sqrt(k)``, :mod:`dpmf.accounting.reductions`). The mixture means are ``m_i = e_i``
(``b x b``), the Gram matrix is ``I_b``. Nothing ``b x b`` is built here: both bounds cost
``O(b)`` (conditional) and ``O(A^2 log b)`` (Rényi) instead of the general code's dense ``b x b``
means, Gram and prefix-Gram arrays (800 MB each at ``b = 10^4``). Same mathematics as the general
code (:mod:`.renyi`, :mod:`.conditional`), which the tests run side by side on sizes both reach.

**Rényi, remove direction** (Lemma 3.2 with ``G = I``): the count-form sum is the coefficient of
``x^a`` in ``f(x)^b`` with ``f(x) = sum_{t>=0} x^t e^{t(t-1)/(2 s^2)} / t!``, so

    rho(a) = (log [x^a] f^b + log a! - a log b) / (a - 1)

(Feldman & Shenfeld's direct RDP bound of one-of-``b`` allocation). The general dynamic program
(bandwidth 1) multiplies by ``f`` ``b`` times; here ``f^b`` is formed by repeated squaring in the
log domain, truncated at degree ``A``: ``O(A^2 log b)``. Rounding: each product of two truncated
series adds at most a few ulp (relative) times the magnitudes, and an error ``e`` in the factors
becomes ``2e`` in a square, so the log-domain error of ``f^b`` is at most ``b`` times that of one
product, the same order as ``b`` sequential multiplications; the general code's allowance
``(b + 16) 4 ulp (|log S| + log a! + a log b) / (a - 1)`` is kept unchanged. The add direction
(Lemma 3.4) is closed form: ``trace(G) = sum(G) = b``.

**Conditional composition** (Alg. 4). At step ``n`` (0-based) component ``n`` has mean 1 and the
others 0, so only the sorted position ``b - 1`` (component ``n``) needs a reverse-hazard bound.
Its predecessors: components ``n+1..b-1`` have the same (zero) prefix (share ``w0 = (b-1-n)/(b-1)``)
and ``n`` components ``j < n`` have prefix ``e_j``, all at squared distance 1 from the zero prefix,
so every ``psi`` of the family (uniform and softmax at any temperature) is uniform over them:
``KL = 0``, ``mu_bar = (1/n) sum_{j<n} e_j``, and the ELBO of ``L_sub`` has

    mean  nu = -1/(2 s^2) (+ <c, mu_bar>/s^2 under the history's mean c),   sd  xi = 1/(s sqrt n).

*Add* (history ``~ N(0, s^2 I)``): ``tau = nu + xi Phi^{-1}(beta)``. *Remove* (history ``~`` the
full mixture): ``nu_k = nu + 1/(n s^2)`` for the ``n`` components ``k < n`` and ``nu`` for the
``b - n`` others, and ``tau`` is the largest value with
``(n Phi((tau - nu_1)/xi) + (b - n) Phi((tau - nu_0)/xi)) / b <= beta`` (bisection from below).
Then ``L >= log(w0 + (1 - w0) e^tau)``, ``lambda = 1 / (1 + (b - 1) e^L)`` and the step's pair is the
subsampled Gaussian ``((1 - lambda) N(0, s^2) + lambda N(1, s^2), N(0, s^2))`` (remove) or its
mirror with the add bound's ``lambda`` (add); step 0 has ``lambda = 1/b``. The same float
allowances as the general code are applied (``64 ulp`` of each magnitude, ``(1 + 1e-12)`` on the
bisection's sum, ``lambda (1 + 64 ulp)``).

Each step's PMF is built on the grid ``j * Delta`` as :meth:`dpmf.privacy.mixture.GaussianMixture.pld`
builds it (same tail points, same grid ends, same connect-the-dots split with its ``1e-9`` cover),
but with the closed-form inverse loss of a two-point mixture,
``u = (log(expm1(L) + lambda) - log lambda + s^2/2) / s`` (standardized units), instead of Newton's
method, only for the direction that is used, and many steps at once (a compiled row kernel,
:func:`dpmf.accounting.allocation._compiled.two_point_rows`). One difference, on the safe side: in
the add direction the loss never exceeds ``-log(1 - lambda)``, the last interval's end point; where
that point lies more than one grid step above the grid (large sigma or lambda), the general builder
puts it at the next grid point, here it is placed at its own grid index and the interval's mass
(at most ``Phi(-10) ~ 7.6e-24``) goes there whole. The ``b`` PMFs are composed by a balanced tree
of FFT convolutions, batched per level, each with dp_accounting's pessimistic ``1e-15`` tail
truncation (:func:`_convolve`), instead of ``b - 1`` sequential ones. Convolution is associative,
so the two orders differ only by truncation (each moves at most ``1e-15`` of mass up) and float
rounding: the tests find the epsilons equal to ``1e-8`` relative at ``delta >= 1e-6``. At small
delta the truncations show, and the tree is the tighter (sigma 1.3, delta 1e-10, b = 2000, add
direction: 2.0e-13 at +inf against 5.5e-13 for the sequence; epsilon 0.182905 against 0.182941,
0.182885 without truncation).

*Above* :data:`EXACT_STEPS` *steps* (4096; the general code's own cost rule skipped conditional
composition from about 3000 steps) each ``lambda_n`` is replaced by the largest ``lambda`` of its
group of relative width :data:`GROUP_RATIO` (``1e-3``) and each group's PMF is raised to the power
of its size by binary powering: a dominating pair per step (sound, see :func:`_composed`), at most
about ``5e-4`` relative looser in epsilon (measured at ``b = 5000, 10^4``), ``O(#groups log b)``
work. The report says so (``grouped_steps``).

Cost (2 shared cores): conditional composition 0.1-0.7 s at ``b = 10^3``, ~2 s at ``4096``,
1.5-2.5 s at ``10^4`` and ``10^5``; memory: work arrays of ``2^21`` entries (16 MB each); the
Rényi bound 0.01-0.03 s at any ``b <= 10^5``.
"""

from __future__ import annotations

import math
import time

import numpy as np
from scipy import special

from dpmf import progress
from dpmf import validation as _v
from dpmf.accounting.allocation._compiled import two_point_rows
from dpmf.errors import InvalidParameterError, NumericalError
from dpmf.privacy.mixture import SPLIT_SLACK, TAIL_Z, GaussianMixture
from dpmf.privacy import dp_pld
from dpmf.privacy.pld import PrivacyLossDistribution, dense_pmf

__all__ = [
    "identity_step_probabilities",
    "identity_conditional_epsilon",
    "identity_remove_rdp",
    "identity_conditional_cost",
]

_ULP = np.finfo(np.float64).eps
_SLACK = 64 * _ULP  # (as in .conditional)


# ============================================================================ Renyi
def _log_series(sigma: float, max_order: int) -> np.ndarray:
    """``log`` of the coefficients of ``f(x) = sum_t x^t e^{t(t-1)/(2 s^2)} / t!``, ``t <= A``."""
    t = np.arange(max_order + 1, dtype=np.float64)
    return t * (t - 1.0) * 0.5 / (sigma * sigma) - special.gammaln(t + 1.0)


def _log_product(f: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Log coefficients of the product of two series, truncated at the same degree."""
    A = f.size - 1
    out = np.empty(A + 1)
    for m in range(A + 1):
        v = f[: m + 1] + g[m::-1]
        mx = v.max()
        out[m] = mx + math.log(float(np.exp(v - mx).sum())) if math.isfinite(mx) else mx
    return out


def identity_remove_rdp(b: int, noise_multiplier: float, max_order: int) -> np.ndarray:
    r"""Remove-direction Rényi bound of one-of-``b`` allocation for DP-SGD, orders ``2..max_order``.

    ``rho(a) = (log [x^a] f(x)^b + log a! - a log b) / (a - 1)`` (module docstring), with the
    allowance of :func:`dpmf.accounting.allocation.renyi.remove_rdp`; equal to it on ``G = I_b``.

    >>> round(float(identity_remove_rdp(100, 1.0, 2)[0]), 10)   # log(1 + (e - 1)/100)
    0.0170368632
    """
    b = _v.positive_int("b", b)
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    amax = int(max_order)
    if amax < 2:
        raise InvalidParameterError(f"max_order must be an integer >= 2, got {max_order!r}")
    base = _log_series(sigma, amax)
    acc = None
    k = b
    while k:  # binary powering: f^b
        if k & 1:
            acc = base.copy() if acc is None else _log_product(acc, base)
        k >>= 1
        if k:
            base = _log_product(base, base)
    log_s = acc[2:]
    a = np.arange(2, amax + 1, dtype=np.float64)
    lf, alb = special.gammaln(a + 1.0), a * math.log(b)
    with np.errstate(invalid="ignore", over="ignore"):
        rho = (log_s + lf - alb) / (a - 1.0)
        slack = (b + 16) * 4.0 * _ULP * (np.abs(log_s) + lf + alb) / (a - 1.0)
        rho = rho + slack
    rho = np.where(np.isnan(rho), np.inf, rho)
    return np.maximum(rho, 0.0)


# ============================================================================ conditional
def identity_step_probabilities(b: int, sigma: float, beta: float) -> dict[str, np.ndarray]:
    """``lambda[direction][n]``: the weight of the mean-1 component in step ``n``'s pair.

    Alg. 4 on ``M = I_b`` (module docstring), both directions, vectorized over the steps.
    """
    lam0 = 1.0 / b
    out = {"remove": np.full(b, lam0), "add": np.full(b, lam0)}
    if b < 2:
        return out
    s2 = sigma * sigma
    n = np.arange(1, b, dtype=np.float64)
    quad = 1.0 / n  # |mu_bar|^2 = |mu_i - mu_bar|^2 (mu_i = 0 prefix)
    xi = np.sqrt(quad + _SLACK * quad) / sigma
    const = -1.0 / (2.0 * s2)  # (|mu_i|^2 - E_psi |mu_j|^2) / (2 s^2) - KL, KL = 0
    const_err = _SLACK * 1.0 / (2.0 * s2)
    z = special.ndtri(beta)
    tau = {"add": (const - const_err) + xi * z}
    # remove: nu_1 (n components k < n, <mu_bar, mu_k> = 1/n) and nu_0 (b - n components, 0)
    v1 = (quad / s2 + const) - (_SLACK * quad / s2 + const_err)
    v0 = np.full_like(n, const - const_err)
    w1, w0c = n, b - n
    target = b * beta - b * 1e-300
    lo = np.minimum(v1, v0) + xi * z
    hi = np.minimum(
        v1 + xi * special.ndtri(np.minimum(b * beta / w1, 0.5)),
        v0 + xi * special.ndtri(np.minimum(b * beta / w0c, 0.5)),
    )
    hi = np.maximum(hi, lo)

    def ok(t):
        tot = w1 * special.ndtr((t - v1) / xi) + w0c * special.ndtr((t - v0) / xi)
        return tot * (1.0 + 1e-12) <= target

    for _ in range(30):
        mid = 0.5 * (lo + hi)
        good = ok(mid)
        lo = np.where(good, mid, lo)
        hi = np.where(good, hi, mid)
    if not np.all(ok(lo)):  # cannot happen in exact arithmetic; stay on the safe side
        raise NumericalError("conditional composition (identity): tail-bound bisection lost its bracket")
    tau["remove"] = lo
    pos = float(b - 1)
    w0 = (b - 1 - n) / pos  # share of predecessors with the same (zero) prefix
    for direction in ("remove", "add"):
        best = tau[direction]
        with np.errstate(over="ignore", divide="ignore"):
            full = np.where(w0 > 0, np.logaddexp(np.log(np.maximum(w0, 1e-300)), np.log1p(-w0) + best), best)
            lam = special.expit(-math.log(pos) - full)
        out[direction][1:] = np.minimum(1.0, lam * (1.0 + _SLACK))
    return out


def _tail_points(s: float, lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`dpmf.privacy.mixture._mixture_tail_points` for ``(1-lam) N(0,1) + lam N(s,1)``,
    vectorized over ``lam`` (same bisection, same stopping rule)."""
    log_tau = float(special.log_ndtr(-TAIL_Z))
    lp = np.stack([np.log1p(-lam), np.log(lam)], axis=1)
    sv = np.array([0.0, s])

    def lse(x):
        m = x.max(axis=1)
        return m + np.log(np.exp(x - m[:, None]).sum(axis=1))

    def bisect(f, want_low_side):
        lo = np.full(lam.size, 0.0 - TAIL_Z)
        hi = np.full(lam.size, s + TAIL_Z)
        for _ in range(80):
            active = ~(hi - lo <= 1e-9 * np.maximum(1.0, np.maximum(np.abs(lo), np.abs(hi))))
            if not active.any():
                break
            mid = 0.5 * (lo + hi)
            cond = (f(mid) <= log_tau) == want_low_side
            hi = np.where(active & cond, mid, hi)
            lo = np.where(active & ~cond, mid, lo)
        return hi if want_low_side else lo

    hi = bisect(lambda u: lse(lp + special.log_ndtr(sv[None, :] - u[:, None])), True)
    lo = bisect(lambda u: lse(lp + special.log_ndtr(u[:, None] - sv[None, :])), False)
    return lo, hi


def _mixture_log_tail(u: np.ndarray, lam: np.ndarray, s: float, upper: bool) -> np.ndarray:
    """``log`` of the mass of ``(1 - lam) N(0, 1) + lam N(s, 1)`` above (``upper``) or below ``u``."""
    if upper:
        return np.logaddexp(np.log1p(-lam) + special.log_ndtr(-u), np.log(lam) + special.log_ndtr(s - u))
    return np.logaddexp(np.log1p(-lam) + special.log_ndtr(u), np.log(lam) + special.log_ndtr(u - s))


def _split(eps: np.ndarray, disc: float, p_mid: np.ndarray, q_mid: np.ndarray) -> np.ndarray:
    """Upper-end share of each interval's P-mass (the connect-the-dots split of
    :func:`dpmf.privacy.mixture._connect_the_dots`, with its ``1e-9`` cover), elementwise."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        qt = np.where(q_mid > 0, np.exp(eps + np.log(np.where(q_mid > 0, q_mid, 1.0))), 0.0)
        upper = (p_mid - qt) * (math.exp(disc) / math.expm1(disc)) + SPLIT_SLACK * p_mid
    upper = np.clip(np.nan_to_num(upper, nan=0.0, posinf=0.0), 0.0, p_mid)
    return np.where(qt == 0, p_mid, upper)


def _grid(lam: np.ndarray, lo_u: np.ndarray, hi_u: np.ndarray, s: float, disc: float, direction: str):
    """Per row: the first grid index, the number of grid points and the row's width (the add
    direction's top point may lie above its last grid point), as in ``GaussianMixture._pmfs``."""
    l1m, ll = np.log1p(-lam), np.log(lam)
    floor_idx = np.floor(l1m / disc).astype(np.int64) + 1  # lowest grid index above min loss log(1 - lam)

    def loss(u):
        return np.logaddexp(l1m, ll + s * u - 0.5 * s * s)

    if direction == "remove":  # P = mixture, Q = N(0, 1); loss j disc at u = L^{-1}(j disc)
        j_lo = np.maximum(np.floor(loss(lo_u) / disc).astype(np.int64), floor_idx)
        n = np.ceil(loss(hi_u) / disc).astype(np.int64) - j_lo + 1
        return j_lo, n, n, floor_idx
    ja_lo = np.floor(-loss(np.full(lam.size, TAIL_Z)) / disc).astype(np.int64)
    ja_hi = np.minimum(np.ceil(-loss(np.full(lam.size, -TAIL_Z)) / disc).astype(np.int64), -floor_idx)
    top = 1 - floor_idx  # the add loss never exceeds -log(1 - lam) <= top * disc: the last point
    return ja_lo, ja_hi - ja_lo + 1, top - ja_lo + 1, floor_idx


def _rows(lam: np.ndarray, lo_u: np.ndarray, hi_u: np.ndarray, s: float, disc: float, direction: str):
    """Pessimistic PMFs of many two-point mixtures at once: ``(lower index, probs (rows x W), inf)``.

    Row ``i`` is the ``direction`` PMF of ``GaussianMixture([0, s sigma], [1 - lam_i, lam_i],
    sigma).pld(disc)`` (module docstring; the arithmetic of ``GaussianMixture._pmfs`` row by row).
    """
    R = lam.size
    first, n, width, floor_idx = _grid(lam, lo_u, hi_u, s, disc, direction)
    rows = np.arange(R)
    last = n - 1
    probs = np.zeros((R, int(width.max())))
    u_first, u_last = np.empty(R), np.empty(R)
    sign = 1.0 if direction == "remove" else -1.0
    two_point_rows(lam, first, n, s, disc, sign, SPLIT_SLACK, probs, u_first, u_last)
    eps_last = (first + last) * disc
    if direction == "remove":  # P = mixture, Q = N(0, 1): the masses below and above the grid
        p_below = np.exp(_mixture_log_tail(u_first, lam, s, upper=False))
        p_above = np.exp(_mixture_log_tail(u_last, lam, s, upper=True))
        q_above = special.ndtr(-u_last)
        with np.errstate(over="ignore", divide="ignore"):
            log_top_q = np.where(q_above > 0, eps_last + np.log(np.where(q_above > 0, q_above, 1.0)), -np.inf)
            top_q = np.where(log_top_q < 700.0, np.exp(np.minimum(log_top_q, 700.0)), np.inf)
        inf_mass = np.minimum(p_above, np.maximum(0.0, p_above - top_q) + SPLIT_SLACK * p_above)
        probs[:, 0] += p_below
        probs[rows, last] += p_above - inf_mass
        return first, probs, inf_mass
    # add: P = N(0, 1), Q = mixture; grid points ja_lo..ja_hi (u decreasing), then the top point
    # (index top - ja_lo): P-mass above the largest u is loss below the grid, below the smallest u
    # the last interval, up to the top point
    ja_hi, top = first + last, 1 - floor_idx
    p_below = special.ndtr(-u_first)
    p_top = special.ndtr(u_last)
    q_top = np.exp(_mixture_log_tail(u_last, lam, s, upper=False))
    probs[:, 0] += p_below
    # split as above where the top point is the next grid point; where it lies further up (a gap),
    # all of the last interval's mass goes to the top point (pessimistic)
    up_top = np.where(top == ja_hi + 1, _split(eps_last, disc, p_top, q_top), p_top)
    probs[rows, last] += p_top - up_top
    probs[rows, top - first] += up_top
    return first, probs, np.zeros(R)


#: Columns searched first for the truncation points (the tails cut are short; rows whose running
#: sum stays below the threshold there are searched in full).
_HEAD = 64


def _first_above(C: np.ndarray, thr: float) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the first index where the running sum exceeds ``thr`` (the row length if none) and
    the sum of the entries before it, as dp_accounting's sequential loop computes them."""
    R, L = C.shape
    head = min(L, _HEAD)
    cs = np.cumsum(C[:, :head], axis=1)
    above = cs > thr
    found = above.any(axis=1)
    idx = np.where(found, above.argmax(axis=1), L)
    before = np.zeros(R)
    hit = np.flatnonzero(found & (idx > 0))
    before[hit] = cs[hit, idx[hit] - 1]
    rest = np.flatnonzero(~found)
    if rest.size:
        full = np.cumsum(C[rest], axis=1)
        ab = full > thr
        k = np.where(ab.any(axis=1), ab.argmax(axis=1), L)
        idx[rest] = k
        before[rest] = np.where(k > 0, full[np.arange(rest.size), np.maximum(k - 1, 0)], 0.0)
    return idx, before


def _convolve(a: tuple, b: tuple, tail: float) -> tuple:
    """Row-wise composition of two stacks of PMFs ``(lower indices, probs (rows x W), inf)``.

    Each row is dp_accounting's ``DensePLDPmf.compose`` (convolution, infinity masses
    ``i1 + i2 - i1 i2``, then the pessimistic tail truncation: the longest prefix and suffix of
    mass ``<= tail / 2`` each are cut, the prefix's mass added to the first kept point and the
    suffix's to the infinity mass), with the same float arithmetic (its round-off in the FFT
    convolution included), one batched FFT for all rows.
    """
    from scipy import fft as _fft

    (lo_a, A, i_a), (lo_b, B, i_b) = a, b
    thr = tail / 2
    L = A.shape[1] + B.shape[1] - 1
    nfft = _fft.next_fast_len(L, real=True)
    C = _fft.irfft(_fft.rfft(A, nfft, axis=1) * _fft.rfft(B, nfft, axis=1), nfft, axis=1)[:, :L]
    inf = i_a + i_b - i_a * i_b
    # dp_accounting's rule: the first index where the running sum exceeds thr, from each side
    left, left_mass = _first_above(C, thr)
    n_right, right_sum = _first_above(C[:, ::-1], thr)
    right0 = L - n_right
    right = np.maximum(right0, left + 1)
    right_mass = right_sum.copy()
    for i in np.flatnonzero(right > right0):  # (left + 1 overrode the suffix: a shorter one is cut)
        right_mass[i] = C[i, right[i] :].sum()
    width = int((right - left).max())
    idx = left[:, None] + np.arange(width)[None, :]
    P = np.where(idx < right[:, None], np.take_along_axis(C, np.minimum(idx, L - 1), axis=1), 0.0)
    P[:, 0] += left_mass
    return lo_a + lo_b + left, P, inf + right_mass


def _stack(parts: list) -> tuple:
    """Rows ``(lower indices, probs (rows x W) zero-padded, inf)`` from ``(lo, probs, inf)`` rows."""
    width = max(p[1].shape[-1] for p in parts)
    P = np.concatenate([np.pad(np.atleast_2d(p[1]), ((0, 0), (0, width - p[1].shape[-1]))) for p in parts])
    lo = np.concatenate([np.atleast_1d(p[0]) for p in parts]).astype(np.int64)
    inf = np.concatenate([np.atleast_1d(p[2]) for p in parts]).astype(np.float64)
    return lo, P, inf


def _compose_rows(lo: np.ndarray, P: np.ndarray, inf: np.ndarray, tail: float):
    """Compose the PMFs in the rows of ``P`` by a balanced tree, one batched :func:`_convolve`
    per level (the pairwise tree of dp_accounting ``compose`` calls, up to the order of additions)."""
    rows = (lo, P, inf)
    while rows[1].shape[0] > 1:
        lo, P, inf = rows
        carry = (lo[-1:], P[-1:], inf[-1:]) if P.shape[0] % 2 else None
        m = P.shape[0] - (1 if carry else 0)
        out = _convolve((lo[0:m:2], P[0:m:2], inf[0:m:2]), (lo[1:m:2], P[1:m:2], inf[1:m:2]), tail)
        rows = _stack([out, carry]) if carry else out
    return int(rows[0][0]), rows[1][0], float(rows[2][0])


def _power_rows(lo: np.ndarray, P: np.ndarray, inf: np.ndarray, counts: np.ndarray, tail: float):
    """Row ``r`` composed ``counts[r]`` times with itself, by binary powering (batched over rows)."""
    base = (lo, P, inf)
    acc: list = [None] * lo.size
    k = counts.astype(np.int64).copy()
    while True:
        bit = np.flatnonzero(k & 1)
        have = [r for r in bit if acc[r] is not None]
        new = [r for r in bit if acc[r] is None]
        for r in new:
            acc[r] = (base[0][r : r + 1], base[1][r : r + 1], base[2][r : r + 1])
        if have:
            cur = _stack([acc[r] for r in have])
            sel = np.array(have)
            prod = _convolve(cur, (base[0][sel], base[1][sel], base[2][sel]), tail)
            for i, r in enumerate(have):
                acc[r] = (prod[0][i : i + 1], prod[1][i : i + 1], prod[2][i : i + 1])
        k >>= 1
        live = np.flatnonzero(k > 0)
        if live.size == 0:
            break
        sq = _convolve(*[(base[0][live], base[1][live], base[2][live])] * 2, tail)
        b0 = base[0].copy()
        b1 = np.zeros((lo.size, max(base[1].shape[1], sq[1].shape[1])))
        b1[:, : base[1].shape[1]] = base[1]
        b2 = base[2].copy()
        b0[live], b2[live] = sq[0], sq[2]
        b1[live] = 0.0
        b1[live, : sq[1].shape[1]] = sq[1]
        base = (b0, b1, b2)
    return _stack(acc)


#: Entries (steps x grid points) of the PMFs built and composed together (work arrays of 1 MiB).
#: Binary powering (:func:`_power_rows`) widens every row of a chunk, and its batched FFTs hold
#: complex copies of the widened rows: at ``b = 10^4`` a chunk of ``2^21`` entries (575 grouped rows)
#: took 65 MiB inside the powering (peak RSS of ``dpmf.account`` 297-305 MiB); ``2^17`` entries
#: take about 8 MiB there (peak 243 MiB) at the same CPU time (measured 2026-11-28, b = 10^3 to 10^5).
#: The chunking only decides which rows are composed together first; every convolution's rounding
#: stays upward, so any chunk size is sound (the epsilons move by ~1e-9 relative).
_CHUNK_ENTRIES = 1 << 17


#: Up to this many steps every step's own pair is composed; above, steps are grouped (below).
EXACT_STEPS = 4096
#: Relative width of a group of ``lambda`` values above :data:`EXACT_STEPS` steps.
GROUP_RATIO = 1e-3


def _groups(lam_sorted: np.ndarray, ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """``(value, count)`` per group of the sorted ``lambda`` in ``[l_0 (1 + r)^k, l_0 (1 + r)^(k+1))``;
    a group's value is its *largest* member, so it is ``>=`` every member's ``lambda`` exactly."""
    ids = np.floor(np.log(lam_sorted / lam_sorted[0]) / math.log1p(ratio)).astype(np.int64)
    ids = np.maximum.accumulate(ids)  # (sorted input: guard the float log against non-monotone ids)
    _, start, count = np.unique(ids, return_index=True, return_counts=True)
    return np.maximum.reduceat(lam_sorted, start), count


def _composed(
    lam: np.ndarray, sigma: float, disc: float, direction: str, tail: float, bar=None,
    exact_steps: int | None = None,
):
    """The composition of the ``direction`` PMFs of every step's pair (module docstring).

    Above ``exact_steps`` steps each step's ``lambda`` is replaced by the largest ``lambda`` of its
    group (:func:`_groups`, width :data:`GROUP_RATIO`), a dominating pair (the pair at a smaller
    ``lambda`` is a post-processing of the one at a larger ``lambda``; and Lemma 4.1 holds for any
    weights that stochastically dominate the posterior, which a larger weight on the top mean does),
    and each group's PMF is composed with itself by binary powering (:func:`_power_rows`): the
    bound is then at most one group width looser than the per-step one, and costs ``O(#groups)``
    PMF builds and ``O(#groups log b)`` convolutions instead of ``b`` of each.
    """
    s = 1.0 / sigma
    ok = (lam > 0) & (lam < 1)
    parts = []
    for l in np.unique(lam[~ok]):  # lambda = 1 (clipped): the plain Gaussian, by the general builder
        pld = GaussianMixture.create([0.0, 1.0], [1.0 - l, l], sigma).pld(disc)
        one = pld.remove if direction == "remove" else pld.add
        parts.append(one if np.sum(lam == l) == 1 else one.self_compose(int(np.sum(lam == l)), tail))
    todo = np.sort(lam[ok])  # (similar widths side by side; composition does not depend on the order)
    counts = None
    if todo.size > (EXACT_STEPS if exact_steps is None else exact_steps):
        todo, counts = _groups(todo, GROUP_RATIO)
    lo_all, hi_all = _tail_points(s, todo) if todo.size else (todo, todo)
    width = _grid(todo, lo_all, hi_all, s, disc, direction)[2]
    c0 = 0
    while c0 < todo.size:
        top = np.maximum.accumulate(width[c0:])  # chunk rows x widest row <= _CHUNK_ENTRIES
        c1 = c0 + max(1, int(np.searchsorted(top * np.arange(1, top.size + 1), _CHUNK_ENTRIES, side="right")))
        chunk, lo_u, hi_u = todo[c0:c1], lo_all[c0:c1], hi_all[c0:c1]
        lo, P, inf = _rows(chunk, lo_u, hi_u, s, disc, direction)
        if counts is not None:  # each group's PMF to the power of its size
            lo, P, inf = _power_rows(lo, P, inf, counts[c0:c1], tail)
        parts.append(dense_pmf(*_compose_rows(lo, P, inf, tail), disc))
        if bar is not None:
            bar.advance(chunk.size if counts is None else int(counts[c0:c1].sum()))
        c0 = c1
    if len(parts) == 1:
        return parts[0]
    arrays = [dp_pld.dense_arrays(p) for p in parts]  # (lower, probs, infinity mass, disc)
    P = np.zeros((len(parts), max(len(a[1]) for a in arrays)))
    for r, a in enumerate(arrays):
        P[r, : len(a[1])] = a[1]
    lo = np.array([a[0] for a in arrays], dtype=np.int64)
    inf = np.array([a[2] for a in arrays], dtype=np.float64)
    return dense_pmf(*_compose_rows(lo, P, inf, tail), disc)


def _auto_discretization(lam: dict, sigma: float, support_size: int) -> float:
    """:func:`dpmf.accounting.allocation.conditional._auto_discretization` for two-point pairs."""
    s = 1.0 / sigma
    u = np.array([-10.0, s + 10.0])
    span = 0.0
    for w in lam.values():
        w = np.asarray(w, dtype=np.float64)
        # log(1 - w), -inf where w = 1 (one step per epoch: the example is always in it), without
        # evaluating log1p(-1) (numpy's "divide by zero" warning); logaddexp below takes -inf exactly
        la0 = np.log1p(-w, out=np.full(w.shape, -np.inf), where=w < 1.0)[:, None] + 0.0 * u[None, :]
        la1 = np.log(w)[:, None] - 0.5 * s * s + u[None, :] * s
        lse = np.logaddexp(la0, la1)
        span = max(span, float(np.max(lse[:, 1] - np.maximum(lse[:, 0], -50.0))))
    return max(1e-4, span / support_size)


def identity_conditional_epsilon(
    b: int,
    noise_multiplier: float,
    delta: float,
    *,
    delta_e: float | None = None,
    discretization: float | None = None,
    support_size: int = 1000,
    callback=None,
) -> dict:
    """:func:`dpmf.accounting.allocation.conditional.conditional_epsilon` of ``means = I_b``.

    Same arguments and result (module docstring: the same bound, ``O(b)`` PMF builds and a tree
    of compositions); the ``psi`` family's temperatures do not matter here (every member is
    uniform over the predecessors).
    """
    start = time.perf_counter()
    b = _v.positive_int("b", b)
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    d = _v.open_unit("delta", delta)
    de = d / 2 if delta_e is None else _v.positive("delta_e", delta_e)
    if not de < d:
        raise InvalidParameterError(f"delta_e must be in (0, delta={d}), got {delta_e!r}")
    beta = de / (max(b - 1, 1) * max(b - 1, 1))
    lam = identity_step_probabilities(b, sigma, beta)
    disc = discretization
    if disc is None:
        disc = _auto_discretization(lam, sigma, support_size)
    disc = _v.positive("discretization", disc)
    composed = {}
    with progress.task("conditional composition (identity)", total=2 * b, unit="steps") as bar:
        for direction in ("remove", "add"):
            composed[direction] = _composed(lam[direction], sigma, disc, direction, 1e-15, bar)
            if callback is not None:
                callback(b, b)
    pld = PrivacyLossDistribution(remove=composed["remove"], add=composed["add"])
    eps = pld.epsilon_by_direction(d - de)
    out = {
        "epsilon": max(eps.values()),
        "epsilon_by_direction": eps,
        "delta_e": de,
        "beta": beta,
        "discretization": disc,
        "fast_path": "identity",
    }
    if b > EXACT_STEPS:
        out["grouped_steps"] = (
            f"b = {b} > {EXACT_STEPS}: each step's lambda rounded up to the largest of its group of relative "
            f"width {GROUP_RATIO:g} (a dominating pair; measured <= 5e-4 relative looser than per-step pairs)"
        )
    out["seconds"] = time.perf_counter() - start
    return out


def identity_conditional_cost(b: int) -> float:
    """Rough seconds of :func:`identity_conditional_epsilon` (2 shared cores: 0.1-0.7 s at
    ``b = 10^3``, ~2 s at ``4096`` (per-step pairs), 1.5-2.5 s at ``10^4`` and ``10^5`` (groups),
    ``benchmarks/bench_allocation_identity.py``)."""
    return 0.1 + 5e-4 * min(b, EXACT_STEPS) + (2.0 if b > EXACT_STEPS else 0.0)

