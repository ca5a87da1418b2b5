r"""Fresh slots and ``k``-of-``t`` random allocation for DP-SGD (``C = I``): compositions of the
one-epoch allocation PLD, pessimistic at every step.

**The samplers.** ``E`` epochs of ``t`` steps; in each epoch every example is in ``k`` distinct,
uniformly random steps (``k = num_selected``). *Reused slots* draw the ``k`` steps once and repeat
them every epoch; *fresh slots* draw them anew, independently, each epoch.

**Reductions (all exact or proved).**

1. *Reused slots, ``C = I``.* The ``E`` releases of one slot are ``E`` Gaussian observations of
   the same sum; their mean is sufficient, so ``E`` epochs are one epoch at ``sigma / sqrt(E)``
   (:mod:`dpmf.accounting.allocation.pld`, module docstring).
2. *Fresh slots.* The epochs use independent randomness, so the mechanism is the (adaptive)
   ``E``-fold composition of the one-epoch mechanism; a dominating pair of a composition is the
   product of the factors' dominating pairs (Zhu, Dong & Wang, AISTATS 2022, Thm 10).
3. *``k`` of ``t`` in one epoch* (Feldman & Shenfeld, arXiv 2502.08202, the ``k > 1`` reduction
   that PLD_accounting 2.0 implements as its floor/ceil split; our proof): write
   ``t = k m + r`` (``0 <= r < k``). Cut the ``t`` steps into a *uniformly random* ordered
   partition with ``r`` blocks of ``m + 1`` steps and ``k - r`` blocks of ``m`` steps, and pick one
   uniform step in each block. The chosen set has ``k`` elements and a law invariant under every
   permutation of the steps, so it is uniform over ``k``-subsets: this *is* ``k``-of-``t``
   allocation. Given the partition, ``C = I`` makes the blocks' outputs independent, so the pair is
   the product of ``k - r`` pairs of 1-of-``m`` allocation and ``r`` of 1-of-``(m + 1)``, the same for
   every partition up to a relabelling of coordinates. The pair of ``k``-of-``t`` is the average of
   these over partitions with the *same* second distribution ``N(0, sigma^2 I)``; the hockey-stick
   divergence is jointly convex, so both directions are at most those of one partition's product.
   ``k = 1`` is one-slot allocation itself (the same code path); ``m = 1`` blocks are Gaussian
   mechanisms.

So every case is a composition of ``n_1`` copies of 1-of-``m`` allocation and ``n_2`` of
1-of-``(m + 1)`` at one noise (``n_1 = (k - r) E'``, ``n_2 = r E'``; fresh: ``E' = E`` at
``sigma``; reused: ``E' = 1`` at ``sigma / sqrt(E)``). A single copy (``k = 1`` and one effective
epoch) is answered by :func:`~dpmf.accounting.allocation.pld.allocation_pld_epsilon` directly.

**Pessimistic computation of a composition.** Per direction:

a. *One copy's privacy profile.* The sum law of :mod:`~dpmf.accounting.allocation.pld`
   (convex-order spread, windows with charged cuts, FFT allowances) gives, for every ``gamma > 0``,
   an upper bound ``d(gamma)`` on ``H_gamma`` of the copy's pair: remove
   ``E[(S' - gamma)_+] + c`` (``c`` the charges; for ``gamma`` below the window the law is linear
   and the raised mass only adds), add ``E[(1 - gamma S')_+] + gamma c``. Both are evaluated at
   ``gamma_j = e^{j Delta}`` on a uniform loss grid, replaced by their running minimum (the true
   profile is non-increasing) and by 1 where larger.
b. *Connect the dots* (Doroshenko, Ghazi, Kamath, Kumar & Manurangsi, PoPETs 2022). The true
   ``H_gamma`` is convex in ``gamma``, equals 1 at ``gamma = 0`` and is ``<= d(gamma_j)`` at every
   grid point, so it is below the *lower convex hull* ``g`` of ``{(0, 1)} U {(gamma_j, d_j)}``
   (a convex function below finitely many points is below their convex envelope), extended flat
   beyond the last point. ``g`` is the hockey-stick curve of a proper pair: P-mass
   ``gamma_j (s_{j+} - s_{j-})`` (the slope increase) at loss ``j Delta``, P-mass ``g(inf)`` at loss
   ``+inf``, total ``g(0) = 1``; its Q-mass ``-g'(0+) <= 1`` because ``d_j >= 1 - gamma_j`` (the rest of
   Q sits at loss ``-inf``). So this pair dominates the copy's pair for every ``gamma > 0``.
c. *Composition.* The P-law of the loss of a product pair is the convolution of the factors'
   P-laws, so ``delta(eps) = E[(1 - e^{eps - L})_+] + P(L = inf)`` of the product is a
   non-negative functional, non-decreasing in every factor's loss. Hence it may be bounded with
   (i) entrywise upper bounds on the masses (the tilted FFT's allowances of
   :func:`~dpmf.accounting.allocation.grid.convolve`, each entry capped by the exact total mass),
   (ii) mass below a window raised to the window's first loss, (iii) mass above the window moved
   to ``+inf``, and (iv) infinity masses combined as ``1 - (1 - a)(1 - b) <= a + b``. Repeated
   squaring keeps every intermediate an entrywise upper bound of a stochastically larger law.
d. *Query.* ``delta(eps) = A(eps) - e^eps B(eps) + p_inf`` with ``A, B`` suffix sums of ``p_k`` and
   ``p_k e^{-l_k}`` over ``l_k > eps`` (sums of non-negative terms, inflated by their rounding
   bound); the smallest ``eps >= 0`` with ``delta(eps) <= delta`` is solved exactly per segment.

Each loss spacing ``Delta`` gives a sound bound (only the hull's chords depend on it); two spacings
are computed and the smaller epsilon is reported.

**Cost.** One copy's profile is one grid sum law (as for a single epoch) plus ``O(n)`` for the
hull; the composition is ``O(log E')`` FFTs on a loss window that grows like ``sqrt(E')`` standard
deviations of the per-copy loss.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from dpmf.accounting.allocation.grid import CAP_MARGIN, CUT_BUDGET, Law, Plan, convolve, refine, sum_law
from dpmf.memo import BoundedMemo
from dpmf.numerics import UNIT_ROUNDOFF
from dpmf.privacy.gdp import gaussian_epsilon

__all__ = ["BUDGET", "composition_epsilon", "one_copy_law", "profile_composition_epsilon", "profiles_composition_epsilon", "split_k_of_t"]


#: Fraction of delta that the composition's window cuts and the profile's top may cost (tightness).
BUDGET = 1e-3
#: Loss spacings tried (the smaller epsilon is kept; each is a sound bound).
_LOSS_STEPS = (4e-3, 1e-3)
#: The add profile's window reaches S = add_reach (loss -log add_reach); the wider one is computed
#: only when the narrow one's add epsilon exceeds the remove epsilon (it then decides the answer).
#: Measured against exact integration: 4 -> 1.016x (two fresh epochs, t = 2, sigma 1) and 1.093x
#: (2-of-3, sigma 1.5); 16 -> 1.00008x (2-of-3); 64 -> 1.00001x at ~6-13x the time (16: ~4x).
_ADD_REACH = (4, 16)


def split_k_of_t(steps: int, num_selected: int) -> list[tuple[int, int]]:
    """``[(m, copies), ...]``: ``k``-of-``t`` allocation as ``k - r`` copies of 1-of-``m`` and ``r``
    of 1-of-``(m + 1)`` (``t = k m + r``, module docstring, reduction 3).

    >>> split_k_of_t(10, 3)
    [(3, 2), (4, 1)]
    >>> split_k_of_t(8, 1)
    [(8, 1)]
    """
    m, r = divmod(steps, num_selected)
    return [(mm, c) for mm, c in ((m, num_selected - r), (m + 1, r)) if c > 0]


# ----------------------------------------------------------------------------- one copy
def _profile_points(direction: str, eta: float, t: int, delta_small: float, rel_tol: float, max_points: int,
                    add_reach: int = 4):
    """``(gammas, d)``: an upper bound on one copy's hockey-stick curve at ``gamma_j`` (step a),
    as a callable on arrays of ``gamma``."""
    if t == 1:  # the Gaussian mechanism at sigma = 1/sqrt(eta), both directions alike (closed form)
        sigma = 1.0 / math.sqrt(eta)

        def d(gam):  # Phi(-eps sigma + 1/(2 sigma)) - e^eps Phi(-eps sigma - 1/(2 sigma)), any real eps
            e = np.log(gam)
            out = special.ndtr(-e * sigma + 0.5 / sigma) - gam * special.ndtr(-e * sigma - 0.5 / sigma)
            return np.minimum(np.maximum(out, 0.0) * (1 + 1e-9) + 1e-300, 1.0)

        eps_top = gaussian_epsilon(sigma, delta_small)
        return d, -eps_top - 1.0, eps_top
    eps_gauss = gaussian_epsilon(1.0 / math.sqrt(eta), delta_small)
    best, levels = refine(direction, eta, t, delta_small, eps_gauss, rel_tol, max_points)
    h = levels[-1]["h"]
    eps_hi = best if math.isfinite(best) else eps_gauss
    if direction == "remove":
        cap = int(math.ceil(t * math.exp(eps_hi) * (1 + CAP_MARGIN) / h))
        plan = Plan("remove", t, h, cap, CUT_BUDGET * delta_small, 1.0, target=math.exp(eps_hi))
    else:
        # the add loss log(1/S) down to -log(add_reach): lower losses are raised (pessimistic; tightness
        # only). At add_reach = 4 this cost 1.6% (two fresh epochs, t = 2) and 9% (2-of-3) against exact
        # integration: the Q-mass of S > 4 is small, but composing moves it into the answer's region.
        # (the whole range [0, add_reach] at the refinement's last spacing: that spacing was chosen for
        # a window near e^-eps and can be far finer than this range needs -- 2.2e8 points, 8 GB, at
        # 2-of-4, sigma 0.7, delta 1e-9 -- so it is coarsened to at most max_points; any h is sound)
        h = max(h, t * add_reach / max_points)
        cap = int(math.ceil(t / h)) * add_reach + 1
        # no FFT tilt: a tilt aimed at S = e^-eps_hi (the single copy's answer) makes the error
        # allowance grow like e^{-theta k} towards large S, where the composed answer also draws on
        # this profile (it raised d(gamma) to 1 below gamma ~ 0.9 at sigma 2, t = 50; 40 fresh
        # epochs were 1.16x PLD_accounting's upper bound instead of <= 1.0x)
        plan = Plan("add", t, h, cap, CUT_BUDGET * delta_small, math.exp(eps_hi))
    law, charge, _ = sum_law(plan, eta)
    T, E, H, D = law.tables()
    n = law.p.size
    mass = float(law.p.sum()) * (1 + 4 * UNIT_ROUNDOFF * n)
    unit = h / t

    def interp(table, x):
        x = np.clip(x, 0.0, n - 1.0)
        i = np.minimum(np.floor(x).astype(np.int64), n - 2) if n > 1 else np.zeros(x.shape, np.int64)
        f = x - i
        return table[i] + f * (table[np.minimum(i + 1, n - 1)] - table[i])

    lo = law.lo
    if direction == "remove":
        def d(gam):
            x = gam / unit - lo
            val = interp(E, x) + np.where(x < 0, -x * mass, 0.0)
            return np.minimum((val * unit + charge) * (1 + 8 * UNIT_ROUNDOFF), 1.0)

        top = (lo + n - 1) * unit
        bottom = max(lo * unit, 1e-300)
        return d, max(math.log(bottom), -max(5.0, 2.0 * math.log(top))), math.log(top)

    def d(gam):
        x = 1.0 / (gam * unit) - lo
        val = interp(D, x) + np.where(x > n - 1, (x - (n - 1)) * mass, 0.0)
        return np.minimum(gam * (val * unit + charge) * (1 + 8 * UNIT_ROUNDOFF), 1.0)

    top = (lo + n - 1) * unit
    bottom = lo * unit
    return d, -math.log(top), (min(-math.log(bottom), 60.0) if bottom > 0 else 60.0)


def _connect_the_dots(d, eps_lo: float, eps_hi: float, step: float):
    """Step b: the loss pmf (``_Law`` on ``l_j = j step``) and infinity mass of the lower convex
    hull of ``{(0, 1)} U {(gamma_j, d(gamma_j))}``."""
    j0, j1 = math.floor(eps_lo / step), math.ceil(eps_hi / step)
    j = np.arange(j0, j1 + 1)
    gam = np.exp(j * step)
    val = np.minimum.accumulate(d(gam))
    xs = np.concatenate([[0.0], gam])
    ys = np.concatenate([[1.0], val])
    # lower convex hull (monotone chain; xs increasing)
    hull = []
    for i in range(xs.size):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (ys[b] - ys[a]) * (xs[i] - xs[a]) >= (ys[i] - ys[a]) * (xs[b] - xs[a]):
                hull.pop()  # b is not below the chord a-i
            else:
                break
        hull.append(i)
    hv = np.array(hull)
    slopes = np.diff(ys[hv]) / np.diff(xs[hv])
    slopes = np.concatenate([slopes, [0.0]])  # flat beyond the last point
    masses = np.zeros(j.size)
    # vertex hv[i] (i >= 1) carries gamma * (slope after - slope before); the flat end is g(inf)
    masses[hv[1:] - 1] = xs[hv[1:]] * (slopes[1:] - slopes[:-1])
    masses = np.maximum(masses, 0.0) * (1 + 16 * UNIT_ROUNDOFF)
    p_inf = float(ys[hv[-1]])
    nz = np.flatnonzero(masses)
    lo_i, hi_i = (int(nz[0]), int(nz[-1])) if nz.size else (0, 0)
    law = Law(int(j[lo_i]), masses[lo_i : hi_i + 1].copy(), float(masses.sum()) + 1e-15)
    return law, min(p_inf * (1 + 4 * UNIT_ROUNDOFF) + 1e-300, 1.0)


def one_copy_law(direction: str, eta: float, t: int, delta_smalls, step: float, *, rel_tol: float,
                 max_points: int, add_reach: int = _ADD_REACH[1]) -> tuple[int, np.ndarray, float]:
    """``(lower_index, masses, infinity_mass)``: steps a-b for one copy of 1-of-``t`` allocation at
    ``eta = 1 / sigma^2`` in one direction -- the P-law of a pair that dominates the copy's pair at
    *every* ``gamma > 0`` (module docstring), mass ``masses[i]`` at the loss
    ``(lower_index + i) * step``.

    Each ``delta_small`` in ``delta_smalls`` gives one profile (step a), its windows and grid fitted
    to that delta, its cut budget charged at every ``gamma`` (so it ends up in the infinity mass):
    a small one reaches far into the tail, a larger one is finer where moderate deltas are decided.
    Each profile bounds ``H_gamma`` at every ``gamma`` (beyond its window it is flat at its charge),
    so their pointwise minimum does too, and its hull (step b) is taken."""
    profiles = [_profile_points(direction, eta, t, ds, rel_tol, max_points, add_reach=add_reach)
                for ds in sorted(set(float(x) for x in delta_smalls))]

    def d(gam):
        return np.minimum.reduce([p[0](gam) for p in profiles])

    law, p_inf = _connect_the_dots(d, min(p[1] for p in profiles), max(p[2] for p in profiles), step)
    return int(law.lo), law.p, float(p_inf)


# ----------------------------------------------------------------------------- composition
def _trim(law: Law, budget: float):
    """Steps c(ii)-(iii): keep the window whose lower and upper tails each hold <= budget of mass;
    the lower tail is raised to the window's first loss, the upper one goes to ``+inf``."""
    p = law.p
    if p.size <= 2:
        return law, 0.0
    upper = np.cumsum(p[::-1])[::-1]
    lower = np.cumsum(p)
    ok_u = np.flatnonzero(upper <= budget)
    u = int(ok_u[0]) - 1 if ok_u.size else p.size - 1
    ok_l = np.flatnonzero(lower <= budget)
    l = int(ok_l[-1]) + 1 if ok_l.size else 0
    u = max(u, l)
    to_inf = float(upper[u + 1]) * (1 + 4 * UNIT_ROUNDOFF * p.size) if u + 1 < p.size else 0.0
    q = p[l : u + 1].copy()
    if l > 0:
        q[0] += float(lower[l - 1]) * (1 + 4 * UNIT_ROUNDOFF * p.size)
    return Law(law.lo + l, q, law.mass), to_inf


def _conv(a, b, tilt: float, budget: float):
    c, err = convolve(a, b, extended=True, tilt=tilt)
    other = a if b is None else b
    mass = a.mass * other.mass * (1 + 4 * UNIT_ROUNDOFF)
    q = np.minimum(np.maximum(c + err, 0.0), mass)
    return _trim(Law(a.lo + other.lo, q, mass), budget)


def _self_compose(law, p_inf: float, copies: int, tilt: float, budget: float):
    result, r_inf = None, 0.0
    base, b_inf = law, p_inf
    bits = bin(copies)[2:][::-1]
    for i, bit in enumerate(bits):
        if bit == "1":
            if result is None:
                result, r_inf = base, b_inf
            else:
                result, cut = _conv(result, base, tilt, budget)
                r_inf = min(r_inf + b_inf + cut, 1.0)
        if i < len(bits) - 1:
            base, cut = _conv(base, None, tilt, budget)
            b_inf = min(2 * b_inf + cut, 1.0)
    return result, r_inf


def _query(law, p_inf: float, step: float, delta: float) -> float:
    """Step d: smallest ``eps >= 0`` with ``E[(1 - e^{eps - L})_+] + p_inf <= delta``."""
    if p_inf >= delta:
        return math.inf
    ell = (law.lo + np.arange(law.p.size)) * step
    n = law.p.size
    infl = 1 + 4 * UNIT_ROUNDOFF * (n + 4)
    shift = float(ell.max())
    A = np.cumsum(law.p[::-1])[::-1] * infl  # sum over l_k >= l_i
    B = np.cumsum((law.p * np.exp(-(ell - shift)))[::-1])[::-1] * infl  # times e^{-shift}

    def delta_at(eps: float) -> float:
        i = int(np.searchsorted(ell, eps, side="right"))
        if i >= n:
            return p_inf
        return max(float(A[i]) - math.exp(eps - shift) * float(B[i]), 0.0) + p_inf

    if delta_at(0.0) <= delta:
        return 0.0
    # grid points: delta at l_i (terms with l_k > l_i)
    idx = np.arange(n)
    nxt = np.minimum(idx + 1, n - 1)
    vals = np.where(idx + 1 < n, np.maximum(A[nxt] - np.exp(ell - shift) * B[nxt], 0.0), 0.0) + p_inf
    ok = np.flatnonzero((vals <= delta) & (ell >= 0))
    if ok.size == 0:
        return math.inf
    k = int(ok[0])
    lo_e = max(ell[k - 1], 0.0) if k > 0 else 0.0
    # on (l_{k-1}, l_k] the active set is l_j >= l_k: delta = A_k - e^eps B_k + p_inf
    a, b = float(A[k]), float(B[k])
    if b <= 0:
        return lo_e
    root = math.log(max(a + p_inf - delta, 1e-300) / b) + shift
    return min(max(root, lo_e), float(ell[k]))


def composition_epsilon(eta: float, parts: list[tuple[int, int]], delta: float, *, rel_tol: float,
                        max_points: int) -> dict:
    """Epsilon (both directions) of the composition of ``copies`` of 1-of-``m`` allocation for each
    ``(m, copies)`` in ``parts``, every step a Gaussian of parameter ``eta = 1 / sigma^2`` (each copy's
    law from the grid engine, :mod:`~dpmf.accounting.allocation.grid`)."""
    key = (float(eta), tuple((int(m), int(c)) for m, c in parts), float(delta), float(rel_tol), int(max_points))
    return _MEMO.get(key, lambda: _composition_epsilon(eta, parts, delta, rel_tol=rel_tol, max_points=max_points),
                     copy_out=True)


#: Results by (eta, parts, delta, rel_tol, max_points): the planner's rows "fresh slots each epoch"
#: and "k of k t fresh" often reduce to the same composition, and their calibrations probe the same
#: noises in the same order (a deterministic search), so the second row costs nothing.
_MEMO = BoundedMemo(512)


def _composition_epsilon(eta: float, parts, delta: float, *, rel_tol: float, max_points: int) -> dict:
    total = sum(c for _, c in parts)
    by_dir, detail = {}, {}
    profiles = {}  # one copy's profile does not depend on the loss spacing: computed once per part
    for direction, reach in (("remove", 0), ("add", _ADD_REACH[0]), ("add", _ADD_REACH[1])):
        if reach == _ADD_REACH[1] and by_dir["add"] <= by_dir["remove"]:
            break  # the add bound cannot decide the max: no need for the wider (costlier) window
        best = by_dir.get(direction, math.inf)
        tries = detail.get(direction, [])
        for step in _LOSS_STEPS:
            budget = BUDGET * delta / (4 * max(1, math.ceil(math.log2(total + 1))) * len(parts) + 4)
            law_all, inf_all = None, 0.0
            eps_guess = None
            for m, copies in parts:
                if (direction, m, reach) not in profiles:
                    profiles[direction, m, reach] = _profile_points(
                        direction, eta, m, budget, rel_tol, max_points, add_reach=reach or 4)
                d, lo, hi = profiles[direction, m, reach]
                law, p_inf = _connect_the_dots(d, lo, hi, step)
                law, cut = _trim(law, budget)
                p_inf = min(p_inf + cut, 1.0)
                if eps_guess is None:
                    eps_guess = float(np.sum(law.p * (law.lo + np.arange(law.p.size)) * step))
                tilt = 0.0
                comp, c_inf = _self_compose(law, p_inf, copies, tilt, budget)
                if law_all is None:
                    law_all, inf_all = comp, c_inf
                else:
                    law_all, cut = _conv(law_all, comp, tilt, budget)
                    inf_all = min(inf_all + c_inf + cut, 1.0)
            eps = _query(law_all, inf_all, step, delta)
            tries.append({"loss_step": step, "points": int(law_all.p.size), "epsilon": eps,
                          **({"add_reach": reach} if direction == "add" else {})})
            best = min(best, eps)
        by_dir[direction] = best
        detail[direction] = tries
    return {"epsilon": max(by_dir.values()), "epsilon_by_direction": by_dir, "compositions": detail}


def profile_composition_epsilon(profiles: dict, copies: int, delta: float) -> dict:
    """Steps b-d for ``copies`` copies of one pair given, per direction, an upper bound on its
    hockey-stick curve: ``profiles[direction] = (d, eps_lo, eps_hi)`` with ``d`` a callable on arrays
    of ``gamma > 0`` returning values ``>= H_gamma`` (and ``<= 1``), ``[eps_lo, eps_hi]`` the loss range
    of the grid (beyond it the hull is flat: the mass at ``+inf`` is ``d(e^eps_hi)``). Both loss
    spacings are tried; the smaller epsilon per direction is kept (each is a sound bound)."""
    return profiles_composition_epsilon([(profiles, copies)], delta)


def profiles_composition_epsilon(parts, delta: float) -> dict:
    """:func:`profile_composition_epsilon` for independent pairs of several kinds: ``parts =
    [(profiles, copies), ...]``, every ``profiles`` with the same directions. Each kind is
    self-composed, then the kinds are convolved (on the same loss grid); every window cut goes to the
    mass at ``+inf``, so the budget per operation only sets tightness."""
    ops = sum(max(1, math.ceil(math.log2(c + 1))) for _, c in parts) + len(parts) - 1
    budget = BUDGET * delta / (4 * ops + 4)
    by_dir, detail = {}, {}
    for direction in parts[0][0]:
        best, tries = math.inf, []
        for step in _LOSS_STEPS:
            total, t_inf = None, 0.0
            for profiles, copies in parts:
                d, lo, hi = profiles[direction]
                law, p_inf = _connect_the_dots(d, lo, hi, step)
                law, cut = _trim(law, budget)
                comp, c_inf = _self_compose(law, min(p_inf + cut, 1.0), copies, 0.0, budget)
                if total is None:
                    total, t_inf = comp, c_inf
                else:
                    total, cut = _conv(total, comp, 0.0, budget)
                    t_inf = min(t_inf + c_inf + cut, 1.0)
            eps = _query(total, t_inf, step, delta)
            tries.append({"loss_step": step, "points": int(total.p.size), "epsilon": eps})
            best = min(best, eps)
        by_dir[direction], detail[direction] = best, tries
    return {"epsilon": max(by_dir.values()), "epsilon_by_direction": by_dir, "compositions": detail}
