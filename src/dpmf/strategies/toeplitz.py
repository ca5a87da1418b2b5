"""Lower-triangular Toeplitz strategies: an encoder ``C`` that is its coefficient vector.

A lower-triangular Toeplitz matrix of size ``n`` is ``C[i, j] = c[i - j]`` for ``i >= j`` and 0
above the diagonal (0-based indices everywhere in this module; a paper's ``C_{i,j} = f(i - j)``
with 1-based ``i, j`` is the same matrix). A coefficient vector shorter than ``n`` means the
remaining coefficients are 0: the encoder is *banded* (``len(c)`` nonzero diagonals). Such
matrices form a commutative algebra (they are truncated power series ``c(x) = sum_k c_k x^k``):
products and inverses are again lower-triangular Toeplitz, so ``C^{-1}`` and the prefix-sum
decoder ``B = A C^{-1}`` are coefficient vectors too.

The optimal continual-counting matrix (Fichtenberger et al. 2023; Henzinger et al. 2023; the
"square-root" factorization; MMCC paper App. E, digest ``notes/mmcc.md`` Sec. 4.3) is::

    f(0) = 1,   f(k) = f(k - 1) * (1 - 1 / (2 k))   (k >= 1),   i.e. f(k) = binom(2k, k) / 4^k,

the coefficients of ``(1 - x)^{-1/2}``. With ``C = B = Toeplitz(f)`` we get ``C @ C = A``, the
all-ones lower-triangular prefix-sum matrix, and ``C^{-1}`` has the coefficients of
``(1 - x)^{1/2}``: ``g(0) = 1``, ``g(k) = g(k - 1) * (k - 3/2) / k``.

Mechanism convention (DESIGN.md): release ``C x + z`` with ``z ~ N(0, sigma^2 I)``; training adds
``sigma * C^{-1} z`` to the clipped gradient sums. :class:`ToeplitzNoise` generates that noise one
step at a time (streaming), holding only the history it needs.

Mirrors ``jax_privacy.matrix_factorization.toeplitz`` in spirit (``materialize_lower_triangular``,
``inverse_coef``); no code is shared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.fft as _fft

from dpmf import validation as _v
from dpmf.errors import InvalidParameterError
from dpmf.resources import check_allocation
from dpmf.strategies.api import ErrorMethods
from dpmf.strategies.streaming import CHUNK, Ring, StreamingNoise, subtract_history

__all__ = [
    "sqrt_prefix_coefficients",
    "materialize_lower_toeplitz",
    "toeplitz_inverse_coefficients",
    "lower_toeplitz_matmul",
    "ToeplitzStrategy",
    "ToeplitzNoise",
]

# Above this many multiply-adds the O(n * band) recursion hands over to Newton iteration with FFTs.
_RECURSION_MAX_WORK = 4_000_000


def _coefficients(name: str, coefs: object) -> np.ndarray:
    return _v.finite_array(name, coefs, ndim=1).copy()


def _band(coefs: np.ndarray) -> int:
    """Number of leading coefficients up to the last nonzero one (0 if all are zero)."""
    nz = np.flatnonzero(coefs)
    return int(nz[-1]) + 1 if nz.size else 0


def sqrt_prefix_coefficients(n: int) -> np.ndarray:
    """The first ``n`` coefficients of ``(1 - x)^{-1/2}``: ``f(0) = 1, f(k) = f(k-1)(1 - 1/(2k))``.

    ``Toeplitz(f) @ Toeplitz(f)`` is the ``n x n`` prefix-sum matrix (optimal continual counting,
    Fichtenberger et al. 2023; Henzinger et al. 2023). ``f(k) = binom(2k, k) / 4^k ~ 1/sqrt(pi k)``.
    """
    n = _v.positive_int("n", n)
    check_allocation(1, n, "building the square-root Toeplitz coefficients", copies=3)
    k = np.arange(1, n, dtype=np.float64)
    return np.cumprod(np.concatenate(([1.0], 1.0 - 1.0 / (2.0 * k))))


def materialize_lower_toeplitz(coefs: object, n: int | None = None) -> np.ndarray:
    """The dense ``n x n`` matrix ``C[i, j] = coefs[i - j]`` (``i >= j``), 0 above the diagonal.

    ``n`` defaults to ``len(coefs)``. Shorter coefficient vectors are padded with zeros (banded
    matrix); longer ones are cut to their first ``n`` entries (the leading ``n x n`` block).
    """
    c = _coefficients("coefs", coefs)
    n = c.size if n is None else _v.positive_int("n", n)
    check_allocation(n, n, "the dense lower-triangular Toeplitz matrix", copies=3)  # (index differences, result)
    col = np.zeros(n)
    m = min(n, c.size)
    col[:m] = c[:m]
    idx = np.arange(n)
    diff = idx[:, None] - idx[None, :]
    return np.where(diff >= 0, col[np.clip(diff, 0, None)], 0.0)


def _inverse_by_recursion(c: np.ndarray, n: int) -> np.ndarray:
    # sum_{j=0}^{k} c_j g_{k-j} = [k == 0]  =>  g_k = -(1/c_0) sum_{j=1}^{min(k, m-1)} c_j g_{k-j}
    # rev[n - 1 - k] = g_k, so g_{k-1}, g_{k-2}, ... is the contiguous slice rev[n - k:].
    m = min(c.size, n)
    rev = np.zeros(n)
    rev[n - 1] = 1.0 / c[0]
    tail = c[1:m]
    for k in range(1, n):
        j = min(k, m - 1)
        if j:
            rev[n - 1 - k] = -np.dot(tail[:j], rev[n - k : n - k + j]) / c[0]
    return rev[::-1].copy()


def _inverse_by_newton(c: np.ndarray, n: int) -> np.ndarray:
    # Power-series Newton iteration g <- g (2 - c g) mod x^{2m}: doubles the number of exact
    # coefficients per step; each step is two FFT convolutions, O(n log n) in total.
    g = np.array([1.0 / c[0]])
    m = 1
    while m < n:
        m = min(2 * m, n)
        cm = c[:m]
        size = _fft.next_fast_len(2 * m, real=True)
        cg = _fft.irfft(_fft.rfft(cm, size) * _fft.rfft(g, size), size)[:m]
        cg = -cg
        cg[0] += 2.0
        g = _fft.irfft(_fft.rfft(g, size) * _fft.rfft(cg, size), size)[:m]
    return g


def toeplitz_inverse_coefficients(
    coefs: object, n: int | None = None, *, method: Literal["auto", "recursion", "newton"] = "auto"
) -> np.ndarray:
    """Coefficients ``g`` (length ``n``) of ``C^{-1}`` for ``C = Toeplitz(coefs)`` of size ``n``.

    ``C^{-1}`` is lower-triangular Toeplitz because the inverse of the power series ``c(x)`` is a
    power series. ``method="recursion"`` is the forward recursion
    ``g_k = -(1/c_0) sum_{j=1}^{k} c_j g_{k-j}`` (``O(n * band)``); ``"newton"`` is Newton's
    iteration on power series with FFT products (``O(n log n)``). ``"auto"`` takes the
    recursion unless it would exceed a few million multiply-adds. Requires ``coefs[0] != 0``.
    """
    c = _coefficients("coefs", coefs)
    n = c.size if n is None else _v.positive_int("n", n)
    if c[0] == 0:
        raise InvalidParameterError("coefs[0] must be nonzero for C to be invertible, got 0.0")
    c = c[:n]
    check_allocation(1, n, "computing the inverse Toeplitz coefficients", copies=6)  # (Newton: padded, FFT buffers)
    band = max(_band(c), 1)
    if method == "auto":
        method = "recursion" if n * band <= _RECURSION_MAX_WORK else "newton"
    if method == "recursion":
        return _inverse_by_recursion(c[:band], n)
    if method == "newton":
        padded = np.zeros(n)
        padded[: c.size] = c
        return _inverse_by_newton(padded, n)
    raise InvalidParameterError(f"method must be 'auto', 'recursion' or 'newton', got {method!r}")


def lower_toeplitz_matmul(coefs: object, x: object, *, transpose: bool = False) -> np.ndarray:
    """``C @ x`` (or ``C.T @ x``) for ``C = Toeplitz(coefs)`` of size ``len(x)``, by FFT.

    ``x`` has shape ``(n,)`` or ``(n, d)``; the columns are transformed independently in
    ``O(n log n)`` each. ``coefs`` shorter than ``n`` mean a banded ``C``.
    """
    c = _coefficients("coefs", coefs)
    x = np.asarray(x, dtype=np.float64)
    if x.ndim not in (1, 2) or x.shape[0] == 0:
        raise InvalidParameterError(f"x must have shape (n,) or (n, d) with n >= 1, got {x.shape}")
    return _toeplitz_matmul(c, x, transpose)


def _toeplitz_matmul(c: np.ndarray, x: np.ndarray, transpose: bool) -> np.ndarray:
    # No validation: internal fast path. C.T = J C J with J the reversal.
    n = x.shape[0]
    c = c[:n]
    if transpose:
        x = x[::-1]
    size = _fft.next_fast_len(n + c.size - 1, real=True)
    cf = _fft.rfft(c, size)
    if x.ndim == 2:
        cf = cf[:, None]
    y = _fft.irfft(cf * _fft.rfft(x, size, axis=0), size, axis=0)[:n]
    return y[::-1].copy() if transpose else y


@dataclass(frozen=True, eq=False)
class ToeplitzStrategy(ErrorMethods):
    """A lower-triangular Toeplitz encoder ``C`` of size ``n`` given by its coefficients.

    ``coefs`` has length ``<= n`` (shorter: banded, the missing coefficients are 0; longer input is
    cut to ``n``). ``coefs[0]`` must be nonzero so that ``C`` is invertible. ``inverse_coefs``
    (optional) are the exact coefficients of ``C^{-1}`` when they are known and shorter (BISR),
    checked against the numerical inverse; the streaming noise then keeps only their band. The strategy is held
    *as given*, not normalized to any sensitivity: ``noise_multiplier`` sigma refers to this ``C``.

    Shares the method set of every strategy (:mod:`dpmf.strategies.api`); the streaming noise is
    :class:`ToeplitzNoise`. Instances compare by identity (they hold arrays).
    """

    coefs: np.ndarray
    n: int
    inverse_coefs: np.ndarray | None = None

    name = "toeplitz"

    def __post_init__(self) -> None:
        n = _v.positive_int("n", self.n)
        c = _coefficients("coefs", self.coefs)[:n]
        if c[0] == 0:
            raise InvalidParameterError("coefs[0] must be nonzero for C to be invertible, got 0.0")
        c.setflags(write=False)
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "coefs", c)
        if self.inverse_coefs is not None:
            # the exact coefficients of C^{-1} when known (e.g. BISR's banded inverse): must agree
            # with the numerical inverse of coefs; used for the streaming noise (exact band)
            g = _coefficients("inverse_coefs", self.inverse_coefs)[:n]
            num = toeplitz_inverse_coefficients(c, n)
            full = np.zeros(n)
            full[: g.size] = g
            scale = max(1.0, float(np.max(np.abs(num))))
            if g[0] == 0 or float(np.max(np.abs(full - num))) > 1e-9 * scale:
                raise InvalidParameterError(
                    "inverse_coefs must be the coefficients of C^{-1} for the given coefs "
                    f"(max deviation {float(np.max(np.abs(full - num))):.3g})"
                )
            g.setflags(write=False)
            object.__setattr__(self, "inverse_coefs", g)

    @classmethod
    def sqrt_prefix_sum(cls, n: int) -> "ToeplitzStrategy":
        """The square-root factorization ``C = B = Toeplitz(f)`` of the prefix sum (``C @ C = A``)."""
        return cls(sqrt_prefix_coefficients(n), n)

    @property
    def band(self) -> int:
        """Number of nonzero diagonals up to the last nonzero coefficient (``n`` if not banded)."""
        return _band(self.coefs)

    def describe(self) -> dict:
        """``name``, ``n``, ``band`` and the coefficients as exact floats (``coefs``, and
        ``inverse_coefs`` when given): :func:`~dpmf.strategies.serialization.strategy_from_dict`
        rebuilds the same strategy from it."""
        d = {"name": self.name, "n": self.n, "band": self.band, "coefs": self.coefs.tolist()}
        if self.inverse_coefs is not None:
            d["inverse_coefs"] = self.inverse_coefs.tolist()
        return d

    def encoder(self) -> np.ndarray:
        """The dense ``n x n`` encoder ``C`` (materialize only when needed)."""
        check_allocation(self.n, self.n, "the Toeplitz strategy's dense encoder")
        return materialize_lower_toeplitz(self.coefs, self.n)

    def noising_coefficients(self) -> np.ndarray:
        """Coefficients (length ``n``) of ``C^{-1}``, the operator applied to the noise in training
        (``inverse_coefs`` zero-padded when given, else computed from ``coefs``)."""
        if self.inverse_coefs is not None:
            g = np.zeros(self.n)
            g[: self.inverse_coefs.size] = self.inverse_coefs
            return g
        return toeplitz_inverse_coefficients(self.coefs, self.n)

    def decoder_coefficients(self) -> np.ndarray:
        """Coefficients of the prefix-sum decoder ``B = A C^{-1}``: the running sums of ``C^{-1}``'s."""
        return np.cumsum(self.noising_coefficients())

    def column_norms(self) -> np.ndarray:
        """L2 norms of the ``n`` columns of ``C``: column ``j`` holds ``coefs[0 .. n-1-j]``.

        Non-increasing in ``j``; ``column_norms()[0]`` is the single-participation sensitivity.
        """
        sq = np.zeros(self.n)
        sq[: self.coefs.size] = self.coefs**2
        return np.sqrt(np.cumsum(sq)[::-1])

    def sensitivity(self, participation) -> float:
        """Sound L2 sensitivity of ``C x`` under ``participation`` (exact for non-negative,
        non-increasing coefficients and for at most ``min_sep`` bands; see
        :func:`dpmf.strategies.sensitivity.toeplitz_sensitivity_squared`)."""
        from dpmf.strategies.sensitivity import toeplitz_sensitivity_squared

        return toeplitz_sensitivity_squared(self.coefs, participation, self.n).sensitivity

    def prefix_sum_rmse(self) -> float:
        """RMSE over the ``n`` prefix sums per unit noise multiplier, for ``C`` as given.

        With ``B = A C^{-1}`` (Toeplitz, coefficients ``b``), query ``i`` gets noise variance
        ``sigma^2 sum_{j<=i} b_j^2``, so ``rmse = sqrt(sum_j (n - j) b_j^2 / n)`` at ``sigma = 1``.
        Not normalized to a participation schema: multiply by the sensitivity of ``C`` to compare
        strategies at equal privacy.
        """
        b = self.decoder_coefficients()
        weights = np.arange(self.n, 0, -1, dtype=np.float64)
        return math.sqrt(float(np.dot(weights, b**2)) / self.n)


    def normalized(self, participation) -> "ToeplitzStrategy":
        """``C / sens`` (coefficients divided by :meth:`sensitivity`): sensitivity <= 1 under
        ``participation`` (= 1 where the sensitivity is exact)."""
        sens = self.sensitivity(participation)
        if not sens > 0:
            raise InvalidParameterError("C has zero sensitivity; it cannot be normalized")
        inv = None if self.inverse_coefs is None else self.inverse_coefs * sens
        return ToeplitzStrategy(self.coefs / sens, self.n, inv)

    def per_query_error(self, workload: object = None) -> np.ndarray:
        """``||B[i, :]||^2`` for ``C`` as given; for the prefix sum (default) in ``O(n log n)``:
        ``B = A C^{-1}`` is Toeplitz with coefficients ``b`` and row ``i`` has ``sum_{j<=i} b_j^2``."""
        if workload is None:
            return np.cumsum(self.decoder_coefficients() ** 2)
        return super().per_query_error(workload)

    def noising_matrix(self) -> np.ndarray:
        """Dense ``C^{-1}`` (lower-triangular Toeplitz with :meth:`noising_coefficients`)."""
        check_allocation(self.n, self.n, "the Toeplitz strategy's dense noising matrix", copies=3)  # (before C^{-1})
        return materialize_lower_toeplitz(self.noising_coefficients(), self.n)

    def _streaming_noise(self, dim: int, rng: object, noise_multiplier: float, dtype: object) -> "ToeplitzNoise":
        # streaming_noise (NoiseMethod): w = C^{-1} z one step at a time (ToeplitzNoise)
        return ToeplitzNoise(self, dim, noise_multiplier=noise_multiplier, rng=rng, dtype=dtype)


class ToeplitzNoise(StreamingNoise):
    """Streaming correlated noise ``w_t = (C^{-1} z)_t`` for a :class:`ToeplitzStrategy` ``C``.

    ``z_t in R^dim`` are the i.i.d. Gaussian vectors of the mechanism ``C x + z``; the ``t``-th
    output (``t = 0 .. n-1``) is ``w_t = sum_{j<=t} g_j z_{t-j}`` with ``g`` the coefficients of
    ``C^{-1}`` -- the noise that training adds to the clipped gradient sum of step ``t``. Same
    interface as every generator of :mod:`dpmf.strategies.streaming`:

    * ``next(noise)`` draws ``z_t = noise_multiplier * N(0, I_dim)`` from ``rng`` and returns
      ``w_t`` (iteration stops after ``n`` steps).
    * ``noise.step(z_t)`` takes ``z_t`` from the caller (no scaling) and returns ``w_t``; feeding
      unit vectors materializes ``C^{-1}``.

    Memory (``memory_floats = history_rows * dim`` floats besides the output), chosen from the
    exact zero pattern of the coefficients:

    * banded encoder (``C`` has ``band`` nonzero diagonals, ``band <=`` the inverse's): solve
      ``C w = z`` forward, ``w_t = (z_t - sum_{j=1}^{band-1} c_j w_{t-j}) / c_0``, keeping the last
      ``band - 1`` outputs;
    * banded inverse (``C^{-1}`` has fewer nonzero diagonals, e.g. from
      :meth:`from_noising_coefficients`): convolve with ``g``, keeping the last ``band - 1`` inputs;
    * general (e.g. the square-root strategy): convolve with ``g`` over the full history of
      ``z``, ``(n - 1) * dim`` floats, and ``O(t * dim)`` work at step ``t``.

    ``dtype`` (float64 by default; float32 on request) is the dtype of the draws, the state and
    the output. Mirrors ``jax_privacy``'s ``toeplitz.inverse_as_streaming_matrix``.
    """

    def __init__(
        self,
        strategy: ToeplitzStrategy,
        dim: int,
        *,
        noise_multiplier: float = 1.0,
        rng: np.random.Generator | int | None = None,
        dtype: object = np.float64,
        _noising_coefficients: object | None = None,
    ) -> None:
        if not isinstance(strategy, ToeplitzStrategy):
            raise InvalidParameterError(
                f"strategy must be a ToeplitzStrategy, got {type(strategy).__name__}"
            )
        super().__init__(strategy.n, dim, noise_multiplier=noise_multiplier, rng=rng, dtype=dtype)
        self.strategy = strategy
        if _noising_coefficients is None:
            g = strategy.noising_coefficients()
        else:  # exact coefficients of C^{-1} (from_noising_coefficients)
            g = _coefficients("noising_coefficients", _noising_coefficients)
            if g.size > self.n:
                raise InvalidParameterError(
                    f"noising_coefficients must have length <= n={self.n}, got {g.size}"
                )
        c = strategy.coefs
        band_c = max(_band(c), 1)
        band_g = max(_band(g), 1)
        if band_c < band_g:
            self.mode = "banded-encoder"
            self._coefs = c[:band_c].copy()
            history = band_c - 1
        else:
            self.mode = "banded-inverse" if band_g < self.n else "full-history"
            self._coefs = g[:band_g].copy()
            history = band_g - 1
        self.history_rows = min(history, self.n - 1)
        # the last h inputs (or outputs) in h * dim floats; _lagged[j] multiplies lag j + 1
        self._ring = Ring(self.history_rows, self.dim, self.dtype)
        lagged = np.zeros(max(self.history_rows, 1))
        lagged[: self.history_rows] = self._coefs[1 : 1 + self.history_rows]
        self._lagged = lagged.astype(self.dtype)
        self._tmp = np.empty(min(self.dim, CHUNK), dtype=self.dtype)

    @classmethod
    def from_noising_coefficients(
        cls,
        noising_coefficients: object,
        n: int,
        dim: int,
        *,
        noise_multiplier: float = 1.0,
        rng: np.random.Generator | int | None = None,
        dtype: object = np.float64,
    ) -> "ToeplitzNoise":
        """Build from the coefficients of ``C^{-1}`` directly (exact band for a banded inverse)."""
        n = _v.positive_int("n", n)
        g = _coefficients("noising_coefficients", noising_coefficients)[:n]
        if g[0] == 0:
            raise InvalidParameterError("noising_coefficients[0] must be nonzero, got 0.0")
        strategy = ToeplitzStrategy(toeplitz_inverse_coefficients(g, n), n)
        return cls(
            strategy, dim, noise_multiplier=noise_multiplier, rng=rng, dtype=dtype, _noising_coefficients=g
        )

    @property
    def memory_floats(self) -> int:
        """Floats of state kept between steps: ``history_rows * dim``."""
        return int(self._ring.buf.size)

    def _step(self, z: np.ndarray) -> np.ndarray:
        if self.mode == "banded-encoder":
            return self._solve(z, None)
        # w_t = g_0 z_t + sum_{j>=0} g_{j+1} z_{t-1-j}; the ring holds past inputs z
        t = self._t
        coef, past = self._ring.weights(self._lagged, t)
        w = (self._coefs[0] * z).astype(self.dtype, copy=False)
        if past.shape[0]:
            subtract_history(w, -coef, past, self._tmp)
        self._ring.store(z, t)
        return w

    def _solve(self, w: np.ndarray, draw) -> np.ndarray:
        # banded encoder: w_t = (z_t - sum_{j>=0} c_{j+1} w_{t-1-j}) / c_0; the ring holds past w
        t = self._t
        coef, past = self._ring.weights(self._lagged, t)
        subtract_history(
            w, coef, past, self._tmp, draw=draw, sigma=self.noise_multiplier, divisor=float(self._coefs[0])
        )
        self._ring.store(w, t)
        return w

    def _next(self) -> np.ndarray:
        if self.mode != "banded-encoder":
            return super()._next()
        # fused and chunked: draw z into the output chunk by chunk and apply the recursion while
        # the chunk is in cache (the same numbers as step(noise_multiplier * standard_normal(dim)))
        w = self._solve(np.empty(self.dim, dtype=self.dtype), self._rng)
        self._t += 1
        return w
