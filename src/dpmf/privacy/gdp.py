"""Gaussian differential privacy (mu-GDP) and its exact (epsilon, delta) profile.

A mechanism is mu-GDP when it is no easier to attack than telling ``N(0, 1)`` from ``N(mu, 1)``
(Dong, Roth, Su 2019). Its privacy profile (Balle & Wang 2018, Cor. 2.13 of Dong et al.) is

    delta(eps) = Phi(-eps/mu + mu/2) - exp(eps) * Phi(-eps/mu - mu/2).

The Gaussian mechanism with noise multiplier ``sigma`` and sensitivity ``s`` is exactly
``mu = s / sigma`` GDP, in both adjacency directions. Everything here is evaluated in log space
(``scipy.special.log_ndtr``) so it stays accurate far into the tails (delta down to 1e-300).
Inversions return the *safe* side of the root: ``gdp_epsilon`` never returns an epsilon whose
delta exceeds the target, ``gdp_mu`` never returns a mu whose delta exceeds it.
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
    hi = mu * (mu / 2 - special.ndtri(delta)) + 1.0
    while _log_delta(mu, hi) > log_target:
        hi *= 2
        if hi > 1e12:
            raise NumericalError(f"gdp_epsilon: no epsilon found for mu={mu!r}, delta={delta!r}")
    root = optimize.brentq(lambda e: _log_delta(mu, e) - log_target, 0.0, hi, xtol=1e-14, rtol=1e-15)
    return _step_until(lambda e: math.exp(_log_delta(mu, e)) <= delta, root, +1)


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
    root = optimize.brentq(lambda m: _log_delta(m, epsilon) - log_target, lo, hi, xtol=1e-300, rtol=1e-15)
    return _step_until(lambda m: math.exp(_log_delta(m, epsilon)) <= delta, root, -1)


def _step_until(ok, x: float, direction: int) -> float:
    """Move ``x`` by growing float steps in ``direction`` until ``ok(x)`` holds."""
    step = max(abs(x), 1e-300) * 1e-15
    for _ in range(200):
        if ok(x):
            return x
        x = x + direction * step
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

    Bisection on ``log delta_mu(eps)``, returning the *upper* end of each final bracket, so every
    entry satisfies ``delta_mu(eps) <= delta``. ``mu = 0`` gives 0.
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
            log_a = special.log_ndtr(-eps / m + m / 2)
            log_b = eps + special.log_ndtr(-eps / m - m / 2)
            with np.errstate(divide="ignore", invalid="ignore"):
                val = log_a + np.log(-np.expm1(np.minimum(log_b - log_a, 0.0)))
            return np.where(log_b < log_a, val, -np.inf)

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
