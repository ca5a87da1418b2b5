"""Certification of Monte Carlo accounting: Estimate-Verify-Release without empty output.

Dong & Ganesh 2026 (``papers/001``), App. A, Algorithm 5 and Theorem A.1 (notes
``bminsep-montecarlo.md`` Sec. 3 "Algorithm 5", Sec. 4 "Thm A.1", oracle O9).

**Algorithm 5.** Candidate mechanisms ``M_1, ..., M_k`` ordered so that ``M_i`` satisfies every
(eps, delta)-DP guarantee of ``M_{i-1}`` (here: the same strategy and sampler with increasing noise
``sigma_1 < ... < sigma_{k-1}``), and a fallback ``M_k`` *proved* (eps, delta)-DP by another
accountant. With verifier outcomes ``v_1..v_{k-1}`` (``v_k = 1``) from *independent* randomness,
release ``M_{i*}``, ``i* = min{i : v_j = 1 for all j >= i}``. Only the suffix of passes matters, so
:func:`estimate_verify_release` verifies from the largest sigma down and stops at the first failure
(the output has the same distribution as verifying every candidate).

**Verifier.** Draw ``s`` losses from P (and ``s`` from Q for the add direction, both directions being
required, footnote 1 of the paper), compute ``delta~ = (1/s) sum (1 - e^{eps - L_j})_+`` per direction
and accept iff ``delta~ <= delta'`` in *both* directions. dpmf computes ``delta~`` from pessimistically
binned losses (:class:`~dpmf.accounting.montecarlo.statistics.LossHistogram`), which is >= the exact
``delta~``, so it accepts no more often than the exact verifier.

**Failure probability.** If a candidate is *not* (eps, delta)-DP then some direction has true
divergence ``H > delta``. Its summands are i.i.d. in ``[0, 1]`` with mean ``H``, and by the
Chernoff-Hoeffding inequality (Hoeffding 1963, Thm. 1; Fact 4.2 of Chua et al. 2025 as used in the
paper):

    Pr[v = 1] <= Pr[delta~ <= delta'] <= q(delta, delta', s) = exp(-s KL(Bern(delta') || Bern(delta))),

for ``delta >= delta'`` (KL(delta' || .) increases on [delta', 1], so ``H > delta`` only lowers it).

**Guarantee (Thm. A.1).** With these ``q`` and a fallback that is (eps, delta)-DP, Algorithm 5 is

    (eps, delta_o)-DP,   delta_o(delta, delta', s) = delta + q(delta, delta', s) (1 - delta),

for *every* ``delta in [delta', 1)``; :func:`overall_delta` minimizes over ``delta`` numerically and
returns the value at the minimizer it found (any choice is valid, so imprecise minimization only
costs tightness). Recipe of the paper's experiments: ``delta' = delta_t / 2`` and the smallest ``s`` with
``min_delta delta_o <= delta_t`` (:func:`minimum_samples`): ``delta_t = 1e-3`` needs s = 75,013
(O9). All failure probabilities are evaluated in log space and rounded up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from dpmf import validation as _v
from dpmf.accounting.montecarlo.statistics import LossHistogram, kl_bernoulli
from dpmf.errors import InvalidParameterError

_ROUND_UP = 1.0 + 1e-12


def verifier_acceptance_bound(num_samples: int, base_delta: float, delta: float) -> float:
    """``q(delta, delta', s) = exp(-s KL(delta' || delta))`` for ``delta >= delta'`` (else 1).

    Upper bound on the probability that the verifier (threshold ``base_delta`` = delta') accepts a
    mechanism whose true divergence exceeds ``delta``.

    >>> q = verifier_acceptance_bound(75_013, 5e-4, 1e-3)
    >>> 0 < q < 1e-3
    True
    """
    s = _v.positive_int("num_samples", num_samples)
    dp = _v.open_unit("base_delta", base_delta)
    d = _v.open_unit("delta", delta)
    return _q(s, dp, d)


def _q(s: int, dp: float, d: float) -> float:
    if d <= dp:
        return 1.0
    return min(1.0, math.exp(-s * kl_bernoulli(dp, d)) * _ROUND_UP)


@dataclass(frozen=True)
class OverallDelta:
    """``delta_o = delta + q (1 - delta)`` at the internal ``delta`` chosen by :func:`overall_delta`."""

    overall: float
    delta: float
    failure_probability: float


def overall_delta(num_samples: int, base_delta: float) -> OverallDelta:
    """``min over delta in [delta', 1) of delta + q(delta, delta', s)(1 - delta)`` (Thm. A.1).

    Minimized by bounded scalar search on ``log(delta)`` then evaluated at the point found (valid
    whatever the minimizer's accuracy).

    >>> round(overall_delta(75_013, 5e-4).overall / 1e-3, 4) <= 1.0
    True
    """
    from scipy.optimize import minimize_scalar

    s = _v.positive_int("num_samples", num_samples)
    dp = _v.open_unit("base_delta", base_delta)

    def value(log_d: float) -> float:
        d = min(math.exp(log_d), 1.0 - 1e-16)
        if d <= dp:
            return 1.0
        q = _q(s, dp, d)
        return d + q * (1.0 - d)

    lo, hi = math.log(dp), math.log(1.0 - 1e-12)
    # the minimizer sits where q is small: bracket it on a coarse grid first, then refine
    grid = [lo + (hi - lo) * i / 400 for i in range(1, 401)]
    vals = [value(x) for x in grid]
    j = min(range(len(grid)), key=vals.__getitem__)
    a = grid[j - 1] if j > 0 else lo
    b = grid[j + 1] if j + 1 < len(grid) else hi
    res = minimize_scalar(value, bounds=(a, b), method="bounded", options={"xatol": 1e-12})
    best_x = min((res.x, grid[j]), key=value)
    d = min(math.exp(best_x), 1.0 - 1e-16)
    q = _q(s, dp, d)
    return OverallDelta(min(1.0, (d + q * (1.0 - d)) * _ROUND_UP), d, q)


def minimum_samples(target_delta: float, base_delta: float | None = None) -> int:
    """Smallest ``s`` with ``overall_delta(s, delta').overall <= target_delta`` (default delta' = delta_t/2).

    The number of Monte Carlo samples per direction and candidate that Algorithm 5 needs to
    certify ``target_delta`` (notes O9: 75,013 at 1e-3; 59,299,627 at 2e-6; ~1.18e10 at 1.301e-8).
    """
    dt = _v.open_unit("target_delta", target_delta)
    dp = dt / 2 if base_delta is None else _v.open_unit("base_delta", base_delta)
    if dp >= dt:
        raise InvalidParameterError(f"base_delta must be < target_delta = {dt!r}, got {dp!r}")

    def ok(s: int) -> bool:
        return overall_delta(s, dp).overall <= dt

    lo, hi = 0, 1
    while not ok(hi):
        lo, hi = hi, hi * 2
        if hi > 10**16:
            raise InvalidParameterError(f"no sample size <= 1e16 certifies target_delta={dt!r} with base_delta={dp!r}")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def base_delta_for(num_samples: int, target_delta: float) -> float:
    """Largest verifier threshold delta' with ``overall_delta(s, delta') <= target_delta``.

    Notes Sec. 3: with s = 7.5e9 and delta_t = 1.301e-8 this is about 5.14e-9.
    """
    s = _v.positive_int("num_samples", num_samples)
    dt = _v.open_unit("target_delta", target_delta)
    lo, hi = 0.0, dt
    if overall_delta(s, dt * 1e-6).overall > dt:
        raise InvalidParameterError(
            f"num_samples={s} is too small to certify target_delta={dt!r} "
            f"(needs at least {minimum_samples(dt, dt * 1e-6)} with delta' = 1e-6 delta_t)"
        )
    lo = dt * 1e-6
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if overall_delta(s, mid).overall <= dt:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return lo


def verify(histograms: dict[str, LossHistogram], epsilon: float, base_delta: float) -> bool:
    """The verifier V: accept iff every direction's binned ``delta~(epsilon) <= base_delta``.

    ``histograms`` must hold both ``"remove"`` and ``"add"`` (a guarantee for zero-out adjacency
    needs both directions).
    """
    eps = _v.non_negative("epsilon", epsilon)
    dp = _v.open_unit("base_delta", base_delta)
    missing = {"remove", "add"} - set(histograms)
    if missing:
        raise InvalidParameterError(f"verify needs histograms for both directions, missing {sorted(missing)}")
    return all(h.delta_estimate(eps) <= dp for h in histograms.values())


@dataclass(frozen=True)
class EVROutcome:
    """Result of Algorithm 5: the released index (``len(candidates)`` = fallback) and verdicts."""

    index: int
    verdicts: dict[int, bool]
    fallback: bool


def estimate_verify_release(
    candidates: Sequence[float],
    verifier: Callable[[int, float], bool],
    *,
    callback: Callable[[int, float, bool], None] | None = None,
) -> EVROutcome:
    """Algorithm 5 over ascending ``candidates`` (noise multipliers of M_1..M_{k-1}).

    ``verifier(i, sigma_i)`` must use randomness independent of every other call. Verification
    goes from the largest sigma down and stops at the first rejection; the released index is the
    smallest ``i`` whose every ``j >= i`` passed, or ``len(candidates)`` (the fallback M_k) when the
    largest candidate fails.

    >>> estimate_verify_release([0.5, 0.6, 0.7], lambda i, s: s > 0.55).index
    1
    """
    sig = [_v.positive("candidates", c) for c in candidates]
    if any(b <= a for a, b in zip(sig, sig[1:])):
        raise InvalidParameterError(f"candidates must be strictly increasing noise multipliers, got {list(sig)}")
    verdicts: dict[int, bool] = {}
    released = len(sig)
    for i in range(len(sig) - 1, -1, -1):
        ok = bool(verifier(i, sig[i]))
        verdicts[i] = ok
        if callback is not None:
            callback(i, sig[i], ok)
        if not ok:
            break
        released = i
    return EVROutcome(released, verdicts, released == len(sig))
