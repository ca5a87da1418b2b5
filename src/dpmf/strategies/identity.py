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
from dpmf.errors import InvalidParameterError
from dpmf.resources import check_allocation
from dpmf.strategies.api import ErrorMethods
from dpmf.strategies.participation import Participation


@dataclass(frozen=True)
class Identity(ErrorMethods):
    """``C = I_n`` (DP-SGD). Non-negative, lower-triangular, columns of norm 1.

    Shares the method set of every strategy (:mod:`dpmf.strategies.api`); the streaming noise is
    fresh independent noise every step (no state).
    """

    n: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _v.positive_int("n", self.n))

    name = "identity"

    def describe(self) -> dict:
        return {"name": self.name, "n": self.n}

    def encoder(self) -> np.ndarray:
        """The dense ``n x n`` encoder (only materialize for small n)."""
        check_allocation(self.n, self.n, "the identity's dense encoder")
        return np.eye(self.n)

    def sensitivity(self, participation: Participation) -> float:
        """L2 sensitivity of ``C x`` under the schema: ``sqrt(min(k, ceil(n / b)))`` (exact; a
        ``min_sep`` beyond ``n`` means a single participation)."""
        from dpmf.strategies.sensitivity import FixedEpochParticipation

        if not isinstance(participation, (Participation, FixedEpochParticipation)):
            raise InvalidParameterError(
                "participation must be a Participation (b-min-sep) or FixedEpochParticipation, "
                f"got {type(participation).__name__}"
            )
        return math.sqrt(min(participation.max_participations, math.ceil(self.n / participation.min_sep)))

    def normalized(self, participation: Participation):
        """``C / sens = I / sqrt(k')`` as a one-band :class:`~dpmf.strategies.toeplitz.ToeplitzStrategy`
        (sensitivity exactly 1 under ``participation``). The DP-SGD accountants take
        ``Identity`` with the noise multiplier instead; this form is for comparing errors."""
        from dpmf.strategies.toeplitz import ToeplitzStrategy

        return ToeplitzStrategy([1.0 / self.sensitivity(participation)], self.n)

    def per_query_error(self, workload: object = None) -> np.ndarray:
        """``||A[i, :]||^2`` (``B = A``); prefix sums: ``i + 1`` without materializing ``A``."""
        if workload is None:
            return np.arange(1, self.n + 1, dtype=np.float64)
        return super().per_query_error(workload)

    def noising_matrix(self) -> np.ndarray:
        """``C^{-1} = I`` (dense)."""
        check_allocation(self.n, self.n, "the identity's dense noising matrix")
        return np.eye(self.n)

    def _streaming_noise(self, dim: int, rng: object, noise_multiplier: float, dtype: object):
        # streaming_noise (NoiseMethod): independent noise w_t = z_t (IdentityNoise)
        from dpmf.strategies.streaming import IdentityNoise

        return IdentityNoise(self.n, dim, noise_multiplier=noise_multiplier, rng=rng, dtype=dtype)

    def prefix_sum_rmse(self) -> float:
        """RMSE of the ``n`` prefix sums per unit noise multiplier: ``sqrt((n + 1) / 2)``."""
        return math.sqrt((self.n + 1) / 2)
