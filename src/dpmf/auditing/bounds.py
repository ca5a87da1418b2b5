"""The bounds of an audit: epsilon *lower* bounds from a membership game with canaries (pure math).

An audit plants ``m`` canaries, includes each with an independent fair coin, runs the mechanism,
scores every canary (higher = "looks included"), turns the scores into guesses and counts how many
guesses are right. If the mechanism is ``(epsilon, delta)``-DP, many correct guesses are unlikely;
observing them *rejects* the claim. The largest epsilon rejected at confidence ``1 - beta`` is an
**empirical lower bound**: with probability at least ``1 - beta`` over the run, the mechanism's
true epsilon (at that delta) is at least this large. It is never a certificate of privacy: a small
lower bound says the attack found little, not that the mechanism is private (the certified upper
bound comes from :func:`dpmf.account`).

Two bounds, each a theorem, each with its own validity conditions:

* **The one-run theorem** (Steinke, Nasr & Jagielski 2023, "Privacy auditing with one (1) training
  run", arXiv 2305.08846, Thm. 3.1 with the delta term of their Sec. 3). One run, ``m`` canaries,
  ``r`` guesses (the rest abstain), ``v`` of them correct, ``p = e^eps / (1 + e^eps)`` and
  ``f(v) = P[Binomial(r, p) >= v]``. An ``(eps, delta)``-DP mechanism (in each coin; zero-out
  adjacency gives exactly that) satisfies

      P[W >= v] <= f(v) + 2 m delta max_{1 <= i <= v} (f(v - i) - f(v)) / i,

  the right-hand side is the p-value of :func:`one_run_p_value`, increasing in ``eps``, and
  :func:`one_run_epsilon` is ``sup{eps : p-value <= beta}``. Guesses may be any function of the
  released output (here: "in" for the ``k`` highest scores, "out" for the ``k`` lowest), but the
  number of guesses must be fixed before looking at the coins -- or the choice corrected for:
  :func:`audit_one_run` tries a short pre-registered grid of guess counts with a Bonferroni
  correction (``beta / len(grid)``), never the best of every threshold (that would be invalid).
  Ceiling: even if every guess is right the bound cannot exceed :func:`one_run_ceiling` (about 5.8
  with 1,000 canaries at 95% confidence).
* **Clopper-Pearson on (FPR, FNR)** over independent runs (:func:`clopper_pearson_epsilon`;
  Jagielski et al. 2020, Nasr et al. 2021; hypothesis-testing view of DP, Kairouz et al. 2015):
  a threshold fixed in advance, one-sided Clopper-Pearson upper bounds at ``beta / 2`` each on the
  false-positive and false-negative rates, and ``(eps, delta)``-DP forces
  ``FPR + e^eps FNR >= 1 - delta``, so ``eps_LB = ln((1 - delta - FNR_ub) / FPR_ub)``. Valid only
  when the trials are independent (one canary per run).

The *reference* a white-box audit is measured against (the ideal attacker on the Gaussian
mechanism with the claimed privacy, simulated) is a game, in :mod:`dpmf.auditing.game`.

Everything here is an exact function of counts (binomial and beta quantiles from scipy); every
inversion rounds the epsilon *down* (a lower bound must never be overstated).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError

__all__ = [
    "LOWER_BOUND_LABEL",
    "DEFAULT_GUESS_FRACTIONS",
    "one_run_p_value",
    "one_run_epsilon",
    "one_run_ceiling",
    "DEFAULT_OUT_RATIOS",
    "ONE_RUN_BOUND",
    "Guesses",
    "guess_grid",
    "correct_guesses",
    "choose_guesses",
    "fault_catchers",
    "OneRunResult",
    "audit_one_run",
    "audit_one_run_tests",
    "clopper_pearson_upper",
    "clopper_pearson_epsilon",
    "ManyRunResult",
    "audit_many_runs",
    "choose_threshold",
    "empirical_roc",
]

#: How every lower bound is named to users: it is evidence of leakage, never a privacy guarantee.
LOWER_BOUND_LABEL = "empirical lower bound (not a certificate)"

#: Candidate "in" guess counts, as fractions of the canaries (:func:`guess_grid`).
DEFAULT_GUESS_FRACTIONS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3)
#: Candidate "out" guess counts, as multiples of the "in" count (0: one-sided).
DEFAULT_OUT_RATIOS = (0.0, 0.5, 1.0, 2.0)
#: Bonferroni grid when nothing was pre-registered (black-box scores, a user's own scores): short,
#: since each candidate costs confidence.
BONFERRONI_FRACTIONS = (0.01, 0.03, 0.1, 0.3)
BONFERRONI_OUT_RATIOS = (0.0, 1.0)

#: The name of the one-run bound, as reports print it.
ONE_RUN_BOUND = "one-run theorem (Steinke, Nasr & Jagielski 2023, Thm. 3.1 with delta)"

#: Absolute tolerance of the epsilon root; the returned bound is moved down by it (and re-checked).
_XTOL = 1e-7


def _counts(canaries, guesses, correct) -> tuple[int, int, int]:
    m = _v.positive_int("canaries", canaries)
    r = _nonneg_int("guesses", guesses)
    v = _nonneg_int("correct", correct)
    if r > m:
        raise InvalidParameterError(f"guesses must be <= canaries ({m}), got {r}")
    if v > r:
        raise InvalidParameterError(f"correct must be <= guesses ({r}), got {v}")
    return m, r, v


def _nonneg_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 0:
        raise InvalidParameterError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


def _confidence(confidence) -> float:
    return _v.open_unit("confidence", confidence)


def _delta(delta) -> float:
    """A delta in ``[0, 1)`` (0: the pure-DP claim)."""
    d = _v.non_negative("delta", delta)
    if d >= 1:
        raise InvalidParameterError(f"delta must be in [0, 1), got {delta!r}")
    return d


def _tail(k, r: int, p: float):
    """``P[Binomial(r, p) >= k]`` (1 for ``k <= 0``), vectorized over ``k``."""
    return special.bdtrc(np.asarray(k) - 1, r, p)


def one_run_p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """The one-run theorem's bound on ``P[W >= correct]`` for an ``(epsilon, delta)``-DP mechanism.

    ``f(v) + 2 m delta max_{1<=i<=v} (f(v-i) - f(v)) / i`` with ``f(v) = P[Binomial(guesses, p) >= v]``,
    ``p = e^epsilon / (1 + e^epsilon)``, ``m = canaries`` (module docstring). Terms with ``i > v`` add
    nothing (``f(v - i) = 1`` there and the maximum is attained earlier). Capped at 1.

    >>> round(one_run_p_value(100, 10, 10, 0.0, 0.0), 6)  # ten fair coins all right: 2^-10
    0.000977
    """
    m, r, v = _counts(canaries, guesses, correct)
    eps = _v.non_negative("epsilon", epsilon)
    d = _delta(delta)
    return _p_value(m, r, v, eps, d)


def _p_value(m: int, r: int, v: int, eps: float, d: float) -> float:
    if v == 0:
        return 1.0
    p = float(special.expit(eps))
    tail = float(_tail(v, r, p))
    if d == 0:
        return min(tail, 1.0)
    i = np.arange(1, v + 1)
    gaps = (_tail(v - i, r, p) - tail) / i  # (f(v - i) - f(v)) / i
    return float(min(tail + 2.0 * m * d * max(float(np.max(gaps)), 0.0), 1.0))


def one_run_epsilon(canaries: int, guesses: int, correct: int, delta: float, confidence: float = 0.95) -> float:
    """``sup{eps >= 0 : one_run_p_value(...) <= 1 - confidence}`` (0 when not even ``eps = 0`` is
    rejected; never infinite: the p-value tends to ``P[Bin(r, 1) >= v] = 1``).

    Rounded down: the value returned is re-checked to reject at the confidence.

    >>> round(one_run_epsilon(1000, 100, 100, 0.0, 0.95), 3)  # every guess right, delta 0: p^100 = 0.05
    3.493
    """
    m, r, v = _counts(canaries, guesses, correct)
    d = _delta(delta)
    return _epsilon(m, r, v, d, 1.0 - _confidence(confidence))


def _epsilon(m: int, r: int, v: int, d: float, beta: float) -> float:
    def excess(eps: float) -> float:  # > 0: the claim (eps, delta) is rejected at level beta
        return beta - _p_value(m, r, v, eps, d)

    if v == 0 or _p_value(m, r, v, 0.0, 0.0) > beta or excess(0.0) <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while excess(hi) > 0:
        lo, hi = hi, hi * 2.0
        if hi > 1e4:  # (unreachable for finite counts)
            return lo
    root = optimize.brentq(excess, lo, hi, xtol=_XTOL)
    out = max(root - _XTOL, lo)
    if excess(out) <= 0:  # (never overstate: the bracket's low end always rejects)
        out = lo
    return float(out)


def one_run_ceiling(canaries: int, delta: float, confidence: float = 0.95, guesses: int | None = None) -> float:
    """The largest bound the one-run theorem can give with ``canaries`` canaries: every one of
    ``guesses`` guesses right, maximized over ``guesses`` when not given (a coarse search over
    powers of 1.2, refined around the best; the value is one actually attained).

    >>> round(one_run_ceiling(1000, 0.0, 0.95), 2)
    5.81
    """
    m = _v.positive_int("canaries", canaries)
    d = _v.non_negative("delta", delta)
    beta = 1.0 - _confidence(confidence)
    if guesses is not None:
        r = _nonneg_int("guesses", guesses)
        return _epsilon(m, min(r, m), min(r, m), d, beta)
    cands = sorted({int(round(1.2**k)) for k in range(0, 200) if 1.2**k <= m} | {m})
    vals = [_epsilon(m, r, r, d, beta) for r in cands]
    best = int(np.argmax(vals))
    lo, hi = cands[max(best - 1, 0)], cands[min(best + 1, len(cands) - 1)]
    fine = [_epsilon(m, r, r, d, beta) for r in range(lo, hi + 1, max((hi - lo) // 50, 1))]
    return float(max(vals + fine))


@dataclass(frozen=True)
class Guesses:
    """Pre-registered guesses: "in" for the ``k_in`` highest scores, "out" for the ``k_out`` lowest
    (the others abstain). Fixed before the coins are seen -- from public information only, e.g.
    :func:`choose_guesses` on a simulation of the claimed mechanism -- so no correction is needed."""

    k_in: int
    k_out: int

    @property
    def total(self) -> int:
        return self.k_in + self.k_out

    def check(self, canaries: int) -> "Guesses":
        ki, ko = _nonneg_int("k_in", self.k_in), _nonneg_int("k_out", self.k_out)
        if ki + ko < 1 or ki + ko > canaries:
            raise InvalidParameterError(
                f"guesses k_in + k_out must be between 1 and the number of canaries ({canaries}), got {ki} + {ko}"
            )
        return self


def guess_grid(canaries: int, fractions=DEFAULT_GUESS_FRACTIONS, out_ratios=DEFAULT_OUT_RATIOS) -> tuple[Guesses, ...]:
    """Candidate guesses: ``k_in = round(f m)`` for each fraction (at least 1) and ``k_out = round(r
    k_in)`` for each ratio, keeping those with ``k_in + k_out <= m``; duplicates dropped."""
    m = _v.positive_int("canaries", canaries)
    if m < 2:
        raise InvalidParameterError(f"an audit needs at least 2 canaries, got {m}")
    fr = [float(f) for f in fractions]
    if not fr or any(not 0 < f <= 1 for f in fr):
        raise InvalidParameterError(f"guess fractions must be in (0, 1], got {fractions!r}")
    out = set()
    for f in fr:
        k = max(int(round(f * m)), 1)
        for ratio in out_ratios:
            ko = int(round(float(ratio) * k))
            if k + ko <= m:
                out.add(Guesses(k, ko))
    if not out:
        raise InvalidParameterError(f"no guess count fits {m} canaries")
    return tuple(sorted(out, key=lambda g: (g.k_in, g.k_out)))


def correct_guesses(scores, included, guesses: Guesses) -> int:
    """How many of the pre-registered guesses are right (ties in the scores broken by a fixed
    permutation, never by the coins)."""
    s, c = _scores_and_coins(scores, included)
    g = guesses.check(s.size)
    return _right(c[_ranked(s)], g)


@dataclass(frozen=True)
class OneRunResult:
    """The outcome of :func:`audit_one_run`: the bound and how it was reached.

    ``epsilon_lower`` is the **empirical lower bound** (:data:`LOWER_BOUND_LABEL`) at
    ``confidence`` given by the one-run theorem. ``guesses`` / ``correct`` count the guesses made
    and the right ones; ``k_in`` / ``k_out`` how they split. ``selection`` says how the guess
    counts were fixed (pre-registered, or the best of ``tests`` candidates, each tested at
    ``(1 - confidence) / tests``: Bonferroni). ``ceiling`` is the bound had every guess been right."""

    epsilon_lower: float
    confidence: float
    delta: float
    canaries: int
    included: int
    k_in: int
    k_out: int
    correct: int
    ceiling: float
    tests: int = 1
    selection: str = "pre-registered"
    bound: str = ONE_RUN_BOUND
    #: every test tried: ``(label, k_in, k_out, correct, share of the level, epsilon)``
    details: tuple = ()

    @property
    def guesses(self) -> int:
        return self.k_in + self.k_out

    def to_dict(self) -> dict:
        return {
            "epsilon_lower": self.epsilon_lower, "confidence": self.confidence, "delta": self.delta,
            "canaries": self.canaries, "included": self.included, "guesses": self.guesses, "k_in": self.k_in,
            "k_out": self.k_out, "correct": self.correct, "ceiling": self.ceiling, "tests": self.tests,
            "selection": self.selection, "bound": self.bound,
            "tests_detail": [dict(zip(("label", "k_in", "k_out", "correct", "level_share", "epsilon"), d))
                             for d in self.details],
        }


def _scores_and_coins(scores, included) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64)
    c = np.asarray(included)
    if s.ndim != 1 or c.shape != s.shape:
        raise InvalidParameterError(f"scores and included must be 1-d of the same length, got {s.shape} and {c.shape}")
    if s.size < 2:
        raise InvalidParameterError(f"an audit needs at least 2 canaries, got {s.size}")
    if not np.all(np.isfinite(s)):
        raise InvalidParameterError("scores must be finite (a NaN or inf score has no rank)")
    if c.dtype != bool:
        if not np.all((c == 0) | (c == 1)):
            raise InvalidParameterError("included must hold booleans (or 0/1): was each canary's coin heads")
        c = c.astype(bool)
    return s, c


def _ranked(scores: np.ndarray) -> np.ndarray:
    """Order of the canaries from the lowest score to the highest; ties broken by a fixed random
    permutation (never by the coins, which the ranking must not see)."""
    tie = np.random.default_rng(0).permutation(scores.size)
    return np.lexsort((tie, scores))


def _right(ranked_coins: np.ndarray, g: Guesses) -> int:
    """Right guesses of ``g`` given the coins ordered from the lowest score to the highest: the
    ``k_in`` highest included, the ``k_out`` lowest left out."""
    m = ranked_coins.size
    return int(ranked_coins[m - g.k_in:].sum()) + int((~ranked_coins[: g.k_out]).sum())


def audit_one_run(scores, included, delta: float, confidence: float = 0.95, *,
                  guesses=None, weights=None, grid=None) -> OneRunResult:
    """The one-run theorem's empirical lower bound from canary scores and their coins.

    ``guesses``: pre-registered :class:`Guesses`, or a sequence of them tested with a (weighted)
    Bonferroni correction -- candidate ``i`` at level ``beta * weights[i]`` (weights summing to at
    most 1; default equal) -- keeping the largest bound. Without ``guesses``: every candidate of
    ``grid`` (default a short :func:`guess_grid`) at equal levels. Valid wherever the maximum falls;
    ``scores`` must have been computed without the coins ``included``. (Several score vectors:
    :func:`audit_one_run_tests`.)

    >>> rng = np.random.default_rng(0)
    >>> coins = rng.random(1000) < 0.5
    >>> res = audit_one_run(rng.normal(size=1000) + 4.0 * coins, coins, delta=1e-5)
    >>> res.correct == res.guesses, 3.5 < res.epsilon_lower <= res.ceiling  # every guess right: at the ceiling
    (True, True)
    """
    s, _ = _scores_and_coins(scores, included)
    if guesses is not None:
        cands = (guesses,) if isinstance(guesses, Guesses) else tuple(guesses)
        if not cands or not all(isinstance(g, Guesses) for g in cands):
            raise InvalidParameterError("guesses must be a Guesses or a non-empty sequence of them")
        selection = "pre-registered" if len(cands) == 1 else f"{len(cands)} pre-registered guess counts, weighted Bonferroni"
    else:
        cands = tuple(grid if grid is not None else guess_grid(s.size, BONFERRONI_FRACTIONS, BONFERRONI_OUT_RATIOS))
        selection = f"best of {len(cands)} guess counts, Bonferroni-corrected"
    if weights is None:
        weights = [1.0 / len(cands)] * len(cands)
    elif np.shape(weights) != (len(cands),):
        raise InvalidParameterError(f"weights must hold one number per guess count ({len(cands)}), got {weights!r}")
    res = audit_one_run_tests(included, delta, confidence, [(s, g, w, "") for g, w in zip(cands, weights)])
    return dataclasses.replace(res, selection=selection)


def audit_one_run_tests(included, delta: float, confidence: float, tests) -> OneRunResult:
    """The one-run bound over several pre-registered tests with a weighted Bonferroni correction.

    ``tests``: ``(scores, guesses, weight, label)`` tuples -- a score vector (computed without the
    coins), a :class:`Guesses` and the share ``weight`` of the level ``1 - confidence`` it is
    tested at (shares summing to at most 1). The largest bound is reported; the winning test's
    label is kept in ``selection``. Valid because every test is fixed before the coins are seen and
    the shares add up to the level.
    """
    if not tests:
        raise InvalidParameterError("tests must not be empty")
    c = np.asarray(included)
    d = _delta(delta)
    conf = _confidence(confidence)
    w = np.asarray([t[2] for t in tests], dtype=np.float64)
    if not np.all(np.isfinite(w)) or np.any(w <= 0) or w.sum() > 1 + 1e-12:
        raise InvalidParameterError(f"test weights must be positive numbers summing to at most 1, got {w.tolist()}")
    beta = 1.0 - conf
    best = None
    details = []
    for scores, g, wi, label in tests:
        s, coins = _scores_and_coins(scores, c)
        m = s.size
        if not isinstance(g, Guesses):
            raise InvalidParameterError(f"each test needs a Guesses, got {type(g).__name__}")
        g.check(m)
        v = _right(coins[_ranked(s)], g)
        e = _epsilon(m, g.total, v, d, beta * float(wi))
        details.append((label, g.k_in, g.k_out, v, float(wi), e))
        if best is None or e > best[0]:
            best = (e, g, v, float(wi), label, m, int(coins.sum()))
    e, g, v, wi, label, m, inc = best
    ceiling = _epsilon(m, g.total, g.total, d, beta * wi)
    return OneRunResult(e, conf, d, m, inc, g.k_in, g.k_out, v, ceiling, len(tests),
                        label or "pre-registered", details=tuple(details))


def fault_catchers(canaries: int) -> tuple[Guesses, ...]:
    """Two guess counts for gross faults, pre-registered next to the claim-optimal one: the top
    quarter guessed "in" (a fault that exposes a part of the canaries perfectly, e.g. steps without
    noise), and 40% each way (a fault that exposes them all, e.g. no clipping or far less noise)."""
    m = _v.positive_int("canaries", canaries)
    return (Guesses(max(m // 4, 1), 0), Guesses(max(int(0.4 * m), 1), max(int(0.4 * m), 1)))


def choose_guesses(simulate, canaries: int, delta: float, confidence: float = 0.95, *, trials: int = 50,
                   grid=None) -> Guesses:
    """Pre-register guess counts from simulations of the *claimed* mechanism: the candidate of
    ``grid`` (default :func:`guess_grid`) with the largest mean bound over ``trials`` simulated games
    (the mean: near the detection threshold most bounds are 0 and a median cannot tell the
    candidates apart).

    ``simulate(trial)`` returns ``(scores, coins)`` of one simulated game (public information only:
    the configuration being audited, never the audited run). Valid because the choice is fixed
    before the audited run's coins exist.
    """
    m = _v.positive_int("canaries", canaries)
    d = _v.non_negative("delta", delta)
    beta = 1.0 - _confidence(confidence)
    n = _v.positive_int("trials", trials)
    cands = tuple(g.check(m) for g in (grid if grid is not None else guess_grid(m)))
    counts = np.zeros((n, len(cands)))
    for t in range(n):
        s, c = _scores_and_coins(*simulate(t))
        if s.size != m:
            raise InvalidParameterError(f"simulate returned {s.size} scores, expected {m}")
        sc = c[_ranked(s)]
        top, bottom = np.cumsum(sc[::-1]), np.cumsum(~sc)  # right "in" / "out" guesses by count
        for j, g in enumerate(cands):
            counts[t, j] = (top[g.k_in - 1] if g.k_in else 0) + (bottom[g.k_out - 1] if g.k_out else 0)
    cache: dict = {}

    def bound(r: int, v: int) -> float:
        if (r, v) not in cache:
            cache[(r, v)] = _epsilon(m, r, v, d, beta)
        return cache[(r, v)]

    mean = [np.mean([bound(g.total, int(v)) for v in counts[:, j]]) for j, g in enumerate(cands)]
    j = max(range(len(cands)), key=lambda i: (mean[i], -cands[i].total))
    return cands[j]


# ---------------------------------------------------------------------------- many runs


def clopper_pearson_upper(successes: int, trials: int, confidence: float) -> float:
    """One-sided Clopper-Pearson upper confidence bound on a binomial rate: the ``p`` with
    ``P[Binomial(trials, p) <= successes] = 1 - confidence`` (1 when every trial succeeded).

    >>> round(clopper_pearson_upper(0, 100, 0.95), 5)  # the rule of three, exactly
    0.02951
    """
    n = _v.positive_int("trials", trials)
    k = _nonneg_int("successes", successes)
    if k > n:
        raise InvalidParameterError(f"successes must be <= trials ({n}), got {k}")
    conf = _confidence(confidence)
    if k == n:
        return 1.0
    return float(stats.beta.ppf(conf, k + 1, n - k))


def clopper_pearson_epsilon(false_positives: int, negatives: int, false_negatives: int, positives: int,
                            delta: float, confidence: float = 0.95) -> float:
    """``max(0, ln((1 - delta - FNR_ub) / FPR_ub))`` with one-sided Clopper-Pearson upper bounds at
    ``(1 - confidence) / 2`` each: the many-run lower bound for a threshold fixed in advance
    (one-sided rule: "in" when the score is at least the threshold).

    >>> round(clopper_pearson_epsilon(0, 1000, 0, 1000, 1e-5, 0.95), 2)  # no error in 1000 + 1000 runs
    5.6
    """
    d = _v.non_negative("delta", delta)
    conf = _confidence(confidence)
    half = 1.0 - (1.0 - conf) / 2.0
    fpr = clopper_pearson_upper(false_positives, negatives, half)
    fnr = clopper_pearson_upper(false_negatives, positives, half)
    top = 1.0 - d - fnr
    if top <= 0 or fpr >= 1.0:
        return 0.0
    return float(max(0.0, math.log(top) - math.log(fpr)))


@dataclass(frozen=True)
class ManyRunResult:
    """The outcome of :func:`audit_many_runs` (Clopper-Pearson, threshold chosen on a held-out split)."""

    epsilon_lower: float
    confidence: float
    delta: float
    runs: int
    threshold: float
    false_positives: int
    negatives: int
    false_negatives: int
    positives: int
    bound: str = "Clopper-Pearson on (FPR, FNR), threshold chosen on a separate half of the runs"

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("epsilon_lower", "confidence", "delta", "runs", "threshold",
                                              "false_positives", "negatives", "false_negatives", "positives", "bound")}


def audit_many_runs(scores, included, delta: float, confidence: float = 0.95, *, threshold: float | None = None,
                    seed: int = 0) -> ManyRunResult:
    """Clopper-Pearson lower bound from one score per independent run (one canary per run).

    With a pre-registered ``threshold`` (fixed before the runs, e.g. :func:`choose_threshold` on
    simulations of the claimed mechanism) every run counts. Without one, the runs are split at
    random (``seed``) into halves: the threshold maximizing the bound is chosen on the first half
    (with its coins) and the bound is computed on the second half only -- valid because the second
    half's coins never chose it.
    """
    s, c = _scores_and_coins(scores, included)
    d = _v.non_negative("delta", delta)
    conf = _confidence(confidence)

    def bound(idx, t) -> tuple[int, int, int, int, float]:
        sc, co = s[idx], c[idx]
        fp, neg = int(np.sum((sc >= t) & ~co)), int(np.sum(~co))
        fn, pos = int(np.sum((sc < t) & co)), int(np.sum(co))
        if neg == 0 or pos == 0:
            return fp, neg, fn, pos, 0.0
        return fp, neg, fn, pos, clopper_pearson_epsilon(fp, neg, fn, pos, d, conf)

    if threshold is not None:
        t = float(threshold)
        if not math.isfinite(t):
            raise InvalidParameterError(f"threshold must be a finite number, got {threshold!r}")
        fp, neg, fn, pos, eps = bound(np.arange(s.size), t)
        return ManyRunResult(eps, conf, d, int(s.size), t, fp, neg, fn, pos,
                             bound="Clopper-Pearson on (FPR, FNR) at a pre-registered threshold")
    if s.size < 4:
        raise InvalidParameterError(f"a many-run audit without a threshold needs at least 4 runs, got {s.size}")
    perm = np.random.default_rng(seed).permutation(s.size)
    pick, test = perm[: s.size // 2], perm[s.size // 2:]
    candidates = np.unique(s[pick])
    best_t, best = float(candidates[-1]), -1.0
    for t in candidates:
        e = bound(pick, t)[4]
        if e > best:
            best_t, best = float(t), e
    fp, neg, fn, pos, eps = bound(test, best_t)
    return ManyRunResult(eps, conf, d, int(s.size), best_t, fp, neg, fn, pos)


def choose_threshold(in_scores, out_scores, runs: int, delta: float, confidence: float = 0.95) -> float:
    """Pre-register a many-run threshold from *simulated* scores of the claimed mechanism: the
    threshold whose Clopper-Pearson bound at the expected counts of ``runs`` runs (half in, half out)
    is the largest. Public information only, so the audited runs may all be used."""
    a = np.sort(np.asarray(in_scores, dtype=np.float64))
    b = np.sort(np.asarray(out_scores, dtype=np.float64))
    if a.size == 0 or b.size == 0:
        raise InvalidParameterError("choose_threshold needs simulated scores of both kinds")
    R = _v.positive_int("runs", runs)
    half = max(R // 2, 1)
    best_t, best = float(np.median(b)), 0.0  # (when nothing gives a positive bound: the out-scores' median)
    both = np.concatenate((a, b))
    for t in np.unique(np.quantile(both, np.linspace(0.0, 1.0, 201))):  # 201 candidate thresholds
        fpr = 1.0 - np.searchsorted(b, t, side="left") / b.size
        fnr = np.searchsorted(a, t, side="left") / a.size
        e = clopper_pearson_epsilon(int(round(fpr * half)), half, int(round(fnr * half)), half, delta, confidence)
        if e > best:
            best_t, best = float(t), e
    return best_t


def empirical_roc(scores, included, points: int = 16, confidence: float | None = None) -> tuple[tuple[float, float], ...]:
    """``(FPR, TPR)`` of "in if among the ``k`` highest scores" for ``points`` values of ``k`` spread
    log-evenly over the ranks: point estimates of the attack's ROC, for drawing against a trade-off
    curve (they use the coins, as any plot of an attack does).

    With ``confidence``: instead of the estimates, the one-sided Clopper-Pearson *upper* bound on
    the FPR and *lower* bound on the TPR of each point, each at ``(1 - confidence) / (2 points)``
    (simultaneous over the points), so a correct mechanism's points fall below its curve with
    probability about ``confidence`` -- treating the canaries as independent trials, which holds for
    white-box audit-block canaries under independent per-example sampling and is an approximation
    otherwise."""
    s, c = _scores_and_coins(scores, included)
    pos, neg = int(c.sum()), int((~c).sum())
    if pos == 0 or neg == 0:
        return ()
    sc = c[_ranked(s)][::-1]  # highest score first
    tp, fp = np.cumsum(sc), np.cumsum(~sc)
    ks = np.unique(np.clip(np.round(np.logspace(0, math.log10(s.size), points)).astype(int), 1, s.size))
    if confidence is None:
        return tuple((float(fp[k - 1] / neg), float(tp[k - 1] / pos)) for k in ks)
    level = 1.0 - (1.0 - _confidence(confidence)) / (2 * len(ks))
    out = []
    for k in ks:
        fpr_ub = clopper_pearson_upper(int(fp[k - 1]), neg, level)
        tpr_lb = 1.0 - clopper_pearson_upper(pos - int(tp[k - 1]), pos, level)
        out.append((float(fpr_ub), float(tpr_lb)))
    return tuple(out)
