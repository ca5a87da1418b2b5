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

Each step's PMF is built on the grid ``j * Delta`` exactly as
:meth:`dpmf.privacy.mixture.GaussianMixture.pld` builds it (same tail points, same grid ends, same
connect-the-dots split with its ``1e-9`` cover), but with the closed-form inverse loss of a
two-point mixture, ``u = (log(expm1(L) + lambda) - log lambda + s^2/2) / s`` (standardized units),
instead of Newton's method, and only the direction that is used. The ``b`` PMFs are composed by a
balanced tree of dp_accounting's FFT convolutions (the same pessimistic ``1e-15`` tail truncation
at each of the ``b - 1`` compositions) instead of ``b - 1`` sequential ones. Convolution is
associative, so the two orders differ only by truncation (each moves at most ``1e-15`` of mass
up) and float rounding.
"""

from __future__ import annotations

import math
import time

import numpy as np
from scipy import special

from dpmf import progress
from dpmf import validation as _v
from dpmf.errors import InvalidParameterError, NumericalError
from dpmf.privacy.mixture import (
    GaussianMixture,
    _TAIL_Z,
    _connect_the_dots,
    _gaussian_interval_masses,
    _mixture_interval_masses,
    _point_tails,
)
from dpmf.privacy.pld import PrivacyLossDistribution, dense_pmf
from dpmf.privacy.rdp import rdp_to_epsilon

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
    log_tau = float(special.log_ndtr(-_TAIL_Z))
    lp = np.stack([np.log1p(-lam), np.log(lam)], axis=1)
    sv = np.array([0.0, s])

    def lse(x):
        m = x.max(axis=1)
        return m + np.log(np.exp(x - m[:, None]).sum(axis=1))

    def bisect(f, want_low_side):
        lo = np.full(lam.size, 0.0 - _TAIL_Z)
        hi = np.full(lam.size, s + _TAIL_Z)
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


def _loss(u, lam: float, s: float):
    """Remove-direction loss ``L(u) = log(1 - lam + lam e^{s u - s^2/2})`` (standardized)."""
    return np.logaddexp(math.log1p(-lam), math.log(lam) + s * np.asarray(u) - 0.5 * s * s)


def _inverse(levels: np.ndarray, lam: float, s: float) -> np.ndarray:
    """``u`` with ``L(u) = level`` (levels ``> log(1 - lam)``), closed form."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.log(np.expm1(levels) + lam) - math.log(lam) + 0.5 * s * s) / s


def _subsampled_pmf(lam: float, s: float, disc: float, lo_u: float, hi_u: float, direction: str):
    """One direction's PMF of ``GaussianMixture([0, s sigma], [1 - lam, lam], sigma).pld(disc)``
    (:meth:`dpmf.privacy.mixture.GaussianMixture._pmfs`, closed-form inverse)."""
    sv, pv = np.array([0.0, s]), np.array([1.0 - lam, lam])
    min_loss = math.log1p(-lam)
    floor_idx = math.floor(min_loss / disc) + 1
    zero, one = np.zeros(1), np.ones(1)
    if direction == "remove":
        l_lo, l_hi = _loss(np.array([lo_u, hi_u]), lam, s)
        j_lo, j_hi = max(math.floor(l_lo / disc), floor_idx), math.ceil(l_hi / disc)
        levels = np.arange(j_lo, j_hi + 1) * disc
        u = _inverse(levels, lam, s)
        _, g_mid, _ = _gaussian_interval_masses(u)
        m_mid = _mixture_interval_masses(u, sv, pv)
        m_below, _ = _point_tails(u[0], sv, pv)
        _, m_above = _point_tails(u[-1], sv, pv)
        _, g_above = _point_tails(u[-1], zero, one)
        probs, inf_mass = _connect_the_dots(levels, disc, m_below, m_mid, m_above, g_mid, g_above)
        return dense_pmf(j_lo, probs, inf_mass, disc)
    l_ylo, l_yhi = _loss(np.array([-_TAIL_Z, _TAIL_Z]), lam, s)
    ja_lo, ja_hi = math.floor(-l_yhi / disc), min(math.ceil(-l_ylo / disc), -floor_idx)
    u = _inverse(np.arange(-ja_hi, -ja_lo + 1) * disc, lam, s)  # L-levels increasing
    _, g_mid, _ = _gaussian_interval_masses(u)
    m_mid = _mixture_interval_masses(u, sv, pv)
    _, g_above_top = _point_tails(u[-1], zero, one)
    g_below_bottom, _ = _point_tails(u[0], zero, one)
    m_below_bottom, _ = _point_tails(u[0], sv, pv)
    eps_a = np.arange(ja_lo, ja_hi + 2) * disc
    eps_a[-1] = (1 - floor_idx) * disc  # the add loss never exceeds -log(1 - lam)
    p_mid = np.append(g_mid[::-1], g_below_bottom)
    q_mid = np.append(m_mid[::-1], m_below_bottom)
    probs, inf_mass = _connect_the_dots(eps_a, disc, g_above_top, p_mid, 0.0, q_mid, 0.0)
    return dense_pmf(ja_lo, probs, inf_mass, disc)


def _step_pmfs(lam: np.ndarray, sigma: float, disc: float, direction: str) -> list:
    s = 1.0 / sigma
    out = []
    ok = (lam > 0) & (lam < 1)
    lo_u = np.zeros(lam.size)
    hi_u = np.zeros(lam.size)
    if ok.any():
        lo_u[ok], hi_u[ok] = _tail_points(s, lam[ok])
    cache: dict = {}
    for i, l in enumerate(lam):
        key = float(l)
        if key not in cache:
            if ok[i]:
                cache[key] = _subsampled_pmf(key, s, disc, float(lo_u[i]), float(hi_u[i]), direction)
            else:  # lambda = 1 (clipped): the plain Gaussian, by the general builder
                pld = GaussianMixture.create([0.0, 1.0], [1.0 - key, key], sigma).pld(disc)
                cache[key] = pld.remove if direction == "remove" else pld.add
        out.append(cache[key])
    return out


def _tree_compose(pmfs: list, tail: float):
    """Compose PMFs pairwise in a balanced tree (dp_accounting's FFT convolution each time)."""
    level = list(pmfs)
    while len(level) > 1:
        nxt = [level[i].compose(level[i + 1], tail) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def _auto_discretization(lam: dict, sigma: float, support_size: int) -> float:
    """:func:`dpmf.accounting.allocation.conditional._auto_discretization` for two-point pairs."""
    s = 1.0 / sigma
    u = np.array([-10.0, s + 10.0])
    span = 0.0
    for w in lam.values():
        la0 = np.log1p(-np.minimum(w, 1.0))[:, None] + 0.0 * u[None, :]
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
            pmfs = _step_pmfs(lam[direction], sigma, disc, direction)
            bar.advance(b)
            if callback is not None:
                callback(b, b)
            composed[direction] = _tree_compose(pmfs, 1e-15)
    pld = PrivacyLossDistribution(remove=composed["remove"], add=composed["add"])
    eps = pld.epsilon_by_direction(d - de)
    return {
        "epsilon": max(eps.values()),
        "epsilon_by_direction": eps,
        "delta_e": de,
        "beta": beta,
        "discretization": disc,
        "fast_path": "identity",
        "seconds": time.perf_counter() - start,
    }


def identity_conditional_cost(b: int) -> float:
    """Rough seconds of :func:`identity_conditional_epsilon` (2 shared cores)."""
    return 0.05 + 1e-3 * b
