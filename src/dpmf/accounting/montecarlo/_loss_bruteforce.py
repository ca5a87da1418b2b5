"""Brute-force oracles for the privacy-loss dynamic programs (tests only; tiny n).

Enumerates every participation pattern ``x`` of the differing example with its exact probability
under the scheme's algorithm (Dong & Ganesh 2026: Algs. 1-3, App. D; balls-in-bins; (cyclic)
Poisson) and evaluates the mixture ``P(y)/Q(y) = sum_x p_x exp((2<Cx, y> - ||Cx||^2)/(2 sigma^2))``
with a dense ``C``. Exponential in ``n``: keep ``n <= 12``. Oracles O1-O5, O14, O15 of the digest.
"""

from __future__ import annotations

import math
from itertools import product

import numpy as np

__all__ = [
    "log_mixture_ratio",
    "minsep_patterns",
    "multi_attribution_patterns",
    "poisson_patterns",
    "cyclic_patterns",
    "balls_in_bins_patterns",
    "allocation_patterns",
    "truncated_log_ratio",
]


def log_mixture_ratio(C: np.ndarray, patterns, sigma: float, y: np.ndarray) -> float:
    """``ln sum_x p_x N(Cx, sigma^2 I)(y) / N(0, sigma^2 I)(y)`` for ``patterns = [(p_x, x), ...]``."""
    terms = []
    for px, x in patterns:
        if px <= 0:
            continue
        m = C @ np.asarray(x, dtype=np.float64)
        terms.append(math.log(px) + (2 * m @ y - m @ m) / (2 * sigma**2))
    t = np.array(terms)
    return float(t.max() + math.log(np.exp(t - t.max()).sum()))


def minsep_patterns(n: int, b: int, p: float, warm: bool = False):
    """All ``(prob, x)`` of b-min-sep sampling (Alg. 1 cold; Alg. 2 warm: stationary start).

    State ``s`` = number of steps the example is still barred. Warm start: ``P(s=0) =
    1/(1+(b-1)p)``, ``P(s) = p/(1+(b-1)p)`` for ``s = 1..b-1`` (barred for steps ``0..s-1``).
    """
    starts = [(1.0, 0)]
    if warm and b > 1:
        z = 1 + (b - 1) * p
        starts = [(1 / z, 0)] + [(p / z, s) for s in range(1, b)]
    return _barred_patterns(n, b, starts, [(0, 1 - p), (1, p)] if p < 1 else [(1, p)])


def _barred_patterns(n: int, b: int, starts, weights):
    """Every ``(prob, x)`` of a chain that, when not barred, draws ``x_i = v`` with probability
    ``w`` for each ``(v, w)`` in ``weights`` and is barred for the next ``b - 1`` steps after a
    ``v > 0``; ``starts`` = ``(probability, steps still barred)`` of the initial state."""
    out = []

    def rec(i, barred, prob, x):
        if i == n:
            out.append((prob, tuple(x)))
            return
        if barred:
            rec(i + 1, barred - 1, prob, x + [0])
            return
        for v, w in weights:
            rec(i + 1, b - 1 if v else 0, prob * w, x + [v])

    for w, s in starts:
        rec(0, s, w, [])
    return out


def multi_attribution_patterns(n: int, b: int, p: float, k: int):
    """Thm 6.1's dominating ``x``: ``x_i = 0`` if any of the previous ``b-1`` is > 0, else
    ``x_i ~ Binomial(k, p)`` (cold start)."""
    pmf = [math.comb(k, j) * p**j * (1 - p) ** (k - j) for j in range(k + 1)]
    return _barred_patterns(n, b, [(1.0, 0)], [(j, pmf[j]) for j in range(k + 1) if pmf[j] > 0])


def poisson_patterns(n: int, p: float):
    """Every ``x in {0,1}^n`` with probability ``p^|x| (1-p)^(n-|x|)``."""
    return [(p ** sum(x) * (1 - p) ** (n - sum(x)), x) for x in product((0, 1), repeat=n)]


def cyclic_patterns(n: int, T: int, p: float, phases):
    """Cyclic Poisson: a uniformly random phase among ``phases``, then Bernoulli(p) at ``g + kT``."""
    out = []
    for g in phases:
        steps = list(range(g, n, T))
        for bits in product((0, 1), repeat=len(steps)):
            x = [0] * n
            for t, bit in zip(steps, bits):
                x[t] = bit
            out.append((p ** sum(bits) * (1 - p) ** (len(bits) - sum(bits)) / len(phases), tuple(x)))
    return out


def balls_in_bins_patterns(n: int, T: int):
    """Uniform ``s in 0..T-1``, ``x = 1{i = s mod T}``."""
    return [(1 / T, tuple(int(i % T == s) for i in range(n))) for s in range(T)]


def allocation_patterns(epochs: int, b: int, k: int, fresh: bool):
    """Balls-in-bins with ``k`` distinct slots of ``b`` per epoch, reused or fresh each epoch: every
    ``(prob, x)`` (``n = epochs * b``), by enumerating the slot sets epoch by epoch."""
    from itertools import combinations

    sets = list(combinations(range(b), k))
    choices = product(sets, repeat=epochs) if fresh else ((s,) * epochs for s in sets)
    out = []
    for pick in choices:
        x = [0] * (epochs * b)
        for e, chosen in enumerate(pick):
            for j in chosen:
                x[e * b + j] = 1
        out.append((1.0 / (len(sets) ** epochs if fresh else len(sets)), tuple(x)))
    return out


def truncated_log_ratio(C, n, b, p, warm, r, B, sigma, y) -> float:
    """``ln P(y|r)/Q(y|r)`` for truncated b-min-sep (App. D, Cor. D.2), by enumeration.

    For each sampled-participation pattern and each survival outcome in truncated rounds
    (``r_i >= B``, survival probability ``B/(r_i+1)``): P's mean uses ``x_i = 2`` (survived
    truncation), 1 (no truncation) or 0; Q's mean uses ``-1`` (survived truncation) or 0.
    """
    pats_p, pats_q = [], []
    for prob, x in minsep_patterns(n, b, p, warm):
        parts = [i for i in range(n) if x[i]]
        cut = [i for i in parts if r[i] >= B]
        for outcome in product((0, 1), repeat=len(cut)):
            w = prob
            xp = np.array(x, dtype=np.float64)
            xq = np.zeros(n)
            for i, surv in zip(cut, outcome):
                tp = B / (r[i] + 1)
                w *= tp if surv else 1 - tp
                xp[i] = 2.0 if surv else 0.0
                xq[i] = -1.0 if surv else 0.0
            pats_p.append((w, xp))
            pats_q.append((w, xq))
    return log_mixture_ratio(C, pats_p, sigma, y) - log_mixture_ratio(C, pats_q, sigma, y)
