r"""Correlated ``C`` under random allocation: a Markov surrogate that keeps the correlation.

dpmf's own argument (not from the papers). The pair is Lemma 2.8 of Schuchardt & Kalinin
(arXiv 2601.21636; digest ``notes/random-allocation.md`` §2.4): remove ``P = (1/b) sum_i
N(m_i, sigma^2 I)``, ``Q = N(0, sigma^2 I)`` (add: swapped). With ``x ~ Q`` the likelihood ratio is

    S = (1/b) T,   T = sum_i X_i,   X_i = exp(Y_i - G_ii / (2 sigma^2)),   Y ~ N(0, G / sigma^2),

``G = M M^T`` the ``b x b`` Gram matrix of the means, and both hockey-stick divergences are
expectations of convex functions of ``S`` (:mod:`.correlated`). The spectral groups of
:mod:`.correlated` make the slots *independent* and pay the correlation as variance; here the
correlation is kept: ``Y`` is replaced by a Gaussian vector ``Y'`` whose covariance is *entrywise*
larger and whose law is a one-dimensional Markov chain, and the law of the resulting sum is
bounded by a dynamic program over (chain state, partial sum) whose every discretization step is an
upper bound. :mod:`.correlated` offers it on the residue classes modulo ``q = 1..4`` (Jensen's
inequality over the classes, its Theorem: ``E f(S) <= sum_r (n_r / b) E f(S_r)``; one chain
dominating every class's Gram), each direction taking the smallest epsilon over all members.

The proofs (Lemma K: Kahane's convexity inequality; Lemma P: a positive-semidefinite part), the
chain, its edges, the shared factor and anchored ring, the call and put programs, the
floating-point argument and the measured accuracy and cost are in the design note
``docs/notes/allocation-surrogates.md`` ("module docstring" below means that note). The surrogate
implements :class:`~dpmf.accounting.allocation.surrogates.protocol.Surrogate`; quadrature (node placement,
convex-order spreading) is :mod:`~dpmf.accounting.allocation.surrogates.quadrature`; the compiled loops are
:mod:`._markov_compiled`. Above :data:`~.markov_chain.MAX_SLOTS` slots the members are skipped.

The Markov surrogate is four modules: :mod:`.markov_chain` (the chain, :class:`MarkovSurrogate`),
this one (fitting a chain to a Gram and certifying its domination, Lemmas K and P), :mod:`.markov_ring`
(the rings on cyclic Grams and the family ranked by :func:`~.markov_ring.pick`) and
:mod:`.markov_programs` (the call and put programs, their threads and the epsilon search).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dpmf.accounting.allocation.surrogates.markov_chain import MarkovSurrogate, added_covariance, toeplitz
from dpmf.numerics import UNIT_ROUNDOFF

__all__ = [
    "slot_order",
    "lag_maxima",
    "class_grams",
    "solve",
    "psd_deficit",
    "surrogate_proxy",
    "psd_member",
    "chain_covariance",
    "deficit",
    "fit_surrogate",
    "wrap_mask",
]

#: The certified PSD test's relative tolerance (:func:`psd_deficit`).
_EIG_TOL = 1e-10
#: The PSD fit ranks its candidates by the second moment at noise ``s^2 = this * max G_ii``.
_PSD_SCALE = 4.0


def slot_order(b: int, kind: str) -> np.ndarray:
    if kind == "natural":
        return np.arange(b)
    lo, hi = np.arange(b // 2 + b % 2), np.arange(b - 1, b // 2 + b % 2 - 1, -1)
    out = np.empty(b, dtype=int)
    out[0::2], out[1::2] = lo, hi
    return out


def lag_maxima(gram: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``max_pos G[order[pos], order[pos + L]]`` for ``L = 0..b-1`` (the entrywise targets)."""
    g = np.asarray(gram, dtype=np.float64)[np.ix_(order, order)]
    return np.array([float(np.diagonal(g, L).max()) for L in range(g.shape[0])])


def class_grams(gram: np.ndarray, q: int) -> tuple[list[np.ndarray], list[tuple[int, float]]]:
    """The Gram matrices of the residue classes ``{i = r mod q}`` and the parts ``(size, weight)``
    (``weight = n_r / b`` summed over the classes of one size) of the Jensen step
    ``E f(S) <= sum_r (n_r / b) E f(S_r)`` (:mod:`.correlated`, Theorem)."""
    b = gram.shape[0]
    grams, sizes = [], {}
    for r in range(q):
        idx = np.arange(r, b, q)
        grams.append(gram[np.ix_(idx, idx)])
        sizes[idx.size] = sizes.get(idx.size, 0) + idx.size
    return grams, sorted((n, c / b) for n, c in sizes.items())


def solve(gamma0: float, g1: float, rho: float, root: int = 0) -> tuple[float, float, float]:
    """``alpha, beta >= 0`` with ``alpha^2 + beta^2 = gamma0`` and ``alpha^2 rho + alpha beta s = g1``.
    Where two solutions exist (``g1 >= gamma0 rho``) ``root = 1`` is the one with the smaller ``alpha``
    (the same stationary covariance; with :attr:`MarkovSurrogate.edges` it adds less covariance)."""
    s = math.sqrt(max(1.0 - rho * rho, 0.0)) * (1 + 4 * UNIT_ROUNDOFF)
    phi = math.atan2(s, rho)  # f(theta) = rho/2 + cos(2 theta - phi)/2, max (1 + rho)/2 at theta = phi/2
    target = min(max(2 * g1 / gamma0 - rho, -1.0), 1.0)
    theta = 0.5 * (phi - math.acos(target)) if g1 >= gamma0 * rho and not root else 0.5 * (phi + math.acos(target))
    theta = min(max(theta, 0.0), math.pi / 2)
    r = math.sqrt(gamma0)
    return r * math.cos(theta), r * math.sin(theta), s


def psd_deficit(excess: np.ndarray, scale: float, keep: int | None = None) -> float:
    """The smallest ``t >= 0`` (rounded up) with ``excess + t I = P + N``, ``P`` positive semidefinite
    and ``N >= 0`` entrywise, where ``N`` is the positive part of ``excess`` at the pairs more than
    ``keep`` positions apart (``keep=None``: ``N = 0``) -- Lemma P of the module docstring.

    ``excess`` is a float ``Cov' - G``; ``scale >= ||Cov'||_F + ||G||_F`` bounds the subtraction's
    rounding (``u`` times that, in the 2-norm). The smallest eigenvalue of the kept part is computed by
    LAPACK (backward stable: off by at most ``p(n) u ||.||_2``, ``p`` a low-degree polynomial) and
    ``t`` carries a tolerance ``1e-10 n (||excess||_F + scale)``, above both errors by orders of
    magnitude for the sizes here (``n <= 256``: ``n^2 u < 1e-11``).

    >>> import numpy as np
    >>> psd_deficit(np.array([[1.0, -0.5], [-0.5, 1.0]]), 4.0)   # PSD already
    0.0
    >>> round(psd_deficit(np.array([[0.0, -1.0], [-1.0, 0.0]]), 4.0), 6)   # needs the diagonal raised by 1
    1.0
    """
    a = np.array(excess, dtype=np.float64)
    n = a.shape[0]
    if keep is not None:
        a[(np.abs(np.subtract.outer(np.arange(n), np.arange(n))) > keep) & (a > 0)] = 0.0
    lam = float(np.linalg.eigvalsh(a)[0])
    tol = _EIG_TOL * n * (float(np.linalg.norm(a)) + scale)
    return max(0.0, tol - lam)


def _proxy_scale(grams) -> float:
    """``s^2 = _PSD_SCALE * max G_ii``: the noise at which the second-moment proxies are taken."""
    return _PSD_SCALE * max(float(np.max(np.diag(g))) for g in grams)


def _second_moment(covs, scale_sq: float) -> float:
    """``mean_r mean_ij (e^{Cov_ij / s^2} - 1)`` over the covariance matrices ``covs``: the second
    moment of a surrogate's sum at noise ``s`` (``s^2 = scale_sq``), the ranking of candidates (any
    candidate is sound; an overflow ranks it last). The means are ``np.mean``'s own operations (one
    ``add.reduce`` over all entries, divided by the count), without its per-call checks: the PSD fit
    takes ~3,800 of them per README snippet (bit for bit: ``test_fit_helpers_are_numpys_bit_for_bit``)."""
    with np.errstate(over="ignore"):
        means = [_mean(np.expm1(c / scale_sq)) for c in covs]
        return float(_mean(np.array(means)))


def _mean(x: np.ndarray):
    """``x.mean()`` of a float64 array: ``add.reduce`` over every axis, then divided by the count."""
    return np.add.reduce(x, axis=None) / x.size


def _frobenius(x: np.ndarray) -> float:
    """``float(np.linalg.norm(x))`` of a real array: its own operations (``sqrt`` of the raveled array's
    ``dot`` with itself) without its checks (bit for bit)."""
    r = x.ravel(order="K")
    return float(np.sqrt(r.dot(r)))


def surrogate_proxy(sur: MarkovSurrogate, grams) -> float:
    """The second-moment proxy of a fitted surrogate's whole covariance (lower bounds) over ``grams``'
    sizes at :func:`_proxy_scale` (to compare the members of one period)."""
    return _second_moment([_cov_lower(sur, g.shape[0]) for g in grams], _proxy_scale(grams))


def psd_member(fit, grams):
    """``fit(domination)`` for ``"entrywise"`` and ``"psd"``: both surrogates, the PSD one ``None``
    unless its :func:`surrogate_proxy` is smaller (a moving average on the classes: the same chain)."""
    ent, psd = fit("entrywise"), fit("psd")
    if ent is not None and psd is not None and surrogate_proxy(psd, grams) >= surrogate_proxy(ent, grams) * (1 - 1e-3):
        psd = None
    return ent, psd


def chain_covariance(sur: MarkovSurrogate, n: int) -> np.ndarray:
    """The chain's covariance over ``n`` positions (Gram units, floats; without a ring) from its
    definition as a linear map of ``(Z_0, xi_1, .., xi_n)``: with raised loadings ``beta_i`` it carries
    their forward covariance ``alpha (beta_i - beta) s rho^{j-i-1}`` (for ranking candidates; the
    soundness checks use the lower bounds of :meth:`MarkovSurrogate.covariance`)."""
    a = np.zeros((n, n + 1))
    z = np.zeros(n + 1)
    z[0] = 1.0
    betas = sur.betas(n)
    for i in range(n):
        if i:
            z = sur.rho * z
            z[i] += sur.s
        a[i] = sur.alpha * z
        a[i, i + 1] += betas[i]
    return a @ a.T


def _cov_lower(sur: MarkovSurrogate, n: int) -> np.ndarray:
    """Lower bounds on the float surrogate's whole covariance over ``n`` positions (Gram units)."""
    return sur.covariance(n) + added_covariance(sur, n)


def deficit(sur: MarkovSurrogate, grams, keeps) -> float:
    """The largest over ``grams`` (in chain order) of the smallest :func:`psd_deficit` over ``keeps``;
    0 where the covariance is entrywise above the Gram (Lemma K alone)."""
    worst = 0.0
    for g in grams:
        cov = _cov_lower(sur, g.shape[0])
        if np.all(cov >= g * (1 + 1e-10)):
            continue
        scale = float(np.linalg.norm(cov) + np.linalg.norm(g))
        worst = max(worst, min(psd_deficit(cov - g, scale, k) for k in keeps))
    return worst


def _chain_lags(gamma0: float, g1: float, rho: float, count: int) -> np.ndarray:
    out = np.empty(count)
    out[0] = gamma0
    out[1:] = g1 * rho ** np.arange(count - 1)
    return out


def _psd_fit(grams, tgt, kind: str, rhos, scale_sq: float):
    """The PSD-dominating chain of ``grams`` (chain order) with the smallest :func:`_second_moment`:
    ``(rho, g_1)`` on a grid (``g_1`` around the largest lag-1 entry) and then a finer one around the
    best, each ``gamma_0`` the smallest making ``chain - G`` positive semidefinite (Lemma P, ``N = 0``);
    ``None`` without lag-1 correlation."""
    if tgt.size < 2 or tgt[1] <= 0:
        return None
    grams = _distinct(grams)  # (gamma_0 is a max over the Grams: equal ones need one eigenvalue each)
    b = max(g.shape[0] for g in grams)
    sizes = sorted({g.shape[0] for g in grams})
    norms = [float(np.linalg.norm(g)) for g in grams]

    def scored_all(cands):
        # per candidate (g1, rho): gamma_0 (the PSD deficit of each distinct Gram, psd_deficit's float
        # operations with the smallest eigenvalues of all candidates from one stacked call -- LAPACK's
        # per matrix, as one call each) and the second-moment proxy; the same floats as one at a time
        lags = [_chain_lags(max(tgt[0], 2 * g1 / (1 + rho)), g1, rho, b) for g1, rho in cands]
        d = [0.0] * len(cands)
        for g, ng in zip(grams, norms):
            n = g.shape[0]
            ts = np.stack([toeplitz(lg[:n], n) for lg in lags])
            excess = ts - g
            lam = np.linalg.eigvalsh(excess)[:, 0]
            for k in range(len(cands)):
                tol = _EIG_TOL * n * (_frobenius(excess[k]) + (_frobenius(ts[k]) + ng))
                d[k] = max(d[k], max(0.0, tol - float(lam[k])))
        out = []
        for (g1, rho), lg, dk in zip(cands, lags, d):
            g0 = (lg[0] + dk) * (1 + 1e-9)
            full = _chain_lags(g0, g1, rho, b)
            out.append((_second_moment([toeplitz(full[:n], n) for n in sizes], scale_sq), g0, g1, rho))
        return out

    best = min(scored_all([(tgt[1] * f, float(r)) for r in rhos[::3] for f in np.arange(0.6, 1.65, 0.1)]))
    _, _, g1c, rc = best
    fine = scored_all([(g1c * f, float(r)) for r in np.arange(max(rc - 0.04, 0.0), min(rc + 0.045, 0.96), 0.02)
                       for f in np.arange(0.95, 1.055, 0.025)])
    return min([best] + fine)


def _distinct(grams) -> list:
    """``grams`` without repeats (equal shape and entries), in their first order: the epochs of a
    banded C with fresh slots share their middle Grams (5 epochs of bsr(500, 4): 3 distinct)."""
    seen, out = set(), []
    for g in grams:
        key = (g.shape, g.tobytes())
        if key not in seen:
            seen.add(key)
            out.append(g)
    return out


def fit_surrogate(gram, *, rhos=None, orders=("natural", "zigzag"), edges: bool = False,
                  domination: str = "entrywise") -> MarkovSurrogate | None:
    """The chain (Gram units) dominating ``gram`` with the smallest proxy over ``rho`` in a grid and the
    two orders (module docstring). ``domination="entrywise"`` (Lemma K): ``g_1`` the smallest lag-1
    covariance whose geometric lags cover every lag, ranked by the spectral proxy
    ``gamma_0 + 2 g_1 / (1 - rho)``; ``"psd"`` (Lemma P): the chain whose covariance minus the Gram is
    positive semidefinite, ``g_1`` free and ``gamma_0`` raised until it is, ranked by the second-moment
    proxy :func:`_second_moment` at ``s^2 = 4 max G_ii``.
    ``gram`` (or a list of Gram matrices, dominated at once: the residue classes of
    :func:`class_grams`) must already be rounded up. ``None`` if no candidate passes the float check.

    ``edges``: also try, in natural order, a stationary variance ``gamma_0`` below the largest
    diagonal entry, the positions whose diagonal is larger covered by a larger innovation loading
    ``beta_i`` (:attr:`MarkovSurrogate.edges`; module docstring, *edges*) -- for Grams whose diagonal
    is raised at the ends only (fresh slots: :mod:`.fresh_correlated`); entrywise only, ranked by
    ``1^T Cov(Y') 1 / n`` with the mean variance over the positions."""
    if domination not in ("entrywise", "psd"):
        raise ValueError(f"domination must be 'entrywise' or 'psd', not {domination!r}")
    grams = [np.asarray(g, dtype=np.float64) for g in gram] if isinstance(gram, (list, tuple)) else [np.asarray(gram, dtype=np.float64)]
    b = max(g.shape[0] for g in grams)
    rhos = np.arange(0.0, 0.97, 0.02) if rhos is None else np.asarray(rhos, dtype=np.float64)
    scale_sq = _proxy_scale(grams)
    best = None
    for kind in orders:
        tgt = np.zeros(b)
        for g in grams:
            lm = lag_maxima(g, slot_order(g.shape[0], kind))
            tgt[: lm.size] = np.maximum(tgt[: lm.size], lm)
        pos = np.flatnonzero(tgt[1:] > 0) + 1
        diag = np.concatenate([np.diag(g) for g in grams])
        diag_by_size = {}  # n -> the largest diagonal over the Grams of n slots, per position
        for g in grams:
            n = g.shape[0]
            diag_by_size[n] = np.maximum(diag_by_size.get(n, 0.0), np.diag(g))
        floors = [tgt[0]]
        if edges and kind == "natural":
            floors += sorted({float(np.quantile(diag, f)) for f in (0.0, 0.25, 0.5, 0.75)} - {tgt[0]})
        if domination == "psd":
            chain_grams = [g[np.ix_(o, o)] for g in grams for o in (slot_order(g.shape[0], kind),)]
            for floor in [None] + floors[1:]:
                # with edges: G = G' + D, D_i = (G_ii - floor)_+; the chain is fitted PSD-above G' and
                # the raised loadings at the ends add D_i (and only non-negative covariances) on top
                base, t = chain_grams, tgt
                if floor is not None:
                    base = [g - np.diag(np.maximum(np.diag(g) - floor, 0.0)) for g in chain_grams]
                    t = np.concatenate([[floor], tgt[1:]])
                fit = _psd_fit(base, t, kind, rhos, scale_sq)
                for root in ((0,) if floor is None else (0, 1)):
                    cand = None if fit is None else _psd_surrogate(fit, kind, chain_grams, diag_by_size, floor, root)
                    if cand is not None and (best is None or cand.proxy < best.proxy):
                        best = cand
            continue
        for rho in rhos:
            rho = float(rho)
            with np.errstate(divide="ignore", over="ignore"):
                need = tgt[pos] / rho ** (pos - 1.0) if pos.size else np.zeros(1)
            g1 = float(np.max(need)) * (1 + 1e-9) if pos.size else 0.0
            if not math.isfinite(g1):
                continue
            for floor, root in [(f, r) for f in floors for r in ((0, 1) if f < tgt[0] else (0,))]:
                gamma0 = max(floor, 2 * g1 / (1 + rho)) * (1 + 1e-9)
                a, be, s = solve(gamma0, g1, rho, root)
                if a < 1e-3 * math.sqrt(gamma0):  # (the put program's grid e^{alpha z} would degenerate)
                    continue
                cand = MarkovSurrogate(a, be, rho, s, kind, gamma0 + 2 * g1 / (1 - rho))
                if gamma0 < tgt[0]:
                    cand = _with_edges(cand, diag_by_size, g1, rho)
                if cand is None or (best is not None and cand.proxy >= best.proxy):
                    continue
                if np.all(cand.lags(b)[1:] >= tgt[1:] * (1 + 1e-10)) and all(
                        np.all(cand.variances(n) >= d * (1 + 1e-10)) for n, d in diag_by_size.items()):
                    best = cand  # (1/sigma scaling later: 4u)
    return best


def _psd_surrogate(fit, kind: str, chain_grams, diag_by_size=None, floor=None, root: int = 0) -> MarkovSurrogate | None:
    """The float chain of a :func:`_psd_fit` result, ``gamma_0`` raised by what the float check of its
    own (lower-bound) covariance still finds (twice at most); ``None`` if it does not pass. With a
    ``floor`` (edges), the innovation loadings at the ends raise the variance at position ``i`` by
    ``(G_ii - floor)_+`` (``diag_by_size`` as in :func:`_with_edges`)."""
    proxy, gamma0, g1, rho = fit
    for _ in range(3):
        a, be, s = solve(gamma0, g1 * (1 + 1e-12), rho, root)
        if a < 1e-3 * math.sqrt(gamma0):
            return None
        cand = MarkovSurrogate(a, be, rho, s, kind, proxy, domination="psd")
        if floor is not None:
            target = {n: np.where(d > floor, gamma0 + d - floor, 0.0) for n, d in diag_by_size.items()}
            cand = _with_edges(cand, target, g1, rho)
            if cand is None:
                return None
            cand = dataclasses.replace(cand, proxy=_second_moment(
                [chain_covariance(cand, g.shape[0]) for g in chain_grams], _proxy_scale(chain_grams)))
        d = deficit(cand, chain_grams, (None,))
        if d == 0.0:
            return cand
        gamma0 = (gamma0 + d) * (1 + 1e-9)
    return None


def _with_edges(sur: MarkovSurrogate, diag_by_size: dict, g1: float, rho: float) -> MarkovSurrogate | None:
    """``sur`` with ``beta_i`` raised where ``alpha^2 + beta^2`` is below a Gram's diagonal (the
    ``j``-th position from the nearer end of each Gram; :attr:`MarkovSurrogate.edges`), and the proxy
    with the mean variance; ``None`` if the raised positions reach the middle of a Gram.
    ``diag_by_size``: per number of slots, the largest diagonal over those Grams, per position."""
    n_max = max(diag_by_size)
    half = (n_max + 1) // 2
    start, end = np.zeros(half), np.zeros(half)
    for n, diag in diag_by_size.items():
        d = diag * (1 + 1e-9)
        need = np.sqrt(np.maximum(d - sur.alpha * sur.alpha, 0.0)) * (1 + 1e-9)
        need[diag * (1 + 1e-10) <= (sur.alpha**2 + sur.beta**2) * (1 - 64 * UNIT_ROUNDOFF)] = 0.0  # (covered already)
        j = np.arange(n)
        front = j < n - 1 - j
        start[j[front]] = np.maximum(start[j[front]], need[front])
        end[(n - 1 - j)[~front]] = np.maximum(end[(n - 1 - j)[~front]], need[~front])
    start, end = (np.trim_zeros(np.where(e > sur.beta, e, 0.0), "b") for e in (start, end))
    if start.size + end.size >= n_max:
        return None
    cand = dataclasses.replace(sur, edges=(tuple(float(x) for x in start), tuple(float(x) for x in end)))
    # the proxy: the mean of 1^T Cov 1 / n -- the variances, the stationary lags, and what a raised
    # beta_i adds forward, alpha (beta_i - beta) s rho^{L-1} summed over the lags L >= 1 (twice)
    raised = cand.betas(n_max) - sur.beta
    extra = 2 * sur.alpha * sur.s * float(np.mean(raised)) / (1 - rho)
    var = np.mean(cand.variances(n_max))
    return dataclasses.replace(cand, proxy=float(var) + 2 * g1 / (1 - rho) + extra)


def wrap_mask(n: int) -> np.ndarray:
    """The pairs ``(i, j)`` of ``n`` slots more than ``n / 2`` apart (the corners of a cyclic Gram)."""
    d = np.abs(np.subtract.outer(np.arange(n), np.arange(n)))
    return 2 * d > n
