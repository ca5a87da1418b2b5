"""The individual Rényi filter of Feldman & Zrnic (2021): the baseline the GDP filter improves on.

F&Z Thm 3.1/4.3: at a Rényi order ``alpha`` fixed in advance, if every example's accumulated
per-step RDP satisfies ``sum_m rho_m(alpha) <= B(alpha)`` almost surely, the run is
``(alpha, B(alpha))``-RDP for every example, hence ``(eps, delta)``-DP by the conversion of
Canonne, Kamath & Steinke (2020) (``notes/individual-accounting.md`` Lemma 4):

    eps = B + log1p(-1/alpha) - (log delta + log alpha) / (alpha - 1).

For a target ``(eps, delta)`` the budget at order ``alpha`` is the inverse of that formula. The
order is chosen *before* the run (it may depend on public quantities only): by default the one
that admits the most Gaussian steps, i.e. maximizes ``B(alpha) / alpha`` (a Gaussian step with
GDP parameter ``mu`` costs ``alpha mu^2 / 2``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError
from dpmf.privacy.rdp import DEFAULT_ORDERS


def rdp_budget(epsilon: float, delta: float, orders=DEFAULT_ORDERS) -> np.ndarray:
    """``B(alpha)``: the RDP level at each order that converts to exactly ``(epsilon, delta)``."""
    eps = _v.positive("epsilon", epsilon)
    delta = _v.open_unit("delta", delta)
    a = np.asarray(orders, dtype=np.float64)
    if np.any(~np.isfinite(a)) or np.any(a <= 1):
        raise InvalidParameterError("orders must be finite and > 1")
    return eps - np.log1p(-1.0 / a) + (math.log(delta) + np.log(a)) / (a - 1)


def best_gaussian_order(epsilon: float, delta: float, orders=DEFAULT_ORDERS) -> tuple[float, float]:
    """``(alpha, B(alpha))`` maximizing ``B(alpha)/alpha``: the most Gaussian steps fit."""
    a = np.asarray(orders, dtype=np.float64)
    budget = rdp_budget(epsilon, delta, a)
    i = int(np.argmax(budget / a))
    if budget[i] <= 0:
        raise InvalidParameterError(f"no order in the list admits epsilon={epsilon!r} at delta={delta!r}")
    return float(a[i]), float(budget[i])


@dataclass
class IndividualRDPLedger:
    """Feldman & Zrnic's individual filter at one Rényi order, vectorized over examples.

    ``step(rho)`` takes each example's RDP (at :attr:`order`) for the coming step, admits those
    that fit the remaining budget and returns the admitted mask. For Gaussian steps use
    :meth:`step_gaussian` with per-example GDP parameters ``mu`` (``rho = alpha mu^2 / 2``).
    """

    num_examples: int
    order: float
    budget: float
    spent: np.ndarray = field(default=None, repr=False)  # type: ignore[assignment]
    steps: int = 0

    def __post_init__(self) -> None:
        self.num_examples = _v.positive_int("num_examples", self.num_examples)
        self.order = _v.positive("order", self.order)
        if self.order <= 1:
            raise InvalidParameterError(f"order must be > 1, got {self.order!r}")
        self.budget = _v.positive("budget", self.budget)
        self.spent = np.zeros(self.num_examples) if self.spent is None else np.asarray(self.spent, float)

    @classmethod
    def for_target(cls, num_examples: int, epsilon: float, delta: float, orders=DEFAULT_ORDERS):
        order, budget = best_gaussian_order(epsilon, delta, orders)
        return cls(num_examples, order, budget)

    def step(self, rho) -> np.ndarray:
        rho = np.asarray(rho, dtype=np.float64)
        if rho.shape != (self.num_examples,) or not np.all(np.isfinite(rho)) or np.any(rho < 0):
            raise InvalidParameterError(f"rho must be {self.num_examples} finite values >= 0")
        new = self.spent + rho
        fits = new <= self.budget
        self.spent = np.where(fits, new, self.spent)
        self.steps += 1
        return fits

    def step_gaussian(self, mu) -> np.ndarray:
        mu = np.asarray(mu, dtype=np.float64)
        return self.step(self.order * mu * mu / 2)

    def individual_epsilon(self, delta: float) -> np.ndarray:
        """Each example's epsilon from its accumulated RDP at the filter's order."""
        delta = _v.open_unit("delta", delta)
        a = self.order
        eps = self.spent + math.log1p(-1 / a) - (math.log(delta) + math.log(a)) / (a - 1)
        return np.maximum(eps, 0.0)
