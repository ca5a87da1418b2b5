r"""Correlated ``C`` under random allocation with a **fresh slot each epoch**: an amplified bound.

dpmf's own argument (not from the papers). With ``k`` epochs of ``b`` steps and a fresh slot
``tau_e`` (uniform on the epoch's ``b`` steps, independent across epochs) the example contributes at
steps ``u_e = e b + tau_e``. For an entrywise non-negative lower-triangular ``C`` the remove pair is
dominated by ``P = E_tau N(sum_e m_{u_e}, sigma^2 I)``, ``Q = N(0, sigma^2 I)`` (add: swapped), with
``m_u = C[:, u]``: the dimension reduction of MMCC (Choquette-Choo et al. 2023, Lemma B.4 and step 1
of Thm 4.3, digest ``notes/mmcc.md``) holds for any law of the participation pattern, and the
balls-in-bins case is Lemma 2.8 of Schuchardt & Kalinin (digest ``notes/random-allocation.md`` §2.4).
With ``x ~ Q`` the likelihood ratio is

    S = E_tau exp(Y_tau - Var(Y_tau) / 2),   Y_tau = sum_e Y_{u_e},   Y = M x / sigma^2 ~ N(0, G / sigma^2),

``G = M M^T`` the ``n x n`` Gram matrix of the steps' columns (``n = k b``), and both directions'
hockey-stick divergences are ``E f(S)`` for a convex ``f`` (remove ``(s - e^eps)_+``, add
``(1 - e^eps s)_+``).

**Step 1 (make the epochs independent).** For every pair ``(u, v)`` of steps in different epochs
add ``G_uv (e_u - e_v)(e_u - e_v)^T`` (positive semidefinite: ``G_uv >= 0`` as ``C >= 0``): the sum
``P`` cancels every cross-epoch entry and adds ``d_u = sum_{v in another epoch} G_uv`` to the
diagonal. With ``W ~ N(0, P / sigma^2)`` independent of ``Y`` and ``Y' = Y + W``,
``S' = E_tau exp(Y'_tau - Var(Y'_tau) / 2)`` has ``E[S' | Y] = S`` (a mean-one lognormal factor per
pattern), so ``E f(S) <= E f(S')`` (conditional Jensen). ``Y'`` has no cross-epoch covariance, so
``Var(Y'_tau) = sum_e Var(Y'_{u_e})`` and ``S' = prod_e S'_e`` with independent
``S'_e = (1/b) sum_i exp(Y'_{eb+i} - Var / 2)``, ``Cov(Y'_e) = (G_ee + diag(d)) / sigma^2``.

**Step 2 (each epoch to the identity's pair).** The spectral groups of :mod:`.correlated` (Jensen
over the residue classes modulo ``q``, then Lemma 1 at ``lambda >= lambda_max`` of each class's Gram
and Lemma 2) show ``S'_e <=_cx S*``, the mean of ``n_q`` i.i.d. mean-one lognormals of parameter
``lambda / sigma^2`` (the identity's one-epoch allocation pair with ``n_q`` steps at noise
``sigma / sqrt(lambda)``), with ``n_q`` the smallest class and ``lambda`` the largest bound over the
classes *and the epochs*. (Jensen over the classes is a convex-order step too: ``S'_e = sum_r w_r
S'_{e,r} <=_cx S'_{e,R}``, ``R`` a random class of law ``w``.)

**Step 3 (products).** For independent non-negative ``A <=_cx A'`` and ``B <=_cx B'``,
``AB <=_cx A'B'`` (``x -> f(x b)`` is convex for ``b >= 0``; condition on one factor at a time). So
``S <=_cx prod_e S*_e``, the likelihood ratio of ``k`` independent copies of the identity's pair:
both directions' epsilons are at most those of the ``k``-fold composition that
:func:`~dpmf.accounting.allocation.pld.allocation_pld_epsilon` computes with ``fresh_slots=True``
(pessimistic grid), at noise ``sigma / sqrt(lambda)`` over ``n_q`` steps. The accountant takes the
smallest over the periods ``q``.

What it costs: step 1 raises the diagonal of the steps next to an epoch boundary by their
correlation with the neighbouring epoch (for a ``p``-banded ``C``, the first and last ``p - 1``
steps of each epoch).

**Step 2' (Markov members, composed through their privacy profiles).** The Markov surrogates of
:mod:`.surrogates.markov_fit` (Kahane's inequality on the residue classes of every epoch's Gram at once, Jensen over
the classes) bound each epoch's hockey-stick curve at *every* ``gamma`` from one call table (remove:
``H_gamma <= sum_r w_r C~_n(n gamma) / n``) and one put table (add: ``H_gamma <= gamma sum_r w_r
P~_n(n / gamma) / n``; ``1`` beyond the table). A curve that is ``>= H_gamma`` everywhere is turned
into a dominating pair by connect-the-dots, and ``k`` dominating pairs compose
(:func:`~dpmf.accounting.allocation.pld_compose.profile_composition_epsilon`, steps b-d of
:mod:`.pld_compose`). Each member is a sound bound of each direction; the smallest is reported.
Step 1's larger diagonal sits at an epoch's first and last ``p - 1`` positions only: the chains keep
a stationary variance below it and raise their innovation loading there (*edges* in :mod:`.surrogates.markov_fit`),
instead of paying the boundary's variance at every position; and since an epoch's pair is symmetric
in its slots, every epoch is fitted with its raised end *last* (:func:`_raised_end_last`: a larger
loading at a chain's start adds covariance to every later position, at its end only variance; with
two epochs no chain needs a raised start; with 3-4 short epochs a member with one chain for the outer
epochs and one for the middle ones is offered too, whose epochs compose as two kinds of independent
pairs, :func:`~dpmf.accounting.allocation.pld_compose.profiles_composition_epsilon`). Each period
offers the entrywise chain
(Lemma K of :mod:`.surrogates.markov_fit`) and the PSD-dominating one (Lemma P; where its second-moment proxy is
smaller). For a band of order ``<= 3`` and at most :data:`_BAND_MAX_SLOTS` slots per epoch the band's
own moving average (:mod:`.moving_average`) is offered first (one for every epoch, and with 3-4
epochs the outer and middle ones' own): its stationary loadings follow the interior exactly and the
raised ends go into its boundary blocks (a PSD cover of the excess over the stationary block, so its
covariance is entrywise above every epoch's Gram: Lemma K). Measured at sigma 2 (composed, the
benchmark's Monte Carlo point): bsr(16, 4) over 2 epochs of 8, 1.118x -> 1.088x; Toeplitz
[1, .8, .6] over 3 epochs of 4, 1.102x -> 1.079x.

**Rounding.** ``G`` is a float product of non-negative numbers, rounded up by
``1 + 2 (N + 2) u`` entrywise; the boundary sums ``d`` are rounded up by ``1 + 2 (n + 2) u``; the
eigenvalue bounds are those of :func:`~dpmf.accounting.allocation.correlated.perron_upper_bound`.
"""

from __future__ import annotations

import math

import numpy as np

from dpmf.accounting.allocation import pld_compose
from dpmf.accounting.allocation.correlated import Reductions, gram_problem, spectral_groups_of_grams
from dpmf.accounting.allocation.dominating_pair import mixture_means
from dpmf.accounting.allocation.surrogates.protocol import Surrogate
from dpmf.errors import UnsupportedConfigurationError
from dpmf.memo import BoundedMemo, array_key
from dpmf.numerics import UNIT_ROUNDOFF
from dpmf.privacy.gdp import gaussian_epsilon

__all__ = ["epoch_grams", "fresh_slot_problem", "fresh_slot_reductions", "add_markov_compositions"]



def epoch_grams(means: np.ndarray, epochs: int) -> list[np.ndarray]:
    """The ``k`` per-epoch Gram matrices of step 1 (module docstring): ``G_ee + diag(d)``, ``d_u`` the
    sum of step ``u``'s Gram entries with the other epochs' steps, all rounded up.

    >>> import numpy as np
    >>> m = np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])  # 2 epochs x 2
    >>> [g.round(12).tolist() for g in epoch_grams(m, 2)]
    [[[1.0, 1.0], [1.0, 3.0]], [[3.0, 1.0], [1.0, 1.0]]]
    """
    m = np.asarray(means, dtype=np.float64)
    n, dim = m.shape
    b = n // epochs
    gram = np.maximum(m @ m.T, 0.0) * (1 + 2 * (dim + 2) * UNIT_ROUNDOFF)
    gram = np.maximum(gram, gram.T)
    epoch = np.arange(n) // b
    cross = np.where(epoch[:, None] != epoch[None, :], gram, 0.0).sum(axis=1) * (1 + 2 * (n + 2) * UNIT_ROUNDOFF)
    out = []
    for e in range(epochs):
        idx = slice(e * b, (e + 1) * b)
        g = gram[idx, idx].copy()
        g[np.diag_indices(b)] += cross[idx]
        out.append(g * (1 + 2 * UNIT_ROUNDOFF))  # (the diagonal sum, rounded up)
    return out


def fresh_slot_problem(strategy, scheme) -> str | None:
    """Why the bound does not apply to ``strategy`` under the fresh-slot ``scheme`` (``C`` not
    non-negative lower-triangular, or the Gram matrix of all steps too large), or ``None``."""
    return gram_problem(strategy, scheme.steps, scheme.steps, "fresh slots with a correlated C",
                        "montecarlo or reused slots")


def fresh_slot_reductions(strategy, scheme) -> Reductions:
    """:class:`~dpmf.accounting.allocation.correlated.Reductions` bounding ``strategy`` under ``scheme``
    with a fresh slot each epoch (no orthogonal groups): each spectral member ``(q, slots, lambda)``
    means the ``k``-fold composition of the identity's one-epoch pair with ``slots`` steps at noise
    ``sigma / sqrt(lambda)``; ``composed_markov`` holds the Markov members of step 2', whose profiles
    :func:`add_markov_compositions` composes (module docstring)."""
    why = fresh_slot_problem(strategy, scheme)
    if why:
        raise UnsupportedConfigurationError(why)
    k, n = scheme.epochs, scheme.steps
    grams = epoch_grams(mixture_means(strategy, 1, n), k)
    return Reductions(None, tuple(spectral_groups_of_grams(grams)), composed_markov=_markov_members(grams))


def _markov_members(grams) -> tuple:
    """Memoized by the oriented Grams' contents and this module's settings (:data:`_MEMBERS`):
    :func:`_fit_markov_members`."""
    grams = [_raised_end_last(g) for g in grams]
    key = (array_key(*grams), _BAND_MAX_SLOTS, _MARKOV_PERIODS, _SPLIT_EPOCHS, _SPLIT_MAX_SLOTS)
    return _MEMBERS.get(key, lambda: _fit_markov_members(grams))


#: The fitted members by their epoch Grams (they do not depend on the noise): a calibration
#: evaluates ~10 noises of one strategy; fitting took 60-80% of each evaluation of the default
#: plan's bsr-4 with fresh slots (5 epochs of 100), every one the same fit.
_MEMBERS = BoundedMemo(16)


def _fit_markov_members(grams) -> tuple:
    """From the epochs' Grams (raised diagonal last, :func:`_raised_end_last`): ``(q, chains, parts)``
    for ``q = 1.._MARKOV_PERIODS``, ``chains = ((surrogate, epochs), ...)``
    with each surrogate dominating the residue classes of the epochs it covers (step 2'): one chain for
    every epoch, entrywise and in the PSD sense (Lemma P of :mod:`.surrogates.markov_fit`; where its second-moment
    proxy is smaller); and with 3 or 4 epochs of at most 32 slots (q = 1) one chain for the first and
    last epochs and one for the middle ones (:data:`_SPLIT_EPOCHS`, :data:`_SPLIT_MAX_SLOTS`). ``()`` above
    :data:`~dpmf.accounting.allocation.surrogates.markov_chain.MAX_SLOTS`."""
    from dpmf.accounting.allocation.surrogates import markov_fit, moving_average
    from dpmf.accounting.allocation.surrogates.markov_chain import MAX_SLOTS

    b = grams[0].shape[0]
    if b > MAX_SLOTS:
        return ()
    k = len(grams)
    every = tuple(range(k))
    out = []
    if b <= _BAND_MAX_SLOTS:  # (a band of order <= 3: its own structure, the raised ends in its boundary blocks)
        band = moving_average.fit_moving_average(grams)
        if band is not None:
            out.append((1, ((band, every),), ((b, 1.0),)))
            if k in _SPLIT_EPOCHS:  # (as the chains below: the outer epochs' and the middle ones' own)
                outer, middle = (0, k - 1), tuple(range(1, k - 1))
                o, m = (moving_average.fit_moving_average([grams[e] for e in eps]) for eps in (outer, middle))
                if o is not None and m is not None:
                    out.append((1, ((o, outer), (m, middle)), ((b, 1.0),)))
    for q in range(1, min(_MARKOV_PERIODS, b // 2) + 1):
        parts = tuple(markov_fit.class_grams(grams[0], q)[1])  # (every epoch has b slots: the same classes)

        def fit(epochs, q=q):
            classes = [c for e in epochs for c in markov_fit.class_grams(grams[e], q)[0]]
            return markov_fit.psd_member(lambda d: markov_fit.fit_surrogate(classes, edges=True, domination=d), classes)

        ent, psd = fit(every)
        out += [(q, ((sur, every),), parts) for sur in (psd, ent) if sur is not None]
        if q == 1 and k in _SPLIT_EPOCHS and b <= _SPLIT_MAX_SLOTS:
            outer, middle = (0, k - 1), tuple(range(1, k - 1))
            (o_ent, o_psd), (m_ent, m_psd) = fit(outer), fit(middle)
            # the same domination in both groups (the PSD one where offered, else the entrywise one;
            # and both entrywise): on the 3-epoch benchmark cases the best pairs were of this kind
            pairs = [(o_psd or o_ent, m_psd or m_ent)]
            if pairs[0] != (o_ent, m_ent):
                pairs.append((o_ent, m_ent))
            out += [(q, ((o, outer), (m, middle)), parts) for o, m in pairs if o is not None and m is not None]
    return tuple(out)


#: Epoch counts for which the first and last epochs get their own chain (their raised diagonal sits at
#: one end only, after :func:`_raised_end_last`; a middle epoch's at both). Monte Carlo of the composed
#: surrogates' pairs at sigma 2: Toeplitz [1, .8, .6] over 3 fresh epochs of 4, 5.228 -> 4.987; bsr(24, 3)
#: over 3 of 8, 2.630 -> 2.552. From 5 epochs on, the outer epochs are at most 2 of 5 and the extra
#: chains' tables are not spent (the default plan has 5 epochs).
_SPLIT_EPOCHS = (3, 4)
#: ... and with at most this many slots per epoch: the raised diagonal's share of an epoch shrinks with
#: its length (bsr(300, 4) over 3 fresh epochs of 100 at sigma 3, delta 1e-6: 0.5374 -> 0.5352 for
#: 2.2x the time, 12 -> 26 s; bsr(24, 3) over 3 of 8 at sigma 2: -3%, Toeplitz over 3 of 4: -5%).
_SPLIT_MAX_SLOTS = 32
#: The band's own moving average (:mod:`.moving_average`) is offered with at most this many slots per
#: epoch (8 tables of ``m^w`` states each per evaluation: ~1.3 s per table at 32 slots, w = 3).
_BAND_MAX_SLOTS = 32


def _raised_end_last(gram: np.ndarray) -> np.ndarray:
    """``gram`` with its slots in reverse order if step 1 raised its diagonal more in the first half
    than in the second. An epoch's pair does not depend on the order of its slots (``S'_e`` is a
    symmetric sum), but a chain pays a raised diagonal at its *start* with a larger innovation
    loading that adds covariance to every later position (*edges* in :mod:`.surrogates.markov_fit`), at its end with
    variance only. Measured (Monte Carlo of the fitted surrogates' composed pairs): bsr(16, 4) over 2
    fresh epochs of 8 at sigma 2, 2.610 -> 2.451 (the decoupled pair 2.332, the exact pair 2.210)."""
    d = np.diag(gram)
    half = d.size // 2
    return gram[::-1, ::-1].copy() if d[:half].sum() > d[d.size - half:].sum() else gram


#: The Markov members are tried on residue classes modulo ``1..this``: on every case of
#: ``bench_allocation_fresh_correlated.py`` and the default plan's bsr-4 row (5 fresh epochs of 100) the
#: members modulo 3 and 4 never gave the smallest epsilon (their classes are nearly independent: the
#: spectral groups' bound), and each costs 8 tables per evaluation.
_MARKOV_PERIODS = 2
#: The put tables reach strikes ``n * r`` for ``r`` in these (the widest: the add loss down to
#: ``-log r``), the call tables ``n e^t`` for ``t`` in these and the profile's top ``eps_top``. A table
#: has a fixed number of strike nodes, so a short one is finer; at each ``gamma`` the smallest bound
#: over the tables that reach it is taken (each is sound). Measured on bsr(128, 4) over 2 fresh epochs
#: of 64 at sigma 2, one epoch's add epsilon through the profile: 0.810 with one put table at 16 (its
#: 600 strike nodes spread over the whole add-loss range), 0.527 with these (the chain's own add table
#: at the top: 0.526); 5 calls and 3 puts per member instead of 2 and 1.
_PUT_REACHES = (1.25, 2.0, 16.0)
_SHORT_CALL_REACHES = (0.5, 1.0, 2.0)


def _profiles(sur: Surrogate, parts, sigma: float, eps_top: float, delta: float = 1e-6) -> dict:
    """Per direction ``(d, eps_lo, eps_hi)`` (step 2'): ``d(gamma) >= H_gamma`` of one epoch's pair."""
    from dpmf.accounting.allocation.surrogates.markov_programs import calls_at, on_threads, puts_at

    call_k = [math.exp(t) * 1.02 for t in sorted({min(t, eps_top) for t in _SHORT_CALL_REACHES} | {eps_top})]
    put_k = [r * 1.0001 for r in _PUT_REACHES]
    jobs = [("call", n, k) for n, _ in parts for k in call_k] + [("put", n, k) for n, _ in parts for k in put_k]

    def run(job):
        kind, n, k = job
        return sur.table(sigma, n, kind, n * k, delta)

    # (a surrogate with its own tables, :mod:`.moving_average`, runs them in turn: its kernels are parallel)
    tables = iter([run(job) for job in jobs] if sur.parallel_tables else on_threads(run, jobs))
    calls = [(n, w, [next(tables) for _ in call_k]) for n, w in parts]
    puts = [(n, w, [next(tables) for _ in put_k]) for n, w in parts]
    infl = 1 + 4 * (len(parts) + 2) * UNIT_ROUNDOFF

    def d_remove(gam):
        tot = 0.0
        for n, w, tabs in calls:
            tot = tot + w * np.min([calls_at(st, ca, n * gam) for st, ca in tabs], axis=0) / n
        return np.minimum(tot * infl, 1.0)

    def d_add(gam):
        tot = 0.0
        for n, w, tabs in puts:
            with np.errstate(invalid="ignore", over="ignore"):
                vals = [np.nan_to_num(gam * puts_at(ps, pu, n / gam) / n, nan=np.inf) for ps, pu in tabs]
            tot = tot + w * np.min(vals, axis=0)
        with np.errstate(invalid="ignore", over="ignore"):
            return np.minimum(np.nan_to_num(tot * infl, nan=1.0, posinf=1.0), 1.0)

    return {"remove": (d_remove, -max(5.0, eps_top), eps_top), "add": (d_add, -math.log(max(_PUT_REACHES)), eps_top)}


def _composed_row(member, sigma: float, delta: float, epochs: int, profiles: dict) -> dict:
    """One composed Markov member's row (its label, slots and epsilon per direction): its chains' one-epoch
    profiles (``profiles``: shared by the members of one evaluation) composed over the epochs."""
    q, chains, parts = member
    budget = pld_compose.BUDGET * delta / (4 * max(1, math.ceil(math.log2(epochs + 1))) + 4)
    if len(chains) == 1:
        label = chains[0][0].describe()
    else:
        label = "; ".join(f"epochs {', '.join(str(e + 1) for e in eps)}: {sur.describe()}" for sur, eps in chains)
    label += (f" on residue classes mod {q}" if q > 1 else "") + f", composed over {epochs} epochs"
    for sur, _ in chains:
        if id(sur) not in profiles:
            # the tables' reach: the Gaussian mechanism at the chain's variance (>= every mean's
            # squared norm) bounds the epoch's curve by ``budget`` beyond it (tightness only)
            top_var = max(float(np.max(sur.variances(n))) for n, _ in parts) * (1 + 1e-9)
            eps_top = gaussian_epsilon(sigma / math.sqrt(top_var), budget)
            profiles[id(sur)] = _profiles(sur, parts, sigma, eps_top, budget)
    comp = pld_compose.profiles_composition_epsilon([(profiles[id(sur)], len(eps)) for sur, eps in chains], delta)
    return {"bound": label, "slots": max(n for n, _ in parts), "epsilon": comp["epsilon"],
            "epsilon_by_direction": comp["epsilon_by_direction"]}


#: Composed members' rows by (member, noise, delta, epochs): each member is computed on its own (no
#: bound from the others), so a calibration that steers by some of them (:meth:`Reductions.contenders`,
#: :mod:`.pld`) and then runs all of them at the same noise computes each once, bit for bit the same.
_COMPOSED = BoundedMemo(256)


def add_markov_compositions(out: dict, reductions: Reductions, sigma: float, delta: float, epochs: int) -> None:
    """Offer the Markov members composed over the epochs (step 2'): each direction's epsilon is the
    smallest over the spectral result ``out`` and the members; their rows are appended to
    ``out["reductions"]``."""
    if not reductions.composed_markov:
        return
    by_dir, names = dict(out["epsilon_by_direction"]), {d: out["bound"] for d in out["epsilon_by_direction"]}
    profiles = {}  # (a chain shared by several members is tabulated once)
    for member in reductions.composed_markov:
        row = _COMPOSED.get((member, float(sigma), float(delta), int(epochs)),
                            lambda: _composed_row(member, sigma, delta, epochs, profiles), copy_out=True)
        out["reductions"].append(row)
        for d, v in row["epsilon_by_direction"].items():
            if v < by_dir[d]:
                by_dir[d], names[d] = v, row["bound"]
    if max(by_dir.values()) < out["epsilon"] or any(names[d] != out["bound"] for d in names):
        kinds = set(names.values())
        out["bound"] = kinds.pop() if len(kinds) == 1 else "; ".join(f"{d}: {n}" for d, n in names.items())
        out["epsilon"], out["epsilon_by_direction"] = max(by_dir.values()), by_dir
