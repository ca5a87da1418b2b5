r"""Correlated ``C`` under random allocation: spectral groups, a sound bound between orthogonal
groups and the exact pair.

dpmf's own argument (not from the papers); the pair is Lemma 2.8 of Schuchardt & Kalinin
(arXiv 2601.21636), digest ``notes/random-allocation.md`` §2.4. For an entrywise non-negative,
lower-triangular ``C`` under balls-in-bins (``k`` epochs of ``b`` slots, slot reused) the remove
pair is ``P = (1/b) sum_i N(m_i, sigma^2 I)``, ``Q = N(0, sigma^2 I)`` (add: swapped). With
``x ~ Q`` its likelihood ratio is

    S = (1/b) sum_i X_i,   X_i = exp(Y_i - G_ii / (2 sigma^2)),   Y = M x / sigma^2 ~ N(0, G / sigma^2),

``G = M M^T`` the ``b x b`` Gram matrix of the means, and both directions' hockey-stick
divergences are ``E f(S)`` for a convex ``f`` (remove ``f(s) = (s - e^eps)_+``, add
``f(s) = (1 - e^eps s)_+``; :mod:`.pld`). So any ``S'`` that dominates ``S`` in *convex order*
(``E f(S) <= E f(S')`` for every convex ``f``) gives a sound bound for both directions at once.

**Lemma 1 (Gram domination).** If ``D`` is diagonal and ``D - G`` is positive semidefinite, then
``S <=_cx S'`` where ``S' = (1/b) sum_i X'_i`` with *independent* mean-one lognormals
``X'_i = exp(Y'_i - D_ii / (2 sigma^2))``, ``Y'_i ~ N(0, D_ii / sigma^2)``.
*Proof.* Let ``W ~ N(0, (D - G) / sigma^2)`` be independent of ``Y`` and ``Y' = Y + W``: then
``Cov(Y') = D / sigma^2`` is diagonal, so the ``Y'_i`` are independent Gaussians, and
``X'_i = X_i exp(W_i - (D_ii - G_ii) / (2 sigma^2))`` with ``E[X'_i | Y] = X_i`` (a mean-one
lognormal factor independent of ``Y``). Hence ``E[S' | Y] = S`` and, for convex ``f``,
``E f(S) = E f(E[S' | Y]) <= E f(S')`` (conditional Jensen). Equivalently ``(P, Q)`` is a
post-processing of the pair with orthogonal means ``sqrt(D_ii) e_i``: ``x = T x~ + noise`` with
``T = M^T D^{-1/2}``, ``T T^T = D^{-1/2} G D^{-1/2} <= I``.

**Lemma 2 (monotone in the variance).** A mean-one lognormal ``exp(N(-eta/2, eta))`` grows in
convex order with ``eta`` (multiply by an independent mean-one lognormal of parameter
``eta' - eta``: the same conditional-Jensen step), and independent sums preserve convex order; the
mean of ``n`` i.i.d. variables is convex-order smaller than the mean of any ``n' <= n`` of them.

**Theorem (spectral groups).** Fix a period ``q`` and split the slots into the residue classes
``R_r = {i : i = r mod q}`` (``n_r`` slots). Then ``S = sum_r (n_r / b) S_r`` with ``S_r`` the
mean over ``R_r``, and by Jensen's inequality ``E f(S) <= sum_r (n_r / b) E f(S_r)``. Within a
class, Lemma 1 with ``D = lambda_r I``, ``lambda_r >= lambda_max(G[R_r, R_r])``, and Lemma 2 give
``E f(S_r) <= E f(S*)`` with ``S*`` the mean of ``n = min_r n_r`` i.i.d. mean-one lognormals of
parameter ``lambda / sigma^2``, ``lambda = max_r lambda_r``. That is exactly the identity's
(DP-SGD) random-allocation pair with ``n`` steps at noise ``sigma / sqrt(lambda)``, whose
epsilon ``allocation_pld_epsilon`` (:mod:`.pld`) bounds pessimistically;
so that epsilon is a sound epsilon for the correlated pair, both directions.

How it relates to the orthogonal groups of :mod:`.pld`: when the classes modulo ``q`` have
pairwise orthogonal means (``q`` the orthogonal period) the class Gram is diagonal and ``lambda``
is ``max_i |m_i|^2`` -- the orthogonal-groups bound is the member ``q = period`` of this family.
Smaller ``q`` keeps more slots (``b / q`` instead of ``b / period``) at the price of a larger
``lambda`` (the in-class correlations are paid for as extra variance): ``q = 1`` is the whole
Gram, ``lambda_max(G)``, which for a banded Toeplitz ``C`` is close to ``(sum_j c_j)^2`` rather
than ``sum_j c_j^2``. The accountant takes the smallest epsilon over the family (each member is a
bound). The exact pair lies strictly in between: Lemma 1 is the best one can do with independent
slots (``T T^T <= I`` forces ``D >= G``), and the remaining gap is the price of independence.

**Rounding.** ``lambda_r`` is an upper bound on the largest eigenvalue computed without trusting
an eigensolver: for a non-negative symmetric ``A`` and any positive vector ``v``,
``lambda_max(A) <= max_i (A v)_i / v_i`` (Collatz-Wielandt; ``A`` is entrywise non-negative
because ``C`` is). ``v`` is a Lanczos estimate of the Perron vector, floored away from zero; the
product and the quotient are rounded up by ``(1 + 4 (n + 4) u)``. The Gram matrix itself is a
float product of non-negative numbers, so ``G <= fl(G) (1 + 2 (N + 2) u)`` entrywise, which
(Perron-Frobenius: the spectral radius is monotone in the entries of a non-negative matrix)
multiplies ``lambda`` by the same factor.

**Cost.** The ``b x N`` means and the ``b x b`` Gram (``O(b^2 N)``), then for each period ``q``
tried one Lanczos run and one Collatz product per class (``O(b^2 / q)`` each), and one
:func:`~dpmf.accounting.allocation.pld.allocation_pld_epsilon` per non-dominated ``(slots, lambda)``. Periods tried:
``1..min(period, 16)``, then powers of two up to the orthogonal period. Above
:data:`MAX_GRAM_ENTRIES` (``b^2`` or ``b N``) the family is skipped and the orthogonal groups stand
alone (stated in the diagnostics).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from dpmf.accounting.allocation.dominating_pair import mixture_means
from dpmf.errors import DPMFError
from dpmf.memo import BoundedMemo, array_key
from dpmf.numerics import UNIT_ROUNDOFF

__all__ = [
    "MAX_GRAM_ENTRIES",
    "SpectralGroup",
    "Reductions",
    "perron_upper_bound",
    "spectral_groups",
    "spectral_groups_of_grams",
    "gram_problem",
    "strategy_reductions",
    "reduced_epsilon",
    "markov_members",
    "MARKOV_MAX_PERIOD",
    "MARKOV_SLOT_BUDGET",
    "MARKOV_RING_SLOTS",
    "identity_pair_epsilon_lower_bound",
    "markov_members_tried",
]

#: Largest ``b * max(b, N)`` for which the Gram matrix is built and the spectral family is tried.
MAX_GRAM_ENTRIES = 2**24
#: The Markov members are tried on residue classes modulo ``1..this`` (:func:`markov_members`).
MARKOV_MAX_PERIOD = 4
#: ... while the members' slots (summed over periods and class sizes) stay below this (cost: about
#: 2-3 s per 64 slots on one core at the default grid).
MARKOV_SLOT_BUDGET = 256
#: Several epochs of reused slots make the Gram cyclic; ring members (the corners covered by the
#: chain's own first state or a shared factor,
#: :func:`~dpmf.accounting.allocation.surrogates.markov_ring.fit_ring_surrogate`) are tried on residue classes of
#: at most this many slots, and half as many (each costs ``~12x`` a chain: a table per factor node).
MARKOV_RING_SLOTS = 64
#: Periods ``1..this`` are all tried (then powers of two up to the orthogonal period).
_ALL_PERIODS_UP_TO = 16


@dataclass(frozen=True)
class SpectralGroup:
    """One member of the family (module docstring): period ``q``, ``slots = min_r n_r`` and
    ``max_eigenvalue`` ``lambda >= max_r lambda_max(G[R_r, R_r])`` (rounded up)."""

    period: int
    slots: int
    max_eigenvalue: float


def perron_upper_bound(a: np.ndarray) -> float:
    """A rigorous upper bound on the largest eigenvalue of a symmetric, entrywise non-negative
    matrix ``a`` (Collatz-Wielandt with a Lanczos estimate of the Perron vector; module docstring).

    >>> import numpy as np
    >>> g = np.array([[2.0, 1.0], [1.0, 2.0]])
    >>> 3.0 <= perron_upper_bound(g) < 3.0 + 1e-12
    True
    """
    a = np.asarray(a, dtype=np.float64)
    n = a.shape[0]
    if n == 1:
        return float(a[0, 0]) * (1 + 4 * UNIT_ROUNDOFF)
    if n <= 64:
        v = np.linalg.eigh(a)[1][:, -1]
    else:
        from scipy.sparse.linalg import eigsh

        try:
            v = eigsh(a, k=1, which="LA", tol=1e-10, v0=np.ones(n))[1][:, 0]
        except Exception:  # no convergence: a cruder vector, the bound stays valid (only looser)
            v = np.ones(n)
            for _ in range(50):
                v = a @ v + 1e-3 * v
                v /= np.abs(v).max()
    v = np.abs(v)
    v = np.maximum(v, 1e-8 * v.max() if v.max() > 0 else 1.0)
    v = a @ v + 1e-12 * v  # one power step: smooths the estimate (still positive)
    ratio = (a @ v) / v
    return float(ratio.max()) * (1 + 4 * (n + 4) * UNIT_ROUNDOFF) + float(np.finfo(np.float64).tiny)


def _periods(period: int) -> list[int]:
    qs = list(range(1, min(period, _ALL_PERIODS_UP_TO) + 1))
    q = _ALL_PERIODS_UP_TO * 2
    while q < period:
        qs.append(q)
        q *= 2
    if period not in qs:
        qs.append(period)
    return qs


def spectral_groups(means: np.ndarray, *, periods=None, max_period: int | None = None) -> list[SpectralGroup]:
    """The non-dominated members ``(q, slots, lambda)`` of the spectral-groups family for the
    ``b x N`` mixture means (module docstring); ``periods`` overrides the periods tried
    (default: ``1..16``, then powers of two, up to ``max_period`` or ``b``).

    >>> import numpy as np
    >>> [(g.period, g.slots) for g in spectral_groups(np.eye(6))]   # the identity: q = 1 is exact
    [(1, 6)]
    """
    m = np.asarray(means, dtype=np.float64)
    b, n = m.shape
    gram = m @ m.T
    gram = np.maximum(0.5 * (gram + gram.T), 0.0) * (1 + 2 * (n + 2) * UNIT_ROUNDOFF)
    return spectral_groups_of_grams([gram], periods=periods, max_period=max_period)


def spectral_groups_of_grams(grams, *, periods=None, max_period: int | None = None) -> list[SpectralGroup]:
    """:func:`spectral_groups` of several Gram matrices of the same size (already rounded up) at once:
    per period, the smallest class over all of them and the largest eigenvalue bound (one member that
    dominates each matrix's pair; the epochs of :mod:`.fresh_correlated`)."""
    b = grams[0].shape[0]
    qs = list(periods) if periods is not None else _periods(min(max_period or b, b))
    out = []
    for q in qs:
        lam, slots = 0.0, b
        for gram in grams:
            for r in range(q):
                idx = np.arange(r, b, q)
                if idx.size == 0:
                    continue
                slots = min(slots, idx.size)
                lam = max(lam, perron_upper_bound(gram[np.ix_(idx, idx)]))
        out.append(SpectralGroup(q, slots, lam))
    return _pareto(out)


def _pareto(groups: list[SpectralGroup]) -> list[SpectralGroup]:
    """Drop members another one beats on both counts: at least as many slots and a lambda no larger
    (up to a relative 1e-9, the size-dependent rounding allowance)."""
    keep: list[SpectralGroup] = []
    for g in sorted(groups, key=lambda g: (-g.slots, g.period)):
        if all(g.max_eigenvalue < h.max_eigenvalue * (1 - 1e-9) for h in keep):
            keep.append(g)
    return sorted(keep, key=lambda g: g.period)


@dataclass(frozen=True)
class Reductions:
    """The reductions of a strategy's allocation pair to the identity's: the orthogonal groups
    (:func:`~dpmf.accounting.allocation.pld.strategy_groups`, always) and the spectral groups
    (when the Gram matrix is small enough; ``skipped`` says why not). ``period``, ``slots`` and
    ``max_norm_sq`` are the orthogonal groups' (what :mod:`.pld` reports)."""

    orthogonal: "OrthogonalGroups | None"  # (dpmf.accounting.allocation.pld; None: fresh slots)
    spectral: tuple[SpectralGroup, ...]
    skipped: str | None = None
    #: the Markov members of :mod:`.surrogates.markov_fit`: ``(q, surrogate, parts)`` per period ``q`` of the residue
    #: classes (empty: skipped, ``markov_skipped`` says why)
    markov: tuple = ()
    markov_skipped: str | None = None
    #: fresh slots (:mod:`.fresh_correlated`): Markov members of one epoch whose privacy profiles are
    #: composed over the epochs -- never offered as a single-epoch bound (:func:`reduced_epsilon`
    #: does not read them)
    composed_markov: tuple = ()
    #: the spectral members' name when it is not "spectral groups (period q)" (:mod:`.k_of_t_correlated`)
    label: str | None = None

    @property
    def period(self) -> int | None:
        return None if self.orthogonal is None else self.orthogonal.period

    @property
    def slots(self) -> int | None:
        return None if self.orthogonal is None else self.orthogonal.slots

    @property
    def max_norm_sq(self) -> float | None:
        return None if self.orthogonal is None else self.orthogonal.max_norm_sq

    def steering(self) -> "Reductions | None":
        """These reductions with the band's moving average as their only Markov member (the identity
        pair's members kept), or ``None`` when there is no such member, no other, or there are
        composed (fresh slot) members. Its epsilon is a sound bound at least this whole set's, per direction -- the
        minimum over fewer of the same members, and the moving average, run first
        (:func:`_fit_markov_members`), is computed exactly as in the whole set -- at a fraction of
        the cost (no ring tables): a calibration steers by it where it passes (:mod:`.pld`)."""
        from dpmf.accounting.allocation.surrogates.moving_average import MovingAverageSurrogate

        if (self.composed_markov or len(self.markov) < 2
                or not isinstance(self.markov[0][1], MovingAverageSurrogate)):
            return None
        return dataclasses.replace(self, markov=self.markov[:1])

    def before_families(self) -> "Reductions | None":
        """These reductions with the Markov members before the first ring family
        (:class:`~.surrogates.markov_ring.SurrogateFamily`: a coarse ranking of several rings, then a run
        of the one picked -- about 40% of an evaluation on the README snippet's pair, 0.4 of 1.1 CPU-s), or
        ``None`` when there is no family, none before it, or there are composed (fresh slot) members. Its
        epsilon is a sound bound at least this whole set's, per direction: the minimum over a prefix of the
        same members, each computed exactly as in the whole set (so memoized for it,
        :func:`~.surrogates.markov_programs.markov_epsilon`). A calibration steers by it on its way down to
        the answer (:mod:`.pld`)."""
        from dpmf.accounting.allocation.surrogates.markov_ring import SurrogateFamily

        if self.composed_markov:
            return None
        first = next((i for i, m in enumerate(self.markov) if isinstance(m[1], SurrogateFamily)), 0)
        return dataclasses.replace(self, markov=self.markov[:first]) if first else None

    def contenders(self, out: dict) -> "Reductions | None":
        """These reductions with only the Markov members with a finite epsilon (a direction) in ``out`` (an
        evaluation of them, :func:`reduced_epsilon`), or ``None`` when that is all of them (or there
        are composed, fresh-slot members). Its epsilon is a sound bound at least this whole set's (the
        minimum over fewer of the same members). Where the members left out come out ``inf`` again
        (searched below the best so far: they cannot win), it *is* this set's, bit for bit: a member that
        is ``inf`` never lowers the bound the later members are searched below, so every member kept
        is computed as in the whole set. A calibration steers its search by it near the answer (:mod:`.pld`).

        With composed (fresh-slot) members, which are computed each on its own (no bound from the others):
        the composed members that attain ``out``'s binding direction, and the identity pair's members only
        where none of them does (:meth:`_composed_contenders`)."""
        if self.composed_markov:
            return self._composed_contenders(out)
        if not self.markov:
            return None
        rows = out.get("reductions", [])[-len(self.markov):]
        if len(rows) != len(self.markov):  # pragma: no cover - every member has its row
            return None
        keep = tuple(m for m, row in zip(self.markov, rows)
                     if any(math.isfinite(v) for v in row.get("epsilon_by_direction", {}).values()))
        return None if len(keep) == len(self.markov) else dataclasses.replace(self, markov=keep)

    def _composed_contenders(self, out: dict) -> "Reductions | None":
        """:meth:`contenders` with composed members: the members whose row attains ``out``'s epsilon in
        its binding direction (the larger; ties kept), and the spectral groups (every one) only where no
        composed member attains it. Every member is computed on its own, so the set's epsilon per
        direction is the minimum over the same rows: at least this whole set's, and its epsilon (the
        larger direction) equal to the whole set's where the members left out lose again there and the
        other direction stays the smaller. ``None`` when that is all of them."""
        rows = out.get("reductions", [])[-len(self.composed_markov):]
        if len(rows) != len(self.composed_markov) or self.markov:  # pragma: no cover - every member has its row
            return None
        best = {d: v for d, v in out["epsilon_by_direction"].items() if v >= out["epsilon"]}
        won = [{d for d, v in best.items() if row["epsilon_by_direction"].get(d) == v} for row in rows]
        keep = tuple(m for m, w in zip(self.composed_markov, won) if w)
        spectral = () if set().union(*won) == set(best) else self.spectral
        if len(keep) == len(self.composed_markov) and len(spectral) == len(self.spectral):
            return None
        return dataclasses.replace(self, spectral=spectral, composed_markov=keep)

    def candidates(self) -> list[tuple[str, int, float]]:
        """``(label, slots, noise scale squared)`` of every member, orthogonal groups first (none
        for fresh slots: :mod:`.fresh_correlated`)."""
        og = self.orthogonal
        if og is None:
            return [(self.label or f"spectral groups (period {g.period})", g.slots, g.max_eigenvalue) for g in self.spectral]
        out = [(f"orthogonal groups (period {og.period})", og.slots, og.max_norm_sq)]
        for g in self.spectral:  # (members the orthogonal groups beat on both counts are left out)
            if g.slots > og.slots or g.max_eigenvalue < og.max_norm_sq * (1 - 1e-9):
                out.append((f"spectral groups (period {g.period})", g.slots, g.max_eigenvalue))
        return out


def gram_problem(strategy, steps: int, slots: int, what: str, remedy: str) -> str | None:
    """Why a reduction that needs the ``slots x slots`` Gram matrix of ``strategy``'s columns (``steps``
    of them) does not apply -- the matrix is over :data:`MAX_GRAM_ENTRIES`, or ``C`` is not
    non-negative lower-triangular -- or ``None``; ``what`` and ``remedy`` are the message's."""
    dim = getattr(strategy, "n", steps)
    if slots * max(slots, dim) > MAX_GRAM_ENTRIES:
        return (f"{what}: the bound needs the {slots} x {slots} Gram matrix; slots * max(slots, N) = "
                f"{slots * max(slots, dim)} > {MAX_GRAM_ENTRIES}: use {remedy}")
    try:
        mixture_means(strategy, 1, steps)
    except DPMFError as exc:
        return str(exc)
    return None


def strategy_reductions(strategy, scheme, orthogonal) -> Reductions:
    """:class:`Reductions` of ``strategy`` under the balls-in-bins ``scheme``, given its orthogonal
    groups (:func:`~dpmf.accounting.allocation.pld.strategy_groups`)."""
    og = orthogonal
    k, n = scheme.epochs, scheme.steps
    b = n // k
    if b * max(b, n) > MAX_GRAM_ENTRIES:
        return Reductions(og, (), f"b * max(b, N) = {b * max(b, n)} > {MAX_GRAM_ENTRIES}: orthogonal groups only")
    means = mixture_means(strategy, k, n)
    members, why = markov_members(means, og.period)
    return Reductions(og, tuple(spectral_groups(means, max_period=og.period)), None, members, why)


def markov_members_tried(slots: int, steps: int) -> bool:
    """Whether the Markov members are tried for ``slots`` slots per epoch of ``steps`` (the bounds of
    :func:`strategy_reductions` and :func:`markov_members`; fresh slots use the same slot bound): the
    Gram matrix fits :data:`MAX_GRAM_ENTRIES` and ``slots <= MAX_SLOTS``. Cheap (no Gram, no fit): the
    dispatcher orders a calibration's searches by it."""
    from dpmf.accounting.allocation.surrogates.markov_chain import MAX_SLOTS

    b, n = int(slots), int(steps)
    return b <= MAX_SLOTS and b * max(b, n) <= MAX_GRAM_ENTRIES


def markov_members(means: np.ndarray, period: int):
    """Memoized by the means' contents and the period (:data:`_MEMBERS`): :func:`_fit_markov_members`."""
    key = (array_key(means), int(period), MARKOV_MAX_PERIOD, MARKOV_SLOT_BUDGET, MARKOV_RING_SLOTS)
    return _MEMBERS.get(key, lambda: _fit_markov_members(means, period))


#: The fitted members by (means, period): they do not depend on the noise, and a calibration
#: evaluates ~10 noises of one strategy.
_MEMBERS = BoundedMemo(16)


def _fit_markov_members(means: np.ndarray, period: int):
    """The Markov members (:mod:`.surrogates.markov_fit`) of the ``b x N`` means -- first, for a band of order ``<= 3``
    (at most 4 diagonals), its own moving average (:mod:`.moving_average`; the ring's corners cut) on
    all slots -- then: for each period ``q`` in
    ``1..min(MARKOV_MAX_PERIOD, period - 1, b // 2)`` (at ``q = period`` the classes are orthogonal
    and the member is the orthogonal groups) a chain dominating every residue class's Gram
    entrywise and one dominating it in the PSD sense (Lemma P of :mod:`.surrogates.markov_fit`; left out where its
    second-moment proxy is no smaller), with the Jensen parts, tried in the order (1, PSD), (2, both),
    (1, entrywise), then 3, 4 while the slots stay within :data:`MARKOV_SLOT_BUDGET`; then, for a
    cyclic Gram (several epochs), the ring members (both dominations)
    (:func:`~dpmf.accounting.allocation.surrogates.markov_ring.fit_ring_surrogate`) at the smallest period whose
    classes have at most :data:`MARKOV_RING_SLOTS` slots and at twice it, and at the smallest one the
    mixed-split ring family (:func:`~dpmf.accounting.allocation.surrogates.markov_ring.ring_family`, one member run
    per evaluation: the one a coarse program ranks best at its noise); or ``()`` and the reason."""
    from dpmf.accounting.allocation.surrogates import markov_fit, markov_ring, moving_average
    from dpmf.accounting.allocation.surrogates.markov_chain import MAX_SLOTS

    b, n = means.shape
    if b > MAX_SLOTS:
        return (), f"b = {b} > {MAX_SLOTS} slots: the Markov members' O(b^2) program is skipped for cost"
    gram = np.maximum(means @ means.T, 0.0) * (1 + 2 * (n + 2) * UNIT_ROUNDOFF)
    gram = np.maximum(gram, gram.T)
    out, work, skipped = [], 0, []
    band = moving_average.fit_moving_average(gram)
    if band is not None:  # (a band of order <= 3: its own structure, the tightest member where it applies)
        out.append((1, band, ((b, 1.0),)))
    top = min(MARKOV_MAX_PERIOD, period - 1, b // 2)
    # each period offers the entrywise chain (Lemma K) and the PSD-dominating one (Lemma P; it
    # follows a banded Gram's lags without the geometric tail) unless the latter's second-moment
    # proxy is no smaller. Order (it matters when the budget stops early): the PSD chain on all
    # slots (the best member on every one-epoch banded and Toeplitz case measured), then q = 2 (for
    # a few bands its classes are nearly a moving average: the entrywise chain is almost exact),
    # the entrywise chain on all slots, then q = 3, 4, while the members' slots fit the budget
    fits = {}
    for q in [q for q in (1, 2, 3, 4) if q <= top] + list(range(5, top + 1)):
        grams, parts = markov_fit.class_grams(gram, q)
        ent, psd = markov_fit.psd_member(lambda d, grams=grams: markov_fit.fit_surrogate(grams, domination=d), grams)
        fits[q] = (grams, tuple(parts), {"entrywise": ent, "psd": psd})
    order = [(1, "psd"), (2, "entrywise"), (2, "psd"), (1, "entrywise")]
    order += [(q, d) for q in sorted(fits) if q > 2 for d in ("entrywise", "psd")]
    for q, dom in order:
        if q not in fits or fits[q][2][dom] is None:
            continue
        grams, parts, surs = fits[q]
        cost = sum(n for n, _ in parts)  # (time is ~linear in the slots of each distinct class size)
        if work + cost > MARKOV_SLOT_BUDGET:
            skipped.append(f"{q} ({dom})")
            continue
        work += cost
        out.append((q, surs[dom], parts))
    # the smallest period whose classes have <= MARKOV_RING_SLOTS slots, and twice it (at larger
    # noise the classes of the doubled period, nearly moving averages, are the tighter)
    q0 = -(-b // MARKOV_RING_SLOTS)
    for q in (q0, 2 * q0):
        if q > min(MARKOV_MAX_PERIOD, period - 1, b // 2):
            break
        grams, parts = markov_fit.class_grams(gram, q)
        ent, psd = markov_fit.psd_member(lambda d, grams=grams: markov_ring.fit_ring_surrogate(grams, domination=d), grams)
        out += [(q, sur, tuple(parts)) for sur in (ent, psd) if sur is not None]
        family = markov_ring.ring_family(grams, ent, rivals=(ent, psd)) if q == q0 else None
        if family is not None:  # (the mixed-split rings around the fitted one, ranked at the call's noise)
            out.append((q, family, tuple(parts)))
    why = (f"periods q = {', '.join(map(str, skipped))} skipped for cost (the members' slots would exceed "
           f"{MARKOV_SLOT_BUDGET})") if skipped else None
    if not out:
        why = why or "no residue class has two correlated slots, or no chain passed the check"
    return tuple(out), why


def identity_pair_epsilon_lower_bound(noise_multiplier: float, slots: int, delta: float) -> float:
    r"""A lower bound on the *exact* epsilon of the identity's one-epoch allocation pair (``t = slots``
    steps at noise ``sigma``), from its remove direction, in closed form.

    With ``S = (1/t) sum_i X_i`` (module docstring; ``X_i`` i.i.d. mean-one lognormals) and Jensen's
    inequality conditional on ``X_1`` (``E[S | X_1] = (X_1 + t - 1) / t``),

        delta_R(eps) = E[(S - e^eps)_+] >= E[((X_1 + t - 1)/t - e^eps)_+]
                     = (1/t) delta_G(log(t e^eps - t + 1)),

    ``delta_G`` the Gaussian mechanism's curve at ``sigma`` (``E[(X - e^a)_+] = delta_G(a)``). So
    below ``eps_lb = log((e^{eps_G(t delta)} + t - 1) / t)`` the remove delta exceeds ``delta``, and
    every sound epsilon of the pair is ``>= eps_lb``. Used only to skip members that cannot win (a
    member's reported epsilon is an upper bound on its pair's exact epsilon); ``eps_G`` is computed
    to ~1e-9, so a relative margin of 1e-6 is taken off.

    >>> round(identity_pair_epsilon_lower_bound(1.0, 1, 1e-5), 4)   # t = 1: the Gaussian mechanism
    4.3772
    """
    from dpmf.privacy.gdp import gaussian_epsilon

    t = int(slots)
    if t * delta >= 1:
        return 0.0
    eps_g = gaussian_epsilon(noise_multiplier, t * delta)
    lb = eps_g + math.log1p((t - 1) * math.exp(-eps_g)) - math.log(t)  # log((e^eps_g + t - 1) / t)
    return max(0.0, lb * (1 - 1e-6) - 1e-9)


def reduced_epsilon(reductions: Reductions, noise_multiplier: float, delta: float, allocation_pld_epsilon,
                    **pld_options) -> dict:
    """The smallest epsilon over the reductions (each a sound bound: module docstring), computed by
    ``allocation_pld_epsilon`` (:func:`dpmf.accounting.allocation.pld.allocation_pld_epsilon`, passed
    in: that module calls this one) and in its format, with ``reductions`` listing every member's
    epsilon and ``bound`` naming the one taken.

    Members are computed in the order of their closed-form lower bounds
    (:func:`identity_pair_epsilon_lower_bound`), and a member whose lower bound is already above the
    best epsilon so far is skipped (it cannot be the minimum; its row says so). At small noise the
    members with many slots and a large ``lambda`` are at epsilon 10-20, where a grid computation
    costs seconds each (a calibration's probe at sigma 0.52 for a BLT of 8 steps took 86 s)."""
    rows, best = [], None
    members = []
    for i, (label, slots, scale_sq) in enumerate(reductions.candidates()):
        sigma = noise_multiplier / math.sqrt(scale_sq)
        members.append((identity_pair_epsilon_lower_bound(sigma, slots, delta), i, label, slots, scale_sq, sigma))
        rows.append({"bound": label, "slots": slots, "noise_scale_sq": scale_sq})  # (candidates' order)
    for lb, i, label, slots, scale_sq, sigma in sorted(members, key=lambda m: m[:2]):
        if best is not None and lb > best[1]["epsilon"]:
            rows[i].update({"epsilon": None, "skipped": f"its epsilon is >= {lb:.6g} > {best[1]['epsilon']:.6g}"})
            continue
        out = allocation_pld_epsilon(sigma, slots, delta, **pld_options)
        rows[i]["epsilon"] = out["epsilon"]
        if best is None or out["epsilon"] < best[1]["epsilon"]:
            best = (label, out)
    if best is None:  # (a calibration's steering set of composed members alone, Reductions.contenders)
        best = ("none", {"epsilon": math.inf, "epsilon_by_direction": {"remove": math.inf, "add": math.inf}})
    label, out = best
    out = dict(out)
    out["bound"] = label
    out["reductions"] = rows
    if reductions.skipped:
        out["spectral_groups_skipped"] = reductions.skipped
    if reductions.markov:
        _add_markov(out, reductions, noise_multiplier, delta)
    if reductions.markov_skipped:
        out["markov_skipped"] = reductions.markov_skipped
    return out


def _add_markov(out: dict, reductions: Reductions, sigma: float, delta: float) -> None:
    """Offer the Markov members (:mod:`.surrogates.markov_fit`): each direction's epsilon is the smallest over the
    members (each a sound bound of that direction; the true deltas are non-increasing in epsilon),
    each searched below the best epsilon so far (above it, it cannot win)."""
    from dpmf.accounting.allocation.surrogates.markov_programs import markov_epsilon
    from dpmf.accounting.allocation.surrogates.markov_ring import pick

    names = {d: out["bound"] for d in out["epsilon_by_direction"]}
    by_dir = dict(out["epsilon_by_direction"])
    for q, member, parts in reductions.markov:
        # (a family: the member a coarse program ranks best for the binding direction(s) at this noise)
        top = max(by_dir.values())
        sur = pick(member, sigma, parts, delta, top, [d for d in by_dir if by_dir[d] >= top])
        if sur is None:
            out["reductions"].append({"bound": f"ring family ({len(member.members)} mixed-split anchored rings)",
                                      "slots": max(n for n, _ in parts), "epsilon": None,
                                      "skipped": "a fitted ring ranks first on the coarse grid"})
            continue
        label = f"{sur.describe()}" + (f" on residue classes mod {q}" if q > 1 else "")
        if sur is not member:
            label += f" ({member.describe()})"
        row = {"bound": label, "slots": max(n for n, _ in parts), "epsilon_by_direction": {}}
        # a direction can lower the reported maximum only while it is the larger one: the binding
        # direction first, then the other if it has become the binding one (a table each)
        for _ in range(2):
            top = max(by_dir.values())
            need = [d for d in by_dir if by_dir[d] >= top and d not in row["epsilon_by_direction"]]
            if not need:
                break
            mk = markov_epsilon(sur, sigma, parts, delta, top, directions=tuple(need))
            row["epsilon_by_direction"].update(mk["epsilon_by_direction"])
            for d, v in mk["epsilon_by_direction"].items():
                if v < by_dir[d]:
                    by_dir[d], names[d] = v, label
        row["epsilon"] = max(row["epsilon_by_direction"].values())
        notes = []
        if math.isinf(row["epsilon"]):
            notes.append(f"searched below {top:.6g} only (it cannot win above)")
        left = [d for d in by_dir if d not in row["epsilon_by_direction"]]
        if left:
            notes.append(f"{', '.join(left)} not computed (it could not lower the larger direction)")
        if notes:
            row["note"] = "; ".join(notes)
        out["reductions"].append(row)
    if max(by_dir.values()) < out["epsilon"]:
        # (the grid keys -- refinements, steps_per_epoch, ... -- stay those of the identity-pair member)
        out["grid_keys_are_for"] = out["bound"]
        kinds = set(names.values())
        out["bound"] = kinds.pop() if len(kinds) == 1 else "; ".join(f"{d}: {n}" for d, n in names.items())
        out["epsilon"], out["epsilon_by_direction"] = max(by_dir.values()), by_dir
