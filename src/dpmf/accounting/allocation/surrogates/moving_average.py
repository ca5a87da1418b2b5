r"""Correlated ``C`` under random allocation: the band's own moving-average structure.

dpmf's own argument (not from the papers), a sibling of :mod:`.markov_fit`. The pair and the sum are
theirs: with ``x ~ Q`` the likelihood ratio of the remove pair is ``S = (1/b) T``,
``T = sum_s X_s``, ``X_s = exp(Y_s - Var(Y_s)/2)``, ``Y ~ N(0, G / sigma^2)``, ``G`` the ``b x b``
Gram matrix of the mixture means, and both directions' deltas are ``E f(T)`` for a hinge ``f``
(:mod:`.markov_fit`, module docstring). A one-dimensional chain pays for a band's lags with a geometric
tail (Lemma K) or extra variance (Lemma P); for a ``p``-banded Toeplitz ``C`` the Gram is itself a
moving average of order ``w = p - 1`` -- ``Y_s = sum_{j <= w} a_j xi_{s+j}`` with i.i.d. standard
normal ``xi`` and ``a = sqrt(k) c`` over ``k`` reused epochs -- and this module runs a dynamic program
on that structure, whose state is the ``w`` innovations the earlier slots still load on.

**The surrogate.** ``Y'_s = sum_{j=0}^{w} A_{s,j} xi_{s+j}`` (``s = 0..b-1``, innovations
``xi_0 .. xi_{b+w-1}``) with non-negative loadings ``A``: the stationary ``a`` (the spectral factor of
the Gram's largest lags ``g_L = max_i G_{i,i+L}``, checked non-negative) on every slot, except two
``w x w`` blocks that only the boundary slots load on: ``xi_0 .. xi_{w-1}`` (the first ``w`` slots,
an upper-triangular block) and ``xi_b .. xi_{b+w-1}`` (the last ``w``, lower-triangular).

**The ring cut (several epochs).** With reused slots the Gram is cyclic: the last ``w`` slots of an
epoch share rows with the first ``w`` of the next, so ``G`` has corners ``R = G[b-w:, :w]``, which a
moving average in slot order cannot carry. Lemma P of :mod:`.markov_fit` (``Cov(Y') - G = P + N``,
``P`` positive semidefinite, ``N >= 0`` entrywise) takes them off with a rank-one ``P = p p^T``,
``p = (v`` on the first ``w`` slots, ``-u`` on the last ``w``, 0 elsewhere``)``: its corner entries are
``-u_i v_j``, so ``N`` is non-negative there as soon as ``u_i v_j >= R_ij`` (:func:`_cover`: the
smallest ``|u|^2 + |v|^2`` by alternating maxima, then balanced), and it asks ``v v^T`` more of the
first slots' covariance and ``u u^T`` of the last ones' -- which the boundary blocks supply (their
Gram is the stationary one plus ``v v^T``, resp. ``u u^T``: a triangular Cholesky factor, used when it
is non-negative, else the stationary block with ``v`` (``u``) added to the innovation all of the
boundary slots share, whose Gram is entrywise larger). Measured (Monte Carlo of the surrogates' own
pairs, bsr(256, 4) over 4 reused epochs of 64 slots, sigma 3): the exact pair without its corners
0.998x the exact pair, the cyclic moving average 1.002x, this cut 1.020x; the best one-dimensional
chain 1.103x.

Soundness of the surrogate: ``D = Cov(Y') - G - p p^T`` is checked ``>= 0`` entrywise in floats
(:func:`_dominates`; a margin of ``4 (w + 4) u`` times the magnitudes covers the products), so
Lemma P applies with ``N = D`` (``G`` enters rounded up). The program runs at noise ``sigma`` with
the loadings ``A / sigma`` rounded *up* (a surrogate with entrywise larger loadings has an entrywise
larger covariance: Lemma K).

**The program (call; remove direction).** ``V_s(d, u) = E[(u + X_s + ... + X_{b-1})_+ | d]`` with
``d = (xi_s, .., xi_{s+w-1})``: ``V_b = u_+`` and ``V_s(d, u) = E_xi V_{s+1}((xi_{s+1}, .., xi), u +
e^{sum_j A_{s,j} d_j + A_{s,w} xi - c_s})``, ``c_s = Var(Y'_s)/2`` (rounded down: the summands only
grow), and the call ``E(T - K)_+ = E V_0(d_0, -K)``. Its discretization:

- *The innovations' law.* ``g(xi) = (T - K)_+`` is convex in every ``xi_t`` (a convex
  non-decreasing function of a sum of exponentials of linear forms with non-negative coefficients),
  so replacing the independent ``xi_t`` one at a time by laws that dominate them in convex order
  only raises ``E g``. With nodes ``x_0 < .. < x_{m-1}`` (the call's on ``[-2.5, L]``): on
  ``A = {every xi_t <= L}`` the mass below ``x_0`` is moved up to it (``g`` is non-decreasing) and
  each cell's mass goes to its two ends with its mean kept (``g`` is convex); the rest is charged:
  ``E[g; xi_t > L] <= E[T_t; xi_t > L] + Phi(-L) E g`` (``T_t`` the slots loading on ``xi_t``, and
  ``(T - K)_+ <= T_t + (T - T_t - K)_+`` with the last term independent of ``xi_t`` and at most
  ``g``), ``E[X_s; xi_t > L] = Phi(A_{s,t} - L)``, so ``E g <= (E~ g + sum_{s,t} Phi(A_{s,t} - L)) /
  (1 - (b + w) Phi(-L))``. On the discrete law the program is *exact in the state*: the next
  state is the current one shifted, every innovation on a node.
- *The partial sum.* ``V_{s+1}`` is convex and non-decreasing in ``u``: it is read by linear
  interpolation between upper bounds at nodes, at positions rounded up; at ``u' >= 0`` it is
  ``u' + R_{s+1}(d)`` with ``R_s(d) = E[X_s + .. + X_{b-1} | d]`` under the discrete law (closed
  form), and ``V~_s = min(V~_s, R_s)`` (both are upper bounds).

**The put (add direction).** ``W_s(d, u) = E[(-u - X_s - .. - X_{b-1})_+ | d]`` is convex in
``eta_t = e^{kappa xi_t}`` for each ``t`` (``kappa`` the largest loading: each ``e^{A xi} =
eta^{A / kappa}`` is concave) and non-increasing: ``eta``'s law is spread onto ``e^{kappa x_k}`` with
``E[eta; cell]`` kept, the mass above the top node put at it, the mass below the bottom node
charged with the strike (a put is at most ``K``: ``(b + w) Phi(x_0) K``); the nodes mirror the
call's; summands and positions rounded down, ``W = 0`` at ``u' >= 0``, ``W~ = min(W~, (-u)_+)``.

Every node value is a non-negative combination (each step multiplies by ``1 + 4 (m + 16) u`` and adds
``1e-290``); the closed forms and charges are rounded up. Then, as in :mod:`.markov_fit`,
``delta_R(eps) <= C~(b e^eps) / b`` and ``delta_A(eps) <= e^eps P~(b e^-eps) / b``.

**Cost and accuracy.** ``m^w`` states times ``m`` new nodes times ``n_u`` partial sums per slot:
``w = 3`` with ``m = 20`` and ``n_u = 400`` is ~4 x 10^9 stencil updates for 64 slots, a few seconds
on two cores; offered for bands ``w <= MAX_ORDER`` and ``b <= MAX_SLOTS``. The grid's error is the
cells' added variance (about ``h^2 / 6`` per innovation), so the nodes are dense where the tilted
innovations that set delta fall (``x`` ~ 0.5-3 for the call): measured on bsr(256, 4) over 4 reused
epochs at sigma 3 (its surrogate 1.020x the exact pair), with the nodes on ``[-2.5, 6]`` dense about
their middle, ``m`` = 16 / 20 / 24 gave 1.082x / 1.062x / 1.053x, and the final grid (dense about
``1.2`` times the loadings' largest row sum) 1.052x at ``m = 20``; a symmetric grid on ``[-7.5, 7.5]``
1.20x / 1.13x at ``m`` = 16 / 20. At larger loadings over sigma the cells cost more (4 reused epochs
at sigma 2: 1.13x, where the anchored ring of :mod:`.markov_fit` is 1.096x): the accountant keeps both.

**Raised ends (fresh slots).** Step 1 of :mod:`.fresh_correlated` raises an epoch's diagonal at its
first and last ``w`` positions. The stationary lags are taken from the pairs not both inside one
boundary block (the diagonal from the interior only), and a block's excess over the stationary
block is covered by a positive-semidefinite ``D`` (its positive off-diagonal part plus a diagonal of
row sums and the positive diagonal) added to the block's own Gram: the covariance is then entrywise
above the Gram (Lemma K; several epochs' Grams at once through their entrywise maximum).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy import special

from dpmf.accounting.allocation.surrogates.quadrature import mp_spread, spread_on
from dpmf.numerics import UNIT_ROUNDOFF
from dpmf.resources import available_cpus, on_threads

__all__ = ["MAX_ORDER", "MAX_SLOTS", "MovingAverageSurrogate", "fit_moving_average", "call_bound_table",
           "put_bound_table"]

#: The largest moving-average order (band width ``w = p - 1``) the program runs: its state has
#: ``m^w`` nodes.
MAX_ORDER = 3
#: Above this many slots the member is not offered (time is linear in ``b``).
MAX_SLOTS = 256
#: Nodes per innovation by order (``m^w`` states: 8000 at ``w = 3``).
_NODES = {1: 96, 2: 40, 3: 20}
#: Partial-sum nodes.
_U_NODES = 400
#: The call's nodes: from ``-_LOW`` (the mass below is moved up to it) to the top ``L`` whose charge is
#: about ``_CHARGE`` of ``b delta``, sinh-stretched (``_STRETCH``) about ``_CENTER`` times the largest
#: row sum of the loadings over sigma (where the tilted innovations that set delta fall; measured on
#: bsr(64, 4) and bsr(256, 4) over 4 epochs at sigma 2-4, the best centre within 1%). The put's mirror
#: them about 0 (measured: denser at 0 is the best for the put).
_LOW, _CHARGE, _STRETCH, _CENTER = 2.5, 1e-2, 2.0, 1.2


@dataclass(frozen=True)
class MovingAverageSurrogate:
    """The surrogate of the module docstring in Gram units (``sigma = 1``): ``rows[s][j]`` is slot
    ``s``'s loading on ``xi_{s+j}`` (``j = 0..w``); ``cut`` the ring cut ``(u, v)`` or ``None`` (tuples:
    equal surrogates compare and hash equal, so the accountant's memo recognizes them)."""

    #: (the band's kernels are parallel themselves: callers run its tables in turn)
    parallel_tables: ClassVar[bool] = True

    rows: tuple
    cut: tuple | None = None

    @property
    def loadings(self) -> np.ndarray:
        return np.array(self.rows, dtype=np.float64)

    @property
    def order(self) -> int:
        return len(self.rows[0]) - 1

    def describe(self) -> str:
        ring = "; the ring cut at its ends" if self.cut is not None else ""
        return f"moving average (MA({self.order}), the band's own structure{ring})"

    def variances(self, n: int) -> np.ndarray:
        """``Var(Y'_s)`` at the ``n`` slots (Gram units)."""
        return (self.loadings**2).sum(axis=1)[:n]

    def covariance(self) -> np.ndarray:
        """``Cov(Y')`` (floats) from the loadings as a linear map of ``xi_0 .. xi_{b+w-1}``."""
        lin = _linear_map(self.loadings)
        return lin @ lin.T

    def table(self, sigma: float, n: int, kind: str, k_max: float, delta: float, **grid):
        """The call or put bound table (:func:`call_bound_table`, :func:`put_bound_table`); ``grid``
        keys of the chain programs that do not apply here are ignored."""
        if n != len(self.rows):
            raise ValueError(f"the surrogate has {len(self.rows)} slots, not {n}")
        fn = call_bound_table if kind == "call" else put_bound_table
        return fn(self, sigma, k_max, delta, u_nodes=grid.get("u_nodes", _U_NODES))


def _linear_map(loadings: np.ndarray) -> np.ndarray:
    b, p = loadings.shape
    out = np.zeros((b, b + p - 1))
    for j in range(p):
        out[np.arange(b), np.arange(b) + j] = loadings[:, j]
    return out


def _autocov(a: np.ndarray, lag: int) -> float:
    """``sum_j a_j a_{j+lag}``: the lag's covariance of a moving average with coefficients ``a``."""
    return float(a[: a.size - lag] @ a[lag:]) if lag < a.size else 0.0


def _band(gram: np.ndarray) -> tuple[int, int] | None:
    """``(w, corner width)``: the largest distance ``<= b/2`` at which ``gram`` has a positive entry,
    and the largest cyclic distance of a positive entry more than ``b/2`` apart; ``None`` if the
    corners reach beyond ``w`` (not a cyclic band)."""
    b = gram.shape[0]
    d = np.abs(np.subtract.outer(np.arange(b), np.arange(b)))
    pos = gram > 0
    w = int(d[pos & (d <= b // 2)].max(initial=0))
    wrap = b - d
    cw = int(wrap[pos & (d > b // 2)].max(initial=0))
    if cw > w:
        return None
    return w, cw


def _spectral_factor(lags: np.ndarray) -> np.ndarray | None:
    """Non-negative ``a_0..a_w`` with ``sum_j a_j a_{j+L} = lags[L]`` (the minimum-phase factor, from the
    roots of ``sum_L lags[|L|] z^{L+w}`` outside the unit circle), or ``None``."""
    w = lags.size - 1
    if w == 0:
        return np.array([math.sqrt(lags[0])])
    roots = np.roots(np.concatenate([lags[::-1], lags[1:]]))
    out = roots[np.abs(roots) > 1 + 1e-9]
    if out.size != w:
        return None
    theta = np.real(np.poly(1.0 / out))  # prod (1 - z / r): coefficients of z^0 .. z^w after reversal
    theta = theta / theta[0]
    acov = np.array([_autocov(theta, L) for L in range(w + 1)])
    a = theta * math.sqrt(lags[0] / acov[0])
    check = np.array([_autocov(a, L) for L in range(w + 1)])
    if np.any(a < 0) or not np.allclose(check, lags, rtol=1e-9, atol=1e-12 * lags[0]):
        return None
    return a


def _cover(corners: np.ndarray, rounds: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative ``u, v`` with ``u_i v_j >= corners[i, j]`` and small ``|u|^2 + |v|^2`` (alternating
    maxima from ``v = sqrt(column maxima)``, then the balance ``|u| = |v|``; any cover is sound)."""
    r = np.maximum(corners, 0.0)
    v = np.sqrt(r.max(axis=0))
    u = np.zeros(r.shape[0])
    for _ in range(rounds):
        u = np.divide(r, v[None, :], out=np.zeros_like(r), where=v[None, :] > 0).max(axis=1)
        v = np.divide(r, u[:, None], out=np.zeros_like(r), where=u[:, None] > 0).max(axis=0)
        if u @ u > 0 and v @ v > 0:
            lam = math.sqrt(math.sqrt(float(v @ v) / float(u @ u)))
            u, v = u * lam, v / lam
    return u * (1 + 1e-9), v * (1 + 1e-9)


def _boundary_block(base: np.ndarray, extra: np.ndarray, raise_: np.ndarray, upper: bool) -> np.ndarray | None:
    """A non-negative triangular ``F`` with ``F F^T = base base^T + extra extra^T + raise_`` (its
    Cholesky factor; upper-triangular via the reversed order), or ``None`` if it has a negative entry."""
    target = base @ base.T + np.outer(extra, extra) + raise_
    try:
        f = np.linalg.cholesky(target[::-1, ::-1])[::-1, ::-1] if upper else np.linalg.cholesky(target)
    except np.linalg.LinAlgError:
        return None
    return f if np.all(f >= 0) else None


def _dominates(sur: MovingAverageSurrogate, gram: np.ndarray) -> bool:
    """``Cov(Y') - G - p p^T >= 0`` entrywise in floats, with a margin for the products' rounding."""
    w = sur.order
    b = gram.shape[0]
    p = np.zeros(b)
    if sur.cut is not None:
        u, v = (np.array(x) for x in sur.cut)
        p[:w], p[b - w:] = v, -u
    cov = sur.covariance()
    pp = np.outer(p, p)
    d = cov - gram - pp
    tol = 4 * (w + 4) * UNIT_ROUNDOFF * (np.abs(cov) + np.abs(gram) + np.abs(pp))
    return bool(np.all(d >= tol))


def _excess_cover(excess: np.ndarray, scale: float) -> np.ndarray:
    """A positive-semidefinite ``D >= excess_+`` entrywise: the positive off-diagonal part plus a
    diagonal of its row sums and the positive diagonal (diagonally dominant), with a margin of
    ``1e-9`` (relative, and ``1e-9 scale`` on the diagonal of a block with any excess) for the float
    check."""
    e = np.maximum(excess, 0.0)
    if not np.any(e > 0):
        return np.zeros_like(e)
    off = e - np.diag(np.diag(e))
    return (off + np.diag(np.diag(e) + off.sum(axis=1))) * (1 + 1e-9) + 1e-9 * scale * np.eye(e.shape[0])


def fit_moving_average(gram) -> MovingAverageSurrogate | None:
    """The surrogate of the module docstring for a (rounded-up) Gram -- or several of one size (their
    entrywise maximum: it dominates each, Lemma K) -- of a band of order ``w <= MAX_ORDER`` (cyclic
    corners allowed), or ``None``: not a band, a spectral factor with a negative coefficient, a
    boundary block without a non-negative factor, too many slots, or the float check fails.

    The stationary lags are the largest at each distance over the pairs not both among the first or
    both among the last ``w`` slots (the interior's diagonal only); what the first (last) ``w`` slots'
    block of the Gram has above the stationary block -- a raised diagonal, as fresh slots' step 1
    leaves at an epoch's ends (:mod:`.fresh_correlated`) -- is covered by a PSD ``D >=`` that excess
    added to the boundary block's own Gram (with the ring cut's ``v v^T``, ``u u^T``)."""
    grams = [np.asarray(g, dtype=np.float64) for g in (gram if isinstance(gram, (list, tuple)) else [gram])]
    g = grams[0] if len(grams) == 1 else np.maximum.reduce(grams)
    b = g.shape[0]
    band = _band(g)
    if band is None or b > MAX_SLOTS:
        return None
    w, cw = band
    if not 1 <= w <= MAX_ORDER or b < 2 * w or (cw and b < 2 * w + 2):  # (the boundary blocks apart)
        return None
    i, j = np.meshgrid(np.arange(b), np.arange(b), indexing="ij")
    d = np.abs(i - j)
    inner = ~(((i < w) & (j < w)) | ((i >= b - w) & (j >= b - w)))
    diag = np.diag(g)[w:b - w] if b > 2 * w else np.diag(g)  # (no interior: the smallest, the rest in the blocks)
    lags = np.array([float(g[(d == L) & inner].max()) if L else float(diag.max() if b > 2 * w else diag.min())
                     for L in range(w + 1)])
    a = _spectral_factor(lags)
    if a is None:
        return None
    a = a * (1 + 1e-9)
    stationary = np.array([[_autocov(a, abs(x - y)) for y in range(w)] for x in range(w)])
    u = v = np.zeros(w)
    cut = None
    if cw:
        u, v = _cover(g[b - w:, :w])
        cut = (tuple(map(float, u)), tuple(map(float, v)))
    t = np.arange(w)
    start = np.where(t[None, :] >= t[:, None], a[np.clip(t[None, :] - t[:, None], 0, w)], 0.0)  # [i, t] = a[t - i]
    end = np.where(t[None, :] <= t[:, None], a[np.clip(w - t[:, None] + t[None, :], 0, w)], 0.0)  # [i, t] = a[w - i + t]
    s_blk = _boundary_block(start, v, _excess_cover(g[:w, :w] - stationary, lags[0]), upper=True)
    e_blk = _boundary_block(end, u, _excess_cover(g[b - w:, b - w:] - stationary, lags[0]), upper=False)
    if s_blk is None or e_blk is None:
        return None
    A = np.tile(a, (b, 1))
    for x in range(w):
        for y in range(w):
            if y >= x:
                A[x, y - x] = s_blk[x, y]
            if y <= x:
                A[b - w + x, w - x + y] = e_blk[x, y]
    sur = MovingAverageSurrogate(tuple(tuple(map(float, r)) for r in A), cut)
    return sur if _dominates(sur, g) else None


def _nodes(kind: str, m: int, top: float, center: float) -> np.ndarray:
    """The call's nodes on ``[-_LOW, top]``, sinh-stretched about ``center`` (denser there), or the
    put's mirror image (any nodes are sound; they only set the error)."""
    t = np.linspace(-1.0, 1.0, m)
    center = min(max(center, 0.0), top - 1.0)
    x = center + np.where(t < 0, center + _LOW, top - center) * np.sinh(_STRETCH * t) / math.sinh(_STRETCH)
    x[0], x[-1] = -_LOW, top
    return x if kind == "call" else -x[::-1]


def _top(loads: np.ndarray, b: int, delta: float) -> float:
    """``L`` with the call's tail charge ``sum_{s,t} Phi(A_{s,t} - L)`` about ``_CHARGE b delta``
    (any ``L`` is sound)."""
    count = loads.size
    z = -float(special.ndtri(min(0.5, _CHARGE * b * delta / count)))
    return min(9.0, max(4.0, float(loads.max()) + z))


def _digits(m: int, w: int) -> np.ndarray:
    """``[state, j]``: the node index of ``xi_{s+j}`` in the flattened state (``j = 0`` the oldest)."""
    idx = np.arange(m**w)
    return np.stack([(idx // m ** (w - 1 - j)) % m for j in range(w)], axis=1)


def _remaining_means(a: np.ndarray, c: np.ndarray, xs: np.ndarray, ps: np.ndarray, digits: np.ndarray) -> np.ndarray:
    """``[s, state]``: ``R_s = E[X_s + .. + X_{b-1} | xi_s..xi_{s+w-1} = state]`` under the discrete law
    (rounded up), for ``s = 0..b``."""
    b, p = a.shape
    w = p - 1
    mgf = np.exp(a[..., None] * xs[None, None, :]) @ ps  # [t, j]: E e^{a xi} on the discrete law
    logm = np.log(np.maximum(mgf, 1e-300))
    free = np.exp(logm.sum(axis=1) - c)  # E X_t with no innovation known
    tail = np.concatenate([np.cumsum(free[::-1])[::-1], [0.0]])  # sum_{t >= s}
    out = np.empty((b + 1, digits.shape[0]))
    for s in range(b + 1):
        r = np.full(digits.shape[0], tail[min(s + w, b)])
        for t in range(s, min(s + w, b)):
            lg = np.full(digits.shape[0], -c[t])
            for j in range(p):
                k = t + j - s
                lg = lg + (a[t, j] * xs[digits[:, k]] if k < w else logm[t, j])
            r = r + np.exp(lg)
        out[s] = r * (1 + 1e-12)
    return out


def _on_threads(kernel, args, groups: int) -> np.ndarray:
    """One step of the program (``kernel(*args, out, first, stride)``, :mod:`._moving_average_compiled`):
    its ``groups`` groups of states interleaved over the CPUs, on threads (a waiting thread sleeps: the
    OpenMP team these kernels had spun on a loaded machine, ~1.4x the CPU time); every row is the same
    on any number of threads."""
    out = np.empty_like(args[0])
    stride = max(1, min(available_cpus(), groups))
    on_threads(lambda first: kernel(*args, out, first, stride), range(stride))
    return out


def _program(sur: MovingAverageSurrogate, sigma: float, k_max: float, delta: float, kind: str, u_nodes: int):
    from dpmf.accounting.allocation.surrogates._moving_average_compiled import call_step, put_step  # (numba loads here)

    b, p = sur.loadings.shape
    w = p - 1
    m = _NODES[w]
    a = sur.loadings / sigma * (1 + 4 * UNIT_ROUNDOFF)
    c = 0.5 * (a * a).sum(axis=1)
    c = c * (1 - 8 * UNIT_ROUNDOFF) if kind == "call" else c * (1 + 8 * UNIT_ROUNDOFF)
    top = _top(a, b, delta)
    xs = _nodes(kind, m, top, _CENTER * float(a.sum(axis=1).max()) if kind == "call" else 0.0)
    if kind == "call":
        xs, ps = spread_on(tuple(float(x) for x in xs))
    else:
        ps = mp_spread(xs, float(a.max()) * (1 + 4 * UNIT_ROUNDOFF))
    h = k_max / (u_nodes - 1)
    factor = 1 + 4 * (m + 16) * UNIT_ROUNDOFF
    digits = _digits(m, w)
    u = (np.arange(u_nodes) - (u_nodes - 1)) * h
    if kind == "call":
        R = _remaining_means(a, c, xs, ps, digits)
        V = np.zeros((m**w, u_nodes))
        for s in range(b - 1, -1, -1):
            V = _on_threads(call_step, (V, R[s + 1], R[s], xs, ps, a[s], c[s], h, m, w, factor), m ** (w - 1))
    else:
        V = np.broadcast_to(-u * (1 + 2 * UNIT_ROUNDOFF), (m**w, u_nodes)).copy()  # W_b = (-u)_+
        for s in range(b - 1, -1, -1):
            V = _on_threads(put_step, (V, xs, ps, a[s], c[s], h, m, w, factor), m ** (w - 1))
    weights = np.prod(ps[digits], axis=1)
    vals = (weights @ V) * (1 + 4 * (w + m**w) * UNIT_ROUNDOFF)
    vals = np.where(np.isnan(vals), np.inf, vals)  # (an overflow is never read as a small bound)
    strikes = -u[::-1].copy()
    vals = vals[::-1].copy()
    if kind == "call":
        charge = float(np.sum(special.ndtr(a - xs[-1])))
        tail = (b + w) * float(special.ndtr(-xs[-1]))
        return strikes, np.maximum.accumulate(((vals + charge * (1 + 1e-9)) / (1 - tail * (1 + 1e-9)))[::-1])[::-1]
    charge = (b + w) * float(special.ndtr(xs[0])) * (1 + 1e-9)
    return strikes, vals + charge * strikes * (1 + 2 * UNIT_ROUNDOFF) + 1e-290


def call_bound_table(sur: MovingAverageSurrogate, sigma: float, k_max: float, delta: float, *, u_nodes: int = _U_NODES):
    """Strikes ``K_l = l h`` (``0 .. k_max``) and upper bounds ``C~(K_l) >= E(T' - K_l)_+`` for the
    surrogate at noise ``sigma`` (module docstring); ``delta`` only places the top node."""
    return _program(sur, sigma, k_max, delta, "call", u_nodes)


def put_bound_table(sur: MovingAverageSurrogate, sigma: float, k_max: float, delta: float, *, u_nodes: int = _U_NODES):
    """Strikes and upper bounds ``P~(K_l) >= E(K_l - T')_+`` (module docstring)."""
    return _program(sur, sigma, k_max, delta, "put", u_nodes)
