r"""The PLD grid engine of random allocation: the law of a sum of ``t`` i.i.d. mean-one lognormals on
a grid, every rounding and truncation pessimistic, and the epsilons it certifies.

Used by :mod:`~dpmf.accounting.allocation.pld` (one epoch, the identity and orthogonal groups) and
:mod:`~dpmf.accounting.allocation.pld_compose` (compositions of profiles). ``X`` is a mean-one
lognormal of parameter ``eta`` (``log X ~ N(-eta/2, eta)``); remove is ``E[(S - e^eps)_+]``, add is
``E[(1 - e^eps S)_+]`` with ``S = (1/t) sum_i X_i`` (the pair and the reductions: the
:mod:`~dpmf.accounting.allocation.pld` docstring).

The public pieces: :class:`Law` (masses on grid indices), :class:`Plan` (direction, grid and cut
rules of one computation), :func:`convolve` (FFT or direct convolution with an entrywise error
bound), :func:`sum_law` (the windowed law of the sum and its charge), :func:`refine` (the driver:
grids refined until two levels agree), :data:`CUT_BUDGET`, :data:`CAP_MARGIN` and :data:`PILOT_POINTS`.

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

**Cost.** ``n`` grid points per window (at most ``max_points``): time ``O(n log n log t)`` per
refinement level (``<= 2 log2 t`` FFTs of length ``<= 2n``), memory ``O(n)``. The window width
tracks the distribution (``O(sqrt(t))`` standard deviations of the sum, or ``t e^eps`` when the tail
is heavy), so ``n`` does not grow with ``t``: at ``t = 10^4`` a few ``10^5`` points suffice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import fft as _fft
from scipy import special

from dpmf.numerics import UNIT_ROUNDOFF

_U_EXTENDED = float(np.finfo(np.longdouble).eps) / 2  # 2^-64 on x86-64; 2^-53 where long double is double
#: Partial sums used at least this many times are convolved in long double (see convolve).
_EXTENDED_MULT = 64
#: First refinement level's points per window (a pilot that fixes the windows).
PILOT_POINTS = 2**10
#: Fraction of delta that window cuts may cost in tightness (never in soundness).
CUT_BUDGET = 1e-4
#: The remove window reaches ``t e^eps_hi (1 + margin)``, so its cut is exact at the answer.
CAP_MARGIN = 0.02
#: Constant of the FFT convolution error bound (Higham, Thm 24.2, with margin).
_FFT_ERROR_FACTOR = 16.0
#: Convolutions with at most this many products (``|a| |b|``) are summed directly, with a relative
#: error bound (see _direct_convolution); above it, by FFT (about 0.05-0.1 s at the threshold here).
_DIRECT_MAX_PRODUCTS = 2**26


# ----------------------------------------------------------------------------- grid laws
@dataclass(frozen=True)
class Law:
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
            return (1.0 - k) * (1 + 4 * UNIT_ROUNDOFF)
        _, fb, _, mb = _lognormal_tables(eta, np.array([k]))
        value, scale = float(mb[0] - k * fb[0]), float(mb[0] + k * fb[0])
    else:
        if k <= 0:
            return 0.0
        f, _, m, _ = _lognormal_tables(eta, np.array([k]))
        value, scale = float(k * f[0] - m[0]), float(k * f[0] + m[0])
    return max(value, 0.0) * (1 + 1e-9) + 8 * UNIT_ROUNDOFF * scale + 1e-300


def _level_one(eta: float, h: float, l: int, u: int, direction: str) -> tuple[Law, float]:
    """The spread of ``X`` onto ``h * [l..u]`` (mass below/above lumped at the ends) and the charge
    (remove: ``E[(X - uh)_+]``; add: ``E[(lh - X)_+]``) per copy, in sum units."""
    x = np.arange(l, u + 1, dtype=np.float64) * h
    F, Fb, M, Mb = _lognormal_tables(eta, x)
    if u == l:
        return Law(l, np.array([1.0 + 4 * UNIT_ROUNDOFF]), 1.0 + 4 * UNIT_ROUNDOFF), _charge_bound(eta, x[0], direction)
    low = Fb[1:] >= F[1:]  # lower-tail differences where they are accurate
    p = np.where(low, F[1:] - F[:-1], Fb[:-1] - Fb[1:])
    # |computed - exact| of a cell's mass: the two ndtr values (a few ulps each) and the subtraction
    p_err = 4 * UNIT_ROUNDOFF * np.where(low, F[1:] + F[:-1], Fb[:-1] + Fb[1:])
    loww = Mb[1:] >= M[1:]
    m = np.where(loww, M[1:] - M[:-1], Mb[:-1] - Mb[1:])
    m_err = 2 * UNIT_ROUNDOFF * np.where(loww, M[1:] + M[:-1], Mb[:-1] + Mb[1:])
    p = np.maximum(p, 0.0)
    m = np.maximum(m, 0.0)
    x0 = x[:-1]
    right = (m - x0 * p) / h  # the cell's mass moved to its right end (mean preserved)
    slack = 4 * (m_err + x0 * p_err + UNIT_ROUNDOFF * (m + x0 * p)) / h
    right = right + slack if direction == "remove" else right - slack
    right = np.clip(right, 0.0, p)
    q = np.zeros(u - l + 1)
    q[:-1] += p - right
    q[1:] += right
    q[0] += F[0] * (1 + 8 * UNIT_ROUNDOFF)  # P(X <= lh)
    q[-1] += Fb[-1] * (1 + 8 * UNIT_ROUNDOFF)  # P(X > uh)
    # mass a cell may have lost to rounding goes to the cell's worst end (remove: right, add: left):
    # the cell's law is then dominated in the direction's convex order (a missing mass ``e`` inside
    # ``[x0, x0 + h]`` is below ``e`` at ``x0 + h`` for every non-decreasing ``f >= 0``). Lumping it
    # at the window's end instead (as before) cost ``~1e-14 t e^eps`` in delta: 0.06 at sigma 0.5.
    if direction == "remove":
        q[1:] += p_err
    else:
        q[:-1] += p_err
    return Law(l, q, float(q.sum()) * (1 + 4 * UNIT_ROUNDOFF * q.size)), _charge_bound(eta, x[-1] if direction == "remove" else x[0], direction)


def convolve(a: Law, b: Law | None, extended: bool = False, tilt: float = 0.0):
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
    unit = _U_EXTENDED if extended else UNIT_ROUNDOFF
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
        out = out.astype(np.float64) * (1 + 2 * UNIT_ROUNDOFF)
        err = err * (1 + 2 * UNIT_ROUNDOFF) + 4 * _U_EXTENDED
    if tilt == 0.0:
        return out, np.full(n, err)
    scale = (ma + mb) - tilt * np.arange(n)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        out = np.exp(np.log(np.maximum(out, 0.0)) + scale) * (1 + 8 * UNIT_ROUNDOFF)
        err = np.exp(math.log(err) + scale) * (1 + 8 * UNIT_ROUNDOFF)
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
    err = out * (4.0 * (m + 2) * UNIT_ROUNDOFF) + m * 1e-300
    return out, err


@dataclass
class Plan:
    """Direction, grid and cut rules of one computation."""

    direction: str
    t: int
    h: float
    cap: int  # grid index of the exact cut (remove: >= t e^eps_hi; add: >= t e^-eps_lo)
    budget: float  # tightness budget per cut, in delta units
    scale: float  # add: e^eps_hi (charges are multiplied by e^eps)
    tilt: float = 0.0  # theta per grid index of the tilted FFTs (see convolve; tightness only)
    target: float = 0.0  # S value where the answer is expected (sets the tilt; 0: no tilt)


def _cut(plan: Plan, a: Law, b: Law | None, mult: int) -> tuple[Law, float, int]:
    """Convolve, cut to a window, lump the cut mass exactly; returns law, charge and width."""
    c, err = convolve(a, b, extended=mult >= _EXTENDED_MULT, tilt=plan.tilt)
    lo = a.lo + (a.lo if b is None else b.lo)
    n = c.size
    mass = a.mass * (a.mass if b is None else b.mass) * (1 + 4 * UNIT_ROUNDOFF)  # no entry or lump exceeds it
    c = np.minimum(c, mass)
    # choose the window from the FFT output (tightness only)
    cpos = np.maximum(c, 0.0)
    _, Ec, _, Dc = Law(lo, cpos).tables()
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
    infl = 1 + 4 * UNIT_ROUNDOFF * (a.p.size + b2.p.size + 8)
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
    return Law(lo + l, q, mass), charge, u - l + 1


def sum_law(plan: Plan, eta: float) -> tuple[Law, float, int]:
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


def _tilt_for(base: Law, target: float) -> float:
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
def _remove_delta_table(law: Law, h: float, t: int, charge: float):
    """Grid ``a_k`` (S units) and ``delta_R(a_k) = E[(S - a_k)_+] + charge``."""
    _, E, _, _ = law.tables()
    a = (law.lo + np.arange(law.p.size)) * h / t
    return a, E * (h / t) + charge


def _remove_epsilon(law: Law, h: float, t: int, charge: float, delta: float) -> float:
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


def _add_epsilon(law: Law, h: float, t: int, charge: float, delta: float) -> float:
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
        cap = int(math.ceil(t * math.exp(eps_hi) * (1 + CAP_MARGIN) / h))
        plan = Plan("remove", t, h, cap, CUT_BUDGET * delta, 1.0, target=math.exp(eps_est) if aim else 0.0)
        law, charge, width = sum_law(plan, eta)
        return _remove_epsilon(law, h, t, charge, delta), width
    cap = int(math.ceil(t * math.exp(-eps_lo) / h)) + 1
    plan = Plan("add", t, h, cap, CUT_BUDGET * delta, math.exp(eps_hi), target=math.exp(-eps_est) if aim else 0.0)
    law, charge, width = sum_law(plan, eta)
    return _add_epsilon(law, h, t, charge, delta), width


def refine(direction, eta, t, delta, eps_gauss, rel_tol, max_points, enough=-1.0):
    """Pilot on a coarse grid, then grids of 4x, 8x, ... the pilot's points over the pilot's
    window, until two levels agree to ``rel_tol`` or a level stops improving (then the FFT error
    allowance, which grows with the number of points, outweighs the finer spread). Returns the
    smallest epsilon seen (each one a sound bound) and the levels. Refinement also stops once the
    bound is ``<= enough`` (the other direction's epsilon: this one can no longer decide the max)."""
    best = eps_gauss
    eps_lo = 0.0  # add: the window reaches t e^-eps_lo, exact for every eps >= eps_lo
    reach = t * (math.exp(eps_gauss) * (1 + CAP_MARGIN) if direction == "remove" else 1.0)
    h = reach / PILOT_POINTS
    levels, prev, points = [], None, PILOT_POINTS
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
            points = 4 * PILOT_POINTS
        else:
            prev, points = eps, 2 * points
        if direction == "add" and math.isfinite(best):
            eps_lo = 0.8 * best
        if points > max_points:
            break
        h = reach / points
    return best, levels
