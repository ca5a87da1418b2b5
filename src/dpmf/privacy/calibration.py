"""Calibration: the smallest noise (or the most steps) whose *reported* epsilon meets a target.

Works for any monotone accountant given as a function. The search brackets the answer (from a
starting point: given, or a *hint* such as the unamplified noise, see :func:`search_hint`), then
narrows the bracket by safeguarded regula falsi (or, for accountants whose evaluations cost seconds,
by secant steps that aim to close it in two: ``smallest_noise(secant=True)``). The returned value is always one the accountant
was evaluated at and found to pass, so it is never on the wrong side of the target, whatever the
accountant's discretization does: starting points and hints only change how fast the search is
(and which sigmas it evaluates, which matters for accountants whose cost grows at small noise),
never whether its answer passes.
"""

from __future__ import annotations

import contextvars
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

from dpmf import validation as _v
from dpmf.errors import CalibrationError, NoiseTooSmallError

ProgressCallback = Callable[[float, float], None]
"""Called as ``callback(parameter, epsilon)`` after each accountant evaluation."""


class NoiseLimitExceeded(CalibrationError):
    """The accountant's epsilon at the largest noise of interest (``limit``) is above the target,
    so the smallest passing noise is larger than ``limit`` (the accountant is non-increasing in
    the noise): a search told to stop there (``smallest_noise(..., limit=...)``,
    ``dpmf.calibrate(..., max_noise_multiplier=...)``) gives up after that one evaluation."""

    def __init__(self, message: str, limit: float, epsilon: float, *, lower_bound: bool = False,
                 method: Optional[str] = None) -> None:
        super().__init__(message)
        self.limit = float(limit)
        self.epsilon = float(epsilon)
        #: ``epsilon`` is a lower bound on the accountant's epsilon at ``limit`` (found from part
        #: of its work), not its value
        self.lower_bound = bool(lower_bound)
        #: the accountant whose ``epsilon`` this is (the tightest at ``limit``), when known
        self.method = method


#: Where searches that were given no starting point start (see :func:`search_hint`), and whether
#: that start is known to be near the answer.
_HINT: contextvars.ContextVar[Optional[float]] = contextvars.ContextVar("dpmf_calibration_hint", default=None)
_NEAR: contextvars.ContextVar[bool] = contextvars.ContextVar("dpmf_calibration_near", default=False)


@contextmanager
def search_hint(start: Optional[float], *, near: bool = False) -> Iterator[None]:
    """Inside the block, :func:`smallest_noise` calls that were given no ``initial`` start at
    ``start`` (a noise multiplier expected to pass, e.g. the unamplified one: amplification only
    lowers epsilon) instead of 1. ``near=True``: the start is a noise already seen to pass and
    expected near the answer (a plan's limit, :func:`dpmf.calibrate`'s ``max_noise_multiplier``):
    the steps below it aim at the answer the ``1 / sigma^2`` law predicts (:func:`_near_factor`:
    the first just above, the next just under) instead of at least halving the noise (smaller
    noises cost more to evaluate). Only the path changes; the answer is still an evaluated, passing noise.

    ``dpmf.calibrate`` sets it around accountants that run their own search (MMCC, random
    allocation), so a search starts from a cheap upper bracket and shrinks towards the answer
    rather than starting at sigma = 1, where some accountants need far more time and memory. A
    hint is only a starting point: a failing hint makes the search grow from there, and the
    answer is always an evaluated, passing noise. ``None`` leaves the default."""
    if start is not None:
        start = _v.positive("start", start)
    token, close = _HINT.set(start), _NEAR.set(bool(near))
    try:
        yield
    finally:
        _HINT.reset(token)
        _NEAR.reset(close)


@dataclass(frozen=True)
class CalibrationResult:
    """The calibrated parameter, its reported epsilon and the search trace."""

    value: float
    epsilon: float
    evaluations: int
    trace: tuple[tuple[float, float], ...] = field(repr=False, default=())
    #: the search stopped at the smallest noise the accountant evaluates
    #: (:class:`~dpmf.errors.NoiseTooSmallError`): smaller noises may meet the target too
    at_floor: bool = False


def smallest_noise(
    epsilon_of: Callable[[float], float],
    target_epsilon: float,
    *,
    initial: float | None = None,
    rel_tol: float = 1e-4,
    max_value: float = 1e6,
    limit: float | None = None,
    callback: ProgressCallback | None = None,
    secant: bool = False,
    revised: Callable[[float], float | None] | None = None,
) -> CalibrationResult:
    """Smallest ``sigma`` (to relative ``rel_tol``) with ``epsilon_of(sigma) <= target_epsilon``.

    ``epsilon_of`` must be non-increasing in sigma (true of every accountant in dpmf). The result
    satisfies ``epsilon_of(result.value) <= target_epsilon`` by construction.

    The search starts at ``initial`` (default: the active :func:`search_hint`, else 1). From a
    passing start it shrinks by steps guided by the epsilon it saw (never more than 8x at once)
    until a noise fails; from a failing one it doubles. With ``limit`` only noises ``<= limit``
    are of interest: the search starts at ``min(start, limit)`` and raises
    :class:`NoiseLimitExceeded` as soon as ``epsilon_of(limit)`` is above the target.

    An accountant that cannot evaluate a noise that small raises
    :class:`~dpmf.errors.NoiseTooSmallError` with the smallest it accepts (its ``smallest``): the
    search evaluates there instead and never goes below it, so a huge target (``epsilon = 1e6``,
    ``delta`` near 1) ends at that noise, fast, with ``at_floor=True`` (the answer still passes:
    it was evaluated). Without such a floor the search stops shrinking below 1e-6.

    ``secant=True`` (for accountants whose every evaluation costs seconds: random allocation with
    Markov members) takes fewer steps to the same contract: below a passing start the first step aims
    just above the ``1 / sigma^2`` answer (as a ``near`` start's), the next ones at the root that the
    last two passing points' slope of ``log epsilon`` vs ``log sigma`` predicts, a little below it
    (:func:`_secant_factor`), and inside the bracket each step aims just beyond the secant root on the
    side of the end farther from it, then just below the passing end (:func:`_secant_bracket`), so
    two or three steps that land where aimed close it. The answer is still an evaluated, passing noise within ``rel_tol`` of
    an evaluated, failing one -- possibly another one of that window than the default path's.
    ``revised(sigma)``: a truer epsilon at an evaluated noise learned since (``None``: the one read;
    ``nan``: none, the point is left out), for the secant's steps only (a calibration that read a cheaper
    bound first, :mod:`dpmf.accounting.allocation.pld`); the bracket itself keeps the epsilons read.
    """
    target = _v.positive("target_epsilon", target_epsilon)
    near = initial is None and _HINT.get() is not None and _NEAR.get()
    if initial is None:
        initial = _HINT.get() or 1.0
    initial = _v.positive("initial", initial)
    rel_tol = _v.positive("rel_tol", rel_tol)
    if limit is not None:
        limit = _v.positive("limit", limit)
        initial = min(initial, limit)
    trace: list[tuple[float, float]] = []
    floor = [0.0]  # the smallest noise the accountant evaluates, once it said so

    def ev_at_least(x: float) -> tuple[float, float]:
        """(the noise evaluated, its epsilon): ``x``, or the accountant's smallest noise if larger."""
        x = max(x, floor[0])
        for _ in range(64):  # (each refusal raises the floor; a few at most)
            try:
                return x, ev(x)
            except NoiseTooSmallError as exc:
                if not exc.smallest > x:  # pragma: no cover - an accountant contradicting itself
                    raise
                floor[0] = x = exc.smallest
            if limit is not None and x > limit:
                raise NoiseLimitExceeded(
                    f"the smallest noise the accountant evaluates, {x:g}, is above the largest of interest, "
                    f"noise_multiplier={limit:g}", limit, math.inf,
                )
        raise CalibrationError(f"the accountant kept refusing noises up to {x:g}")  # pragma: no cover

    def ev(x: float) -> float:
        eps = float(epsilon_of(x))
        if math.isnan(eps):
            raise CalibrationError(f"the accountant returned NaN at noise_multiplier={x!r}")
        trace.append((x, eps))
        if callback is not None:
            callback(x, eps)
        return eps

    def over_limit(eps: float) -> NoiseLimitExceeded:
        return NoiseLimitExceeded(
            f"epsilon at the largest noise of interest, noise_multiplier={limit:g}, is {eps:g} > {target:g}: "
            "the smallest passing noise is larger",
            limit,
            eps,
        )

    hi, eps_hi = ev_at_least(initial)
    if eps_hi > target:  # grow until the target is met
        lo = hi
        while eps_hi > target:
            if limit is not None and hi >= limit:
                raise over_limit(eps_hi)
            lo = hi
            hi = hi * 2 if limit is None else min(hi * 2, limit)
            if hi > max_value:
                raise CalibrationError(
                    f"no noise_multiplier <= {max_value:g} reaches epsilon <= {target:g} "
                    f"(epsilon at {lo:g} is {eps_hi:g})"
                )
            eps_hi = ev(hi)
    else:  # shrink until the target fails (or the accountant's smallest noise passes)
        if hi <= floor[0]:
            return CalibrationResult(hi, eps_hi, len(trace), tuple(trace), at_floor=True)
        first = near or secant
        lo, eps_lo = ev_at_least(hi * (_near_factor(eps_hi, target, first=True) if first else _shrink_factor(eps_hi, target)))
        while eps_lo <= target or lo >= hi:
            if lo >= hi:  # (the accountant's smallest noise turned out to be above a noise it evaluated)
                return CalibrationResult(hi, eps_hi, len(trace), tuple(trace), at_floor=True)
            hi, eps_hi = lo, eps_lo
            if hi <= floor[0]:
                return CalibrationResult(hi, eps_hi, len(trace), tuple(trace), at_floor=True)
            if secant:
                lo = hi * _secant_factor(trace, target, revised)
            else:
                lo = hi * (_near_factor(eps_lo, target) if near else _shrink_factor(eps_lo, target))
            if lo < 1e-6 and not floor[0]:
                return CalibrationResult(hi, eps_hi, len(trace), tuple(trace))
            lo, eps_lo = ev_at_least(lo)
    if secant:
        hi, eps_hi = _secant_bracket(ev, trace, lo, hi, eps_hi, target, rel_tol, revised)
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


def check_limit(
    epsilon_of: Callable[[float], float], target_epsilon: float, limit: float, *, callback: ProgressCallback | None = None
) -> float:
    """``epsilon_of(limit)`` when it is ``<= target_epsilon``; else :class:`NoiseLimitExceeded`.

    The probe a calibration makes at the largest noise of interest before searching (``limit``: the
    noise another accountant already reached, or the caller's maximum): a search that does not pass
    there cannot give a smaller noise. An accountant that cannot evaluate a noise that small
    (:class:`~dpmf.errors.NoiseTooSmallError`) does not pass there either (epsilon ``inf``).
    ``callback(limit, epsilon)`` after the evaluation."""
    try:
        eps = float(epsilon_of(limit))
    except NoiseTooSmallError:
        raise NoiseLimitExceeded(
            f"the accountant cannot evaluate noise_multiplier={limit:g}, the largest of interest", limit, math.inf
        ) from None
    if callback is not None:
        callback(limit, eps)
    if not eps <= target_epsilon:
        raise NoiseLimitExceeded(
            f"epsilon at the largest noise of interest, noise_multiplier={limit:g}, is {eps:g} > {target_epsilon:g}: "
            "the smallest passing noise is larger",
            limit,
            eps,
        )
    return eps


def _shrink_factor(eps: float, target: float) -> float:
    """How far below a passing noise (epsilon ``eps <= target`` there) to look for a failing one.

    Amplified accountants fall at least like ``1 / sigma`` and often like ``1 / sigma^2``, so the
    answer is near ``sigma * sqrt(eps / target)``; aim a little below it (the next point should
    fail, which brackets the answer in one step), halving when the target is nearly met, never
    more than 8x at once (small noises can be expensive)."""
    if not (eps > 0 and math.isfinite(eps)):
        return 0.125
    return min(0.5, max(0.125, 0.8 * math.sqrt(eps / target)))


def _near_factor(eps: float, target: float, first: bool = False) -> float:
    """A step below a passing noise in a search whose start is near the answer (:func:`search_hint`'s
    ``near``), by ``sqrt(eps / target)``, where epsilon ``~ 1 / sigma^2`` puts the answer: the first
    step aims 1% *above* it, so it most likely passes and certifies a noise within about 1% of the
    answer at once (a plan stopped by its budget keeps it); the next ones 2% under it, so the noise
    most likely fails just below the answer and brackets it tightly. Never more than 8x at once,
    and always below the passing noise."""
    if not (eps > 0 and math.isfinite(eps)):
        return 0.125
    aim = (1.01 if first else 0.98) * math.sqrt(eps / target)
    return min(0.995 if first else 0.98, max(0.125, aim))


def _log_points(trace, target: float) -> list[tuple[float, float]]:
    """``(log sigma, log(epsilon / target))`` of the evaluations with a finite, positive epsilon."""
    return [(math.log(x), math.log(e) - math.log(target)) for x, e in trace if x > 0 and 0 < e < math.inf]


def _revise(trace, revised) -> list[tuple[float, float]]:
    """The trace with each epsilon ``revised(sigma)`` gives in its place (``None``: kept; ``nan``: the point
    left out of the chords, :func:`_log_points` and :func:`_secant_factor` skip it)."""
    if revised is None:
        return list(trace)
    return [(x, e if revised(x) is None else revised(x)) for x, e in trace]


def _secant_factor(trace, target: float, revised=None) -> float:
    """:func:`smallest_noise`'s ``secant`` step below its last passing noise ``x_b`` (the previous
    passing one ``x_a``): with ``p = log(e_b / e_a) / log(x_a / x_b)`` (epsilon ``~ sigma^-p`` between
    them) the root is near ``r = x_b (e_b / target)^(1/p)``, where the step aims: on random allocation
    epsilon steepens in ``log sigma`` as sigma falls, so the chord's ``r`` lies a little below the root
    (0.1% on the README snippet) and the step most likely fails there, bracketing the root tightly
    (if it passes, the next chord is far shorter). Never more than 8x at once, always below ``x_b``;
    without a usable slope, :func:`_near_factor`. ``revised``: as :func:`smallest_noise`'s (the slope from
    the last two passing points it leaves, scaled to the last passing noise ``hi``)."""
    passing = [(x, e) for x, e in trace if e <= target]
    hi = passing[-1][0]
    pts = [(x, e) for x, e in _revise(passing, revised) if e == e]  # (a nan: left out)
    if len(pts) >= 2:
        (xa, ea), (xb, eb) = pts[-2], pts[-1]
        if xa > xb and 0 < ea < eb < math.inf:
            p = math.log(eb / ea) / math.log(xa / xb)
            if p > 0.25:
                root = (eb / target) ** (1.0 / p)
                return min(0.995, max(0.125, root if xb == hi else xb * root / hi))
    return _near_factor(pts[-1][1] if pts else passing[-1][1], target)


def _secant_bracket(ev, trace, lo: float, hi: float, eps_hi: float, target: float, rel_tol: float, revised=None):
    """Close the bracket ``epsilon(lo) > target >= epsilon(hi)`` to ``hi - lo <= rel_tol hi`` (the
    ``secant`` search of :func:`smallest_noise`); ``(hi, epsilon(hi))``.

    Each step estimates the root ``r`` (in ``log epsilon`` vs ``log sigma``) from the evaluation
    nearest the target and the slope of its chord to the nearest one at least ``20 rel_tol`` away
    (closer chords would follow an accountant's own digits, ~1e-5-1e-4 of epsilon for grids, not its
    slope). It then aims ``0.3 rel_tol`` beyond ``r`` on the side of the bracket's end that is farther
    from ``r`` (above: it most likely passes there; below: fails), so that end comes within about
    ``rel_tol`` of the root; once the passing end is within ``0.9 rel_tol`` above ``r`` the step is
    ``0.9 rel_tol`` below it (it most likely fails, and then closes the bracket). Safeguards: each
    step lies strictly inside the bracket (by 0.1% of its width), and after three steps in a row that
    did not halve the width the next one bisects (so the search always ends). ``revised``: as
    :func:`smallest_noise`'s, for the chords."""
    slow = 0
    step = math.log1p(rel_tol)
    while hi - lo > rel_tol * hi:
        x_lo, x_hi = math.log(lo), math.log(hi)
        width = x_hi - x_lo
        root = _secant_root(_log_points(_revise(trace, revised), target), 20 * step) if slow < 3 else None
        if root is None:
            guess = 0.5 * (x_lo + x_hi)
        elif x_hi - root <= 0.9 * step:
            guess = x_hi - 0.9 * step
        else:
            guess = root + 0.3 * step if x_hi - root >= root - x_lo else root - 0.3 * step
        guess = min(max(guess, x_lo + 0.001 * width), x_hi - 0.001 * width)
        mid = math.exp(guess)
        eps_mid = ev(mid)
        if eps_mid <= target:
            hi, eps_hi = mid, eps_mid
        else:
            lo = mid
        slow = slow + 1 if math.log(hi) - math.log(lo) > 0.5 * width else 0
    return hi, eps_hi


def _secant_root(points: list[tuple[float, float]], min_chord: float) -> float | None:
    """The root of the line through the point of ``points`` (``(log sigma, log(epsilon / target))``)
    nearest the target and the nearest one at least ``min_chord`` from it in ``log sigma`` (else the
    next nearest); ``None`` when there is no such line."""
    if len(points) < 2:
        return None
    ranked = sorted(points, key=lambda p: abs(p[1]))
    x0, f0 = ranked[0]
    x1, f1 = next((p for p in ranked[1:] if abs(p[0] - x0) >= min_chord), ranked[1])
    if f1 == f0 or x1 == x0:
        return None
    root = x0 - f0 * (x1 - x0) / (f1 - f0)
    return root if math.isfinite(root) else None


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
