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
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
from scipy import special

from dpmf import progress
from dpmf import validation as _v
from dpmf.errors import InvalidParameterError, NumericalError
from dpmf.privacy.mixture import GaussianMixture
from dpmf.privacy.pld import PrivacyLossDistribution

__all__ = [
    "DEFAULT_TEMPERATURES",
    "reverse_hazard_bounds",
    "step_weights",
    "conditional_epsilon",
    "conditional_cost",
]

#: Option-3 temperatures of App. F (t = inf is the uniform psi, always included).
DEFAULT_TEMPERATURES = (10**-1, 10**-0.5, 1.0, 10**0.5, 10.0)
_ULP = np.finfo(np.float64).eps
_SLACK = 64 * _ULP


def conditional_cost(b: int, steps: int, n_psi: int = 1 + len(DEFAULT_TEMPERATURES)) -> float:
    """Rough wall-clock estimate in seconds (2-core machine, 2026): two mixture-PLD builds per step
    (about 0.1 s each, dominated by :mod:`dpmf.privacy.mixture`) plus the tail bounds,
    ``steps * n_psi * 2 b^3`` flops at about 1 GFLOP/s."""
    return float(steps) * (0.2 + n_psi * 2.0 * float(b) ** 3 / 1e9)


def _prefix_labels(labels: np.ndarray, column: np.ndarray) -> np.ndarray:
    """Refine equality classes of prefixes by one more coordinate (exact float equality)."""
    pairs = np.stack([labels.astype(np.float64), column], axis=1)
    _, new = np.unique(pairs, axis=0, return_inverse=True)
    return new.reshape(-1)


def _tau_add(nu: np.ndarray, xi: np.ndarray, beta: float) -> np.ndarray:
    z = special.ndtri(beta)
    return np.where(xi > 0, nu + xi * z, nu)


def _tau_remove(nu_k: np.ndarray, mult: np.ndarray, xi: np.ndarray, beta: float, b: int) -> np.ndarray:
    """Largest tau (from below) with ``(1/b) sum_k mult_k Phi((tau - nu_k)/xi) <= beta``, per row.

    The search never goes above ``min_k nu_k`` (``hi`` below), so every term has
    ``tau - nu_k <= 0`` and is non-decreasing in ``xi``: the rounded-up ``xi`` of the caller is
    therefore the pessimistic side for every component.
    """
    nu_min = nu_k.min(axis=1)
    pos = xi > 0
    out = nu_min.copy()  # xi = 0: the bound is the constant nu_k, never below min_k nu_k
    if not np.any(pos):
        return out
    nk, x = nu_k[pos], xi[pos][:, None]
    m = mult[None, :]
    # sum_k mult_k Phi(.) <= b beta; ndtr underflows only below 1e-300 per term, covered by the
    # absolute allowance b * 1e-300 on the left-hand side
    target = b * beta - b * 1e-300
    lo = nk.min(axis=1) + xi[pos] * special.ndtri(beta)  # every term <= beta: valid
    ratio = np.minimum(b * beta / mult, 0.5)
    hi = (nk + x * special.ndtri(ratio)[None, :]).min(axis=1)  # one group alone reaches beta
    hi = np.maximum(hi, lo)

    def ok(tau):
        return (special.ndtr((tau[:, None] - nk) / x) * m).sum(axis=1) * (1.0 + 1e-12) <= target

    for _ in range(30):
        mid = 0.5 * (lo + hi)
        good = ok(mid)
        lo = np.where(good, mid, lo)
        hi = np.where(good, hi, mid)
    if not np.all(ok(lo)):  # cannot happen in exact arithmetic; stay on the safe side
        raise NumericalError("conditional composition: tail-bound bisection lost its bracket")
    out[pos] = lo
    return out


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
    H = np.asarray(prefix_gram, dtype=np.float64)
    b = H.shape[0]
    s2 = sigma * sigma
    idx = np.arange(b)
    pred = idx[None, :] < idx[:, None]  # j < i
    ident = labels[None, :] == labels[:, None]
    S = pred & ~ident  # non-identical predecessors
    n_sub = S.sum(axis=1)
    n_id = (pred & ident).sum(axis=1)
    lam = np.ones(b)
    with np.errstate(divide="ignore"):
        lam[1:] = 1.0 / (1.0 + idx[1:])  # L_i = 0 where every predecessor is identical
    rows = np.flatnonzero(n_sub > 0)
    if rows.size == 0:
        return lam
    diag = np.diag(H)
    d2 = np.maximum(diag[:, None] + diag[None, :] - 2.0 * H, 0.0)
    Sr = S[rows]
    families = [np.where(Sr, 1.0, 0.0)]
    for t in temperatures:
        logits = np.where(Sr, -d2[rows] / t, -np.inf)
        logits -= logits.max(axis=1, keepdims=True)
        families.append(np.where(Sr, np.exp(logits), 0.0))
    # group the mixture components of the remove case by identical prefix means
    _, first, mult = np.unique(labels, return_index=True, return_counts=True)
    best = np.full(rows.size, -np.inf)
    hii = diag[rows]
    for W in families:
        W = W / W.sum(axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            kl = np.where(W > 0, W * np.log(W * n_sub[rows][:, None]), 0.0).sum(axis=1)
        WH = W @ H  # (rows, b): <mu_bar_i, mu_k>
        wh_self = WH[np.arange(rows.size), rows]  # <mu_bar_i, mu_i>
        quad = np.einsum("rk,rk->r", WH, W)  # |mu_bar_i|^2
        e_norm = W @ diag  # E_psi |mu_j|^2
        xi2 = hii - 2.0 * wh_self + quad
        scale = hii + 2.0 * np.abs(wh_self) + np.abs(quad)
        xi = np.sqrt(np.maximum(xi2, 0.0) + _SLACK * scale) / sigma
        const = (hii - e_norm) / (2.0 * s2) - kl
        const_err = _SLACK * (hii + e_norm) / (2.0 * s2) + _SLACK * np.abs(kl)
        if direction == "add":
            nu = const - const_err
            tau = _tau_add(nu, xi, beta)
        else:
            Hk = H[:, first]  # (b, K) <mu_i, mu_k> for representative k
            nu_k = (WH[:, first] - Hk[rows]) / s2 + const[:, None]
            err = _SLACK * (np.abs(WH[:, first]) + np.abs(Hk[rows])) / s2 + const_err[:, None]
            tau = _tau_remove(nu_k - err, mult.astype(np.float64), xi, beta, b)
        best = np.maximum(best, tau)
    w0 = n_id[rows] / rows  # rows >= 1 (component 0 has no predecessors)
    with np.errstate(over="ignore"):
        # L_i >= log(w0 + (1 - w0) e^{tau_sub}), increasing in tau_sub
        tau_full = np.where(
            w0 > 0, np.logaddexp(np.log(np.maximum(w0, 1e-300)), np.log1p(-w0) + best), best
        )
        lam_rows = special.expit(-np.log(rows) - tau_full)
    lam[rows] = np.minimum(1.0, lam_rows * (1.0 + _SLACK))
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

    Returns:
      dict with ``epsilon``, ``epsilon_by_direction``, ``delta_e``, ``discretization``,
      ``seconds``.
    """
    start = time.perf_counter()
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
    pairs = {"remove": [], "add": []}
    H = np.zeros((b, b))
    labels = np.zeros(b, dtype=np.int64)
    with progress.task("conditional composition: steps", total=N) as bar:
        for n in range(N):
            a = M[:, n]
            order = np.lexsort((labels, a))
            Hs, lab = H[np.ix_(order, order)], labels[order]
            for direction in ("remove", "add"):
                if n == 0:
                    lam = np.concatenate([[1.0], 1.0 / (2.0 + np.arange(b - 1))])
                else:
                    lam = reverse_hazard_bounds(Hs, lab, sigma, beta, direction, temperatures)
                pairs[direction].append((a[order], step_weights(lam)))
            H += np.outer(a, a)
            labels = _prefix_labels(labels, a)
            bar.advance()
            if callback is not None:
                callback(n + 1, N)
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
