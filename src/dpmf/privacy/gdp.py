"""Gaussian differential privacy (mu-GDP) and its exact (epsilon, delta) profile.

A mechanism is mu-GDP when it is no easier to attack than telling ``N(0, 1)`` from ``N(mu, 1)``
(Dong, Roth, Su 2019). Its privacy profile (Balle & Wang 2018, Cor. 2.13 of Dong et al.) is

    delta(eps) = Phi(-eps/mu + mu/2) - exp(eps) * Phi(-eps/mu - mu/2).

The Gaussian mechanism with noise multiplier ``sigma`` and sensitivity ``s`` is exactly
``mu = s / sigma`` GDP, in both adjacency directions. Everything here is evaluated in log space
(``scipy.special.log_ndtr``) so it stays accurate far into the tails (delta down to 1e-300).
Inversions return the *safe* side of the root: ``gdp_epsilon`` never returns an epsilon whose
delta exceeds the target, ``gdp_mu`` never returns a mu whose delta exceeds it -- for the exact
delta, not only its floating-point value: the last step of every inversion moves past the root by
the evaluation's error bound (:func:`_log_delta_error`; it matters for tiny epsilon and delta,
where the profile is a difference of two nearly equal terms).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from dpmf import validation as _v
from dpmf.errors import NumericalError


def _log_delta(mu: float, epsilon: float) -> float:
    """``log delta(eps)`` for mu-GDP (``-inf`` when delta underflows to 0)."""
    log_a = special.log_ndtr(-epsilon / mu + mu / 2)
    log_b = epsilon + special.log_ndtr(-epsilon / mu - mu / 2)
    if not log_b < log_a:
        return -math.inf
    return float(log_a + math.log(-math.expm1(log_b - log_a)))


#: Unit roundoff of float64.
_U = 2.0**-53


def _log_delta_error(mu: float, epsilon: float, log_delta: float) -> float:
    """A bound on ``|computed - exact|`` of :func:`_log_delta` (an absolute error in log space,
    i.e. a relative error of delta), from forward error analysis with generous constants.

    ``log delta = log_a + log(-expm1(D))`` with ``D = log_b - log_a <= 0``. The arguments
    ``-eps/mu +- mu/2`` carry a rounding error ``<= 2u (eps/mu + mu)``, which moves
    ``log Phi(x)`` by at most ``(|x| + 1)`` times as much (the Mills ratio bound on its slope);
    ``log_ndtr`` itself is accurate to a few ulps of its value. ``D`` inherits the errors of both
    logs; ``-expm1(D)`` turns an error ``e`` in ``D`` into a relative error ``<= e / |D|`` (its
    log-derivative is ``e^D / (1 - e^D) <= 1 / |D|``). When delta is tiny relative to
    ``Phi(-eps/mu + mu/2)`` (``|D|`` small: tiny epsilon and delta), this term dominates -- it is
    what made the plain floating-point check accept a mu whose true delta was ~5e-12 relative
    above the target."""
    if not math.isfinite(log_delta):
        return math.inf
    x_a = -epsilon / mu + mu / 2
    x_b = -epsilon / mu - mu / 2
    log_na, log_nb = float(special.log_ndtr(x_a)), float(special.log_ndtr(x_b))  # Python floats from here
    arg = 2 * _U * (epsilon / mu + mu)
    err_a = 8 * _U * (abs(log_na) + 1) + arg * (abs(x_a) + 1)
    err_b = 8 * _U * (abs(log_nb) + 1) + arg * (abs(x_b) + 1) + 2 * _U * epsilon
    d = epsilon + log_nb - log_na
    if not d < 0:
        return math.inf
    return 4 * (err_a + (err_a + err_b + 2 * _U * abs(d)) / abs(d) + 8 * _U)


def _log_delta_upper(mu: float, epsilon: float) -> float:
    """A cancellation-free upper bound on ``log delta_mu(epsilon)``: since ``e^eps >= 1``,
    ``delta <= Phi(a) - Phi(b) = int_b^a phi <= mu * phi(m)`` with ``[b, a] = -eps/mu -+ mu/2``
    and ``m`` the point of ``[b, a]`` closest to 0 (plus a margin for its own rounding)."""
    a, b = -epsilon / mu + mu / 2, -epsilon / mu - mu / 2
    m = 0.0 if b <= 0 <= a else min(abs(a), abs(b))
    return math.log(mu) - 0.5 * m * m - 0.5 * math.log(2 * math.pi) + 1e-12 * (1 + 0.5 * m * m)


def _safely_below(mu: float, epsilon: float, log_target: float) -> bool:
    """``delta_mu(epsilon) <= exp(log_target)`` holds for the *exact* delta, not only for its
    floating-point value: the computed log delta plus its error bound, or the cancellation-free
    bound :func:`_log_delta_upper`, is below the target (a delta that underflowed or cancelled
    to 0 in floats proves nothing by itself)."""
    ld = _log_delta(mu, epsilon)
    bound = ld + _log_delta_error(mu, epsilon, ld) if math.isfinite(ld) else math.inf
    return min(bound, _log_delta_upper(mu, epsilon)) <= log_target


def gdp_delta(mu: float, epsilon: float) -> float:
    """delta(epsilon) of a mu-GDP mechanism (exact, both directions).

    >>> round(gdp_delta(1.0, 1.0), 8)   # Gaussian mechanism, sigma = sensitivity = 1
    0.12693674
    """
    mu = _v.positive("mu", mu)
    epsilon = _v.non_negative("epsilon", epsilon)
    return math.exp(_log_delta(mu, epsilon))


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest epsilon >= 0 with ``delta(epsilon) <= delta`` for a mu-GDP mechanism.

    The returned value is verified: ``gdp_delta(mu, result) <= delta`` holds in floating point.
    """
    mu = _v.positive("mu", mu)
    delta = _v.open_unit("delta", delta)
    log_target = math.log(delta)
    if _log_delta(mu, 0.0) <= log_target:
        return 0.0
    # delta(eps) <= Phi(-eps/mu + mu/2), so eps_hi makes the bound equal to delta.
    hi = mu * (mu / 2 - float(special.ndtri(delta))) + 1.0
    if not hi <= 1e12:  # (Python floats: inf, not an overflow warning)
        raise NumericalError(
            f"gdp_epsilon: the epsilon of mu={mu!r} at delta={delta!r} exceeds 1e12 (no privacy to speak of; for a "
            "Gaussian mechanism mu = sensitivity / noise: use a larger noise multiplier)"
        )
    while _log_delta(mu, hi) > log_target:
        hi *= 2
        if hi > 1e12:
            raise NumericalError(f"gdp_epsilon: no epsilon found for mu={mu!r}, delta={delta!r}")
    root = optimize.brentq(lambda e: _log_delta(mu, e) - log_target, 0.0, hi, xtol=1e-14, rtol=1e-15)
    # last step: round toward the safe side by the evaluation's own error bound (not just in floats)
    return _step_until(lambda e: _safely_below(mu, e, log_target), root, +1)


def gdp_mu(epsilon: float, delta: float) -> float:
    """Largest mu whose mu-GDP profile has ``delta(epsilon) <= delta`` (verified)."""
    epsilon = _v.non_negative("epsilon", epsilon)
    delta = _v.open_unit("delta", delta)
    log_target = math.log(delta)
    lo, hi = 1e-300, 1.0
    while _log_delta(hi, epsilon) <= log_target:
        hi *= 2
        if hi > 1e8:
            raise NumericalError(f"gdp_mu: delta stays below target for epsilon={epsilon!r}")
    ok = lambda m: _safely_below(m, epsilon, log_target)  # noqa: E731
    try:
        root = optimize.brentq(lambda m: _log_delta(m, epsilon) - log_target, lo, hi, xtol=1e-300, rtol=1e-15)
    except (RuntimeError, ValueError):  # no convergence (delta near the float floor): bisect in log(mu)
        root = _bisect_log(ok, lo, hi)
    # last step: round toward the safe side by the evaluation's own error bound (not just in floats)
    return _step_until(ok, root, -1)


def _bisect_log(ok, lo: float, hi: float) -> float:
    """Largest ``x`` in ``[lo, hi]`` found with ``ok(x)`` by bisection on ``log x`` (``ok``
    non-increasing: true below the root)."""
    a, b = math.log(lo), math.log(hi)
    for _ in range(200):
        mid = 0.5 * (a + b)
        if ok(math.exp(mid)):
            a = mid
        else:
            b = mid
    return math.exp(a)


def _step_until(ok, x: float, direction: int) -> float:
    """Move ``x`` by growing float steps in ``direction`` until ``ok(x)`` holds."""
    step = max(abs(x), 1e-300) * 1e-15
    for _ in range(2000):
        if ok(x):
            return x
        # a positive quantity stays positive: at most halve it per step when moving down
        x = x + step if direction > 0 else max(x - step, x / 2)
        step *= 2
    raise NumericalError("could not move a root to the safe side of the target")


def gaussian_epsilon(noise_multiplier: float, delta: float, sensitivity: float = 1.0) -> float:
    """Exact epsilon of the Gaussian mechanism ``N(f(D), sigma^2)`` with L2 sensitivity ``s``.

    Equal to :func:`gdp_epsilon` with ``mu = s / sigma`` (Balle & Wang 2018, Thm 8).
    """
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    sens = _v.positive("sensitivity", sensitivity)
    return gdp_epsilon(sens / sigma, delta)


def gaussian_delta(noise_multiplier: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """Exact delta(epsilon) of the Gaussian mechanism (see :func:`gaussian_epsilon`)."""
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    sens = _v.positive("sensitivity", sensitivity)
    return gdp_delta(sens / sigma, epsilon)


def gdp_delta_array(mu: float, epsilons: np.ndarray) -> np.ndarray:
    """Vectorized :func:`gdp_delta` over many epsilons (no validation: internal helper)."""
    eps = np.asarray(epsilons, dtype=np.float64)
    log_a = special.log_ndtr(-eps / mu + mu / 2)
    log_b = eps + special.log_ndtr(-eps / mu - mu / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.exp(log_a) * -np.expm1(np.minimum(log_b - log_a, 0.0))
    return np.where(log_b < log_a, out, 0.0)


def gdp_epsilon_array(mu, delta: float, *, iterations: int = 80) -> np.ndarray:
    """Vectorized :func:`gdp_epsilon` for many mu at one delta (e.g. one per example).

    Bisection on an upper bound of ``log delta_mu(eps)`` (the computed value plus its error bound,
    as in :func:`gdp_epsilon`), returning the *upper* end of each final bracket, so every entry
    satisfies ``delta_mu(eps) <= delta`` for the exact delta. ``mu = 0`` gives 0.
    """
    delta = _v.open_unit("delta", delta)
    mu = np.asarray(mu, dtype=np.float64)
    if np.any(~np.isfinite(mu)) or np.any(mu < 0):
        raise _v.InvalidParameterError("mu must be finite and >= 0")
    log_target = math.log(delta)
    flat = mu.ravel()
    out = np.zeros_like(flat)
    pos = flat > 0
    m = flat[pos]
    if m.size:

        def log_d(eps: np.ndarray) -> np.ndarray:
            """An upper bound on the exact log delta (vectorized :func:`_safely_below`)."""
            x_a, x_b = -eps / m + m / 2, -eps / m - m / 2
            log_na, log_nb = special.log_ndtr(x_a), special.log_ndtr(x_b)
            log_a, log_b = log_na, eps + log_nb
            d = log_b - log_a
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                val = log_a + np.log(-np.expm1(np.minimum(d, 0.0)))
                arg = 2 * _U * (eps / m + m)
                err_a = 8 * _U * (np.abs(log_na) + 1) + arg * (np.abs(x_a) + 1)
                err_b = 8 * _U * (np.abs(log_nb) + 1) + arg * (np.abs(x_b) + 1) + 2 * _U * eps
                err = 4 * (err_a + (err_a + err_b + 2 * _U * np.abs(d)) / np.abs(d) + 8 * _U)
                bound = np.where((d < 0) & np.isfinite(val), val + err, np.inf)
                near = np.where((x_b <= 0) & (x_a >= 0), 0.0, np.minimum(np.abs(x_a), np.abs(x_b)))
                upper = np.log(m) - 0.5 * near**2 - 0.5 * math.log(2 * math.pi) + 1e-12 * (1 + 0.5 * near**2)
            return np.minimum(bound, upper)

        lo = np.zeros_like(m)
        hi = m * (m / 2 - special.ndtri(delta)) + 1.0
        while np.any(bad := log_d(hi) > log_target):
            hi = np.where(bad, hi * 2, hi)
        passes_at_zero = log_d(lo) <= log_target
        for _ in range(iterations):
            if np.all(hi - lo <= 1e-12 * np.maximum(hi, 1e-300)):
                break
            mid = 0.5 * (lo + hi)
            ok = log_d(mid) <= log_target
            hi = np.where(ok, mid, hi)
            lo = np.where(ok, lo, mid)
        out[pos] = np.where(passes_at_zero, 0.0, hi)
    return out.reshape(mu.shape)
