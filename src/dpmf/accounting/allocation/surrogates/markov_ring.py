"""The Markov surrogate on cyclic Grams: rings (a shared factor on both ends, or the last slots
anchored on the chain's first state), the mixed-split family of anchored rings and :func:`pick`, which
ranks a family's members by a coarse program.

Part of the Markov surrogate (:mod:`.markov_fit` has the argument; design note
``docs/notes/allocation-surrogates.md``, *the shared factor*, *the anchored ring*).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from dpmf.accounting.allocation.surrogates.markov_chain import MarkovSurrogate, added_covariance, toeplitz
from dpmf.accounting.allocation.surrogates.markov_fit import (
    deficit,
    fit_surrogate,
    lag_maxima,
    slot_order,
    solve,
    wrap_mask,
)
from dpmf.accounting.allocation.surrogates.markov_programs import markov_epsilon

__all__ = ["fit_ring_surrogate", "SurrogateFamily", "ring_family", "pick"]

#: The anchored-ring family (:func:`ring_family`): steps of ``rho`` around the fitted ring's, and
#: factors of the largest lag-1 entry for ``g_1``.
_FAMILY_RHO_STEPS = (-0.08, -0.04, 0.0, 0.04, 0.08)
_FAMILY_G1 = (0.9, 1.0, 1.1)
#: The coarse grid on which :func:`pick` ranks a family's members.
_RANK_GRID = {"u_nodes": 200, "z_nodes": 45, "xi_cells": 48, "w_cells": 6}
_RANK_MARGIN = 1.25


def fit_ring_surrogate(gram, *, rhos=None, kinds=("anchor", "factor"),
                       domination: str = "entrywise") -> MarkovSurrogate | None:
    """For a *cyclic* Gram (several epochs of reused slots: the last slots of an epoch are next to the
    first slots of the next one), the chain in natural order fitted to the Gram without its corners,
    plus a shared factor ``a W r^j`` (``W ~ N(0, 1)`` independent of the chain) on the ``j``-th slot
    from either end, ``j < width``, with ``a^2`` the smallest making ``chain + a^2 v v^T >= G``
    entrywise (``r`` from a grid by ``a^2 (sum v)^2``; any choice is sound). ``None`` if the corners
    are empty (one epoch), wider than a quarter of the slots, or no candidate passes the float check.
    ``gram`` as in :func:`fit_surrogate` (rounded up; one Gram or a list, dominated at once).

    ``kinds``: also (and by default preferred when it adds less covariance, ``1^T (Cov(Y') - chain)
    1``) the *anchored* variant, in which the last slots load on the chain's own first state ``Z_0``
    instead of an extra factor: ``Y'_i += e_i Z_0`` with ``e_i = max_j resid(j, i) / (alpha rho^j)``
    (module docstring, *the anchored ring*); it needs ``rho > 0``."""
    grams = as_grams(gram)
    width = ring_width(grams)
    if width is None:
        return None
    sur = fit_surrogate(paths(grams), rhos=rhos, orders=("natural",), domination=domination)
    # a chain that covers the path only in the PSD sense (Lemma P) may need its variance raised once
    # the ends are added: by the deficit of the whole covariance, then checked again
    for _ in range(3 if domination == "psd" else 1):
        if sur is None:
            return None
        rings = [c for c in (_anchored(sur, grams, width) if "anchor" in kinds else None,
                             _factored(sur, grams, width) if "factor" in kinds else None) if c is not None]
        ok = [c for c in rings if _dominates(c, grams)]
        if ok or not rings:
            return min(ok, key=lambda c: c.proxy) if ok else None
        sur = _lifted(sur, min(max(deficit(c, [g], (g.shape[0] // 2, None)) for g in grams) for c in rings))
    return None


def as_grams(gram) -> list[np.ndarray]:
    """One Gram matrix or a list of them (the residue classes), as a list of float arrays."""
    if isinstance(gram, (list, tuple)):
        return [np.asarray(g, dtype=np.float64) for g in gram]
    return [np.asarray(gram, dtype=np.float64)]


def ring_width(grams) -> int | None:
    """The corners' width of cyclic Grams (the most slots from an end that a wrap pair reaches);
    ``None`` if there are no corners or they are wider than a quarter of the slots."""
    width = 0
    for g in grams:
        n = g.shape[0]
        i, j = np.nonzero((g > 0) & wrap_mask(n) & (np.arange(n)[:, None] < np.arange(n)[None, :]))
        if i.size:
            width = max(width, int(np.max(np.maximum(i + 1, n - j))))
            if 4 * width > n:
                return None
    return width or None


def paths(grams) -> list[np.ndarray]:
    """The Grams without their corners (what the chain in natural order is fitted to)."""
    return [np.where(wrap_mask(g.shape[0]), 0.0, g) for g in grams]


@dataclass(frozen=True)
class SurrogateFamily:
    """Several sound surrogates of one pair, of which :func:`pick` runs the one a coarse program ranks
    best at the call's noise (each member is a bound on its own: the choice only aims at tightness)."""

    members: tuple
    #: surrogates run on their own as members (the fitted rings): ranked with the family on the coarse
    #: grid, and where one of them ranks first the family is not run (:func:`pick` returns ``None``)
    rivals: tuple = ()

    def describe(self) -> str:
        return f"the best of {len(self.members)} by a coarse program"


def ring_family(gram, around: MarkovSurrogate, rivals=()) -> SurrogateFamily | None:
    """Anchored rings (:func:`fit_ring_surrogate`) of a *mixed* split (Lemma P with ``N`` every
    positive off-diagonal entry of ``Cov(Y') - G``, ``P`` the rest): for ``rho`` around the fitted
    ring's (``around.rho + (-0.08 .. 0.08)``) and ``g_1`` 0.9-1.1 of the largest lag-1 entry, the
    smallest ``gamma_0`` whose anchored covariance minus ``G`` splits that way (the chain may fall
    short of a lag where its variance pays for it in the PSD sense). No proxy ranks them well (the
    second moments at ``s^2 = 0.5 .. 4 G_00`` picked chains 1-5% off the best; measured by Monte Carlo
    of the surrogates' own pairs), so the family is ranked at the call's noise by :func:`pick`.
    Measured: bsr(128, 4) over 2 epochs at sigma 2, delta 1e-5, the fitted ring 0.9670, the family's
    pick (``rho`` 0.62) 0.946 (the exact pair ~0.865). ``None`` with fewer than two members."""
    grams = as_grams(gram)
    width = ring_width(grams)
    if width is None or around is None or around.rho <= 0:
        return None
    b = max(g.shape[0] for g in grams)
    tgt = np.zeros(b)
    for g in paths(grams):
        lm = lag_maxima(g, slot_order(g.shape[0], "natural"))
        tgt[: lm.size] = np.maximum(tgt[: lm.size], lm)
    if b < 2 or tgt[1] <= 0:
        return None
    members = []
    for step in _FAMILY_RHO_STEPS:
        rho = round(around.rho + step, 6)
        if not 0 < rho < 0.96:
            continue
        for f in _FAMILY_G1:
            cand = _mixed_ring(grams, float(tgt[0]), float(tgt[1] * f), rho, width)
            if cand is not None and _dominates(cand, grams):
                members.append(cand)
    return SurrogateFamily(tuple(members), tuple(r for r in rivals if r is not None)) if len(members) > 1 else None


def _mixed_ring(grams, g0_min: float, g1: float, rho: float, width: int) -> MarkovSurrogate | None:
    """The anchored ring of ``(g_1, rho)`` with the smallest ``gamma_0`` (from ``max(g0_min, 2 g_1 /
    (1 + rho))``, raised by the float check's deficit) whose covariance minus the Grams is PSD plus the
    positive off-diagonal entries; ``None`` if that fails four times or the chain degenerates."""
    g0 = max(g0_min, 2 * g1 / (1 + rho)) * (1 + 1e-9)
    for _ in range(4):
        a, be, s = solve(g0, g1, rho)
        if a < 1e-3 * math.sqrt(g0):
            return None
        cand = _anchored(MarkovSurrogate(a, be, rho, s, "natural", 0.0, domination="psd"), grams, width)
        if cand is None:
            return None
        d = deficit(cand, grams, (0,))
        if d == 0.0:
            return cand
        g0 = (g0 + d) * (1 + 1e-6)
    return None


def pick(member, sigma: float, parts, delta: float, eps_hi: float, directions) -> MarkovSurrogate | None:
    """``member`` itself, or for a :class:`SurrogateFamily` the member with the smallest epsilon of
    ``directions`` by :func:`markov_epsilon` on the coarse grid :data:`_RANK_GRID` (~1/20 of the
    default grid's cost; its ranking matched Monte Carlo's on bsr(128, 4) over 2 epochs), searched
    below ``_RANK_MARGIN * eps_hi`` (the coarse grid is a few % looser: members that the default grid
    certifies below ``eps_hi`` must still be ranked); ties go to the first member. ``None`` when one of
    the family's rivals ranks at least as well (the family is then not run: on the six multi-epoch
    benchmark cells its pick won only where it also ranked first, and the skip saves one
    default-grid run, ~4-5 s at 64 slots).

    Each member is ranked with ``below`` the smallest score so far (:func:`markov_epsilon`; members
    in the order of their covariance proxy, ties still to the first in the family's order), then each
    rival with ``below`` the best member's score: a score above that bound can neither make the first
    member nor beat it, and its coarse tables stop as soon as that is proved, while every score that
    is computed is the one computed without ``below``, bit for bit -- so the choice is the one of
    ranking every member and rival in full (30% fewer coarse tables on bsr(32/64, 4)), in any order:
    the member picked the last time (:data:`_LAST_PICK`) is ranked first."""
    if not isinstance(member, SurrogateFamily):
        return member
    hi = _RANK_MARGIN * eps_hi

    def score(m, below=None):
        return markov_epsilon(m, sigma, parts, delta, hi, directions=tuple(directions), below=below,
                              **_RANK_GRID)["epsilon"]

    best, first = math.inf, 0  # (np.argmin's choice: the first of the smallest, index 0 when all are inf)
    # (the member picked the last time first, then the smallest covariance proxy: they tend to rank well,
    # which makes the bound tight early; the choice is the same in any order)
    last = _LAST_PICK.get(member)
    for k in sorted(range(len(member.members)), key=lambda k: (k != last, member.members[k].proxy, k)):
        s = score(member.members[k], best if math.isfinite(best) else None)
        if s < best or (s == best and k < first):
            best, first = s, k
    if math.isfinite(best):
        if len(_LAST_PICK) >= 64:
            _LAST_PICK.clear()
        _LAST_PICK[member] = first
    bound = best if math.isfinite(best) else None
    if any(score(r, bound) <= best for r in member.rivals):
        return None
    return member.members[first]


#: The member :func:`pick` chose the last time, by family (a calibration picks at ~5 nearby noises): ranked
#: first, so the others are ranked below its score from the start. Only the order of the ranking, never
#: its choice (the smallest score, ties to the first in the family's order, in any order).
_LAST_PICK: dict = {}


def _lifted(sur: MarkovSurrogate, extra: float) -> MarkovSurrogate | None:
    """``sur`` with ``gamma_0`` raised by ``extra`` (and a relative margin), ``g_1`` and ``rho`` kept."""
    g0 = sur.alpha**2 + sur.beta**2
    g1 = sur.alpha**2 * sur.rho + sur.alpha * sur.beta * sur.s
    a, be, s = solve((g0 + extra) * (1 + 1e-6), g1 * (1 + 1e-12), sur.rho)
    if a < 1e-3 * math.sqrt(g0):
        return None
    return dataclasses.replace(sur, alpha=a, beta=be, s=s)


def _residuals(sur: MarkovSurrogate, grams) -> list[np.ndarray]:
    """What the chain leaves of each Gram's corners (``max(G - chain, 0)`` on the wrap pairs)."""
    out = []
    for g in grams:
        n = g.shape[0]
        chain = toeplitz(sur.lags(n), n)
        out.append(np.where(wrap_mask(n), np.maximum(g - chain, 0.0), 0.0))
    return out


def _dominates(sur: MarkovSurrogate, grams) -> bool:
    """The float check that ``Cov(Y') - G`` is entrywise non-negative (Lemma K) or, failing that, splits
    as PSD + non-negative with the non-negative part the positive entries past a lag of ``0`` (every
    off-diagonal one), ``n / 2`` (the corners) or none (Lemma P; :func:`~.markov_fit.psd_deficit`)."""
    return all(deficit(sur, [g], (0, g.shape[0] // 2, None)) == 0.0 for g in grams)


def _anchored(sur: MarkovSurrogate, grams, width: int) -> MarkovSurrogate | None:
    """The anchored ring: ``e_i`` on the last ``width`` positions, the smallest with
    ``e_i alpha rho^j >= resid(j, i)`` for the start positions ``j`` (``None`` if some residual sits
    where ``alpha rho^j = 0``)."""
    e = np.zeros(width)
    for res in _residuals(sur, grams):
        n = res.shape[0]
        c = sur.start_covariances(n)
        for j in range(width):
            col = res[: n // 2 + 1, n - 1 - j]
            m = col > 0
            if not m.any():
                continue
            if np.any(c[: n // 2 + 1][m] <= 0):
                return None
            e[j] = max(e[j], float(np.max(col[m] / c[: n // 2 + 1][m])))
    if not np.any(e > 0):
        return None
    while e.size and e[-1] == 0:
        e = e[:-1]
    e = e * (1 + 1e-9) + 1e-300 * (e > 0)
    n_max = max(g.shape[0] for g in grams)
    cand = MarkovSurrogate(sur.alpha, sur.beta, sur.rho, sur.s, "natural", 0.0, anchor=tuple(float(x) for x in e),
                           domination=sur.domination)
    cand = dataclasses.replace(cand, proxy=sur.proxy + float(added_covariance(cand, n_max).sum()) / n_max)
    return cand


def _factored(sur: MarkovSurrogate, grams, width: int) -> MarkovSurrogate | None:
    """The ring with a shared factor ``a r^j W`` on both ends (``r`` from a grid)."""
    best, resid = None, _residuals(sur, grams)
    for r in np.arange(0.05, 1.0, 0.05):
        cand = MarkovSurrogate(sur.alpha, sur.beta, sur.rho, sur.s, "natural", sur.proxy, (1.0, float(r), width),
                               domination=sur.domination)
        need = 0.0
        for res in resid:
            v = cand.loadings(res.shape[0])
            vv = np.outer(v, v)
            m = res > 0
            if np.any(m & (vv == 0)):
                need = math.inf
                break
            if m.any():
                need = max(need, float(np.max(res[m] / vv[m])))
        cost = need * float(cand.loadings(max(g.shape[0] for g in grams)).sum()) ** 2
        if math.isfinite(cost) and (best is None or cost < best[0]):
            best = (cost, float(r), need)
    if best is None or best[2] <= 0:  # (no residual: the natural-order chain alone is a member)
        return None
    _, r, need = best
    a = math.sqrt(need) * (1 + 1e-9) + 1e-300
    n_max = max(g.shape[0] for g in grams)
    out = MarkovSurrogate(sur.alpha, sur.beta, sur.rho, sur.s, "natural", sur.proxy + best[0] / n_max, (a, r, width),
                          domination=sur.domination)
    return out
