"""MMCC's probability tail bounds (Algorithms 2 and 4, App. F.3), split into a sigma-free part.

Paper: Choquette-Choo, Ganesh, Steinke, Thakurta, "Privacy amplification for matrix mechanisms"
(ICLR 2024), Sec. 4 and App. C-D, F.3; digest ``notes/mmcc.md`` §3.2, §3.4 and F.3.

The analysis processes *units* in order (a unit is one row of ``C`` for MMCC, or a block of rows
for the b-min-sep generalization). For unit ``u`` and a column ``j`` it touches, the posterior
probability that the example took part in step ``j`` given the outputs of the earlier units is
(Lemma C.3, 0-based indices)

    p_uj = q e^{L} / (q e^{L} + 1 - q),   L = (2 <theta, C_{<u, j}> - ||C_{<u, j}||^2) / (2 sigma^2),

and with probability ``>= 1 - 2 delta'`` (a Gaussian and a binomial tail event)
``<theta, C_{<u,j}> <= z sigma a_uj + s_uj`` with ``a_uj = ||C_{<u, j}||``, ``z = Phi^{-1}(1 -
delta')`` and ``s_uj`` the sum of the ``t`` largest Gram entries ``<C_{<u,j'}, C_{<u,j}>`` over
``j'``, where ``t`` is the smallest integer with ``Pr[Binomial(K_uj, q) > t] <= delta'`` and
``K_uj`` the number of columns ``j'`` with a non-zero Gram entry (F.3; all Gram entries are
``>= 0`` because ``C >= 0``, so the top-t sum bounds the signal whenever at most ``t`` of those
``K_uj`` steps were sampled). This gives

    eps_uj = z a_uj / sigma + (2 s_uj - a_uj^2) / (2 sigma^2),
    p~_uj  = q e^{eps_uj} / (q e^{eps_uj} + 1 - q).

Pairs with ``a_uj = 0`` (the first unit touching column ``j``) need no tail bound: ``p~ = q``.
The union bound runs over the non-trivial pairs actually used: ``delta' = delta_1 / (2 N)`` with
``N`` their number (``nnz(C) - n`` for a square ``C`` with non-zero columns, as in Alg. 2).
When ``N = 0`` (e.g. ``C = I``) no tail bound is needed and the caller may set ``delta_1 = 0``.

**What is sigma-independent.** ``a_uj``, ``a_uj^2``, ``s_uj`` (the Gram matrices, the counts
``K_uj``, the binomial thresholds ``t``), ``delta'`` and ``z`` depend only on ``C``, ``q`` and
``delta_1``; :func:`tail_bound_structure` computes them once (``O(m n^2)`` with an incremental
Gram matrix). Only the last two formulas depend on sigma
(:meth:`TailBoundStructure.probabilities`, cheap and vectorized). A calibration therefore builds
the structure once and re-evaluates ``p~`` per sigma.

**Soundness of the float arithmetic.** All Gram entries are sums of non-negative products, so
their relative error is at most ``gamma_m`` (``m`` rows). ``a`` and ``s`` are rounded *up* and
``a^2`` (which enters with a minus sign) *down*, each with that error bound and then onto a
relative grid of 2^-40 (so equal structures in different rows compare equal and can be reused).
Integer-valued ``C`` with small entries (trees, 0/1 matrices) has exact integer Gram entries and
is used as is (only a non-square ``a`` moves up one ulp).
``z`` is rounded up, ``eps`` inflated by ``1e-12`` relative and ``p~`` rounded up. Every one of
these moves ``p~`` up, and a larger ``p~`` gives a stochastically larger sensitivity (paper
Cor. B.3): the bound only gets more pessimistic. The binomial threshold is accepted only when
``binom.sf(t) <= delta' (1 - 1e-9)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import special

from dpmf._lazy import LazyModule
from dpmf.errors import NumericalError
from dpmf.numerics import UNIT_ROUNDOFF

stats = LazyModule("scipy.stats")  # ~0.25 s to import: only when a tail bound is computed

__all__ = ["TailBoundStructure", "tail_bound_structure", "binomial_thresholds", "posterior_bounds", "rounding_gamma",
           "block_norms_up"]

_GRID_BITS = 40


def rounding_gamma(k: int) -> float:
    """``gamma_k = k u / (1 - k u)`` (Higham, Accuracy and Stability of Numerical Algorithms, Sec. 3.1):
    the relative rounding-error bound of a float64 sum or dot product of ``k`` terms."""
    nu = k * UNIT_ROUNDOFF
    if nu >= 0.01:  # pragma: no cover - would need ~1e13 rows
        raise NumericalError("rounding-error bound of the Gram matrix is not small")
    return nu / (1.0 - nu)


def _round_up_relative(x: np.ndarray) -> np.ndarray:
    """Smallest value >= x on the grid with 40 significant bits (x >= 0)."""
    m, e = np.frexp(x)
    return np.ldexp(np.ceil(m * 2.0**_GRID_BITS) / 2.0**_GRID_BITS, e)


def _round_down_relative(x: np.ndarray) -> np.ndarray:
    """Largest value <= x on the grid with 40 significant bits (x >= 0)."""
    m, e = np.frexp(x)
    return np.ldexp(np.floor(m * 2.0**_GRID_BITS) / 2.0**_GRID_BITS, e)


def binomial_thresholds(max_count: int, prob: float, delta_prime: float) -> np.ndarray:
    """``t[K]`` = the smallest ``t`` with ``Pr[Binomial(K, prob) > t] <= delta_prime``, K = 0..max_count.

    Accepted only when ``scipy.stats.binom.sf(t, K, prob) <= delta_prime * (1 - 1e-9)`` (a margin
    for the float evaluation of the tail); ``t = K`` always qualifies (the tail is then 0).

    >>> binomial_thresholds(3, 0.5, 0.2).tolist()   # Pr[Bin(3, .5) > 2] = 0.125 <= 0.2
    [0, 1, 2, 2]
    """
    counts = np.arange(max_count + 1)
    if delta_prime <= 0:
        return counts.copy()
    target = delta_prime * (1.0 - 1e-9)
    guess = stats.binom.isf(delta_prime, counts, prob)
    t = np.clip(np.nan_to_num(guess, nan=0.0), 0, counts).astype(np.int64)
    for _ in range(max_count + 2):  # step up until the tail passes
        bad = (stats.binom.sf(t, counts, prob) > target) & (t < counts)
        if not bad.any():
            break
        t[bad] += 1
    for _ in range(max_count + 2):  # step down while the smaller value still passes
        lower = np.maximum(t - 1, 0)
        better = (t > 0) & (stats.binom.sf(lower, counts, prob) <= target)
        if not better.any():
            break
        t[better] -= 1
    return t


class UnitOffsets:
    """Units (rows or row blocks) as slices ``offsets[u]:offsets[u + 1]`` of the stored entries:
    the unit interface shared by :class:`TailBoundStructure` and the compact structures of
    :mod:`dpmf.accounting.mmcc.structured` (each declares the ``offsets`` field)."""

    @property
    def num_units(self) -> int:
        return int(self.offsets.size - 1)

    def unit(self, u: int) -> slice:
        return slice(int(self.offsets[u]), int(self.offsets[u + 1]))


@dataclass(frozen=True)
class TailBoundStructure(UnitOffsets):
    """Everything of the tail bounds that does not depend on sigma (see module docstring).

    Entries of all units are stored flat: unit ``u`` owns ``slice(offsets[u], offsets[u+1])``.
    ``columns`` are indices into the analysed columns, ``sensitivities`` the unit's entries
    (``C[i, j]`` for a row, the block-column norm rounded up for a block), ``prior_norm``
    ``a_uj`` (rounded up; 0 marks a trivial pair), ``prior_norm_sq`` ``a_uj^2`` (rounded down),
    ``signal`` ``s_uj`` (rounded up).
    """

    sampling_prob: float
    delta1: float
    delta_prime: float
    z: float
    tail_events: int
    offsets: np.ndarray
    columns: np.ndarray
    sensitivities: np.ndarray
    prior_norm: np.ndarray
    prior_norm_sq: np.ndarray
    signal: np.ndarray
    info: dict = field(default_factory=dict)

    def probabilities(self, noise_multiplier: float) -> np.ndarray:
        """``p~`` for every stored entry at noise ``sigma`` (flat, aligned with ``sensitivities``;
        :func:`posterior_bounds`)."""
        return posterior_bounds(self.sampling_prob, self.z, self.prior_norm, self.prior_norm_sq, self.signal,
                                noise_multiplier)

    # -- the unit-wise interface the accountant uses (shared with the compact structures of
    #    :mod:`dpmf.accounting.mmcc.structured`, which never hold all entries at once)
    def iter_units(self, units=None):
        """Yield ``(u, sensitivities, a, a^2, s)`` of every unit (or of the sorted ``units``) in order."""
        for u in range(self.num_units) if units is None else units:
            sl = self.unit(u)
            yield u, self.sensitivities[sl], self.prior_norm[sl], self.prior_norm_sq[sl], self.signal[sl]

    @property
    def nontrivial_pairs(self) -> int:
        """Number of stored pairs with a tail bound (``a > 0``)."""
        return int(np.count_nonzero(self.prior_norm > 0))

    def sensitivity_summary(self) -> tuple[float, bool]:
        """``(largest sensitivity, all sensitivities are integers)`` (``(0, True)`` when empty)."""
        c = self.sensitivities
        if c.size == 0:
            return 0.0, True
        return float(c.max()), bool(np.all(c == np.round(c)))


def posterior_bounds(q: float, z: float, a: np.ndarray, a2: np.ndarray, s: np.ndarray, noise_multiplier: float) -> np.ndarray:
    """``p~`` of pairs with tail-bound data ``(a, a^2, s)`` at noise ``sigma``, element by element.

    ``eps = z a / sigma + (2 s - a^2) / (2 sigma^2)``; ``p~ = 1 / (1 + (1-q)/q e^{-eps})``
    (overflow-safe logistic), rounded up; exactly ``q`` for trivial pairs (``a = 0``). Every
    operation is elementwise, so any subset of the entries gives the same values bit for bit.
    """
    sigma = float(noise_multiplier)
    out = np.full(a.shape, q)
    nontrivial = a > 0
    if not nontrivial.any() or q >= 1.0:
        return out
    a, a2, s = a[nontrivial], a2[nontrivial], s[nontrivial]
    with np.errstate(over="ignore", invalid="ignore"):
        eps = z * a / sigma + (2.0 * s - a2) / (2.0 * sigma * sigma)
    eps = np.where(np.isnan(eps), np.inf, eps)  # z = inf (delta1 = 0) with a > 0
    eps = eps + np.abs(eps) * 1e-12 + 1e-300
    log_odds = math.log1p(-q) - math.log(q)
    with np.errstate(over="ignore"):
        pt = special.expit(eps - log_odds)  # = 1 / (1 + (1-q)/q e^{-eps})
    pt = np.minimum(1.0, pt * (1.0 + 4 * UNIT_ROUNDOFF))
    out[nontrivial] = np.maximum(pt, q)
    return out


def union_bound(pairs: int, delta1: float, columns: int, q: float) -> tuple[int, float, float, np.ndarray]:
    """``(events, delta', z, t)`` for ``pairs`` non-trivial pairs: ``2 pairs`` tail events share
    ``delta1`` (``delta' = delta1 / events``), ``z = Phi^{-1}(1 - delta')`` rounded up, and the
    binomial thresholds ``t[K]`` for ``K = 0..columns`` (module docstring)."""
    events = 2 * pairs
    if pairs == 0 or not delta1 > 0:
        delta_prime, z = 0.0, math.inf
    else:
        delta_prime = delta1 / events
        z = float(stats.norm.isf(delta_prime))
        z = z + abs(z) * 1e-12 + 1e-300
    tvals = binomial_thresholds(columns, q, delta_prime) if pairs else np.zeros(columns + 1, dtype=np.int64)
    return events, delta_prime, z, tvals


def finish_pairs(gjj: np.ndarray, sv: np.ndarray, exact: bool, gam: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(a, a^2, s)`` of non-trivial pairs from the Gram diagonal ``gjj`` and the top-t sums ``sv``
    as computed in float64, rounded pessimistically (module docstring: ``a``, ``s`` up, ``a^2``
    down; ``exact``: integer data, no slack)."""
    if exact:
        root = np.sqrt(gjj)
        perfect = (root == np.round(root)) & (root * root == gjj)
        return _round_up_relative(np.where(perfect, root, np.nextafter(root, np.inf))), gjj, sv
    return (
        _round_up_relative(np.sqrt(gjj * (1.0 + gam)) * (1.0 + 2 * UNIT_ROUNDOFF)),
        _round_down_relative(gjj * (1.0 - gam)),
        _round_up_relative(sv * (1.0 + gam) + 1e-300 * (sv > 0)),
    )


def tail_bound_structure(
    matrix: np.ndarray,
    units: list[np.ndarray],
    sampling_prob: float,
    delta1: float,
    *,
    columns: np.ndarray | None = None,
) -> TailBoundStructure:
    """Sigma-independent tail-bound data for the units ``units`` of ``matrix[:, columns]``.

    ``matrix`` is non-negative (``m x n``); ``units`` is a list of arrays of row indices in
    composition order (one row each for MMCC, Alg. 2; a block of rows for generalized MMCC,
    Alg. 4, where the unit's sensitivity of column ``j`` is ``||C[block, j]||_2`` by the
    triangle inequality / Cor. B.6). Rows in no unit are ignored (they must be independent of
    the analysed example). ``delta1`` is the failure budget of all tail bounds together.
    """
    C = matrix if columns is None else matrix[:, columns]
    m, n = C.shape
    q = float(sampling_prob)

    # unit sensitivities (sigma-free); block norms rounded up
    unit_cols: list[np.ndarray] = []
    unit_vals: list[np.ndarray] = []
    for rows in units:
        sub = C[rows]
        if sub.shape[0] == 1:
            vals = sub[0]
        else:
            vals = block_norms_up(sub)
        nz = np.flatnonzero(vals > 0)
        unit_cols.append(nz)
        unit_vals.append(vals[nz])

    # number of non-trivial pairs: every appearance of a column after its first
    appearances = np.zeros(n, dtype=np.int64)
    for cols in unit_cols:
        appearances[cols] += 1
    pairs = int(np.sum(np.maximum(appearances - 1, 0)))
    events, delta_prime, z, tvals = union_bound(pairs, delta1, n, q)
    # Integer-valued C (trees, 0/1 strategies) with small entries: every Gram entry and top-t sum
    # is an exact integer below 2^53, so no rounding slack is needed.
    exact = bool(np.all(C == np.round(C))) and float(C.max(initial=0.0)) ** 2 * (m + 1) * (n + 1) < 2.0**52
    gam = 0.0 if exact else rounding_gamma(m + n + 4)

    G = np.zeros((n, n))
    pattern = np.zeros((n, n), dtype=bool)
    seen = np.zeros(n, dtype=bool)
    seen_lo, seen_hi = n, -1
    prior_norm: list[np.ndarray] = []
    prior_sq: list[np.ndarray] = []
    signal: list[np.ndarray] = []
    counts_used: list[int] = []
    for rows, cols in zip(units, unit_cols):
        a = np.zeros(cols.size)
        a2 = np.zeros(cols.size)
        s = np.zeros(cols.size)
        act = np.flatnonzero(seen[cols]) if cols.size else cols
        if act.size:
            jc = cols[act]
            # restrict to the seen columns (contiguous range for streaming matrices)
            # G and the pattern are symmetric: read rows jc (contiguous memory), not columns
            if seen[seen_lo : seen_hi + 1].all():
                Gs = G[jc, seen_lo : seen_hi + 1]
                Ps = pattern[jc, seen_lo : seen_hi + 1]
            else:
                idx = np.flatnonzero(seen)
                Gs = G[np.ix_(jc, idx)]
                Ps = pattern[np.ix_(jc, idx)]
            gjj = G[jc, jc]
            K = np.count_nonzero(Ps, axis=1)
            t = tvals[K]
            counts_used.extend(K.tolist())
            r = Gs.shape[1]
            tmax = int(t.max())
            if tmax > 0:
                if tmax < r:
                    top = np.partition(Gs, r - tmax, axis=1)[:, r - tmax :]
                else:
                    top = Gs
                top = -np.sort(-top, axis=1)
                csum = np.cumsum(top, axis=1)
                sv = np.where(t > 0, csum[np.arange(jc.size), np.maximum(t - 1, 0)], 0.0)
            else:
                sv = np.zeros(jc.size)
            a[act], a2[act], s[act] = finish_pairs(gjj, sv, exact, gam)
        prior_norm.append(a)
        prior_sq.append(a2)
        signal.append(s)
        # add the unit's rows to the Gram matrix
        for r_ in np.atleast_1d(rows):
            row = C[r_]
            supp = np.flatnonzero(row > 0)
            if supp.size == 0:
                continue
            lo, hi = int(supp[0]), int(supp[-1])
            if hi - lo + 1 == supp.size:
                v = row[lo : hi + 1]
                G[lo : hi + 1, lo : hi + 1] += np.outer(v, v)
                pattern[lo : hi + 1, lo : hi + 1] = True
            else:
                v = row[supp]
                G[np.ix_(supp, supp)] += np.outer(v, v)
                pattern[np.ix_(supp, supp)] = True
            seen[supp] = True
            seen_lo, seen_hi = min(seen_lo, lo), max(seen_hi, hi)

    offsets = np.zeros(len(units) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([c.size for c in unit_cols])
    cat = lambda xs, dt=np.float64: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
    info = {
        "pairs": pairs,
        "max_binomial_count": int(max(counts_used)) if counts_used else 0,
        "max_threshold": int(tvals[max(counts_used)]) if counts_used else 0,
    }
    return TailBoundStructure(
        sampling_prob=q,
        delta1=float(delta1) if pairs else 0.0,
        delta_prime=delta_prime,
        z=z,
        tail_events=events,
        offsets=offsets,
        columns=cat(unit_cols, np.int64),
        sensitivities=cat(unit_vals),
        prior_norm=cat(prior_norm),
        prior_norm_sq=cat(prior_sq),
        signal=cat(signal),
        info=info,
    )


def block_norms_up(sub: np.ndarray) -> np.ndarray:
    """Column L2 norms of a block, rounded up (kept exact when they are small integers).

    For integer entries below 2^20 the sums of squares are exact; a correctly rounded sqrt that
    is an integer whose square is the sum is then exact too (e.g. a tree column norm 2). Every
    other value moves up one ulp (correct rounding is within half an ulp), after inflating the
    sum by its summation-error bound for non-integer entries.
    """
    sq = np.sum(sub * sub, axis=0)
    if np.all(sub == np.round(sub)) and np.all(np.abs(sub) < 2.0**20):
        norms = np.sqrt(sq)
        exact = (norms == np.round(norms)) & (norms * norms == sq)
        return np.where(exact, norms, np.nextafter(norms, np.inf))
    gam = rounding_gamma(sub.shape[0] + 4)
    up = np.nextafter(np.sqrt(sq * (1.0 + gam)) * (1.0 + 2 * UNIT_ROUNDOFF), np.inf)
    return np.where(sq > 0, up, 0.0)  # an all-zero block column stays exactly 0
