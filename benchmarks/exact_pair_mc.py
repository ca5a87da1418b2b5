"""Monte Carlo estimate (not a bound) of the exact pair's epsilon under random allocation, the
yardstick of ``bench_allocation_correlated.py`` and ``bench_allocation_fresh_correlated.py``.

The pair (Lemma 2.8 of Schuchardt & Kalinin; :mod:`dpmf.accounting.allocation.surrogates.markov_fit`): remove
``P = (1/b) sum_j N(m_j, sigma^2 I)`` against ``Q = N(0, sigma^2 I)``, add swapped. Everything is a
function of ``y = M x / sigma^2 ~ N(shift, A)`` with ``A = G / sigma^2`` (``G = M M^T``): under ``Q``
the shift is 0, under component ``j`` of ``P`` it is ``A_j`` (column ``j``), and the likelihood ratio
is ``LR = dP/dQ = (1/b) sum_j exp(y_j - A_jj / 2)``. The deltas are

    remove:  delta(eps) = E_P[(1 - e^eps / LR)_+],     add:  delta(eps) = E_Q[(1 - e^eps LR)_+].

Plain sampling (``x ~ P``, ``x ~ Q``) sees the events that set ``delta = 1e-5`` a few dozen times in
10^6 draws; over several epochs of reused slots (little noise per slot) its estimate scattered by
+-3% between seeds (bsr(256, 4) over 4 epochs at sigma 2: 1.824 ... 1.905 in six runs of 0.4-2 x 10^6).
Here both directions are *importance sampled* from defensive mixtures, which keeps every weight
bounded (so the estimator is never worse than plain sampling with a quarter of the draws):

* remove: ``D = (1/4) sum_t R_t``, ``R_t = (1/b) sum_j N(t A_j, A)`` for tilts ``t = 1`` (``P``
  itself) and ``1 + (1.5, 3, 4.5) / mu`` (``mu^2`` the mean of ``A_jj``: the sampled slot's own
  privacy loss shifted by ~1.5-4.5 of its standard deviations), weight ``dP/dD = LR / mean_t(dR_t/dQ)``
  with ``dR_t/dQ = (1/b) sum_j exp(t y_j - t^2 A_jj / 2)``, so ``dP/dD <= 4``;
* add: ``D' = (1/4) sum_h N(-h v, A)``, ``v = A 1 / mean(A 1)`` (every slot's ``y`` lowered at once)
  for ``h = (0, 0.5, 1, 1.5) mu``, weight ``dQ/dD' = 1 / mean_h exp(-h v^T A^+ y - h^2 v^T A^+ v / 2)``
  (``<= 4``; for ``y`` in the range of ``A``, ``v^T A^+ y = 1^T y / mean(A 1)`` and
  ``v^T A^+ v = b / mean(A 1)``: no solve needed).

Measured (10^6 draws, delta 1e-5): bsr(256, 4) over 4 epochs at sigma 2, remove, three seeds 1.8669,
1.8703, 1.8721 (z = 4 half-width 0.009; the six plain runs average 1.869); bsr(64, 4) at sigma 4
(4 x 10^5 draws): the add direction's z = 4 half-width ~3% (plain) -> 0.2%. ``tests/accounting/test_exact_pair_estimator.py`` checks
the estimated deltas against exact integration (b = 2, 3).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

#: draws per batch, and the most entries of one ``batch x b`` array (~200 MB; a few are alive at once)
_BATCH, _ENTRIES = 200_000, 25_000_000


def _log_mean_exp(v: np.ndarray, axis: int = 1) -> np.ndarray:
    """``log mean exp`` along ``axis`` (stable)."""
    return special.logsumexp(v, axis=axis) - math.log(v.shape[axis])


def exact_pair_samples(means: np.ndarray, sigma: float, n: int, seed: int) -> dict:
    """``{"remove": (log LR, weight), "add": (log LR, weight)}``: ``n`` importance-sampled draws per
    direction; ``mean(h(log LR) * weight)`` estimates ``E_P h`` (remove) or ``E_Q h`` (add)."""
    rng = np.random.default_rng(seed)
    means = np.asarray(means, dtype=np.float64)
    b = means.shape[0]
    A = means @ means.T / sigma**2
    d = np.diag(A)
    root = means / sigma  # (A = root root^T: y = root xi, xi ~ N(0, I_N))
    mu = math.sqrt(float(d.mean()))
    tilts = np.array([1.0] + [1.0 + f / mu for f in (1.5, 3.0, 4.5)])
    rows = A.sum(axis=1)
    v, vq = rows / rows.mean(), b / rows.mean()  # v^T A^+ y = (1^T y) / mean(A 1) for y in range(A)
    lifts = np.array([0.0, 0.5, 1.0, 1.5]) * mu
    out = {"remove": ([], []), "add": ([], [])}
    done = 0
    batch = max(1_000, min(_BATCH, _ENTRIES // b))
    while done < n:
        m = min(batch, n - done)
        done += m
        z = rng.standard_normal((m, root.shape[1])) @ root.T
        # remove: a tilt and a slot per draw
        t = tilts[rng.integers(0, tilts.size, m)]
        y = z + t[:, None] * A[rng.integers(0, b, m)]
        log_r = [_log_mean_exp(s * y - s * s * d / 2) for s in tilts]  # log dR_t/dQ (t = 1: log LR)
        log_lr, log_d = log_r[0], _log_mean_exp(np.stack(log_r), axis=0)
        out["remove"][0].append(log_lr)
        out["remove"][1].append(np.exp(log_lr - log_d))
        # add: every slot lowered by h v
        h = lifts[rng.integers(0, lifts.size, m)]
        y = z - h[:, None] * v
        proj = y.sum(axis=1) / rows.mean()
        log_d = _log_mean_exp(np.stack([-s * proj - 0.5 * s * s * vq for s in lifts]), axis=0)
        out["add"][0].append(_log_mean_exp(y - d / 2))
        out["add"][1].append(np.exp(-log_d))
    return {k: (np.concatenate(a), np.concatenate(wt)) for k, (a, wt) in out.items()}


def hinge(direction: str, log_lr: np.ndarray, eps: float) -> np.ndarray:
    """The integrand of ``delta(eps)``: ``(1 - e^eps / LR)_+`` (remove), ``(1 - e^eps LR)_+`` (add)."""
    sign = -1.0 if direction == "remove" else 1.0
    return np.maximum(1.0 - np.exp(eps + sign * log_lr), 0.0)


def mc_epsilon(means, sigma: float, delta: float, n: int, seed: int, z: float = 4.0) -> tuple[float, float, float]:
    """(lower, point, upper) Monte Carlo epsilon of the exact pair (the larger direction): the point
    solves ``estimate(eps) = delta``, the ends ``estimate -+ z standard errors = delta``."""
    samples = exact_pair_samples(means, sigma, n, seed)

    def solve(direction, k):
        log_lr, wt = samples[direction]

        def stat(e):
            v = hinge(direction, log_lr, e) * wt
            return v.mean() - k * v.std() / math.sqrt(v.size)

        if stat(0.0) <= delta:
            return 0.0
        lo, hi = 0.0, 30.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if stat(mid) <= delta else (mid, hi)
        return hi

    return tuple(max(solve(dn, k) for dn in ("remove", "add")) for k in (z, 0.0, -z))
