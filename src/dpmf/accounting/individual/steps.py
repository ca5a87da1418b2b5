"""How many worst-case (full-gradient) steps fit a target: GDP filter vs Rényi filter.

Private GD with noise multiplier ``sigma`` and clip norm ``C``: an example whose gradient is
always clipped pays ``mu = 1/sigma`` per step. ``k`` such steps are ``sqrt(k)/sigma``-GDP exactly,
so the GDP filter admits the largest ``k`` with ``gdp_epsilon(sqrt(k)/sigma, delta) <= eps``. The
Rényi filter (F&Z) admits ``k`` steps at order ``alpha`` when ``alpha k / (2 sigma^2) <= B(alpha)``,
maximized over an order chosen in advance. Paper example (Koskela et al., Sec. 4.1): sigma = 100,
delta = 1e-5, eps = 0.81563 gives 495 GDP steps and 420 RDP steps.
"""

from __future__ import annotations

import math

import numpy as np

from dpmf import validation as _v
from dpmf.accounting.individual.rdp_filter import rdp_budget
from dpmf.errors import InvalidParameterError
from dpmf.privacy.gdp import gdp_epsilon, gdp_mu
from dpmf.privacy.rdp import DEFAULT_ORDERS, rdp_to_epsilon


#: Largest step count these functions count exactly. One more step changes the privacy loss of
#: ``k`` steps (``mu = sqrt(k) / sigma``, or ``k alpha / (2 sigma^2)``) by a relative ``1 / (2k)``
#: or ``1 / k``; beyond 2^50 that is below float64's resolution (2^-52), so k steps and k + 1
#: cannot be told apart: a noise multiplier that allows more is refused, naming the largest that
#: does not (the count grows like ``sigma^2``).
MAX_STEPS = 2**50


def _check_count(log_count: float, sigma: float, epsilon: float, delta: float, what: str) -> None:
    """Refuse a step count ``exp(log_count)`` above :data:`MAX_STEPS` (see there)."""
    if log_count > math.log(MAX_STEPS):
        largest = sigma * math.exp(0.5 * (math.log(MAX_STEPS) - log_count))
        raise InvalidParameterError(
            f"noise_multiplier {sigma!r} allows about 10^{log_count / math.log(10):.1f} full-gradient steps under "
            f"the {what} filter at epsilon={epsilon:g}, delta={delta:g}: more than 2^50 (1.1e15), beyond which "
            f"float64 cannot tell k steps from k + 1 (the count grows like noise^2); use noise_multiplier <= "
            f"{largest:.4g}"
        )


def gdp_steps(noise_multiplier: float, epsilon: float, delta: float) -> int:
    """Largest ``k`` with ``k`` full steps ``(epsilon, delta)``-DP under the GDP filter (at most
    :data:`MAX_STEPS`; a noise multiplier allowing more raises
    :class:`~dpmf.errors.InvalidParameterError`)."""
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    b = gdp_mu(epsilon, delta)
    if b > 0:
        _check_count(2 * (math.log(b) + math.log(sigma)), sigma, epsilon, delta, "GDP")
    k = int(math.floor((b * sigma) ** 2))
    while k > 0 and gdp_epsilon(math.sqrt(k) / sigma, delta) > epsilon:
        k -= 1
    # (mu above 2 b is certainly over budget -- b is the largest mu that fits -- and can be far
    # beyond what gdp_epsilon computes, e.g. one step at noise 1e-300: zero steps)
    while math.sqrt(k + 1) / sigma <= 2 * b and gdp_epsilon(math.sqrt(k + 1) / sigma, delta) <= epsilon:
        k += 1
    return k


def rdp_steps(noise_multiplier: float, epsilon: float, delta: float, orders=DEFAULT_ORDERS) -> int:
    """Largest ``k`` with ``k`` full steps ``(epsilon, delta)``-DP under the Rényi filter."""
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    a = np.asarray(orders, dtype=np.float64)
    budget = rdp_budget(epsilon, delta, a)
    best = float(np.max(np.maximum(budget, 0.0) / a))
    if best > 0:
        _check_count(math.log(2.0) + 2 * math.log(sigma) + math.log(best), sigma, epsilon, delta, "Renyi")
    per_order = np.floor(2 * sigma**2 * np.maximum(budget, 0.0) / a)
    k = int(per_order.max())
    # verify with the conversion itself (guards float rounding at the boundary)
    while k > 0 and rdp_to_epsilon(a, a * k / (2 * sigma**2), delta)[0] > epsilon:
        k -= 1
    return k


def full_gradient_steps(noise_multiplier: float, epsilon: float, delta: float) -> dict:
    """Both counts with the epsilon each one actually reaches (``gdp_steps``, ``rdp_steps``, ...)."""
    g = gdp_steps(noise_multiplier, epsilon, delta)
    r = rdp_steps(noise_multiplier, epsilon, delta)
    a = DEFAULT_ORDERS
    return {
        "noise_multiplier": float(noise_multiplier),
        "epsilon": float(epsilon),
        "delta": float(delta),
        "gdp_steps": g,
        "rdp_steps": r,
        "gdp_epsilon_at_steps": gdp_epsilon(math.sqrt(g) / noise_multiplier, delta) if g else 0.0,
        "rdp_epsilon_at_steps": rdp_to_epsilon(a, a * r / (2 * noise_multiplier**2), delta)[0] if r else 0.0,
    }
