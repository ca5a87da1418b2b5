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
from typing import TYPE_CHECKING

import numpy as np

from dpmf.errors import InvalidParameterError
from dpmf.strategies import error as _error

__all__ = ["ErrorMethods", "NoiseMethod"]

if TYPE_CHECKING:  # pragma: no cover
    from dpmf.strategies.streaming import StreamingNoise


class NoiseMethod:
    """Mixin: the one ``streaming_noise`` signature; a class supplies ``_streaming_noise``."""

    def streaming_noise(
        self,
        dim: int,
        rng: np.random.Generator | int | None = None,
        *,
        noise_multiplier: float = 1.0,
        dtype: object = np.float64,
        **options: object,
    ) -> "StreamingNoise":
        """Per-step noise ``w = L z`` (``C^{-1} z`` for a square ``C``) one step at a time, with
        ``z = noise_multiplier * N(0, I)`` drawn from ``rng`` (a ``numpy.random.Generator`` or a
        seed; ``None`` only to feed ``z`` yourself with ``step(z)``). ``dim`` is the number of
        parameters or a parameter shape; ``dtype`` that of the output.

        The generator and its state (``memory_floats``) per class
        (:mod:`dpmf.strategies.streaming`):

        * ``Identity``: :class:`~dpmf.strategies.streaming.IdentityNoise`, ``w_t = z_t``, 0 floats;
        * ``DenseStrategy``: :class:`~dpmf.strategies.streaming.DenseNoise`, forward substitution
          keeping the last ``band - 1`` outputs, ``(band - 1) * dim``; a non-adaptive (tall) ``C``
          has no streaming form and its ``C^+ z`` is drawn up front
          (:class:`~dpmf.strategies.streaming.PregeneratedNoise`, ``n * dim``);
        * ``ToeplitzStrategy``: :class:`~dpmf.strategies.toeplitz.ToeplitzNoise`, ``(band - 1) * dim``
          for a banded encoder, ``(n - 1) * dim`` for a dense one;
        * ``BLT`` / ``BLTStrategy``: :class:`~dpmf.strategies.blt.BLTNoise`, the BLT recursion,
          ``num_buffers * dim`` (``BLT`` takes ``n=None``: unbounded unless given);
        * ``BinaryTree``: :class:`~dpmf.strategies.streaming.TreeNoise`, the online Honaker decoder
          (``step`` takes the noises of the nodes released at that step), ``levels * dim``;
        * ``FFTMechanism``: ``L z`` (see its ``noising_matrix``) drawn up front from ``z`` of
          shape ``(2n, dim)`` (:class:`~dpmf.strategies.streaming.PregeneratedNoise`, ``n * dim``);
          ``decoder="fft"`` or ``"optimal"``, or a given ``z=`` (used as is); no ``step(z)``.

        ``options`` are those a class names above (``n``; ``decoder``, ``z``).
        """
        return self._streaming_noise(dim, rng, noise_multiplier, dtype, **options)

    def _streaming_noise(self, dim: int, rng: object, noise_multiplier: float, dtype: object) -> "StreamingNoise":
        raise NotImplementedError  # pragma: no cover - every strategy class defines it


class ErrorMethods(NoiseMethod):
    """Mixin: workload errors from ``encoder()``, ``sensitivity()`` and ``_decoder_for(A)``; the
    shared ``streaming_noise`` (:class:`NoiseMethod`)."""

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
