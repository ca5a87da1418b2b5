"""Calibration: the smallest noise (or the most steps) whose *reported* epsilon meets a target.

Works for any monotone accountant given as a function. The search brackets the answer by
doubling, then bisects. The returned value is always one the accountant was evaluated at and
found to pass, so it is never on the wrong side of the target, whatever the accountant's
discretization does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from dpmf import validation as _v
from dpmf.errors import CalibrationError

ProgressCallback = Callable[[float, float], None]
"""Called as ``callback(parameter, epsilon)`` after each accountant evaluation."""


@dataclass(frozen=True)
class CalibrationResult:
    """The calibrated parameter, its reported epsilon and the search trace."""

    value: float
    epsilon: float
    evaluations: int
    trace: tuple[tuple[float, float], ...] = field(repr=False, default=())


def smallest_noise(
    epsilon_of: Callable[[float], float],
    target_epsilon: float,
    *,
    initial: float = 1.0,
    rel_tol: float = 1e-4,
    max_value: float = 1e6,
    callback: ProgressCallback | None = None,
) -> CalibrationResult:
    """Smallest ``sigma`` (to relative ``rel_tol``) with ``epsilon_of(sigma) <= target_epsilon``.

    ``epsilon_of`` must be non-increasing in sigma (true of every accountant in dpmf). The result
    satisfies ``epsilon_of(result.value) <= target_epsilon`` by construction.
    """
    target = _v.positive("target_epsilon", target_epsilon)
    initial = _v.positive("initial", initial)
    rel_tol = _v.positive("rel_tol", rel_tol)
    trace: list[tuple[float, float]] = []

    def ev(x: float) -> float:
        eps = float(epsilon_of(x))
        if math.isnan(eps):
            raise CalibrationError(f"the accountant returned NaN at noise_multiplier={x!r}")
        trace.append((x, eps))
        if callback is not None:
            callback(x, eps)
        return eps

    hi, eps_hi = initial, ev(initial)
    if eps_hi > target:  # grow until the target is met
        lo = hi
        while eps_hi > target:
            lo = hi
            hi *= 2
            if hi > max_value:
                raise CalibrationError(
                    f"no noise_multiplier <= {max_value:g} reaches epsilon <= {target:g} "
                    f"(epsilon at {lo:g} is {eps_hi:g})"
                )
            eps_hi = ev(hi)
    else:  # shrink until the target fails
        lo = hi / 2
        while (eps_lo := ev(lo)) <= target:
            hi, eps_hi = lo, eps_lo
            lo /= 2
            if lo < 1e-6:
                return CalibrationResult(hi, eps_hi, len(trace), tuple(trace))
    # Illinois (modified regula falsi) on log(epsilon) vs log(sigma), with bisection safeguards.
    # The bracket invariant: epsilon(lo) > target >= epsilon(hi); hi is always a passing point.
    eps_lo = next(e for x, e in reversed(trace) if x == lo)
    f_lo = math.log(max(eps_lo, 1e-300)) - math.log(target)
    f_hi = math.log(max(eps_hi, 1e-300)) - math.log(target)
    side = 0
    while hi - lo > rel_tol * hi:
        x_lo, x_hi = math.log(lo), math.log(hi)
        if f_lo > 0 > f_hi and math.isfinite(f_lo):
            guess = x_hi - f_hi * (x_hi - x_lo) / (f_hi - f_lo)
        else:
            guess = 0.5 * (x_lo + x_hi)
        width = x_hi - x_lo
        guess = min(max(guess, x_lo + 0.02 * width), x_hi - 0.02 * width)
        mid = math.exp(guess)
        eps_mid = ev(mid)
        f_mid = math.log(max(eps_mid, 1e-300)) - math.log(target)
        if eps_mid <= target:
            hi, eps_hi, f_hi = mid, eps_mid, f_mid
            if side == 1:
                f_lo /= 2
            side = 1
        else:
            lo, f_lo = mid, f_mid
            if side == -1:
                f_hi /= 2
            side = -1
    return CalibrationResult(hi, eps_hi, len(trace), tuple(trace))


def largest_count(
    epsilon_of: Callable[[int], float],
    target_epsilon: float,
    *,
    max_count: int = 10**9,
    callback: ProgressCallback | None = None,
) -> CalibrationResult:
    """Largest integer ``n >= 1`` (e.g. a number of steps) with ``epsilon_of(n) <= target``.

    ``epsilon_of`` must be non-decreasing in ``n``. Raises :class:`CalibrationError` when even
    ``n = 1`` exceeds the target.
    """
    target = _v.positive("target_epsilon", target_epsilon)
    trace: list[tuple[float, float]] = []

    def ev(n: int) -> float:
        eps = float(epsilon_of(n))
        trace.append((float(n), eps))
        if callback is not None:
            callback(float(n), eps)
        return eps

    if ev(1) > target:
        raise CalibrationError(f"even one step exceeds epsilon {target:g} (epsilon {trace[-1][1]:g})")
    lo, eps_lo = 1, trace[-1][1]
    hi = 2
    while True:
        eps = ev(hi)
        if eps > target:
            break
        lo, eps_lo = hi, eps
        if hi >= max_count:
            return CalibrationResult(float(lo), eps_lo, len(trace), tuple(trace))
        hi = min(2 * hi, max_count)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        eps = ev(mid)
        if eps <= target:
            lo, eps_lo = mid, eps
        else:
            hi = mid
    return CalibrationResult(float(lo), eps_lo, len(trace), tuple(trace))
