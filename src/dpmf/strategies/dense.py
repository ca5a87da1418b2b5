"""A dense encoder ``C`` held as an explicit matrix (any strategy small enough to materialize).

The matrix mechanism releases ``C x + z`` (multi-epoch MF paper, Choquette-Choo et al. 2023,
arXiv 2211.06530, Eq. 1); training adds ``sigma C^{-1} z`` to the clipped gradient sums, so for an
adaptive (streaming) stream ``C`` must be lower triangular and invertible. Non-streaming encoders
(e.g. the FFT mechanism's tall ``2n x n`` ``C_F``, or a symmetric ``C`` for analysis) are allowed
with ``adaptive=False``; then only a full column rank is required.

Same small method set as every strategy (:mod:`dpmf.strategies.api`): ``n``, ``name``,
``describe()``, ``encoder()``, ``sensitivity(participation)``, ``normalized``, ``prefix_sum_rmse()``,
the workload errors, ``noising_matrix()`` and ``streaming_noise`` (forward substitution keeping the
last ``band - 1`` outputs: ``O(band * dim)`` memory for BandMF, ``O(n * dim)`` for a dense ``C``),
plus ``sensitivity_result`` and ``decoder``. Mirrors ``jax_privacy.matrix_factorization.dense``
(strategy matrix plus ``sensitivity`` / ``per_query_error``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError
from dpmf.strategies import error as _error
from dpmf.strategies.api import ErrorMethods
from dpmf.strategies.sensitivity import SensitivityResult, sensitivity_squared
from dpmf.strategies.workloads import lower_triangular, prefix_sum

__all__ = ["DenseStrategy"]


@dataclass(frozen=True, eq=False)
class DenseStrategy(ErrorMethods):
    """Encoder ``C`` (``n x n`` lower triangular and invertible unless ``adaptive=False``).

    The stored matrix is a read-only float64 copy. ``sensitivity(participation)`` is a sound
    upper bound (the exact value whenever :func:`~dpmf.strategies.sensitivity.sensitivity_squared`
    finds one: ``sensitivity_result`` says which) for vector contributions of L2 norm <= 1.
    """

    C: np.ndarray
    adaptive: bool = True
    name: str = "dense"
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __repr__(self) -> str:
        return f"DenseStrategy(name={self.name!r}, n={self.n}, adaptive={self.adaptive})"

    def __post_init__(self) -> None:
        if not isinstance(self.adaptive, (bool, np.bool_)):
            raise InvalidParameterError(f"adaptive must be True or False, got {self.adaptive!r}")
        if not isinstance(self.name, str) or not self.name:
            raise InvalidParameterError(f"name must be a non-empty string, got {self.name!r}")
        if self.adaptive:
            arr = lower_triangular(self.C, "C", invertible=True)
        else:
            arr = _v.finite_array("C", self.C, ndim=2).copy()
            if arr.shape[0] < arr.shape[1]:
                raise InvalidParameterError(
                    f"C must have at least as many rows as columns (steps), got shape {arr.shape}"
                )
            if np.linalg.matrix_rank(arr) < arr.shape[1]:
                raise InvalidParameterError(f"C must have full column rank {arr.shape[1]}")
        arr.setflags(write=False)
        object.__setattr__(self, "C", arr)
        object.__setattr__(self, "adaptive", bool(self.adaptive))

    @property
    def n(self) -> int:
        """Number of steps (columns of ``C``)."""
        return int(self.C.shape[1])

    @property
    def nonnegative(self) -> bool:
        """``C >= 0`` entrywise (needed by the amplification analyses)."""
        return bool(np.all(self.C >= 0))

    def describe(self) -> dict:
        """``name``, ``n``, ``adaptive``, ``nonnegative``, ``class`` (``"DenseStrategy"``: the name
        is free), ``rows``, ``sha256`` (content hash of ``C``, see
        :func:`~dpmf.strategies.matrix_identity.matrix_sha256`) and, for a small ``C``, the
        ``matrix`` itself (rows of exact floats). A larger ``C`` is referenced by its hash only:
        :func:`~dpmf.strategies.serialization.strategy_from_dict` finds it in an ``.npz``
        (:func:`~dpmf.strategies.serialization.save_matrices` writes one)."""
        from dpmf.strategies.matrix_identity import inline_matrix, matrix_sha256

        if "sha256" not in self._cache:
            self._cache["sha256"] = matrix_sha256(self.C)
        d = {
            "name": self.name,
            "n": self.n,
            "adaptive": self.adaptive,
            "nonnegative": self.nonnegative,
            "class": "DenseStrategy",
            "rows": int(self.C.shape[0]),
            "sha256": self._cache["sha256"],
        }
        if inline_matrix(self.C):
            d["matrix"] = self.C.tolist()
        return d

    def encoder(self) -> np.ndarray:
        """A writable copy of ``C``."""
        return np.array(self.C)

    def decoder(self, A: object = None) -> np.ndarray:
        """``B`` with ``B C = A`` (``A`` defaults to the prefix sum): ``A C^{-1}`` or ``A C^+``."""
        return _error.decoder(self.C, A)

    def sensitivity_result(self, participation: object, *, data: str = "vector") -> SensitivityResult:
        """Squared sensitivity with its method and exactness (cached per schema)."""
        key = (participation, data)
        if key not in self._cache:
            self._cache[key] = sensitivity_squared(self.C, participation, data=data)
        return self._cache[key]

    def sensitivity(self, participation: object) -> float:
        """L2 sensitivity of ``C x`` under the schema (sound upper bound; vector contributions).

        ``participation`` is a :class:`~dpmf.strategies.participation.Participation` (b-min-sep)
        or a :class:`~dpmf.strategies.sensitivity.FixedEpochParticipation`.
        """
        return self.sensitivity_result(participation).sensitivity

    def prefix_sum_rmse(self) -> float:
        """RMSE of the ``n`` prefix sums per unit noise multiplier on ``C`` **as given**:
        ``sqrt(mean_i ||(S C^{-1})[i, :]||^2)`` (same convention as ``Identity``; multiply by the
        sensitivity, or call :meth:`normalized` first, to compare strategies at equal privacy)."""
        return math.sqrt(float(_error.per_query_error(self.C, prefix_sum(self.n)).mean()))

    def normalized(self, participation: object) -> "DenseStrategy":
        """``C / sens``: sensitivity <= 1 under ``participation`` (= 1 when the value is exact)."""
        sens = self.sensitivity(participation)
        if not sens > 0:
            raise InvalidParameterError("C has zero sensitivity; it cannot be normalized")
        return DenseStrategy(self.C / sens, adaptive=self.adaptive, name=self.name)

    def _decoder_for(self, workload: object) -> np.ndarray:
        return self.decoder(workload)

    def noising_matrix(self) -> np.ndarray:
        """The left inverse ``L`` (``L C = I``) training applies to ``z``: ``C^{-1}`` for an adaptive
        (square lower-triangular) ``C``, else the pseudo-inverse ``C^+`` (the optimal decoder's
        noise, not streaming)."""
        if self.adaptive:
            import scipy.linalg as _sla

            return _sla.solve_triangular(self.C, np.eye(self.n), lower=True)
        return np.linalg.pinv(self.C)

    @property
    def band(self) -> int:
        """``b`` with ``C[i, j] = 0`` whenever ``i - j >= b`` (``n`` for a dense ``C``)."""
        from dpmf.strategies.streaming import bandwidth

        return bandwidth(np.tril(self.C))

    def _streaming_noise(self, dim: int, rng: object, noise_multiplier: float, dtype: object):
        # streaming_noise (NoiseMethod): DenseNoise (forward substitution); a tall C has no
        # streaming form, its C^+ z is drawn up front (PregeneratedNoise)
        from dpmf.strategies.streaming import DenseNoise, PregeneratedNoise, StreamingNoise

        if self.adaptive:
            return DenseNoise(self.C, dim, noise_multiplier=noise_multiplier, rng=rng, dtype=dtype)
        base = StreamingNoise(self.n, dim, noise_multiplier=noise_multiplier, rng=rng, dtype=dtype)
        if base._rng is None:
            raise InvalidParameterError("rng is required: a non-streaming strategy draws all its noise up front")
        z = base._draw((self.C.shape[0], base.dim))
        rows = (self.noising_matrix() @ z).astype(base.dtype)
        return PregeneratedNoise(
            rows, reason=f"the {self.name} encoder is not lower triangular (not streaming)", shape=base.shape
        )
