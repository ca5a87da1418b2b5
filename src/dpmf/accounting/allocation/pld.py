r"""PLD accountant for DP-SGD (``C = I``) under random allocation (balls-in-bins), sound and tight.

Feldman & Shenfeld, "Privacy amplification by random allocation" (arXiv 2502.08202) and
"Efficient privacy loss accounting for subsampling and random allocation" (arXiv 2602.17284):
the privacy loss of 1-out-of-``t`` random allocation of a Gaussian step is a log-sum-exp of ``t``
i.i.d. Gaussian losses, so its PLD is a ``t``-fold convolution in exp-space. This module computes
that distribution on a grid whose every rounding and truncation is pessimistic.

**The pair.** One epoch of ``t`` steps, each example in exactly one uniformly random step, noise
``sigma`` (clip norm 1). The dominating pair (Lemma 2.8 of the digest ``notes/random-allocation.md``
with ``C = I``) is ``P = (1/t) sum_i N(e_i, sigma^2 I_t)`` and ``Q = N(0, sigma^2 I_t)``: remove is
``(P, Q)``, add is ``(Q, P)``. With ``x ~ Q`` the likelihood ratio is

    S = dP/dQ(x) = (1/t) sum_i X_i,   X_i = exp((x_i - 1/2) / sigma^2)  i.i.d. lognormal,
    log X_i ~ N(-eta/2, eta),  eta = 1 / sigma^2,  E X_i = 1,

and both hockey-stick divergences are expectations of convex functions of ``S`` under ``Q``:

    remove:  delta_R(eps) = E_P[(1 - e^{eps - L})_+] = E[(S - e^eps)_+]
    add:     delta_A(eps) = E_Q[(1 - e^eps dP/dQ)_+] = E[(1 - e^eps S)_+].

``t = 1`` is the Gaussian mechanism (both directions). ``k`` epochs with the slot reused
(:class:`~dpmf.sampling.BallsInBinsSampling`) are one epoch at ``sigma / sqrt(k)``, exactly
(:mod:`dpmf.accounting.reductions`), so ``eta = k / sigma^2``. (A ``k``-fold PLD self-composition of
one epoch would describe a *fresh* slot each epoch, which is a different, more private sampler;
it is not a bound for reused slots and is not used.)

**Pessimistic computation** (the grid engine, :mod:`~dpmf.accounting.allocation.grid`): the law
of ``sum_i X_i`` on a grid whose every rounding and truncation is pessimistic (spread to the grid,
repeated squaring by convolution, windows with exactly charged cuts, FFT error allowances, exact
queries); its module docstring gives the five steps and their proofs. The grid is refined until
two successive epsilons agree to ``rel_tol``, and the smallest epsilon seen is reported. The
result is also never above the Gaussian mechanism's epsilon at ``sigma / sqrt(k)``
(post-processing: revealing the slot), which is the reported value when it is smaller.

**Beyond the identity: orthogonal groups** (:func:`orthogonal_groups`; dpmf's own argument,
not from the papers). For any entrywise non-negative, lower-triangular ``C`` the dominating pair
of Lemma 2.8 has ``S = (1/b) sum_i X_i`` with ``X_i = exp(<m_i, x>/sigma^2 - |m_i|^2/(2 sigma^2))``,
``x ~ N(0, sigma^2 I)``: lognormals of mean 1 and parameter ``eta_i = |m_i|^2 / sigma^2``, now
*dependent* (``Cov(<m_i, x>, <m_j, x>) = sigma^2 G_ij``). If the slots split into the residue
classes modulo ``p`` and ``G_ij = 0`` for any two slots of one class, the ``X_i`` of a class are
jointly Gaussian in the exponent and uncorrelated, hence independent. Then, for any convex ``f``
(both directions' integrands are convex in ``S``),

    E f(S) = E f(sum_r (n_r / b) S_r) <= sum_r (n_r / b) E f(S_r) <= E f(S*),

where ``S_r`` is the mean of class ``r`` (``n_r`` slots) and ``S*`` the mean of ``n_min = min_r n_r``
i.i.d. lognormals of parameter ``eta_max = max_i eta_i``: Jensen's inequality, then convex order
(a mean-one lognormal grows in convex order with ``eta``; independent sums keep convex order; the
mean of ``n`` i.i.d. variables is convex-order smaller than the mean of fewer). So both deltas are
at most those of the identity's pair with ``t = n_min`` steps at noise ``sigma / sqrt(g_max)``
(``g_max = max_i G_ii``), computed by the machinery above. For a ``p``-banded ``C`` in one epoch
(or ``k`` epochs with ``p`` dividing ``b``) ``n_min = floor(b / p)``: the bound counts
``b / p`` slots instead of ``b``. How far it goes: for the identity it *is* the exact pair
(``p = 1``); for BSR / banded Toeplitz with a few bands it is a cheap amplified bound, looser as
``p`` grows (it forgets the partial correlation inside a band); for a dense ``C`` (BLT,
sqrt-Toeplitz, the optimal factorization) ``p = b`` and it is the Gaussian mechanism at
``sigma / sqrt(g_max)``, with no amplification. ``method="auto"`` takes the smaller of it and the
Rényi / conditional-composition bounds. Orthogonality is decided from the supports of the means
(``G_ij = 0`` exactly iff their supports are disjoint, ``C >= 0``), never from float products
that could underflow to zero, and ``g_max`` is rounded up.

**Cost.** See :mod:`~dpmf.accounting.allocation.grid`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from dataclasses import dataclass

import numpy as np

from dpmf import validation as _v
from dpmf.accounting.allocation import pld_compose, pld_curve
from dpmf.accounting.allocation.grid import PILOT_POINTS, refine
from dpmf.accounting.allocation.correlated import markov_members_tried, reduced_epsilon, strategy_reductions
from dpmf.accounting.allocation.fresh_correlated import add_markov_compositions, fresh_slot_problem, fresh_slot_reductions
from dpmf.accounting.allocation import k_of_t_correlated
from dpmf.accounting.allocation.k_of_t_correlated import k_of_t_problem, k_of_t_reductions
from dpmf.accounting.allocation.dominating_pair import (
    describe_strategy,
    mixture_means,
    pair_problem,
    toeplitz_coefficients,
)
from dpmf.accounting.guard import check_pair, guarded, recorded_options
from dpmf.accounting.report import PrivacyReport
from dpmf.errors import InvalidParameterError
from dpmf.memo import BoundedMemo
from dpmf.numerics import UNIT_ROUNDOFF
from dpmf.accounting.allocation.noise_search import smallest_noise_and_report
from dpmf.privacy.calibration import ProgressCallback
from dpmf.privacy.gdp import gaussian_epsilon
from dpmf.resources import one_blas_thread
from dpmf.sampling.schemes import BallsInBinsSampling
from dpmf.strategies.identity import Identity

__all__ = [
    "NAME",
    "supports",
    "allocation_pld_epsilon",
    "account_allocation_pld",
    "calibrate_allocation_pld",
    "noise_and_report",
    "OrthogonalGroups",
    "orthogonal_groups",
    "toeplitz_orthogonal_groups",
    "strategy_groups",
    "searches_markov_members",
]

NAME = "allocation_pld"
#: Relative agreement of two successive grid refinements at which refinement stops.
DEFAULT_REL_TOL = 2e-4
#: Largest number of grid points in one window (memory ~ 40 bytes per point).
DEFAULT_MAX_POINTS = 2**20


def supports(strategy, scheme) -> str | None:
    """``None`` under balls-in-bins sampling for the identity (the exact pair) and for any
    non-negative lower-triangular ``C`` (the orthogonal-groups bound), else why not."""
    if not isinstance(scheme, BallsInBinsSampling):
        return f"the random-allocation PLD accountant needs BallsInBinsSampling, got {type(scheme).__name__}"
    if isinstance(strategy, Identity):
        return None
    if getattr(scheme, "num_selected", 1) > 1:  # (k_of_t_correlated.py)
        return k_of_t_problem(strategy, scheme)
    if _fresh(scheme):  # (fresh_correlated.py)
        return fresh_slot_problem(strategy, scheme)
    return pair_problem(strategy, scheme)


@dataclass(frozen=True)
class OrthogonalGroups:
    """The reduction of a strategy's allocation pair to the identity's (module docstring).

    ``period``: slots ``i`` and ``j`` with ``i = j (mod period)`` have orthogonal means;
    ``slots``: ``n_min``, the size of the smallest residue class (the identity pair's ``t``);
    ``max_norm_sq``: ``g_max = max_i |m_i|^2``, rounded up (noise scale ``1 / sqrt(g_max)``).
    """

    period: int
    slots: int
    max_norm_sq: float


def orthogonal_groups(means: np.ndarray, *, exact: bool | None = None) -> OrthogonalGroups:
    """The smallest period ``p`` such that slots in one residue class modulo ``p`` have pairwise
    disjoint supports (so orthogonal means and independent lognormals), for the ``b x N`` mixture
    means of :func:`~dpmf.accounting.allocation.dominating_pair.mixture_means`.

    Supports are compared through 0/1 indicator products (exact integer counts), never through
    float products that might underflow: time ``O(b^2 N)``, memory ``O(b^2)``. Every pair of a
    class is checked, so a wrap-around overlap (several epochs) is always seen. Above ``b^2 N =
    2e8`` (or with ``exact=False``) the supports are replaced by their spans ``[first, last]``
    nonzero column: disjoint spans imply disjoint supports, so the period found is never smaller
    than the exact one (a looser, still sound bound): time ``O(b N + b^2)``.

    >>> import numpy as np
    >>> g = orthogonal_groups(np.eye(6))                   # the identity: every slot alone
    >>> (g.period, g.slots), 1.0 <= g.max_norm_sq < 1.0 + 1e-14   # (the norm is rounded up)
    ((1, 6), True)
    >>> m = np.eye(6) + 0.5 * np.eye(6, k=1)               # 2-banded C, one epoch
    >>> g = orthogonal_groups(m); (g.period, g.slots)
    (2, 3)
    """
    M = np.asarray(means, dtype=np.float64)
    b, n = M.shape
    supp = M > 0
    if exact is None:
        exact = float(b) * b * n <= 2e8
    if exact:
        ind = supp.astype(np.float64)
        overlap = ind @ ind.T  # exact: integer counts below 2^53
        lags = np.array([False] + [bool(np.any(np.diagonal(overlap, L) > 0)) for L in range(1, b)])
    else:
        nz = supp.any(axis=1)
        first = np.where(nz, supp.argmax(axis=1), n)  # an empty row overlaps nothing
        last = np.where(nz, n - 1 - supp[:, ::-1].argmax(axis=1), -1)
        lags = np.array([False] + [
            bool(np.any((first[L:] <= last[:-L]) & (first[:-L] <= last[L:]))) for L in range(1, b)
        ])
    return _groups(lags, np.einsum("ij,ij->i", M, M).max(initial=0.0), n)


def toeplitz_orthogonal_groups(h: np.ndarray, b: int) -> OrthogonalGroups:
    """:func:`orthogonal_groups` for Toeplitz means ``m_i[r] = h[r - i]`` (``r >= i``), without the
    ``b x N`` means: slot ``0`` has the whole support ``S`` of ``h``, so slots at distance ``L``
    overlap iff ``S`` meets ``S + L`` (an autocorrelation of 0/1 indicators, by FFT, counts
    rounded at 1/2). ``|m_0|^2 = sum h^2`` is the largest norm. Time ``O(N log N)``, memory ``O(N)``."""
    h = np.asarray(h, dtype=np.float64)
    n = h.size
    ind = (h > 0).astype(np.float64)
    spec = np.fft.rfft(ind, 2 * n)
    auto = np.fft.irfft(spec * np.conj(spec), 2 * n)[:b]  # auto[L] = #{t in S: t + L in S}
    lags = auto > 0.5
    lags[0] = False
    return _groups(lags, float(np.dot(h, h)), n)


def _groups(lags: np.ndarray, max_norm_sq: float, n: int) -> OrthogonalGroups:
    b = lags.size
    period = next((p for p in range(1, b + 1) if not np.any(lags[p::p])), b)
    g_max = float(max_norm_sq) * (1.0 + 2.0 * (n + 2) * UNIT_ROUNDOFF) + float(np.finfo(np.float64).tiny)  # rounded up
    return OrthogonalGroups(period, b // period, g_max)


def strategy_groups(strategy, scheme) -> OrthogonalGroups:
    """:class:`OrthogonalGroups` of ``strategy`` under balls-in-bins ``scheme`` (Toeplitz strategies
    from their coefficients, others from the means)."""
    k, b = scheme.epochs, scheme.steps_per_epoch
    if isinstance(strategy, Identity):
        return OrthogonalGroups(1, b, float(k))
    c = None if isinstance(strategy, (np.ndarray, list, tuple)) else toeplitz_coefficients(strategy, scheme.steps)
    if c is not None and np.all(np.isfinite(c)) and np.all(c >= 0):
        return toeplitz_orthogonal_groups(np.cumsum(c.reshape(k, b), axis=0).ravel(), b)
    return orthogonal_groups(mixture_means(strategy, k, scheme.steps))


def allocation_pld_epsilon(
    noise_multiplier: float,
    steps: int,
    delta: float,
    *,
    epochs: int = 1,
    num_selected: int = 1,
    fresh_slots: bool = False,
    rel_tol: float = DEFAULT_REL_TOL,
    max_points: int = DEFAULT_MAX_POINTS,
) -> dict:
    """Epsilon (both directions) of ``epochs`` epochs of ``num_selected``-out-of-``steps`` random
    allocation of a Gaussian step with noise ``noise_multiplier`` (sensitivity 1, ``C = I``).

    ``steps`` is ``t``, the steps per epoch; each example is in ``k = num_selected`` distinct
    uniformly random steps of an epoch. ``fresh_slots=False``: the steps are drawn once and reused
    every epoch (``E`` epochs = one epoch at ``sigma / sqrt(E)``, exact); ``True``: drawn anew each
    epoch (the ``E``-fold composition). ``k > 1`` is bounded by a composition of 1-of-``floor(t/k)``
    and 1-of-``ceil(t/k)`` allocations (:mod:`~dpmf.accounting.allocation.pld_compose`). A single
    copy (``k = 1``, reused slots or one epoch) is computed directly (module docstring), so
    ``fresh_slots`` over one epoch equals reused slots exactly, and ``num_selected=1`` is one-slot
    allocation.

    Returns a dict with ``epsilon``, ``epsilon_by_direction``, ``refinements`` (per direction: the
    grid spacing ``h`` in sum units, the widest window's points and the epsilon of each level; or
    ``compositions`` for a composition), ``gaussian_epsilon`` and ``seconds``.
    """
    start = time.perf_counter()
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    t = _v.positive_int("steps", steps)
    k = _v.positive_int("epochs", epochs)
    sel = _v.positive_int("num_selected", num_selected)
    if sel > t:
        raise InvalidParameterError(f"num_selected must be <= steps ({t}), got {sel}")
    d = _v.open_unit("delta", delta)
    rel_tol = _v.positive("rel_tol", rel_tol)
    max_points = _v.positive_int("max_points", max_points)
    if max_points < 8 * PILOT_POINTS:
        raise InvalidParameterError(f"max_points must be >= {8 * PILOT_POINTS}, got {max_points}")
    fresh = bool(fresh_slots) and k > 1
    if sel > 1 or fresh:
        sigma_eff = sigma if fresh else sigma / math.sqrt(k)
        rounds = k if fresh else 1
        parts = [(m, c * rounds) for m, c in pld_compose.split_k_of_t(t, sel)]
        out = {"noise_multiplier_one_epoch": sigma_eff, "steps_per_epoch": t, "epochs": k,
               "num_selected": sel, "fresh_slots": bool(fresh_slots),
               "gaussian_epsilon": gaussian_epsilon(sigma / math.sqrt(k * sel), d),
               "composition": [{"steps": m, "copies": c} for m, c in parts]}
        comp = pld_compose.composition_epsilon(1.0 / sigma_eff**2, parts, d, rel_tol=rel_tol, max_points=max_points)
        by_dir = {key: min(v, out["gaussian_epsilon"]) for key, v in comp["epsilon_by_direction"].items()}
        out.update({"epsilon": max(by_dir.values()), "epsilon_by_direction": by_dir,
                    "compositions": comp["compositions"], "seconds": time.perf_counter() - start})
        return out
    sigma_eff = sigma / math.sqrt(k)
    eta = 1.0 / sigma_eff**2
    eps_gauss = gaussian_epsilon(sigma_eff, d)
    out = {"noise_multiplier_one_epoch": sigma_eff, "steps_per_epoch": t, "epochs": k,
           "gaussian_epsilon": eps_gauss}
    by_dir, levels = {}, {}
    if t == 1 or eps_gauss == 0.0 or eps_gauss > 300:
        by_dir = {"remove": eps_gauss, "add": eps_gauss}
        out["note"] = "the Gaussian mechanism's epsilon (t = 1, or a grid beyond float range)"
    else:
        by_dir["remove"], levels["remove"] = refine("remove", eta, t, d, eps_gauss, rel_tol, max_points)
        by_dir["add"], levels["add"] = refine(
            "add", eta, t, d, eps_gauss, rel_tol, max_points, enough=by_dir["remove"]
        )
    out.update({
        "epsilon": max(by_dir.values()),
        "epsilon_by_direction": by_dir,
        "refinements": levels,
        "seconds": time.perf_counter() - start,
    })
    return out


# ----------------------------------------------------------------------------- accountant
#: Results of :func:`_epsilon` for a correlated C by (reductions, scheme, noise, delta, options): the
#: reductions (frozen: every member's numbers) and the scheme determine the computation, so equal keys
#: give equal results. A calibration repeated in one process (the README's two training examples, a
#: plan row and its report) costs nothing the second time.
_MEMO = BoundedMemo(256)


def _epsilon(strategy, scheme, groups, sigma: float, d: float, accuracy, max_points) -> dict:
    """The identity's exact pair, or for any other C the best of the reductions ``groups``
    (:class:`~dpmf.accounting.allocation.correlated.Reductions`; memoized, :data:`_MEMO`)."""
    if groups is None:
        return _epsilon_of(strategy, scheme, groups, sigma, d, accuracy, max_points)
    key = (groups, scheme, float(sigma), float(d), float(accuracy), int(max_points))
    return _MEMO.get(key, lambda: _epsilon_of(strategy, scheme, groups, sigma, d, accuracy, max_points),
                     copy_out=True)


def _steering_set(groups, first: bool, last=None):
    """The cheaper member set a calibration steers by on its way down to the answer (:func:`noise_and_report`):
    at its ``first`` noise the moving average alone (``Reductions.steering``), at the next ones the
    members before the first ring family (``Reductions.before_families``) -- each a prefix of the members,
    computed as in the whole set, so an epsilon at least the accountant's, per direction; with fresh slots
    (composed members, no prefix) ``last``, the contenders of the last evaluation (``Reductions.contenders``);
    ``None`` where there is none (the identity; no such member; no evaluation yet)."""
    if groups is None:
        return None
    if groups.composed_markov:
        return last
    return groups.steering() if first else groups.before_families()


def _epsilon_of(strategy, scheme, groups, sigma: float, d: float, accuracy, max_points) -> dict:
    if groups is None:
        return allocation_pld_epsilon(
            sigma, scheme.steps_per_epoch, d, epochs=scheme.epochs, num_selected=getattr(scheme, "num_selected", 1),
            fresh_slots=getattr(scheme, "fresh_slots", False), rel_tol=accuracy, max_points=max_points,
        )
    if getattr(scheme, "num_selected", 1) != 1:  # the identity's k-of-t at sigma / sqrt(Lambda) (k_of_t_correlated.py)
        fresh = _fresh(scheme)
        return reduced_epsilon(groups, sigma, d, allocation_pld_epsilon, rel_tol=accuracy, max_points=max_points,
                               epochs=scheme.epochs if fresh else 1, fresh_slots=fresh, num_selected=scheme.num_selected)
    if _fresh(scheme):  # the k-fold composition of each member's identity pair (fresh_correlated.py)
        out = reduced_epsilon(groups, sigma, d, allocation_pld_epsilon, rel_tol=accuracy, max_points=max_points,
                              epochs=scheme.epochs, fresh_slots=True)
        add_markov_compositions(out, groups, sigma, d, scheme.epochs)
        return out
    # the smallest epsilon over orthogonal and spectral groups, each a sound reduction (correlated.py)
    return reduced_epsilon(groups, sigma, d, allocation_pld_epsilon, rel_tol=accuracy, max_points=max_points)


def searches_markov_members(strategy, scheme) -> bool:
    """Whether an evaluation of ``strategy`` under ``scheme`` runs Markov members (:mod:`.correlated`,
    :mod:`.fresh_correlated`): ``C != I``, one slot per epoch (``k``-of-``t`` has none), and the slots
    within :func:`~.correlated.markov_members_tried`'s bounds. Then one evaluation costs seconds (the
    members' tables), the Renyi/conditional accountant's a fraction of one: the dispatcher searches this
    accountant first and probes that one once at its noise (``dispatch.METHODS``). Cheap: no Gram, no fit."""
    if isinstance(strategy, Identity) or getattr(scheme, "num_selected", 1) != 1:
        return False
    return markov_members_tried(scheme.steps_per_epoch, scheme.steps)


def _fresh(scheme) -> bool:
    return bool(getattr(scheme, "fresh_slots", False)) and scheme.epochs > 1


def _reductions(strategy, scheme):
    """``None`` for the identity, else the reductions of :mod:`.correlated` (orthogonal groups and,
    when the Gram matrix is small enough, spectral groups)."""
    if isinstance(strategy, Identity):
        return None
    if getattr(scheme, "num_selected", 1) > 1:
        return k_of_t_reductions(strategy, scheme)
    if _fresh(scheme):
        return fresh_slot_reductions(strategy, scheme)
    return strategy_reductions(strategy, scheme, strategy_groups(strategy, scheme))


@guarded(NAME, supports)
def account_allocation_pld(
    strategy,
    scheme,
    noise_multiplier: float,
    delta: float,
    *,
    accuracy: float = DEFAULT_REL_TOL,
    max_points: int = DEFAULT_MAX_POINTS,
) -> PrivacyReport:
    """Epsilon of ``strategy`` under balls-in-bins ``scheme`` (module docstring): exact (up to the
    pessimistic grid) for DP-SGD (``Identity(N)``); for any other non-negative lower-triangular
    ``C`` the smallest bound, per direction, over the orthogonal groups (:func:`strategy_groups`),
    the spectral groups and the Markov members (:mod:`.correlated`, :mod:`.surrogates.markov_fit`) -- with fresh
    slots over the epochs' compositions (:mod:`.fresh_correlated`), with ``num_selected > 1`` the
    random-blocks bound (:mod:`.k_of_t_correlated`); the diagnostics' ``bound`` names the member
    used and ``reductions`` lists every member's epsilon.

    Args:
      strategy: :class:`~dpmf.strategies.Identity` with ``n = scheme.steps``, or any strategy the
        random-allocation pair covers (Toeplitz / banded / BLT from their coefficients).
      scheme: :class:`~dpmf.sampling.BallsInBinsSampling` (``k`` epochs of ``b`` steps; slots reused or
        fresh, ``num_selected`` of them per epoch).
      noise_multiplier: ``sigma > 0`` (clip norm 1).
      delta: target delta in (0, 1).
      accuracy: grid refinement stops when two levels agree to this relative tolerance.
      max_points: most grid points in one window (bounds memory and time).

    Returns:
      A certified :class:`PrivacyReport`, epsilon the worst of both directions; diagnostics hold
      the refinement levels, the Gaussian-mechanism bound and the exact epochs reduction.
    """
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    d = _v.open_unit("delta", delta)
    with one_blas_thread():  # (small Grams: the fits' eigenvalues, the members' products)
        groups = _reductions(strategy, scheme)
        out = _epsilon(strategy, scheme, groups, sigma, d, accuracy, max_points)
    return _report(strategy, scheme, groups, sigma, d, out, accuracy, max_points)


def _member(scheme, groups, sigma: float, d: float, out: dict) -> tuple[dict | None, str, bool]:
    """``(identity_pld keyword arguments or None, note, whether it is the member reported)``: the
    identity pair whose PLD bounds this report's pair at every delta (:mod:`.pld_curve`): the
    scheme's own for ``C = I``, else the reductions' best identity-pair member (the one :func:`_epsilon` reported, or -- when a Markov member gave
    the reported epsilon, which has no PLD -- the best member that has one)."""
    fresh, sel = _fresh(scheme), getattr(scheme, "num_selected", 1)
    if groups is None:
        return ({"noise_multiplier": sigma, "steps": scheme.steps_per_epoch, "epochs": scheme.epochs,
                 "num_selected": sel, "fresh_slots": fresh}, "the identity's allocation pair", True)
    rows = [r for r in out.get("reductions", ()) if "noise_scale_sq" in r and r.get("epsilon") is not None]
    if not rows:  # (no identity-pair member was computed: no PLD to carry, the report keeps its claim)
        return None, "no identity-pair reduction member was computed", False
    row = min(rows, key=lambda r: r["epsilon"])
    kw = {"noise_multiplier": sigma / math.sqrt(row["noise_scale_sq"]), "steps": row["slots"]}
    if sel != 1:
        kw.update(epochs=scheme.epochs if fresh else 1, fresh_slots=fresh, num_selected=sel)
    elif fresh:
        kw.update(epochs=scheme.epochs, fresh_slots=True)
    note = f"the identity's pair of the reduction member '{row['bound']}'"
    same = row["bound"] == out.get("bound")
    if not same:
        note += (f" (the reported epsilon came from '{out.get('bound')}', which has no PLD: this curve is the best "
                 f"member that has one, epsilon {row['epsilon']:.6g} at delta {d:.3g})")
    return kw, note, same


def _build_curve(kw: dict, note: str, d: float, eps: float, accuracy: float, max_points: int):
    """The report's curve (:attr:`PrivacyReport.curve_source` holds a ``functools.partial`` of this
    module function, so the report still pickles): the pessimistic PLD of the identity pair ``kw``
    (:func:`_member`), valid at every delta (:mod:`.pld_curve`)."""
    from dpmf.privacy.tradeoff import PrivacyCurve  # (lazy, as report.pld_report)

    pld = pld_curve.identity_pld(delta=d, rel_tol=accuracy, max_points=max_points, **kw)
    if pld is None:
        return None  # (the Gaussian mechanism's epsilon without a grid: the (epsilon, delta) claim)
    return PrivacyCurve.from_pld(pld, epsilon=eps, delta=d, note=(
        f"allocation_pld: pessimistic PLD valid at every delta (connect-the-dots hull of the grid's "
        f"hockey-stick bound, loss step {pld_curve.LOSS_STEP:g}) of {note}"))


def _report(strategy, scheme, groups, sigma: float, d: float, out: dict, accuracy: float = DEFAULT_REL_TOL,
            max_points: int = DEFAULT_MAX_POINTS) -> PrivacyReport:
    """The report of :func:`account_allocation_pld` from :func:`_epsilon`'s result ``out``, its PLD
    built on first use (:func:`_build_curve`)."""
    out = dict(out)
    kw, note, same = _member(scheme, groups, sigma, d, out)
    source = None if kw is None else functools.partial(_build_curve, kw, note, d, out["epsilon"], accuracy, max_points)
    if kw is None:
        out["pld_curve"] = f"none carried ({note}): dpmf.compose uses the (epsilon, delta) claim"
    elif not same:  # (a Markov member gave the epsilon: say which PLD is carried)
        out["pld_curve"] = "the carried PLD (dpmf.compose, tradeoff) is " + note
    by_dir = dict(out.pop("epsilon_by_direction"))
    eps = out.pop("epsilon")
    if groups is not None and groups.label == k_of_t_correlated.LABEL:
        n_sel, fresh = scheme.num_selected, _fresh(scheme)
        out["reduction"] = (
            f"{n_sel} of {scheme.steps_per_epoch} steps per epoch, {'fresh' if fresh else 'reused'} slots: random "
            "blocks made independent (cross-block Gram entries moved to the diagonal), every block bounded by the "
            "identity's pair at sigma / sqrt(largest row sum of the Gram), so the identity's "
            f"{n_sel}-of-{scheme.steps_per_epoch} allocation{f' over {scheme.epochs} fresh epochs' if fresh else ''} "
            "at that noise (k_of_t_correlated.py)"
        )
    elif groups is not None and groups.orthogonal is None:
        out["reduction"] = (
            f"{scheme.epochs} epochs of fresh slots: the epochs made independent (cross-epoch Gram entries "
            "moved to the diagonal), each reduced to the identity's pair by spectral groups, then the "
            f"{scheme.epochs}-fold composition (fresh_correlated.py)"
        )
    elif groups is not None:
        out["orthogonal_groups"] = {
            "period": groups.period, "slots": groups.slots, "max_norm_sq": groups.max_norm_sq,
            "bound": f"the identity's pair with {groups.slots} steps at sigma / sqrt({groups.max_norm_sq:.6g}) "
                     "(Jensen + convex order over orthogonal residue classes; module docstring)",
        }
    elif "composition" in out:
        out["reduction"] = (
            f"identity, {scheme.epochs} epochs, {out['num_selected']} of {scheme.steps_per_epoch} steps per epoch, "
            f"{'fresh' if out['fresh_slots'] else 'reused'} slots = a composition of one-slot allocations "
            + ", ".join(f"{c['copies']} x 1-of-{c['steps']}" for c in out["composition"])
            + (f" at sigma / sqrt({scheme.epochs})" if not out["fresh_slots"] and scheme.epochs > 1 else "")
        )
    elif scheme.epochs > 1:
        out["reduction"] = (
            f"identity, {scheme.epochs} epochs with the same slot each epoch = one epoch of "
            f"{scheme.steps_per_epoch} steps at sigma / sqrt({scheme.epochs})"
        )
    return PrivacyReport(
        epsilon=eps,
        delta=d,
        noise_multiplier=sigma,
        method=NAME,
        certified=True,
        epsilon_by_direction=by_dir,
        strategy=describe_strategy(strategy),
        scheme=scheme.describe(),
        diagnostics=out,
        curve_source=source,
    )


@guarded(NAME, supports)
def calibrate_allocation_pld(
    strategy,
    scheme,
    target_epsilon: float,
    delta: float,
    *,
    rel_tol: float = 1e-4,
    callback: ProgressCallback | None = None,
    accuracy: float = DEFAULT_REL_TOL,
    max_points: int = DEFAULT_MAX_POINTS,
) -> float:
    """Smallest noise multiplier whose :func:`account_allocation_pld` epsilon is ``<= target``.

    ``rel_tol`` is the search's relative tolerance on sigma, ``accuracy`` the accountant's
    ``rel_tol``; ``callback(sigma, epsilon)`` after each evaluation.
    """
    return noise_and_report(strategy, scheme, target_epsilon, delta, rel_tol=rel_tol, callback=callback,
                            accuracy=accuracy, max_points=max_points)[0]


# How noise_and_report's search steers (the function's own notes, kept here to keep it short).
# The search steers by cheaper sets of the same members, each a bound at least the accountant's (a
# noise where one passes passes the accountant; _steering_set):
# - at its first noise (far above the answer: the unamplified noise or a closed form's), the
#   moving-average member alone (Reductions.steering, without the ring tables);
# - on its way down to the answer, the members before the first ring family
#   (Reductions.before_families: a family's coarse ranking and run are ~40% of an evaluation on the
#   README snippet's pair). Where a family wins, their pass is still the accountant's pass, and their
#   epsilon is above the accountant's by the family's lead (on the README snippet's pair 0.06% at
#   sigma 1.37; on the README's `dpmf calibrate` pair 2.4% at sigma 1.40);
# - where one of these fails, the accountant itself (its members before a family are memoized), so
#   the first failure is the accountant's;
# - once the accountant has failed at a noise and passed at a larger one (near the answer, where
#   members that win far above it, as the moving average on the `dpmf calibrate` pair, often lose),
#   the contenders of its last evaluation -- the members that came out finite there
#   (Reductions.contenders; the others were searched below the best and could not win), narrowed by
#   each steering evaluation. Near the answer those are the accountant's own epsilons, bit for bit (on
#   the README snippet's pair: the moving average and one anchored ring; the ring family and the
#   plain chains, ~half of an evaluation, are left out).
# - with fresh slots (composed members, each computed on its own and memoized by member and noise:
#   no prefix to steer by), from the second noise on the contenders of the last evaluation -- the
#   composed members attaining its binding direction, the spectral groups only where none does; on
#   the default plan's costly row (bsr(500, 4), 5 fresh epochs of 100, epsilon 2 at delta 1e-6) a
#   steering evaluation is one member, ~1.3 of ~5.5 CPU-s (benchmarks/README.md, "fresh slots steered").
# The report at the answer is the accountant's, and unless the steering set evaluated the answer too
# and was the accountant there, the bracket's failing end is checked (smallest_noise_and_report's
# steer_at, `settled`). Where the accountant, run where the members before the family failed, comes
# out below them (the family won there), their epsilons nearby are left out of the search's chords
# (`revised`). Measured against the accountant at every noise but the first (benchmarks/README.md, "the
# way down steered by the members before the ring family"): both README calibrations 0.91-0.92x the CPU
# time; 17 more bsr pairs (bench_allocation_calibration_grid.py) the same in all -- faster where the
# family loses near the answer, by one or two evaluations slower where it wins there.
def noise_and_report(
    strategy,
    scheme,
    target_epsilon: float,
    delta: float,
    *,
    rel_tol: float = 1e-4,
    callback: ProgressCallback | None = None,
    limit: float | None = None,
    **options,
) -> tuple[float, PrivacyReport]:
    """:func:`calibrate_allocation_pld` for the dispatcher (the registry's ``fast_calibration``): the
    noise and the :func:`account_allocation_pld` report at it (with ``options``: ``accuracy``,
    ``max_points``), built from the search's own evaluation there (not evaluated twice).

    ``limit``: only noises up to it are of interest (the noise another accountant reached):
    evaluated first, :class:`~dpmf.privacy.calibration.NoiseLimitExceeded` when the epsilon there is
    above the target; otherwise the search runs as without it (from the active
    :func:`~dpmf.privacy.calibration.search_hint`, so its answer does not depend on the limit).
    """
    check_pair(NAME, supports, strategy, scheme)
    target = _v.positive("target_epsilon", target_epsilon)
    d = _v.open_unit("delta", delta)
    unknown = sorted(set(options) - {"accuracy", "max_points"})
    if unknown:
        raise InvalidParameterError(f"unknown option(s) {unknown} for allocation_pld (accepted: accuracy, max_points)")
    accuracy, max_points = options.get("accuracy", DEFAULT_REL_TOL), options.get("max_points", DEFAULT_MAX_POINTS)
    with one_blas_thread():  # (as account_allocation_pld: the fits' small Grams)
        groups = _reductions(strategy, scheme)
    # (how the search steers: the comment above this function)
    seen: dict[float, dict] = {}  # the accountant's own evaluations
    bounds: dict[float, dict] = {}  # the steering sets'
    read_by_prefix: dict[float, float] = {}  # the epsilons of the members before the family, where they steered
    family: list = []  # the noises where the accountant came out below them (the family won)
    lead: list = []  # the steering set: the contenders of the last evaluation, narrowed by each steering one (None: all)

    # (every evaluation with BLAS on one thread, as account_allocation_pld's: a threaded OpenBLAS's worker and
    # the waits for it -- the MA's `weights @ V`, the put tables' `w0 @ P` -- cost the README snippet's
    # calibration ~0.7 CPU-s on 2 CPUs, a tenth of it, for no wall time)
    def full(s: float) -> dict:
        if s not in seen:
            with one_blas_thread():
                seen[s] = _epsilon(strategy, scheme, groups, s, d, accuracy, max_points)
            lead[:] = [None if groups is None else groups.contenders(seen[s])]
        return seen[s]

    def bracketed() -> bool:  # (the accountant has failed at a noise and passed at a larger one: a steering pass is its pass)
        fails = [x for x, out in seen.items() if out["epsilon"] > target]
        return bool(fails) and any(x > min(fails) and out["epsilon"] <= target for x, out in (*seen.items(), *bounds.items()))

    def bound(s: float) -> float:  # (a steering set's epsilon where one was evaluated, else the accountant's)
        if s in seen and s not in bounds:
            return seen[s]["epsilon"]
        if s not in bounds:
            if bracketed():  # (near the answer: the contenders of the accountant's last evaluation; None: all)
                if lead[0] is None:
                    return full(s)["epsilon"]
                with one_blas_thread():
                    out = _epsilon(strategy, scheme, lead[0], s, d, accuracy, max_points)
                lead[:] = [lead[0].contenders(out) or lead[0]]  # (those that lost here are left out next)
            else:  # (on the way down; where the steering set fails, the accountant)
                first = not (seen or bounds)
                steer = _steering_set(groups, first=first, last=lead[0] if lead else None)
                if steer is None:
                    return full(s)["epsilon"]
                with one_blas_thread():
                    out = _epsilon(strategy, scheme, steer, s, d, accuracy, max_points)
                if not first:
                    read_by_prefix[s] = out["epsilon"]
                if out["epsilon"] > target:
                    own = full(s)["epsilon"]
                    if not first and own < out["epsilon"]:  # (the prefix failed where the family won)
                        family.append(s)
                    return own
            bounds[s] = out
        return bounds[s]["epsilon"]

    def eps_of(s: float) -> float:  # the accountant's verdict: a steering set's pass, else its own epsilon
        e = bound(s)
        return e if e <= target else full(s)["epsilon"]

    def revised(s: float) -> float | None:
        """The epsilon the search's steps read at ``s`` in place of the steering set's (only its aim: every
        verdict is an evaluation's): the accountant's where it was evaluated there too; none (``nan``, left
        out of the chords) where the members before the family steered within 2% of a noise where the family
        has since been seen to win. Their epsilons there are above the accountant's by about the family's
        lead, and a chord that short between the two sets of members is mostly that lead: on bsr(24, 4)
        over 2 epochs to epsilon 2.98 (the family wins by 0.7% near the answer) such chords took 22
        evaluations where 10 do. Farther off, their epsilons are kept: where the family loses there
        (the README's `dpmf calibrate` pair, bsr(32, 4) to 2.5) they are the accountant's, and where it
        wins, a chord across more than 2% tilts little."""
        if s in bounds and s in seen:
            return seen[s]["epsilon"]
        if s in read_by_prefix and s not in seen and any(abs(math.log(s / f)) < 0.02 for f in family):
            return math.nan
        return None

    def settled(passing: float, failing: float) -> bool:
        """Whether the bracket holds for the accountant as it stands: the failure is its own, or the
        steering set that failed there was the accountant at the answer, a passing noise it evaluated
        too -- the members it leaves out lost at the answer, by more than the ``rel_tol`` step below
        it is taken to change (only the answer's nearness rests on this, as on the search's premise
        that epsilon grows as the noise falls; the answer is always a pass of the accountant)."""
        if failing in seen:
            return True
        return passing in bounds and full(passing)["epsilon"] == bounds[passing]["epsilon"]

    def report_at(s: float) -> PrivacyReport:  # (at a steered pass the accountant's epsilon is at most the bound's)
        return dataclasses.replace(_report(strategy, scheme, groups, s, d, full(s), accuracy, max_points),
                                   options=recorded_options(options))

    # (an evaluation with Markov members costs seconds: the search's secant steps take ~5 of them where
    # halving took 6-7, to the same contract -- a passing noise within rel_tol of a failing one)
    costly = groups is not None and bool(groups.markov or groups.composed_markov)
    sigma, report = smallest_noise_and_report(eps_of, report_at, target, rel_tol=rel_tol, callback=callback,
                                              limit=limit, secant=costly, steer_at=bound, settled=settled,
                                              revised=revised)
    if report.epsilon > target:  # (never seen outside a test: a contenders' pass the accountant does not confirm)
        # (a prefix of the members is the accountant's bound wherever it passes; the contenders are not a
        # prefix, and are its epsilon only where the members they leave out lose again -- a member that won
        # at the answer would have changed the grids of the ones after it. The search goes on from there by
        # the accountant alone, so the answer is always one of its passes.)
        sigma, report = smallest_noise_and_report(lambda s: full(s)["epsilon"], report_at, target, rel_tol=rel_tol,
                                                  callback=callback, initial=sigma, secant=costly)
    return sigma, report
