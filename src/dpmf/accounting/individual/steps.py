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
from dpmf.privacy.gdp import gdp_epsilon, gdp_mu
from dpmf.privacy.rdp import DEFAULT_ORDERS, rdp_to_epsilon


def gdp_steps(noise_multiplier: float, epsilon: float, delta: float) -> int:
    """Largest ``k`` with ``k`` full steps ``(epsilon, delta)``-DP under the GDP filter."""
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    b = gdp_mu(epsilon, delta)
    k = int(math.floor((b * sigma) ** 2))
    while k > 0 and gdp_epsilon(math.sqrt(k) / sigma, delta) > epsilon:
        k -= 1
    while gdp_epsilon(math.sqrt(k + 1) / sigma, delta) <= epsilon:
        k += 1
    return k


def rdp_steps(noise_multiplier: float, epsilon: float, delta: float, orders=DEFAULT_ORDERS) -> int:
    """Largest ``k`` with ``k`` full steps ``(epsilon, delta)``-DP under the Rényi filter."""
    sigma = _v.positive("noise_multiplier", noise_multiplier)
    a = np.asarray(orders, dtype=np.float64)
    budget = rdp_budget(epsilon, delta, a)
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
