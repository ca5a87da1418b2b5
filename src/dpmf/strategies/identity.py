"""The identity encoder ``C = I``: DP-SGD, fresh independent noise every step.

With the prefix-sum workload ``A`` (lower-triangular ones) the decoder is ``B = A`` and the noise
on prefix sum ``i`` (1-based) has variance ``i * sigma^2``, so the RMSE over the ``n`` prefix sums
per unit noise multiplier is ``sqrt((n + 1) / 2)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpmf import validation as _v
from dpmf.strategies.participation import Participation


@dataclass(frozen=True)
class Identity:
    """``C = I_n`` (DP-SGD). Non-negative, lower-triangular, columns of norm 1."""

    n: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _v.positive_int("n", self.n))

    name = "identity"

    def describe(self) -> dict:
        return {"name": self.name, "n": self.n}

    def encoder(self) -> np.ndarray:
        """The dense ``n x n`` encoder (only materialize for small n)."""
        return np.eye(self.n)

    def sensitivity(self, participation: Participation) -> float:
        """L2 sensitivity of ``C x`` under the schema: ``sqrt(min(k, ceil(n / b)))``."""
        k = min(participation.max_participations, math.ceil(self.n / participation.min_sep))
        return math.sqrt(k)

    def prefix_sum_rmse(self) -> float:
        """RMSE of the ``n`` prefix sums per unit noise multiplier: ``sqrt((n + 1) / 2)``."""
        return math.sqrt((self.n + 1) / 2)
