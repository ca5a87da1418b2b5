r"""Conditional-composition accountant for random allocation (Alg. 4 with variational tail bounds).

Schuchardt & Kalinin (arXiv 2601.21636), Sec. 4, App. D-F; digest ``notes/random-allocation.md``
§2.7, §3.4-§3.7 (typos T8, T10-T14 handled as described there).

**Idea** (Lemma 4.1 = MMCC's conditional composition). Given the outputs of steps ``0..n-1``,
step ``n`` of the dominating pair is a 1-D mixture ``sum_i P(z = i | y_{<n}) N(m_{i,n}, s^2)``
against ``N(0, s^2)``. If, outside an event of probability ``<= delta_E``, the posterior over
``z`` is stochastically dominated by fixed weights ``p^(n)`` (over components sorted by their
step-``n`` mean ``a_j = m_{pi(j), n}``, T10), then the pair is dominated by the per-step
mixture-of-Gaussians pair ``(sum_j p_j N(a_j, s^2), N(0, s^2))`` (remove) or its mirror (add), and

    delta(eps) <= delta_PLD(eps; composition over n of the per-step pairs) + delta_E.

**Reverse hazards** (Lemmas 4.3-4.5, Cor. 4.4). In sorted order (0-based, ``i`` predecessors
``j < i``): ``P(z = i | z <= i, y) = 1 / (1 + i exp(L_i(y)))`` with
``L_i = log( (1/i) sum_{j<i} N(y; mu_j, s^2 I) / N(y; mu_i, s^2 I) )`` on the prefix means
``mu_j = m_{pi(j), :n}``. A high-probability lower bound ``L_i >= tau_i`` gives
``lambda_i <= 1 / (1 + i e^{tau_i})`` and ``p_i = lambda_i prod_{j > i} (1 - lambda_j)``
(T8, T11: barred lambdas; ``lambda_0 = 1``).

**Tail bounds** (§3.5). With the per-pair loss ``L_ij(x) = (x.(mu_j - mu_i))/s^2 +
(|mu_i|^2 - |mu_j|^2)/(2 s^2)`` and any weights ``psi`` over predecessors, the ELBO
``L_i >= E_psi L_ij - KL(psi || uniform)`` is Gaussian under ``N(c, s^2 I)``: mean
``(c.(mu_bar - mu_i))/s^2 + (|mu_i|^2 - E_psi|mu_j|^2)/(2 s^2) - KL``, standard deviation
``|mu_i - mu_bar| / s``. *Add*: the history follows ``Q = N(0, s^2 I)``, ``tau = nu + xi
Phi^{-1}(beta)`` (Thm. 4.8). *Remove*: it follows the **full** mixture
``(1/b) sum_{k=0}^{b-1} N(mu_k, s^2 I)`` (Thm. D.3, not the pruned one of Alg. 4: T12), and
``tau`` is the largest value with ``(1/b) sum_k Phi((tau - nu_k)/xi) <= beta``, found by
bisection and returned from the safe side. The family of ``psi``: uniform, and
``softmax_j(-|mu_i - mu_j|^2 / t)`` for ``t`` in :data:`DEFAULT_TEMPERATURES` (Option 3 of
App. F); the largest ``tau`` over the family is used: every ELBO lies below ``L_i``
pointwise, so each ``psi``'s bound is a valid lower quantile bound of ``L_i`` itself, and the
family depends only on the means, not on the outcome. Predecessors with a prefix mean *identical* to
``mu_i`` contribute exactly 1 to the likelihood ratio, so with ``w0`` their share,
``L_i = log(w0 + (1 - w0) e^{L_sub})`` and the bound is applied to ``L_sub`` over the others
(the exact-offset form of §3.5; Remark D.5's literal rule is loose, T14). If every predecessor is
identical, ``L_i = 0`` exactly.

**Failure probability** (§3.6, T9, T13). ``delta_E = delta / 2`` by default, spread by a plain
union bound: ``beta = delta_E / ((N - 1)(b - 1))`` for every (step, component) bound. The paper's
per-epoch max rule is not used: its validity is not proven (T13).

**PLDs.** Each per-step pair is a mixture of Gaussians with non-negative means ``a_j`` (``C >= 0``),
built pessimistically by :func:`dpmf.privacy.mixture_of_gaussians` (remove and add from their own
weights) and composed by FFT. The discretization is chosen, as in App. B.2, so that the widest
per-step PMF has about ``support_size`` points (never finer than ``1e-4``).

**How it scales** (:func:`_step_pairs`; every shortcut gives the dense formulation's numbers up to
float rounding, checked against it in ``tests/accounting/test_allocation_conditional.py``):

* Only components *above the lowest step-n mean* need a bound. With ``g`` the size of the lowest
  group (sorted positions ``0..g-1``), ``sum_{i<g} p_i = prod_{j>=g}(1 - lambda_j)`` (telescoping,
  ``lambda_0 = 1``), and the mixture merges equal means, so ``lambda_1..lambda_{g-1}`` never
  matter. A banded ``C`` (``p`` bands) has ``r_n <= p`` such rows per step instead of ``b``.
* The ``psi`` weights, ``psi H`` products and ELBO moments are computed once for both directions,
  in the original component order (no ``b x b`` permutation per step); the prefix Gram ``H`` is
  updated by the non-zero products only, and when the final Gram is sparse (banded ``C``:
  cyclically banded) ``psi H`` is a CSR product.
* The remove-case bisection merges exactly equal ``nu_k`` per row, skips terms that are exactly 0
  in float64, and drops ``psi`` rows that cannot be the maximum (:func:`_tau_remove`).
* Softmax weights below ``e^-700`` of the largest are set to 0 (no subnormal arithmetic). That is
  a different but equally valid ``psi`` (any data-independent ``psi`` gives a valid ELBO bound and
  all its moments are computed for the ``psi`` actually used); the moments move by far less than
  an ulp. BLAS runs single-threaded in the step loop (:func:`dpmf.resources.one_blas_thread`): threaded
  products of this size were 10-15x slower on the shared 2-core machine.

Cost, with ``F = 1 + len(temperatures)`` (6), ``r_n`` the rows at step ``n`` (``<= b - 1``;
``~p`` for ``p`` bands) and ``nnz`` the non-zeros of the final Gram (``~(2p - 1) b`` banded,
``b^2`` dense): time ``O(sum_n F r_n (nnz + 30 b) + N b log b)`` for the bounds, plus two
mixture-PLD builds per step (``O(support * (r_n + 1))``) and ``N - 1`` FFT compositions; memory
``O(b^2 + F b min(r_n, 2^21 / (F b)) + N r_n)`` (dense ``H``, work blocks of at most ``2^21``
entries, the per-step pairs). Measured (2 shared cores, ``benchmarks/bench_conditional.py``): BSR
with 4 bands at N = 1000 in ~5 s (k = 1, b = 1000; the dense formulation: hours) and ~4 s
(k = 10), a dense Toeplitz ``C`` at k = 10 (b = 100) in 17-25 s (before: 158-195 s); a dense ``C`` at
k = 1, b = N = 1000 is ``O(N^4)`` (see ``benchmarks/README.md``).
"""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np
from scipy import special

from dpmf import progress
from dpmf import validation as _v
from dpmf.errors import InvalidParameterError, NumericalError
from dpmf.numerics import UNIT_ROUNDOFF
from dpmf.privacy.mixture import PRUNE_MASS, GaussianMixture
from dpmf.privacy.pld import PrivacyLossDistribution
from dpmf.resources import one_blas_thread

__all__ = [
    "DEFAULT_TEMPERATURES",
    "reverse_hazard_bounds",
    "step_weights",
    "conditional_epsilon",
    "conditional_pairs",
    "composition_delta_lower_bound",
    "conditional_cost",
]

#: Option-3 temperatures of App. F (t = inf is the uniform psi, always included).
DEFAULT_TEMPERATURES = (10**-1, 10**-0.5, 1.0, 10**0.5, 10.0)
_ULP = np.finfo(np.float64).eps
_SLACK = 64 * _ULP


def conditional_cost(
    b,
    steps: int | None = None,
    n_psi: int = 1 + len(DEFAULT_TEMPERATURES),
    *,
    gram: np.ndarray | None = None,
) -> float:
    """Rough wall-clock estimate in seconds of :func:`conditional_epsilon` (2-core machine, 2026,
    fitted to ``benchmarks/bench_conditional.py``).

    ``b`` is either the number of steps per epoch (then ``steps`` is ``N`` and the worst case is
    assumed: every component above the lowest step mean, dense prefix Gram) or the ``b x N``
    means themselves (then the rows that need a bound, ``r_n`` = components above the lowest
    step-``n`` mean, are counted, and ``gram``, the final Gram matrix, gives the sparsity of the
    products; without it the means' Gram is formed). Per step ``n``:

    * tail bounds: ``n_psi r_n`` rows, each ``2e-10 s * nnz(G)`` (the ``psi H`` product) plus
      ``2e-7 s * b`` (ELBO moments and the bisection over ``b`` components, after pruning);
    * two mixture-PLD builds, ``2 * (1e-3 + 3.5e-5 * (r_n + 1))`` s, and one FFT composition
      (``1e-3`` s) plus ``1e-6 s * b`` bookkeeping.
    """
    if isinstance(b, np.ndarray):
        M = np.asarray(b, dtype=np.float64)
        bb, N = M.shape
        rows = (M > M.min(axis=0, keepdims=True)).sum(axis=0).astype(np.float64)
        rows[0] = 0.0  # no history at the first step
        G = M @ M.T if gram is None else np.asarray(gram)
        nnz = float(np.count_nonzero(G))
        if nnz > bb * bb / 8:
            nnz = float(bb * bb)  # dense products
        total_rows = float(rows.sum())
    else:  # every step but the first has b - 1 rows (no array: steps may be huge)
        bb, N = int(b), int(steps)
        total_rows = float(max(bb - 1, 0)) * N
        nnz = float(bb) ** 2
    per_row = 2e-10 * nnz + 2e-7 * bb
    bounds = float(n_psi) * per_row * total_rows
    builds = 2.0 * (1e-3 * N + 3.5e-5 * (total_rows + N))
    return float(bounds + builds + N * (1e-3 + 1e-6 * bb))


def _prefix_labels(labels: np.ndarray, column: np.ndarray) -> np.ndarray:
    """Refine equality classes of prefixes by one more coordinate (exact float equality)."""
    pairs = np.stack([labels.astype(np.float64), column], axis=1)
    _, new = np.unique(pairs, axis=0, return_inverse=True)
    return new.reshape(-1)


def _tau_add(nu: np.ndarray, xi: np.ndarray, beta: float) -> np.ndarray:
    z = special.ndtri(beta)
    return np.where(xi > 0, nu + xi * z, nu)


def _tau_remove(
    nu_k: np.ndarray,
    mult: np.ndarray,
    xi: np.ndarray,
    beta: float,
    b: int,
    group: np.ndarray | None = None,
    merge_equal: bool = True,
) -> np.ndarray:
    """Largest tau (from below) with ``(1/b) sum_k mult_k Phi((tau - nu_k)/xi) <= beta``, per row.

    The search never goes above ``min_k nu_k`` (``hi`` below), so every term has
    ``tau - nu_k <= 0`` and is non-decreasing in ``xi``: the rounded-up ``xi`` of the caller is
    therefore the pessimistic side for every component.

    Speed (the result is that of the plain sum over ``k``, up to the rounding of the sum): per
    row, components with *exactly* equal ``nu_k`` are evaluated once with their summed
    multiplicity when ``merge_equal`` (it costs a sort; the caller turns it off for dense Grams) (in banded strategies most components are orthogonal to ``mu_i`` and to the
    ``psi``-mean and share one value), and terms with ``(hi - nu_k)/xi < -39`` are skipped:
    ``Phi`` of that is exactly ``0.0`` in float64 and every point tried is ``<= hi``.

    ``group`` (optional, one id per row): the caller keeps only the *maximum* over the rows of a
    group (the ``psi`` family). Every few halvings, a row whose upper bracket ``hi`` is below the
    lower bracket ``lo`` of another row of its group is dropped: its final value would be
    ``<= hi < lo <=`` that row's final value, so the maximum is unchanged. A dropped row returns
    its current ``lo`` (still a valid, smaller bound).
    """
    nu_min = nu_k.min(axis=1)
    pos = xi > 0
    out = nu_min.copy()  # xi = 0: the bound is the constant nu_k, never below min_k nu_k
    if not np.any(pos):
        return out
    nk, x = nu_k[pos], xi[pos]
    R, K = nk.shape
    # sum_k mult_k Phi(.) <= b beta; ndtr underflows only below 1e-300 per term, covered by the
    # absolute allowance b * 1e-300 on the left-hand side
    target = b * beta - b * 1e-300
    lo = nk.min(axis=1) + x * special.ndtri(beta)  # every term <= beta: valid
    ratio = np.minimum(b * beta / mult, 0.5)
    hi = (nk + x[:, None] * special.ndtri(ratio)[None, :]).min(axis=1)  # one group alone reaches beta
    hi = np.maximum(hi, lo)
    if merge_equal:  # group equal values per row (exact float equality), flattened with row ids
        srt = np.argsort(nk, axis=1, kind="stable")
        v = np.take_along_axis(nk, srt, axis=1)
        start = np.ones((R, K), dtype=bool)
        start[:, 1:] = v[:, 1:] != v[:, :-1]
        flat = np.flatnonzero(start.ravel())
        vals = v.ravel()[flat]
        wts = np.add.reduceat(mult[srt].ravel(), flat)
        rid = flat // K
    else:
        vals, wts, rid = nk.ravel(), np.tile(mult, R), np.repeat(np.arange(R), K)
    keep = (hi[rid] - vals) / x[rid] >= -39.0  # the others contribute exactly 0 for tau <= hi
    vals, wts, rid = vals[keep], wts[keep], rid[keep]
    xr = x[rid]
    active = np.ones(R, dtype=bool)
    grp = None if group is None else np.unique(np.asarray(group)[pos], return_inverse=True)[1]

    def ok(tau):
        terms = special.ndtr((tau[rid] - vals) / xr) * wts
        return np.bincount(rid, weights=terms, minlength=R) * (1.0 + 1e-12) <= target

    for it in range(30):
        if grp is not None and it % 3 == 0:
            best_lo = np.full(grp.max() + 1, -np.inf)
            np.maximum.at(best_lo, grp[active], lo[active])
            drop = active & (hi < best_lo[grp])
            active &= ~drop
            if drop.sum() > 0.1 * R:  # compact the work arrays (else dropped rows are just masked)
                keep = active[rid]
                vals, wts, rid, xr = vals[keep], wts[keep], rid[keep], xr[keep]
        mid = 0.5 * (lo + hi)
        good = ok(mid) & active
        lo = np.where(good, mid, lo)
        hi = np.where(good | ~active, hi, mid)
    if not np.all(ok(lo)[active]):  # cannot happen in exact arithmetic; stay on the safe side
        raise NumericalError("conditional composition: tail-bound bisection lost its bracket")
    out[pos] = lo
    return out


def _identical_predecessors(lab_sorted: np.ndarray) -> np.ndarray:
    """``n_id[i] = #{j < i : lab_j = lab_i}`` for labels in sorted (component) order, O(b log b)."""
    b = lab_sorted.size
    s = np.argsort(lab_sorted, kind="stable")  # groups of equal labels, positions increasing
    ls = lab_sorted[s]
    starts = np.flatnonzero(np.concatenate([[True], ls[1:] != ls[:-1]]))
    first = np.repeat(starts, np.diff(np.append(starts, b)))
    out = np.empty(b, dtype=np.int64)
    out[s] = np.arange(b) - first
    return out


#: Entries of one (families x rows) x b block of the tail-bound work arrays (bounds memory to
#: a few arrays of 16 MB each; rows are processed in chunks of this size).
_BLOCK = 1 << 21


def _bounds_for_rows(
    H: np.ndarray,
    H_sparse,
    diag: np.ndarray,
    order: np.ndarray,
    rank: np.ndarray,
    labels: np.ndarray,
    reps: np.ndarray,
    mult: np.ndarray,
    rows: np.ndarray,
    n_id: np.ndarray,
    sigma: float,
    beta: float,
    temperatures,
    directions,
) -> dict:
    """``lambda_bar`` at the sorted positions ``rows`` (each with a non-identical predecessor).

    ``H`` (dense, ``b x b``) is the prefix Gram matrix in the *original* component order,
    ``H_sparse`` the same matrix as CSR (or ``None``: dense products); ``order`` the sorted
    order (``order[i]`` = component at position ``i``) and ``rank`` its inverse; ``labels``
    (original order) mark identical prefixes; ``reps``/``mult`` the representative (original
    index) and size of every label class. The arithmetic is that of the module docstring, row by
    row exactly as in the dense formulation, and the ``psi`` weights, ``W H`` products and ELBO
    moments are shared by both directions.
    """
    b = order.size
    s2 = sigma * sigma
    fams = 1 + len(tuple(temperatures))
    out = {d: np.empty(rows.size) for d in directions}
    chunk = max(1, _BLOCK // (fams * b))
    for c0 in range(0, rows.size, chunk):
        rr = rows[c0 : c0 + chunk]
        r = rr.size
        o = order[rr]
        ident = labels[None, :] == labels[o][:, None]
        S = (rank[None, :] < rr[:, None]) & ~ident  # non-identical predecessors (original cols)
        n_sub = S.sum(axis=1)
        Hr = H[o]
        hii = diag[o]
        d2 = np.maximum(hii[:, None] + diag[None, :] - 2.0 * Hr, 0.0)
        W = np.empty((fams, r, b))
        W[0] = np.where(S, 1.0, 0.0)
        for f, t in enumerate(temperatures, start=1):
            logits = np.where(S, -d2 / t, -np.inf)
            logits -= logits.max(axis=1, keepdims=True)
            # weights below e^-700 (relative to the largest, 1) are set to 0: this psi is then a
            # (valid) member of the same kind whose every moment differs from the unclipped one
            # by far less than one ulp, and no subnormal numbers reach the products below
            # (subnormal arithmetic made them several times slower)
            W[f] = np.where(S & (logits > -700.0), np.exp(logits), 0.0)
        W = W.reshape(fams * r, b)
        W /= W.sum(axis=1, keepdims=True)
        nsub = np.tile(n_sub, fams)
        with np.errstate(divide="ignore", invalid="ignore"):
            kl = np.where(W > 0, W * np.log(W * nsub[:, None]), 0.0).sum(axis=1)
        WH = W @ H if H_sparse is None else np.asarray((H_sparse @ W.T).T)  # <mu_bar, mu_k>
        of = np.tile(o, fams)
        wh_self = WH[np.arange(fams * r), of]  # <mu_bar_i, mu_i>
        quad = np.einsum("rk,rk->r", WH, W)  # |mu_bar_i|^2
        e_norm = W @ diag  # E_psi |mu_j|^2
        hf = np.tile(hii, fams)
        xi2 = hf - 2.0 * wh_self + quad
        scale = hf + 2.0 * np.abs(wh_self) + np.abs(quad)
        xi = np.sqrt(np.maximum(xi2, 0.0) + _SLACK * scale) / sigma
        const = (hf - e_norm) / (2.0 * s2) - kl
        const_err = _SLACK * (hf + e_norm) / (2.0 * s2) + _SLACK * np.abs(kl)
        pos = rr.astype(np.float64)  # sorted position = number of predecessors (>= 1)
        w0 = n_id[rr] / pos
        for direction in directions:
            if direction == "add":
                tau = _tau_add(const - const_err, xi, beta)
            else:
                Hk = np.tile(Hr[:, reps], (fams, 1))  # <mu_i, mu_k>, representatives k
                WHk = WH[:, reps]
                nu_k = (WHk - Hk) / s2 + const[:, None]
                err = _SLACK * (np.abs(WHk) + np.abs(Hk)) / s2 + const_err[:, None]
                tau = _tau_remove(
                    nu_k - err, mult, xi, beta, b, group=np.tile(np.arange(r), fams),
                    merge_equal=H_sparse is not None,
                )
            best = tau.reshape(fams, r).max(axis=0)
            with np.errstate(over="ignore", divide="ignore"):
                # L_i >= log(w0 + (1 - w0) e^{tau_sub}), increasing in tau_sub
                tau_full = np.where(
                    w0 > 0, np.logaddexp(np.log(np.maximum(w0, 1e-300)), np.log1p(-w0) + best), best
                )
                lam_rows = special.expit(-np.log(pos) - tau_full)
            out[direction][c0 : c0 + r] = np.minimum(1.0, lam_rows * (1.0 + _SLACK))
    return out


def _classes(lab_sorted: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Representatives (original index of each label class's first sorted position) and sizes."""
    _, first, mult = np.unique(lab_sorted, return_index=True, return_counts=True)
    return order[first], mult.astype(np.float64)


def reverse_hazard_bounds(
    prefix_gram: np.ndarray,
    labels: np.ndarray,
    sigma: float,
    beta: float,
    direction: str,
    temperatures=DEFAULT_TEMPERATURES,
) -> np.ndarray:
    """Upper bounds ``lambda_bar_i`` on the reverse hazards, components in the given (sorted) order.

    Args:
      prefix_gram: ``H_ij = <mu_i, mu_j>`` of the prefix means, rows/columns in sorted order.
      labels: equal labels mark identical prefix means (exactly).
      sigma: noise multiplier.
      beta: failure probability of each component's bound.
      direction: ``"remove"`` (history under the mixture P) or ``"add"`` (under Q).
      temperatures: Option-3 temperatures (the uniform psi is always used).

    Returns:
      ``lambda_bar`` (length ``b``), ``lambda_bar[0] = 1``; valid simultaneously for all ``i``
      with probability ``>= 1 - (b - 1) beta``.
    """
    if direction not in ("remove", "add"):
        raise InvalidParameterError(f"direction must be 'remove' or 'add', got {direction!r}")
    H = np.asarray(prefix_gram, dtype=np.float64)
    b = H.shape[0]
    lab = np.asarray(labels)
    idx = np.arange(b)
    lam = np.ones(b)
    lam[1:] = 1.0 / (1.0 + idx[1:])  # L_i = 0 where every predecessor is identical
    n_id = _identical_predecessors(lab)
    rows = np.flatnonzero(idx - n_id > 0)
    if rows.size == 0:
        return lam
    reps, mult = _classes(lab, idx)
    out = _bounds_for_rows(
        H, None, np.diag(H).copy(), idx, idx, lab, reps, mult, rows, n_id, sigma, beta,
        temperatures, (direction,),
    )
    lam[rows] = out[direction]
    return lam


def step_weights(lam: np.ndarray) -> np.ndarray:
    """``p_i = lambda_i prod_{j > i} (1 - lambda_j)`` (Cor. 4.4, T8), summing to 1.

    >>> step_weights([1.0, 1 / 2, 1 / 3, 1 / 4]).round(12).tolist()   # no history: uniform
    [0.25, 0.25, 0.25, 0.25]
    """
    lam = np.asarray(lam, dtype=np.float64)
    with np.errstate(divide="ignore"):
        log_surv = np.log1p(-np.minimum(lam, 1.0))
    tail = np.concatenate([np.cumsum(log_surv[::-1])[::-1][1:], [0.0]])  # sum_{j > i}
    with np.errstate(divide="ignore"):
        p = np.exp(np.log(lam) + tail)
    return p / p.sum()


def _gram_pattern(M: np.ndarray):
    """CSR matrix (zeros) with the sparsity pattern of the final Gram ``M M^T``, or ``None`` when
    it is dense enough that dense products win. Every prefix Gram has its non-zeros inside this
    pattern (its entries are partial sums of the same non-negative products)."""
    from scipy import sparse

    b = M.shape[0]
    Ms = sparse.csr_matrix(M)
    if Ms.nnz > 0.25 * M.size:
        G = M @ M.T
        nz = np.count_nonzero(G)
    else:
        G = (Ms @ Ms.T).tocsr()
        G.eliminate_zeros()
        nz = G.nnz
    if nz > b * b / 8:
        return None
    pattern = sparse.csr_matrix(np.asarray(G != 0) if not sparse.issparse(G) else G != 0, dtype=np.float64)
    pattern.sort_indices()
    pattern.data[:] = 0.0
    return pattern


def _step_pairs(M: np.ndarray, sigma: float, beta: float, temperatures, callback) -> dict:
    """The per-step mixture pairs ``(a, p)`` of both directions (Alg. 4 at every step).

    Only the reverse hazards of components *above the lowest step mean* are computed: with
    ``g`` the size of the lowest group (sorted positions ``0..g-1`` share the smallest ``a``),
    ``sum_{i<g} p_i = prod_{j>=g} (1 - lambda_j)`` telescopes (``lambda_0 = 1``), so the lowest
    group's total weight, the only thing the mixture sees of it, does not depend on
    ``lambda_1..lambda_{g-1}``; :func:`step_weights` gets their no-history value ``1/(i+1)``.
    The prefix Gram is kept in the original component order (no ``b x b`` permutation per step)
    and, when the final Gram is sparse (banded ``C``: cyclically banded), multiplied as CSR.
    """
    b, N = M.shape
    H = np.zeros((b, b))
    pattern = _gram_pattern(M) if b > 1 else None
    if pattern is not None:
        p_rows = np.repeat(np.arange(b), np.diff(pattern.indptr))
        p_cols = pattern.indices
    labels = np.zeros(b, dtype=np.int64)
    idx = np.arange(b)
    no_history = np.concatenate([[1.0], 1.0 / (2.0 + np.arange(b - 1))])
    pairs = {"remove": [], "add": []}
    with one_blas_thread(), progress.task("conditional composition", total=N, unit="steps") as bar:
        for n in range(N):
            a = M[:, n]
            order = np.lexsort((labels, a))
            a_s = a[order]
            lam = {"remove": no_history, "add": no_history}
            g = int(np.searchsorted(a_s, a_s[0], side="right"))  # size of the lowest group
            if n > 0 and g < b:
                lab_s = labels[order]
                n_id = _identical_predecessors(lab_s)
                rows = np.flatnonzero((idx >= g) & (idx - n_id > 0))
                if rows.size:
                    rank = np.empty(b, dtype=np.int64)
                    rank[order] = idx
                    reps, mult = _classes(lab_s, order)
                    if pattern is not None:
                        pattern.data[:] = H[p_rows, p_cols]
                    out = _bounds_for_rows(
                        H, pattern, np.diag(H).copy(), order, rank, labels, reps, mult, rows,
                        n_id, sigma, beta, temperatures, ("remove", "add"),
                    )
                    for direction in ("remove", "add"):
                        lam[direction] = no_history.copy()
                        lam[direction][rows] = out[direction]
            for direction in ("remove", "add"):
                pairs[direction].append((a_s, step_weights(lam[direction])))
            nz = np.flatnonzero(a)
            H[np.ix_(nz, nz)] += np.outer(a[nz], a[nz])
            labels = _prefix_labels(labels, a)
            bar.advance()
            if callback is not None:
                callback(n + 1, N)
    return pairs


#: Cells of the grid the linear statistic's mean part is rounded down to (:func:`composition_delta_lower_bound`).
_LB_GRID = 2048


def composition_delta_lower_bound(pairs, noise_multiplier: float, epsilon: float, direction: str) -> float:
    r"""A lower bound on ``delta(epsilon)`` of the composition of the exact per-step pairs of ``direction``
    (:func:`conditional_pairs`), hence on the composed PLD's delta that :func:`conditional_epsilon` reads
    (a pessimistic discretization of pairs that dominate these: an upper bound at every epsilon).

    One test set of the composed pair, a half-line of the linear statistic ``T = sum_n c_n x_n`` with
    ``c_n = sum_j p_j a_j`` (the step's mean): under ``N(0, s^2)`` at every step ``T ~ N(0, s_T^2)``,
    ``s_T = s |c|``; under the mixtures ``T = M + N(0, s_T^2)`` with ``M = sum_n c_n a_{J_n}``, ``J_n ~ p``
    independent. So for any ``y``

    * remove (``P`` the mixtures): ``delta(eps) >= P(T >= y) - e^eps Q(T >= y) = E Phi((M - y)/s_T) - e^eps Phi(-y/s_T)``;
    * add (``P = N(0, s^2)``): ``delta(eps) >= Phi(y/s_T) - e^eps E Phi((y - M)/s_T)``;

    and both stay lower bounds with ``M`` replaced by ``M_r <= M``: each ``c_n a_j`` rounded *down* to a
    grid of :data:`_LB_GRID` cells (``E Phi((M - y)/s_T)`` only falls, ``E Phi((y - M)/s_T)`` only
    rises), whose law is the convolution of the steps'. The best of a few dozen ``y`` is returned, less
    ``1e-9`` of each part (the float sums of non-negative terms and ``Phi`` are far closer) and the mass
    the mixtures' pruning may move (``2 PRUNE_MASS`` a step). The pairs of conditional composition are
    nearly Gaussian in this sense: on bsr(32, 4) over 2 epochs at sigma 1.268 the epsilon this gives is
    21.10 (remove) and 20.17 (add), the accountant's 21.24 and 20.31."""
    if direction not in ("remove", "add"):
        raise InvalidParameterError(f"direction must be 'remove' or 'add', got {direction!r}")
    steps = [(np.asarray(a, dtype=np.float64), np.asarray(w, dtype=np.float64)) for a, w in pairs]
    steps = [(a, w / w.sum()) for a, w in steps if w.sum() > 0]
    c = np.array([float(a @ w) for a, w in steps])
    top = float(sum(cn * a.max() for cn, (a, _) in zip(c, steps))) if steps else 0.0
    if not top > 0:
        return 0.0
    h = top / _LB_GRID
    law = np.ones(1)
    for cn, (a, w) in zip(c, steps):  # (c_n a_j >= 0 rounded down: the product's and quotient's rounding undone)
        law = np.convolve(law, np.bincount(np.floor(cn * a / h * (1 - 4 * UNIT_ROUNDOFF)).astype(np.int64), weights=w))
    nz = np.flatnonzero(law > 0)
    law, m = law[nz], nz * h
    s_t = float(noise_multiplier) * math.sqrt(float(c @ c))
    grow = math.exp(epsilon)

    def lower(ys: np.ndarray) -> np.ndarray:
        if direction == "remove":
            p_part, q_part = special.ndtr((m[None, :] - ys[:, None]) / s_t) @ law, special.ndtr(-ys / s_t)
        else:
            p_part, q_part = special.ndtr(ys / s_t), special.ndtr((ys[:, None] - m[None, :]) / s_t) @ law
        return p_part * (1 - 1e-9) - grow * q_part * (1 + 1e-9)

    lo, hi = float(m[0]) - 8 * s_t, float(m[-1]) + 8 * s_t
    best = -math.inf
    for _ in range(3):  # (a grid of y, then twice around its best point)
        ys = np.linspace(lo, hi, 48)
        vals = lower(ys)
        k = int(np.argmax(vals))
        best = max(best, float(vals[k]))
        step = ys[1] - ys[0]
        lo, hi = ys[k] - 2 * step, ys[k] + 2 * step
    return best - 2 * len(steps) * PRUNE_MASS


def _auto_discretization(pairs, sigma: float, support_size: int) -> float:
    span = 0.0
    for a, w in pairs:
        s = a / sigma
        u = np.array([-10.0, s.max() + 10.0])
        with np.errstate(divide="ignore"):
            la = np.log(w)[None, :] - 0.5 * s[None, :] ** 2 + u[:, None] * s[None, :]
        lo, hi = special.logsumexp(la, axis=1)
        span = max(span, float(hi - max(lo, -50.0)))
    return max(1e-4, span / support_size)


def conditional_pairs(
    means: np.ndarray,
    noise_multiplier: float,
    delta: float,
    *,
    delta_e: float | None = None,
    temperatures=DEFAULT_TEMPERATURES,
    callback: Callable[[int, int], None] | None = None,
) -> dict:
    """The per-step mixture pairs of both directions (module docstring, Alg. 4 at every step) that
    :func:`conditional_epsilon` composes, with what it needs to read them: ``{"pairs": {"remove":
    [(a, p), ...], "add": [...]}, "sigma", "delta", "delta_e", "beta"}`` (arguments as there)."""
    M = _v.finite_array("means", means, ndim=2)
    if np.any(M < 0):
        raise InvalidParameterError("means must be >= 0 (non-negative encoder C)")
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    d = _v.open_unit("delta", delta)
    de = d / 2 if delta_e is None else _v.positive("delta_e", delta_e)
    if not de < d:
        raise InvalidParameterError(f"delta_e must be in (0, delta={d}), got {delta_e!r}")
    b, N = M.shape
    beta = de / (max(N - 1, 1) * max(b - 1, 1))
    return {"pairs": _step_pairs(M, sigma, beta, temperatures, callback), "sigma": sigma, "delta": d,
            "delta_e": de, "beta": beta}


def conditional_epsilon(
    means: np.ndarray,
    noise_multiplier: float,
    delta: float,
    *,
    delta_e: float | None = None,
    temperatures=DEFAULT_TEMPERATURES,
    discretization: float | None = None,
    support_size: int = 1000,
    callback: Callable[[int, int], None] | None = None,
    prepared: dict | None = None,
) -> dict:
    r"""Epsilon per direction from conditional composition (module docstring), both directions.

    ``delta(eps) = delta_PLD(eps) + delta_E`` per direction, so epsilon is read off the composed
    PLD at ``delta - delta_E``.

    Args:
      means: ``b x N`` mixture means (rows ``m_i``), non-negative.
      noise_multiplier: ``sigma``.
      delta: target delta.
      delta_e: failure budget (default ``delta / 2``; must be in ``(0, delta)``).
      temperatures: Option-3 temperatures.
      discretization: PLD grid (default: chosen so the widest per-step PMF has about
        ``support_size`` points, at least ``1e-4``).
      callback: ``callback(step, steps)`` after each step's pair is built.
      prepared: the pairs :func:`conditional_pairs` built for the same arguments (not built again).

    Returns:
      dict with ``epsilon``, ``epsilon_by_direction``, ``delta_e``, ``discretization``,
      ``seconds``.
    """
    start = time.perf_counter()
    if prepared is None:
        prepared = conditional_pairs(means, noise_multiplier, delta, delta_e=delta_e, temperatures=temperatures,
                                     callback=callback)
    pairs, sigma, d, de, beta = (prepared[k] for k in ("pairs", "sigma", "delta", "delta_e", "beta"))
    disc = discretization
    if disc is None:
        disc = _auto_discretization(pairs["remove"] + pairs["add"], sigma, support_size)
    disc = _v.positive("discretization", disc)
    pmfs = {}
    for direction in ("remove", "add"):
        acc = None
        cache: dict = {}
        for a, w in pairs[direction]:
            key = (a.tobytes(), w.tobytes())
            if key not in cache:
                mech = GaussianMixture.create(a, w, sigma)
                pld = mech.pld(disc) if not mech.is_trivial else PrivacyLossDistribution.identity(disc)
                cache[key] = pld
            pld = cache[key]
            acc = pld if acc is None else acc.compose(pld)
        pmfs[direction] = acc
    composed = PrivacyLossDistribution(remove=pmfs["remove"].remove, add=pmfs["add"].add)
    eps = composed.epsilon_by_direction(d - de)
    return {
        "epsilon": max(eps.values()),
        "epsilon_by_direction": eps,
        "delta_e": de,
        "beta": beta,
        "discretization": disc,
        "seconds": time.perf_counter() - start,
    }
