"""The small method set every strategy class shares: errors at sensitivity 1 for any workload.

Multi-epoch MF paper (Choquette-Choo et al., ICML 2023), Sec. 2.6 / Eq. 4; the formulas are those
of :mod:`dpmf.strategies.error`, evaluated with the strategy's own (structured, sound)
``sensitivity(participation)`` and its default decoder ``B`` with ``B C = A``: ``A C^{-1}`` for a
square encoder, the optimal ``A C^+`` for a tall one (binary tree, FFT), as in
:func:`dpmf.strategies.error.decoder`.

Every strategy class (``Identity``, ``DenseStrategy``, ``ToeplitzStrategy`` and ``BLTStrategy``,
``BinaryTree``, ``FFTMechanism``) has:

* ``n``, ``name``, ``describe()``, ``encoder()`` (dense, on request);
* ``sensitivity(participation)`` -- a sound upper bound (exact where documented);
* ``normalized(participation)`` -- the same strategy scaled to sensitivity 1 (``C / sens``);
* ``prefix_sum_rmse()`` -- RMSE of the ``n`` prefix sums per unit noise multiplier for ``C`` *as
  given* (not normalized);
* ``per_query_error(workload=None)`` -- ``||B[i, :]||^2`` for ``C`` as given (mirrors
  ``jax_privacy.matrix_factorization.dense.per_query_error``);
* ``per_step_variance``, ``total_squared_error``, ``rmse``, ``max_error`` ``(participation,
  workload=None)`` -- the same at sensitivity 1 under ``participation`` (module
  :mod:`~dpmf.strategies.error`); ``workload`` defaults to the prefix sum;
* ``noising_matrix()`` -- the dense ``n x m`` left inverse ``L`` (``L C = I``) whose product with
  ``z`` training adds (``C^{-1}`` for square ``C``);
* ``streaming_noise(dim, rng, *, noise_multiplier=1.0, dtype=float64)`` -- that noise one step at
  a time (:mod:`dpmf.strategies.streaming`), with its ``memory_floats``; ``dim`` is the number of
  parameters or a parameter shape. (``jax_privacy`` splits this into
  ``inverse_as_streaming_matrix()`` and ``noise_addition.matrix_factorization_privatizer``.)

The workload-general errors materialize ``n x n`` matrices (meant for ``n`` up to a few thousand).

Example (DP-SGD noise, 128 steps, 2 epochs: notes/peer-libraries.md §B.5):

    >>> from dpmf.strategies import FixedEpochParticipation, Identity
    >>> part = FixedEpochParticipation(2, 64)
    >>> round(Identity(128).rmse(part), 4), Identity(128).max_error(part)
    (11.3578, 16.0)
    >>> round(Identity(128).normalized(part).sensitivity(part), 12)
    1.0
"""

from __future__ import annotations

import math

import numpy as np

from dpmf.errors import InvalidParameterError
from dpmf.strategies import error as _error

__all__ = ["ErrorMethods"]


class ErrorMethods:
    """Mixin: workload errors from ``encoder()``, ``sensitivity()`` and ``_decoder_for(A)``."""

    def _decoder_for(self, workload: object) -> np.ndarray:
        return _error.decoder(self.encoder(), workload)

    def per_query_error(self, workload: object = None) -> np.ndarray:
        """``||B[i, :]||^2`` per query ``i``: noise variance per unit noise multiplier on ``C`` as
        given (default workload: prefix sum)."""
        B = self._decoder_for(workload)
        return np.einsum("ij,ij->i", B, B)

    def _sens2(self, participation: object) -> float:
        s = float(self.sensitivity(participation))
        if not (s > 0 and math.isfinite(s)):
            raise InvalidParameterError(f"the strategy has sensitivity {s!r}; it cannot be normalized")
        return s * s

    def per_step_variance(self, participation: object, workload: object = None) -> np.ndarray:
        """``sens^2 ||B[i, :]||^2``: variance of query ``i`` per unit noise multiplier with the
        strategy normalized to sensitivity 1 under ``participation``."""
        return self._sens2(participation) * self.per_query_error(workload)

    def total_squared_error(self, participation: object, workload: object = None) -> float:
        """``sens^2 ||B||_F^2``, the paper's loss (Eq. 4) at sensitivity 1."""
        return float(self.per_step_variance(participation, workload).sum())

    def rmse(self, participation: object, workload: object = None) -> float:
        """``sens sqrt(mean_i ||B[i, :]||^2)``: RMSE of the queries at sensitivity 1."""
        return math.sqrt(float(self.per_step_variance(participation, workload).mean()))

    def max_error(self, participation: object, workload: object = None) -> float:
        """``sens max_i ||B[i, :]||``: standard deviation of the worst query at sensitivity 1."""
        return math.sqrt(float(self.per_step_variance(participation, workload).max()))
